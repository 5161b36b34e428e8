"""Wheel bytes and install-to-first-Launcher of the one wheel of two vLLM
releases and two arches, against the target (<= 12 MB), beside the anchor.

    python bench/wheel.py [--prebuilt DIR] [--json]
    (default: build + link the smoke profile, both releases, in a temp dir)

Prints, side by side:
- smoke, built for real: the one wheel of every room (<arch>/vllm-<release>/);
- per room (arch, release), one deployment (the arch at its largest TP) and
  the room's ``full`` keys (``dsv41-aot build --list --profile full``),
  EXTRAPOLATED from that room's built bands: each band = its shared part +
  each key's marginal xz bytes, both measured by linking the room's smoke
  objects into one library with and without each key (ld.lld, the link
  flags) and compressing it as a band. Real bands hold eight adjacent widths
  of one TP, which share more than the smoke keys do, so this over-estimates;
  the releases' kernels differ, so each release's bands count in full;
- the anchor, measured on a 32-core ``full`` build of vLLM 0.33.0 alone: the
  old per-arch deflate wheels (44.3 + 19.7 MB) and gfx950's libraries as xz
  (3.9 MB for 1,611 keys);
- with ``--full-band DIR`` (a prebuilt dir holding every ``full`` key of at
  least one chunk of a room, e.g. ``dsv41-aot build --release 0.32.0 --key
  <the 40 gfx950 tp=4 s=1..8 keys>``): that real band's xz bytes per key, and
  the best estimate of the whole wheel: each room's full keys at its own real
  band's rate, else at the anchor's rate;
- pip install into a fresh venv, then a fresh process to the first bound
  Launcher of each room (band verified, dlopened, entry resolved).
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
from ci.check_wheel import source_tree  # noqa: E402

PY = sys.executable
TARGET_MB = 12.0  # two releases, two arches (issue 14)
MB = 1e6
# measured on a 32-core full build of vLLM 0.33.0: the old per-arch deflate wheels,
# and gfx950's libraries as xz -6 (keys)
ANCHOR_OLD_MB = {"gfx950": 44.3, "gfx942": 19.7}
ANCHOR_XZ_GFX950 = (3.9, 1611)


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


def full_keys(arch: str, release: str) -> list:
    entries = json.loads(sh([PY, "-m", "dsv41_aot.cli", "build", "--list", "--profile", "full", "--arch", arch,
                             "--json"], cwd=ROOT).stdout)["entries"]
    return [row["key"] for row in entries if row["release"] == release]


# ------------------------------------------------------------------ xz band model, per room


def band_model(prebuilt: Path, arch: str, release: str) -> dict:
    """{"shared": bytes, "marginal": {kind: bytes}}: a band's xz bytes as its
    shared part plus each key's marginal bytes, from relinking the room's
    smoke objects with and without each key."""
    from dsv41_aot.aot.link import LINK_FLAGS, compress_band, find_linker
    from dsv41_aot.room import Room

    man = Room(prebuilt, arch, release).manifest()
    keys = sorted(man.entries)
    linker = find_linker()

    def xz(subset) -> int:
        with tempfile.TemporaryDirectory() as t:
            out = Path(t) / "band.so"
            objs = sorted({man.entries[k].object for k in subset})
            sh([linker, *LINK_FLAGS, "-soname=band.so", "-o", out, *objs], cwd=prebuilt / arch)
            return len(compress_band(out.read_bytes()))

    every = xz(keys)
    marginal = defaultdict(list)
    for k in keys:
        marginal[k.split("@")[0]].append(every - xz([x for x in keys if x != k]) if len(keys) > 1 else every)
    per_kind = {kind: sum(v) / len(v) for kind, v in marginal.items()}
    shared = max(every - sum(sum(v) for v in marginal.values()), 0)
    return {"shared": shared, "marginal": per_kind, "smoke_band_bytes": every, "smoke_keys": len(keys)}


def extrapolate(model: dict, keys: list, release: str) -> float:
    from dsv41_aot.aot.link import chunk_name
    from dsv41_aot.keys import BuildKey

    bands = {chunk_name(BuildKey.parse(k, release)) for k in keys}
    mean = sum(model["marginal"].values()) / len(model["marginal"])
    return len(bands) * model["shared"] + sum(model["marginal"].get(k.split("@")[0], mean) for k in keys)


# ------------------------------------------------------------------ install to first Launcher


FIRST = ("import sys, time; t = time.perf_counter(); import dsv41_aot; "
         "l = dsv41_aot.load_key(sys.argv[1], release=sys.argv[2]); "
         "l.bind(); print(time.perf_counter() - t, l.kernel_name)")


def full_band_rates(prebuilt: Path) -> dict:
    """room -> the largest chunk of ``prebuilt`` that holds every ``full``
    key of that chunk: {"chunk", "keys", "bytes"} (its xz band, measured)."""
    from dsv41_aot.aot.link import chunk_name
    from dsv41_aot.keys import BuildKey
    from dsv41_aot.listing import built_rooms

    out = {}
    for room in built_rooms(prebuilt):
        want: dict = {}
        for k in full_keys(room.arch, room.release):
            want.setdefault(chunk_name(BuildKey.parse(k, room.release)), set()).add(k)
        for band in room.links().bands:
            if set(band.entries) == want.get(band.chunk) and len(band.entries) > out.get(room.name, {}).get("keys", 0):
                out[room.name] = {"chunk": band.chunk, "keys": len(band.entries), "bytes": band.bytes}
    return out


def install(wheel: Path, venv: Path) -> dict:
    sh([PY, "-m", "venv", venv])  # not timed: the user's environment exists already
    t0 = time.perf_counter()
    sh([venv / "bin" / "python", "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel], env=clean_env())
    return {"pip_install_s": time.perf_counter() - t0}


def first_launcher(venv: Path, key: str, release: str) -> dict:
    t0 = time.perf_counter()
    r = sh([venv / "bin" / "python", "-c", FIRST, key, release], cwd=venv, env=clean_env())
    return {"process_s": time.perf_counter() - t0, "in_process_s": float(r.stdout.split()[0])}


def main(argv=None) -> int:
    from dsv41_aot.manifest import folder_name
    from dsv41_aot.room import Room
    from dsv41_aot.listing import built_rooms

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prebuilt", help="a built and linked prebuilt dir (default: build smoke now)")
    ap.add_argument("--full-band", help="a prebuilt dir holding some room's complete full-profile chunk(s)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dsv41-bench-wheel-") as t:
        tmp = Path(t)
        if args.prebuilt:
            prebuilt = Path(args.prebuilt).resolve()
        else:
            prebuilt = tmp / "prebuilt"
            print("building the smoke profile (both releases) ...", file=sys.stderr)
            sh([PY, "-m", "dsv41_aot.cli", "build", "--profile", "smoke", "--out", prebuilt, "--no-progress"], cwd=ROOT)
            sh([PY, "-m", "dsv41_aot.cli", "link", "--dir", prebuilt], cwd=ROOT)
        rooms = built_rooms(prebuilt)
        found = [(r.arch, r.release) for r in rooms]
        bare = sorted({r.arch for r in rooms if not r.built_here})
        if bare:  # a shipped deployment holds bands only: nothing to relink into a band model
            print(f"bench/wheel.py: error: {prebuilt} holds no stored objects for {', '.join(bare)} "
                  f"(the band model relinks them)\n  fix: pass a build folder: dsv41-aot build --out DIR, "
                  f"then bench/wheel.py --prebuilt DIR", file=sys.stderr)
            return 2
        src = source_tree(tmp / "src")
        t0 = time.perf_counter()
        wheel = pip_wheel(src, tmp / "dist", {"DSV41_AOT_PREBUILT": str(prebuilt)})
        build_s = time.perf_counter() - t0
        with zipfile.ZipFile(wheel) as z:
            py_bytes = sum(i.compress_size for i in z.infolist() if "kernels_prebuilt/" not in i.filename)
        venv = tmp / "venv"
        report = {"wheel": wheel.name, "bytes": wheel.stat().st_size, "build_s": build_s, "python_bytes": py_bytes,
                  "install": install(wheel, venv), "rooms": {}}
        for arch, release in found:
            keys = full_keys(arch, release)
            tp = max(int(k.split("tp=")[1].split(",")[0]) for k in keys)
            deployment = [k for k in keys if f",tp={tp}," in k]
            model = band_model(prebuilt, arch, release)
            first = sorted(Room(prebuilt, arch, release).manifest().entries)[0]
            report["rooms"][f"{arch}/{folder_name(release)}"] = {
                "arch": arch, "release": release, "full_keys": len(keys),
                "full_by_kind": dict(Counter(k.split("@")[0] for k in keys)),
                "deployment": f"{arch} tp={tp}", "deployment_keys": len(deployment), "model": model,
                "full_bytes": extrapolate(model, keys, release),
                "deployment_bytes": extrapolate(model, deployment, release),
                "first_key": first, "first_launcher": first_launcher(venv, first, release),
            }
        report["full_bands"] = full_band_rates(Path(args.full_band)) if args.full_band else {}
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    r, R = report, report["rooms"]
    print(f"the one wheel of {len(R)} rooms ({', '.join(R)}): xz bands, shared per arch by its releases\n")
    print(f"  {'':52} {'anchor (measured)':>26} {'project':>12}")
    print(f"  {'smoke, built':52} {'':>26} {r['bytes'] / MB:9.2f} MB   {r['wheel']}")
    for room, a in R.items():
        what = "%s, one deployment %s (%d keys), EXTRAPOLATED" % (room, a["deployment"], a["deployment_keys"])
        print(f"  {what:52} {'':>26} {(a['deployment_bytes'] + r['python_bytes']) / MB:9.2f} MB")
    for room, a in R.items():
        what = "%s, full (%d keys), EXTRAPOLATED" % (room, a["full_keys"])
        print(f"  {what:52} {'':>26} {a['full_bytes'] / MB:9.2f} MB")
    total = sum(a["full_bytes"] for a in R.values()) + r["python_bytes"]
    releases = sorted({a["release"] for a in R.values()})
    arches = sorted({a["arch"] for a in R.values()})
    anchor = "%.1f MB old wheels" % sum(ANCHOR_OLD_MB.values())
    what = "full, %d keys, %d releases x %d arches" % (sum(a["full_keys"] for a in R.values()), len(releases),
                                                       len(arches))
    print(f"  {what:52} {anchor:>26} {total / MB:9.2f} MB   target <= {TARGET_MB:.0f} MB: "
          f"{'ok' if total / MB <= TARGET_MB else 'MISSED'}")
    xz_mb, xz_keys = ANCHOR_XZ_GFX950
    scaled = xz_mb / xz_keys * sum(a["full_keys"] for a in R.values())
    print(f"  {'  (anchor: vLLM 0.33.0 full only, 32-core build)':52} "
          f"{'gfx950 xz %.1f MB/%d keys' % (xz_mb, xz_keys):>26}   "
          f"-> at that rate, every room's full keys: {scaled:.1f} MB")
    xz_rate = xz_mb * MB / xz_keys
    if r["full_bands"]:
        best = r["python_bytes"]
        for room, a in R.items():
            band = r["full_bands"].get(room)
            rate = band["bytes"] / band["keys"] if band else xz_rate
            best += rate * a["full_keys"]
            src = ("its real full band %s: %d keys, %.1f kB" % (band["chunk"], band["keys"], band["bytes"] / 1e3)
                   if band else "the anchor's xz rate")
            what = "%s, full (%d keys) at %.2f kB a key" % (room, a["full_keys"], rate / 1e3)
            print(f"  {what:52} {'':>26} {rate * a['full_keys'] / MB:9.2f} MB   ({src})")
        what = "full, best estimate (real band rates, else anchor's)"
        print(f"  {what:52} {'':>26} {best / MB:9.2f} MB   target <= {TARGET_MB:.0f} MB: "
              f"{'ok' if best / MB <= TARGET_MB else 'MISSED'}")
    for room, a in R.items():
        m = a["model"]
        print(f"\n  {room} band model: shared {m['shared'] / 1e3:.1f} kB per band, marginal xz per key "
              + ", ".join(f"{k} {v / 1e3:.1f} kB" for k, v in sorted(m["marginal"].items()))
              + f" ({m['smoke_keys']} smoke objects in one band: {m['smoke_band_bytes'] / 1e3:.1f} kB); "
                f"full: {a['full_by_kind']}")
        f = a["first_launcher"]
        print(f"  fresh process to its first bound Launcher {f['process_s']:.2f} s "
              f"(in-process {f['in_process_s'] * 1e3:.1f} ms)   ({a['first_key']}, vLLM {a['release']})")
    print(f"\n  pip install {r['install']['pip_install_s']:.2f} s; wheel build (pip wheel, no isolation) "
          f"{r['build_s']:.1f} s; python files {r['python_bytes'] / 1e3:.0f} kB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
