"""Wheel size per arch and install-to-first-Launcher time, in one run.

    python bench/wheel.py [--prebuilt DIR]   (default: build + link the smoke profile in a temp dir)

Prints, per arch, side by side:
- the kernels wheel as built (manifest + linked libraries), the same with the
  stored objects packed too (DSV41_AOT_WHEEL_OBJECTS=1), and the naive size:
  FlyDSL's unstripped export objects (manifest ``export_bytes``);
- each extrapolated to the ``full`` profile by its key count per kind
  (``dsv41-aot build --list --profile full``), against the 30 MB target;
  a key's share of a library is its stripped object's share of the bytes;
- where a library's bytes go: GPU code objects vs the host runtime each
  exported object carries, and what a solid (LZMA) compression would give;
- time from ``pip install`` of the wheel in a fresh venv to the first
  Launcher, beside the JIT anchor for the same key (FlyDSL import + the
  compile seconds the build recorded).
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from ci.check_wheel import source_tree  # noqa: E402
from dsv41_aot.manifest import read_timings  # noqa: E402

PY = sys.executable
TARGET_MB = 30.0
MB = 1e6


def sh(cmd, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    if r.returncode:
        sys.exit(f"bench/wheel.py: {' '.join(map(str, cmd))} failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return r


def clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSV41_AOT_") and k != "PYTHONPATH"}
    env.update(extra)
    return env


def build_wheel(src: Path, out: Path, arch: str, prebuilt: Path, objects: bool) -> tuple[Path, float]:
    env = clean_env(DSV41_AOT_ARCH=arch, DSV41_AOT_PREBUILT=str(prebuilt))
    if objects:
        env["DSV41_AOT_WHEEL_OBJECTS"] = "1"
    shutil.rmtree(out, ignore_errors=True)
    t = time.perf_counter()
    sh([PY, "-m", "pip", "wheel", "-q", "--no-deps", "-w", out, "."], cwd=src, env=env)
    (w,) = out.glob("*.whl")
    return w, time.perf_counter() - t


def full_counts(arch: str) -> Counter:
    r = sh([PY, "-m", "dsv41_aot.cli", "build", "--list", "--profile", "full", "--arch", arch, "--json"], cwd=ROOT)
    return Counter(k.split("@")[0] for k in json.loads(r.stdout)["entries"])


def shares(prebuilt: Path, arch: str, wheel: Path) -> dict:
    """key -> (compressed bytes in the wheel attributable to it, kind)."""
    man = json.loads((prebuilt / arch / "manifest.json").read_bytes())["entries"]
    libs = json.loads((prebuilt / arch / "lib" / "libs.json").read_bytes())["libraries"]
    out = {}
    with zipfile.ZipFile(wheel) as z:
        infos = {n.rsplit("/", 1)[-1]: z.getinfo(n) for n in z.namelist() if "kernels_prebuilt/" in n}
        fixed = sum(i.compress_size for n, i in infos.items() if not n.endswith((".so", ".o")))
        for lib in libs:
            comp = infos[lib["file"]].compress_size
            total = sum(man[k]["bytes"] for k in lib["entries"])
            for k in lib["entries"]:
                out[k] = comp * man[k]["bytes"] / total + fixed / len(man)
        for k, e in man.items():
            name = e["object"].rsplit("/", 1)[-1]
            if name in infos:
                out[k] += infos[name].compress_size
    return {k: (v, man[k]["kind"]) for k, v in out.items()}


def extrapolate(per_key: dict, counts: Counter) -> float:
    by_kind = defaultdict(list)
    for v, kind in per_key.values():
        by_kind[kind].append(v)
    allv = [v for v, _ in per_key.values()]
    return sum(n * (sum(by_kind[k]) / len(by_kind[k]) if by_kind[k] else sum(allv) / len(allv))
               for k, n in counts.items())


def install_to_launcher(wheel: Path, key: str, tmp: Path) -> dict:
    venv = tmp / f"venv-{key.split('@')[1].split(':')[0]}"
    sh([PY, "-m", "venv", venv])  # not timed: the user's environment exists already
    py = venv / "bin" / "python"
    t0 = time.perf_counter()
    sh([py, "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel], env=clean_env())
    t1 = time.perf_counter()
    r = sh([py, "-c", "import sys, time; t=time.perf_counter(); import dsv41_aot; l = dsv41_aot.load_key(sys.argv[1]);"
                      "print(time.perf_counter() - t, l.kernel_name)", key], cwd=venv, env=clean_env())
    t2 = time.perf_counter()
    return {"pip_install_s": t1 - t0, "first_launcher_process_s": t2 - t1,
            "first_launcher_in_process_s": float(r.stdout.split()[0]), "total_s": t2 - t0}


def jit_import_seconds() -> float:
    """Importing what FlyDSL's JIT path needs before its first compile (flydsl + torch)."""
    r = sh([PY, "-c", "import time; t=time.perf_counter(); import torch, flydsl; print(time.perf_counter()-t)"])
    return float(r.stdout.strip())


