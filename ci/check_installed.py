"""Run inside an environment where a kernels wheel is installed (a fresh venv,
cibuildwheel's test step): the runtime imports with no FlyDSL, torch or vLLM,
and every packaged key resolves through the loader to a Launcher.

    python ci/check_installed.py [--arch A] [--json]

Loading a key opens the host's libamdhip64 and dlopens the key's library, so
that part needs one (ROCm, or Debian's libamdhip64-dev on a CPU machine);
without it (a manylinux build container) the check stops at the manifest and
link record and says so. Nothing is launched: there may be no GPU.
Exit 0 ok, 1 a check failed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

HEAVY = ("flydsl", "torch", "vllm")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", help="only this packaged arch (default: every one)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    import dsv41_aot
    from dsv41_aot.runtime import hip, loader
    from dsv41_aot.errors import AotError, HipUnavailableError

    import_ms = (time.perf_counter() - t0) * 1e3
    out = {"package": str(Path(dsv41_aot.__file__).parent), "import_ms": round(import_ms, 2), "arches": {},
           "problems": []}
    heavy = [m for m in HEAVY if m in sys.modules]
    if heavy:
        out["problems"].append(f"importing dsv41_aot imported {', '.join(heavy)}")
    out["installed_heavy"] = [m for m in HEAVY if importlib.util.find_spec(m) is not None]
    packaged = Path(dsv41_aot.__file__).parent / "kernels_prebuilt"
    if "site-packages" not in str(packaged) and "dist-packages" not in str(packaged):
        out["problems"].append(f"dsv41_aot imported from {packaged.parent}, not an installed wheel")
    arches = sorted(p.parent.name for p in packaged.glob("*/manifest.json"))
    if args.arch:
        arches = [a for a in arches if a == args.arch]
    if not arches:
        out["problems"].append(f"no packaged arch in {packaged}")
    try:
        hip.load()
        have_hip = True
    except HipUnavailableError:
        have_hip = False
    out["libamdhip64"] = hip._hip.path if have_hip else None
    for arch in arches:
        keys = loader.keys(arch, prebuilt=packaged)
        launchers = {}
        for key in keys:
            try:
                if have_hip:
                    t = time.perf_counter()
                    launcher = loader.load_key(key)
                    launchers[key] = {"kernel": launcher.kernel_name, "library": Path(launcher.library).name,
                                      "slots": len(launcher.abi), "ms": round((time.perf_counter() - t) * 1e3, 3)}
                else:
                    idx = loader._index(packaged, arch)
                    lib, obj_sha = idx.lib_of[key]
                    if obj_sha != idx.entries[key]["sha256"]:
                        raise AotError(f"{key}: link record names another object")
                    launchers[key] = {"kernel": idx.entries[key]["symbol"], "library": lib["file"]}
            except AotError as e:
                out["problems"].append(f"{key}: {e}")
        out["arches"][arch] = {"keys": len(keys), "resolved": launchers}
    out["seconds"] = round(time.perf_counter() - t0, 3)
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        for arch, a in out["arches"].items():
            how = "Launchers" if have_hip else "manifest + link record (no libamdhip64 here: not dlopened)"
            print(f"{arch}: {len(a['resolved'])}/{a['keys']} keys -> {how}")
        for p in out["problems"]:
            print(f"PROBLEM: {p}", file=sys.stderr)
    return 1 if out["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
