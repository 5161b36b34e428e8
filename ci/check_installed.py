"""Check an installed kernels wheel, run in the environment it is installed in.

    python ci/check_installed.py [--arch A] [--release R] [--json]

The runtime must import without FlyDSL, torch or vLLM, and every key of
every packaged room must bind through the loader. It checks the installed
``kernels_prebuilt/``, never what DSV41_AOT_PREBUILT names (dropped, and
reported). Binding needs the host's libamdhip64 (ROCm, or Debian's
libamdhip64-dev); without it (a manylinux container) the room's verdict
still reads and checks each band, and the output says so. Nothing is
launched: there may be no GPU. Exit 0 ok, 1 a check failed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", help="only this packaged arch (default: every one)")
    ap.add_argument("--release", help="only this vLLM release's room (default: every one)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    ignored = os.environ.pop("DSV41_AOT_PREBUILT", None)

    t0 = time.perf_counter()
    import dsv41_aot
    from dsv41_aot import verdict
    from dsv41_aot.runtime import hip, loader
    from dsv41_aot.errors import AotError, HipUnavailableError
    from dsv41_aot.listing import built_rooms

    import_ms = (time.perf_counter() - t0) * 1e3
    from dsv41_aot.aot.wheel import HEAVY  # after the timed import: what it must not have imported
    out = {"package": str(Path(dsv41_aot.__file__).parent), "import_ms": round(import_ms, 2), "arches": {},
           "ignored_DSV41_AOT_PREBUILT": ignored, "problems": []}
    heavy = [m for m in HEAVY if m in sys.modules]
    if heavy:
        out["problems"].append(f"importing dsv41_aot imported {', '.join(heavy)}")
    out["installed_heavy"] = [m for m in HEAVY if importlib.util.find_spec(m) is not None]
    packaged = Path(dsv41_aot.__file__).resolve().parent / "kernels_prebuilt"
    if "site-packages" not in str(packaged) and "dist-packages" not in str(packaged):
        out["problems"].append(f"dsv41_aot imported from {packaged.parent}, not an installed wheel")
    rooms = [r for r in built_rooms(packaged) if args.arch in (None, r.arch) and args.release in (None, r.release)]
    if not rooms:
        out["problems"].append(f"no packaged room (<arch>/vllm-<release>/manifest.json) in {packaged}")
    try:
        out["libamdhip64"] = hip.load().path
    except HipUnavailableError:
        out["libamdhip64"] = None
    have_hip = out["libamdhip64"] is not None
    for room in rooms:
        arch, release = room.arch, room.release
        keys = loader.keys(arch, release=release, prebuilt=packaged)
        bound, bands = {}, set()
        for key in keys:
            try:
                t = time.perf_counter()
                launcher = loader.load_key(key, release=release, prebuilt=packaged)
                if have_hip:
                    launcher.bind()  # both sha256, memfd, dlopen, entry, ABI against the export metadata
                bands.add(launcher.library)
                bound[key] = {"kernel": launcher.kernel_name, "band": Path(launcher.library).name,
                              "slots": len(launcher.abi), "ms": round((time.perf_counter() - t) * 1e3, 3)}
            except AotError as e:
                out["problems"].append(f"{key} (vLLM {release}): {e}")
        if not have_hip:  # nothing to dlopen against: the room's verdict reads and checks each band
            out["problems"] += [f"{room.name}: {p.message}" for p in verdict.problems(room, objects=False, proof=False)]
        out["arches"].setdefault(arch, {})[release] = {"keys": len(keys), "bands": len(bands), "bound": bound}
    out["mapped_from_memory"] = have_hip and not any(
        str(packaged) in line for line in Path("/proc/self/maps").read_text().splitlines())
    if have_hip and not out["mapped_from_memory"]:
        out["problems"].append(f"a library was mapped from {packaged}: bands must be dlopened from memory")
    out["seconds"] = round(time.perf_counter() - t0, 3)
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        if ignored:
            print(f"(DSV41_AOT_PREBUILT={ignored} ignored: checking the installed wheel)")
        how = "bound (memfd dlopen, entry, ABI)" if have_hip else "bands verified (no libamdhip64 here: not dlopened)"
        for arch, by_release in out["arches"].items():
            for release, a in by_release.items():
                print(f"{arch} vLLM {release}: {len(a['bound'])}/{a['keys']} keys, {a['bands']} bands -> {how}")
        for p in out["problems"]:
            print(f"PROBLEM: {p}", file=sys.stderr)
    return 1 if out["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