def library_breakdown(prebuilt: Path, arch: str) -> dict:
    man = json.loads((prebuilt / arch / "manifest.json").read_bytes())["entries"]
    libs = json.loads((prebuilt / arch / "lib" / "libs.json").read_bytes())["libraries"]
    lib_bytes = sum(lib["bytes"] for lib in libs)
    code = sum(man[k]["code_object_bytes"] for lib in libs for k in lib["entries"])
    data = b"".join((prebuilt / arch / "lib" / lib["file"]).read_bytes() for lib in libs)
    import zlib

    return {"keys": len(man), "lib_bytes": lib_bytes, "code_object_bytes": code,
            "runtime_bytes_per_key": (lib_bytes - code) / len(man),
            "deflate_bytes": len(zlib.compress(data, 9)), "lzma_bytes": len(lzma.compress(data, preset=9))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prebuilt", help="a built and linked prebuilt dir (default: build smoke now)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dsv41-bench-wheel-") as t:
        tmp = Path(t)
        if args.prebuilt:
            prebuilt = Path(args.prebuilt).resolve()
        else:
            prebuilt = tmp / "prebuilt"
            print("building the smoke profile ...", file=sys.stderr)
            sh([PY, "-m", "dsv41_aot.cli", "build", "--profile", "smoke", "--out", prebuilt, "--no-progress"], cwd=ROOT)
            sh([PY, "-m", "dsv41_aot.cli", "link", "--dir", prebuilt], cwd=ROOT)
        src = source_tree(tmp / "src")
        arches = sorted(p.parent.name for p in prebuilt.glob("*/manifest.json"))
        jit_import = jit_import_seconds()
        report = {}
        for arch in arches:
            man = json.loads((prebuilt / arch / "manifest.json").read_bytes())["entries"]
            counts = full_counts(arch)
            wheel, wheel_s = build_wheel(src, tmp / f"dist-{arch}", arch, prebuilt, objects=False)
            wheel_o, _ = build_wheel(src, tmp / f"dist-{arch}-objects", arch, prebuilt, objects=True)
            with zipfile.ZipFile(wheel) as z:
                py_bytes = sum(i.compress_size for i in z.infolist() if "kernels_prebuilt/" not in i.filename)
            naive = {k: (float(e.get("export_bytes", 0)), e["kind"]) for k, e in man.items()}
            first = sorted(man)[0]
            row = {
                "smoke_keys": len(man), "full_keys": sum(counts.values()), "full_by_kind": dict(counts),
                "wheel_bytes": wheel.stat().st_size, "wheel_with_objects_bytes": wheel_o.stat().st_size,
                "python_bytes": py_bytes, "wheel_build_s": wheel_s,
                "full_wheel_mb": (py_bytes + extrapolate(shares(prebuilt, arch, wheel), counts)) / MB,
                "full_wheel_with_objects_mb": (py_bytes + extrapolate(shares(prebuilt, arch, wheel_o), counts)) / MB,
                "full_naive_mb": extrapolate(naive, counts) / MB,
                "naive_bytes": sum(v for v, _ in naive.values()),
                "library": library_breakdown(prebuilt, arch),
                "install": install_to_launcher(wheel, first, tmp),
                "jit_first_launcher_s": jit_import + read_timings(prebuilt / arch).get(first, float("nan")),
                "first_key": first,
            }
            lib = row["library"]
            row["full_wheel_lzma_mb"] = (py_bytes + row["full_keys"] * lib["lzma_bytes"] / lib["keys"]) / MB
            report[arch] = row
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    for arch, r in report.items():
        lib, ins = r["library"], r["install"]
        print(f"\n== {arch}: smoke {r['smoke_keys']} keys -> full {r['full_keys']} keys {r['full_by_kind']}")
        print(f"  {'':34} {'smoke':>10} {'full (extrapolated)':>20}")
        print(f"  {'wheel (manifest + libraries)':34} {r['wheel_bytes'] / MB:9.2f}M {r['full_wheel_mb']:19.1f}M"
              f"   target {TARGET_MB:.0f} MB: {'ok' if r['full_wheel_mb'] <= TARGET_MB else 'MISSED by %.1f MB (x%.2f)' % (r['full_wheel_mb'] - TARGET_MB, r['full_wheel_mb'] / TARGET_MB)}")
        print(f"  {'wheel + stored objects':34} {r['wheel_with_objects_bytes'] / MB:9.2f}M {r['full_wheel_with_objects_mb']:19.1f}M")
        print(f"  {'naive: unstripped export objects':34} "
              f"{r['naive_bytes'] / MB:9.2f}M {r['full_naive_mb']:19.1f}M (uncompressed)")
        print(f"  {'solid LZMA of the libraries':34} {'':>10} {r['full_wheel_lzma_mb']:19.1f}M (not a wheel format; what solid compression would reach)")
        print(f"  python files in the wheel: {r['python_bytes'] / 1e3:.0f} kB; wheel build {r['wheel_build_s']:.1f} s")
        print(f"  libraries: {lib['lib_bytes'] / 1e3:.0f} kB for {lib['keys']} keys, GPU code objects "
              f"{lib['code_object_bytes'] / 1e3:.0f} kB ({100 * lib['code_object_bytes'] / lib['lib_bytes']:.0f}%), "
              f"host runtime + launch code {lib['runtime_bytes_per_key'] / 1e3:.1f} kB a key; "
              f"deflate -9 {lib['deflate_bytes'] / 1e3:.0f} kB, lzma -9 {lib['lzma_bytes'] / 1e3:.0f} kB")
        print(f"  install -> first Launcher ({r['first_key']}): pip install {ins['pip_install_s']:.2f} s + "
              f"fresh process to Launcher {ins['first_launcher_process_s']:.2f} s "
              f"(in-process {ins['first_launcher_in_process_s'] * 1e3:.1f} ms) = {ins['total_s']:.2f} s"
              f"   target 10 s: {'ok' if ins['total_s'] <= 10 else 'MISSED'}")
        print(f"  anchor, FlyDSL JIT to the same first launcher: import torch+flydsl {jit_import:.2f} s + "
              f"compile {r['jit_first_launcher_s'] - jit_import:.2f} s = {r['jit_first_launcher_s']:.2f} s "
              f"(x{r['jit_first_launcher_s'] / ins['first_launcher_process_s']:.0f} the AOT process), on every new machine")
    return 0


if __name__ == "__main__":
    sys.exit(main())
