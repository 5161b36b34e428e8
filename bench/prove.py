"""An operator's proof of an installed wheel, and the wheel of every shared deployment.

    python bench/prove.py [--sample N] [--seed S] [--jobs J] [--json]

Prints, side by side:

- the wheel of the shared gfx942 TP4 deployment (../shared/prebuilt-gfx942-tp4,
  630 keys), installed into a fresh venv and proven there as an operator
  would: ``dsv41-aot verify --against-jit --sample N`` with no ``--dir`` (the
  installed kernels) and ``--no-cache`` (every sampled key JIT-built for
  real). Its keys per minute, beside the anchor: the seconds vLLM's own JIT
  spent compiling those keys in the same run, the part a proof cannot skip.
  The fresh venv holds the wheel alone; FlyDSL, torch and vLLM's kernel
  source, which the JIT needs, come from this checkout's .venv (a .pth file),
  as they would from the operator's vLLM environment.
- one wheel holding all three shared deployments' rooms (gfx950 TP2 and TP4,
  gfx942 TP4: 2,934 keys): each (arch, release) room merged from the
  deployments' rooms through the records' own classes (manifest, libs.json,
  verified.json), then built as a wheel; beside the anchor, the three
  deployments' own wheels, built the same way.

No GPU is used: the launches of the proof go through the recording HIP
(the stand-in for the AMD GPU). Quote the load average with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
from _smoke import DEPLOYMENTS, SHARED  # noqa: E402

from dsv41_aot.linkrecord import LinkRecord  # noqa: E402
from dsv41_aot.listing import built_rooms  # noqa: E402
from dsv41_aot.manifest import Manifest  # noqa: E402
from dsv41_aot.proof import Proof  # noqa: E402
from dsv41_aot.room import Room  # noqa: E402

PY = sys.executable
MB = 1e6


def sh(cmd, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    if r.returncode:
        sys.exit(f"bench/prove.py: {' '.join(map(str, cmd))} failed (exit {r.returncode}):\n"
                 f"{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return r


def build_wheel(prebuilt: Path, out: Path) -> Path:
    """The kernels wheel of ``prebuilt``, as the release builds it (``ci/release.py build-wheel``)."""
    sh([PY, ROOT / "ci" / "release.py", "build-wheel", prebuilt, out], cwd=ROOT)
    (wheel,) = out.glob("*.whl")
    return wheel


def folder_of(name: str) -> Path:
    _, var, default, _ = DEPLOYMENTS[name]
    d = Path(os.environ.get(var) or default)
    if not d.is_dir():
        sys.exit(f"bench/prove.py: no {name} deployment at {d} (the shared folder {SHARED}, or {var}=DIR)")
    return d


def installed_proof(wheel: Path, tmp: Path, sample: int, seed: int, jobs: int) -> dict:
    """Install ``wheel`` into a fresh venv and prove a sample of its kernels there."""
    venv = tmp / "operator-venv"
    sh([PY, "-m", "venv", venv])
    sh([venv / "bin" / "python", "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel])
    site = next((venv / "lib").glob("python3*/site-packages"))
    ours = next((ROOT / ".venv" / "lib").glob("python3*/site-packages"))
    (site / "vllm-environment.pth").write_text(f"{ours}\n")  # after the venv's own: the wheel's dsv41_aot wins
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSV41_AOT_") and k != "PYTHONPATH"}
    env["DSV41_AOT_ALLOW_HIP_VERSION"] = os.environ.get("DSV41_AOT_ALLOW_HIP_VERSION", "5.2")  # Debian's ROCm 5.2
    t0 = time.perf_counter()
    r = subprocess.run([venv / "bin" / "dsv41-aot", "verify", "--against-jit", "--sample", str(sample), "--seed",
                        str(seed), "--no-cache", "--jobs", str(jobs), "--json", "--no-progress"],
                       cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    doc = json.loads(r.stdout)
    if r.returncode or doc["jit_checked"] != sample:
        sys.exit(f"bench/prove.py: the installed wheel's proof failed (exit {r.returncode}): "
                 f"{json.dumps(doc['failures'][:3])}\n{r.stderr[-2000:]}")
    jit = sum(rep["jit_seconds"] or 0 for rep in doc["reports"])
    return {"keys": sample, "jobs": jobs, "wall_seconds": round(wall, 1), "jit_seconds": round(jit, 1),
            "keys_per_minute": round(sample / wall * 60, 2), "dir": doc["dir"]}


def merged(names: list, dest: Path) -> Path:
    """One prebuilt dir holding every room of the ``names`` deployments, merged room by room."""
    rooms: dict = {}
    for name in names:
        for room in built_rooms(folder_of(name)):
            rooms.setdefault((room.arch, room.release), []).append(room)
    for (arch, release), parts in sorted(rooms.items()):
        out = Room(dest, arch, release)
        out.dir.mkdir(parents=True, exist_ok=True)
        out.lib.mkdir(exist_ok=True)
        man = Manifest(out.arch_dir, arch, release=release)
        bands, proofs = [], []
        for room in parts:
            src = room.manifest()
            man.entries.update(src.entries)
            man.abis.update(src.abis)
            for band in room.links().bands:
                shutil.copyfile(room.lib / band.file, out.lib / band.file)
                bands.append(band)
            proofs += room.proof().all()
        man.write()
        out.write_links(LinkRecord.of(arch, release, bands))
        if proofs:
            (out.dir / "verified.json").write_bytes(Proof.of(arch, release, proofs, man.entries).to_bytes())
    return dest


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sample", type=int, default=4, help="keys to prove (default 4)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the sample (default 0)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out: dict = {"load_average": list(os.getloadavg())}
    with tempfile.TemporaryDirectory(prefix="dsv41-bench-prove-") as tmp:
        tmp = Path(tmp)
        singles = {name: build_wheel(folder_of(name), tmp / f"wheel-{name}") for name in sorted(DEPLOYMENTS)}
        out["proof"] = installed_proof(singles["gfx942-tp4"], tmp, args.sample, args.seed, args.jobs)
        every = build_wheel(merged(sorted(DEPLOYMENTS), tmp / "every"), tmp / "wheel-every")
        sh([PY, ROOT / "ci" / "check_wheel.py", "--no-auditwheel", every])  # the one judge passes it
        out["wheels_mb"] = {name: round(w.stat().st_size / MB, 2) for name, w in singles.items()}
        out["every_mb"] = round(every.stat().st_size / MB, 2)
        out["every_keys"] = sum(len(r.manifest().entries) for r in built_rooms(tmp / "every"))
    out["load_average_after"] = list(os.getloadavg())
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    p = out["proof"]
    print(f"load average before {out['load_average'][0]:.2f}, after {out['load_average_after'][0]:.2f} "
          f"({os.cpu_count()} CPUs)")
    print(f"proof of the installed gfx942 TP4 wheel ({p['dir']}), --sample {p['keys']} --no-cache:")
    print(f"  anchor: vLLM's JIT compiling those keys, seconds summed over {p['jobs']} worker(s): "
          f"{p['jit_seconds']:.1f} s")
    print(f"  the whole proof (import, bands, JIT, both launches): {p['wall_seconds']:.1f} s = "
          f"{p['keys_per_minute']} keys per minute")
    print("one wheel of every shared deployment's rooms:")
    for name, mb in out["wheels_mb"].items():
        print(f"  anchor: the {name} wheel alone {mb:6.2f} MB")
    print(f"  anchor: the three wheels summed {sum(out['wheels_mb'].values()):6.2f} MB")
    print(f"  one wheel of all {out['every_keys']} keys       {out['every_mb']:6.2f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
