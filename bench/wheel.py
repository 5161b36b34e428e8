"""Wheel bytes and install-to-first-Launcher: the old per-arch deflate wheels
beside the new one wheel of xz bands, in one run.

    python bench/wheel.py [--prebuilt DIR] [--old-ref REF] [--json]
    (default: build + link the smoke profile in a temp dir)

Prints, side by side:
- smoke, built for real: the old layout's wheels (one per arch, raw .so
  libraries deflated by the zip; rebuilt from git ``--old-ref`` by its own
  setup.py and link on the same stored objects) and the new single wheel;
- one deployment (an arch at one TP) and ``full``, both EXTRAPOLATED from the
  built bands, per kind and per band of the ``full`` key list
  (``dsv41-aot build --list --profile full``):
  new: each band = its shared part + each key's marginal xz bytes. Both are
  measured by linking the arch's smoke objects into one library with and
  without each key (ld.lld, the link flags) and compressing it as a band.
  Real bands hold eight adjacent widths of one TP, which share more than the
  smoke keys do, so this over-estimates;
  old: each key's deflate share of its library in the old wheel, times keys;
  and the measured anchor (a full build on a 32-core machine): 44.3 + 19.7 MB
  old wheels, 3.9 MB of xz for gfx950's libraries;
- pip install into a fresh venv, then a fresh process to the first bound
  Launcher (band or library verified, dlopened, entry resolved), old and new.
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
import zipfile
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench._old import OLD_REF, old_prebuilt, old_tree  # noqa: E402
from ci.check_wheel import source_tree  # noqa: E402

PY = sys.executable
TARGET_MB = 8.0
MB = 1e6
ANCHOR_OLD_MB = {"gfx950": 44.3, "gfx942": 19.7}  # the per-arch wheels of a full build, measured on a 32-core machine


def sh(cmd, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    if r.returncode:
        sys.exit(f"bench/wheel.py: {' '.join(map(str, cmd))} failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return r


def clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSV41_AOT_") and k != "PYTHONPATH"}
    env.setdefault("DSV41_AOT_ALLOW_HIP_VERSION", os.environ.get("DSV41_AOT_ALLOW_HIP_VERSION", "5.2"))
    env.update(extra)
    return env


def pip_wheel(src: Path, out: Path, env: dict) -> Path:
    shutil.rmtree(out, ignore_errors=True)
    sh([PY, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", out, "."], cwd=src,
       env=clean_env(**env))
    (w,) = out.glob("*.whl")
    return w


def full_keys(arch: str) -> list:
    return json.loads(sh([PY, "-m", "dsv41_aot.cli", "build", "--list", "--profile", "full", "--arch", arch, "--json"],
                         cwd=ROOT).stdout)["entries"]


# ------------------------------------------------------------------ new: xz band model


def band_model(prebuilt: Path, arch: str) -> dict:
    """{"shared": bytes, "marginal": {kind: bytes}}: a band's xz bytes as its
    shared part plus each key's marginal bytes, from relinking the arch's
    smoke objects with and without each key."""
    from dsv41_aot.build.link import LINK_FLAGS, compress_band, find_linker
    from dsv41_aot.manifest import Manifest

    man = Manifest.read(prebuilt / arch)
    keys = sorted(man.entries)
    linker = find_linker()

    def xz(subset) -> int:
        with tempfile.TemporaryDirectory() as t:
            out = Path(t) / "band.so"
            objs = sorted({man.entries[k]["object"] for k in subset})
            sh([linker, *LINK_FLAGS, "-soname=band.so", "-o", out, *objs], cwd=prebuilt / arch)
            return len(compress_band(out.read_bytes()))

    every = xz(keys)
    marginal = defaultdict(list)
    for k in keys:
        marginal[k.split("@")[0]].append(every - xz([x for x in keys if x != k]) if len(keys) > 1 else every)
    per_kind = {kind: sum(v) / len(v) for kind, v in marginal.items()}
    shared = max(every - sum(sum(v) for v in marginal.values()), 0)
    return {"shared": shared, "marginal": per_kind, "smoke_band_bytes": every}


def extrapolate_new(model: dict, keys: list) -> float:
    from dsv41_aot.build.link import chunk_name
    from dsv41_aot.keys import BuildKey

    bands = {chunk_name(BuildKey.parse(k)) for k in keys}
    mean = sum(model["marginal"].values()) / len(model["marginal"])
    return len(bands) * model["shared"] + sum(model["marginal"].get(k.split("@")[0], mean) for k in keys)


# ------------------------------------------------------------------ old: deflate share per key


def old_shares(prebuilt: Path, arch: str, wheel: Path) -> dict:
    """kind -> mean deflate bytes a key takes in the old wheel (its stripped
    object's share of its library, plus its share of the manifest)."""
    man = json.loads((prebuilt / arch / "manifest.json").read_bytes())["entries"]
    libs = json.loads((prebuilt / arch / "lib" / "libs.json").read_bytes())["libraries"]
    per_key = {}
    with zipfile.ZipFile(wheel) as z:
        infos = {n.rsplit("/", 1)[-1]: z.getinfo(n) for n in z.namelist() if "kernels_prebuilt/" in n}
        fixed = sum(i.compress_size for n, i in infos.items() if not n.endswith(".so"))
        for lib in libs:
            total = sum(man[k]["bytes"] for k in lib["entries"])
            for k in lib["entries"]:
                per_key[k] = infos[lib["file"]].compress_size * man[k]["bytes"] / total + fixed / len(man)
    by_kind = defaultdict(list)
    for k, v in per_key.items():
        by_kind[k.split("@")[0]].append(v)
    return {kind: sum(v) / len(v) for kind, v in by_kind.items()}


def extrapolate_old(shares: dict, keys: list) -> float:
    mean = sum(shares.values()) / len(shares)
    return sum(shares.get(k.split("@")[0], mean) for k in keys)


# ------------------------------------------------------------------ install to first Launcher


FIRST = ("import sys, time; t = time.perf_counter(); import dsv41_aot; l = dsv41_aot.load_key(sys.argv[1]); "
         "l.bind(); print(time.perf_counter() - t, l.kernel_name)")


def install_to_launcher(wheel: Path, key: str, venv: Path) -> dict:
    sh([PY, "-m", "venv", venv])  # not timed: the user's environment exists already
    py = venv / "bin" / "python"
    t0 = time.perf_counter()
    sh([py, "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel], env=clean_env())
    t1 = time.perf_counter()
    r = sh([py, "-c", FIRST, key], cwd=venv, env=clean_env())
    t2 = time.perf_counter()
    return {"pip_install_s": t1 - t0, "first_launcher_process_s": t2 - t1,
            "first_bound_in_process_s": float(r.stdout.split()[0]), "total_s": t2 - t0}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prebuilt", help="a built and linked prebuilt dir (default: build smoke now)")
    ap.add_argument("--old-ref", default=OLD_REF, help=f"git ref of the old layout (default {OLD_REF})")
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
        arches = sorted(p.parent.name for p in prebuilt.glob("*/manifest.json"))
        src = source_tree(tmp / "src")
        t0 = time.perf_counter()
        new = pip_wheel(src, tmp / "dist-new", {"DSV41_AOT_PREBUILT": str(prebuilt)})
        new_build_s = time.perf_counter() - t0
        with zipfile.ZipFile(new) as z:
            py_bytes = sum(i.compress_size for i in z.infolist() if "kernels_prebuilt/" not in i.filename)
        old_src = old_tree(args.old_ref, tmp / "old-src")
        old_dir = old_prebuilt(old_src, prebuilt, tmp / "old-prebuilt")
        old = {a: pip_wheel(old_src, tmp / f"dist-old-{a}", {"DSV41_AOT_ARCH": a, "DSV41_AOT_PREBUILT": str(old_dir)})
               for a in arches}
        report = {"new_wheel": new.name, "new_bytes": new.stat().st_size, "new_build_s": new_build_s,
                  "python_bytes": py_bytes, "old_wheels": {a: w.name for a, w in old.items()},
                  "old_bytes": {a: w.stat().st_size for a, w in old.items()}, "arches": {}}
        for arch in arches:
            keys = full_keys(arch)
            tp = max(int(k.split("tp=")[1].split(",")[0]) for k in keys)
            deployment = [k for k in keys if f",tp={tp}," in k]
            model = band_model(prebuilt, arch)
            shares = old_shares(old_dir, arch, old[arch])
            first = sorted(json.loads((prebuilt / arch / "manifest.json").read_bytes())["entries"])[0]
            report["arches"][arch] = {
                "full_keys": len(keys), "full_by_kind": dict(Counter(k.split("@")[0] for k in keys)),
                "deployment": f"{arch} tp={tp}", "deployment_keys": len(deployment), "model": model,
                "new_full_bytes": extrapolate_new(model, keys), "new_deployment_bytes": extrapolate_new(model, deployment),
                "old_full_bytes": extrapolate_old(shares, keys), "old_deployment_bytes": extrapolate_old(shares, deployment),
                "install_new": install_to_launcher(new, first, tmp / f"venv-new-{arch}"),
                "install_old": install_to_launcher(old[arch], first, tmp / f"venv-old-{arch}"),
                "first_key": first,
            }
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    r, A = report, report["arches"]
    old_total = sum(r["old_bytes"].values())
    print(f"wheels of {', '.join(A)} (old = git {args.old_ref}: one deflate wheel per arch, raw .so; "
          f"new = one wheel, xz bands)\n")
    print(f"  {'':44} {'old':>24} {'new':>12}")
    smoke_old = " + ".join("%.2f" % (b / MB) for b in r["old_bytes"].values()) + " = %.2f MB" % (old_total / MB)
    print(f"  {'smoke, built':44} {smoke_old:>24} {r['new_bytes'] / MB:9.2f} MB   {r['new_wheel']}")
    for arch, a in A.items():
        what = "one deployment, %s (%d keys), EXTRAPOLATED" % (a["deployment"], a["deployment_keys"])
        print(f"  {what:44} {a['old_deployment_bytes'] / MB:21.1f} MB "
              f"{(a['new_deployment_bytes'] + r['python_bytes']) / MB:9.2f} MB")
    old_full = sum(a["old_full_bytes"] for a in A.values()) + r["python_bytes"] * len(A)
    new_full = sum(a["new_full_bytes"] for a in A.values()) + r["python_bytes"]
    what = "full, %s keys, EXTRAPOLATED" % " + ".join(str(a["full_keys"]) for a in A.values())
    print(f"  {what:44} {old_full / MB:21.1f} MB {new_full / MB:9.2f} MB   target <= {TARGET_MB:.0f} MB: "
          f"{'ok' if new_full / MB <= TARGET_MB else 'MISSED'}")
    anchor = " + ".join(str(ANCHOR_OLD_MB[a]) for a in A if a in ANCHOR_OLD_MB)
    anchor += " = %.1f MB" % sum(ANCHOR_OLD_MB.get(a, 0) for a in A)
    print(f"  {'full, measured (32-core build)':44} {anchor:>24}   (gfx950's libraries, xz -6: 3.9 MB)")
    for arch, a in A.items():
        m = a["model"]
        print(f"\n  {arch} band model: shared {m['shared'] / 1e3:.1f} kB a band, marginal xz per key "
              + ", ".join(f"{k} {v / 1e3:.1f} kB" for k, v in sorted(m["marginal"].items()))
              + f" (smoke objects in one band: {m['smoke_band_bytes'] / 1e3:.1f} kB); full: {a['full_by_kind']}")
        for side in ("old", "new"):
            i = a[f"install_{side}"]
            print(f"  {side}: pip install {i['pip_install_s']:.2f} s + fresh process to the first bound Launcher "
                  f"{i['first_launcher_process_s']:.2f} s (in-process {i['first_bound_in_process_s'] * 1e3:.1f} ms)"
                  f" = {i['total_s']:.2f} s   ({a['first_key']})")
    print(f"\n  new wheel build (pip wheel, no isolation): {r['new_build_s']:.1f} s; python files {r['python_bytes'] / 1e3:.0f} kB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
