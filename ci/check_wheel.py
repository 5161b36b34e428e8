"""Check a built dsv41-aot wheel before it is uploaded.

    python ci/check_wheel.py WHEEL [--prebuilt DIR] [--require-proofs] [--no-auditwheel] [--json]
    python ci/check_wheel.py --audit-only WHEEL      (cibuildwheel's repair step)
    python ci/check_wheel.py --audit-prebuilt DIR    (before packing: the raw libraries of DIR's bands)

The verdict is ``dsv41_aot.aot.wheel.judge``'s, the one ``dsv41-aot verify
--wheel`` gives (see its docstring for every check); this script adds
``auditwheel show`` on the raw libraries (unpacked from xz into a scratch
wheel): no external library but the host's libamdhip64.

Exit 0 ok, 1 a check failed, 2 bad input.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from dsv41_aot.errors import AotError  # noqa: E402
from dsv41_aot.listing import built_rooms  # noqa: E402
from dsv41_aot.aot.wheel import judge, open_wheel, raw_libraries, wheel_rooms  # noqa: E402

ALLOWED_EXTERNAL = ("libamdhip64.so",)  # prefix: any SONAME version of the host's HIP runtime


def audit_raw(libraries: dict) -> list:
    """The external libraries auditwheel finds in raw libraries ``{name: bytes}``.

    The libraries are packed as .so files into a scratch platform wheel,
    which ``auditwheel show`` reads; RuntimeError when it fails.
    """
    with tempfile.TemporaryDirectory(prefix="dsv41-audit-") as tmp:
        wheel = Path(tmp) / "dsv41_aot_raw-0-py3-none-linux_x86_64.whl"
        info = "dsv41_aot_raw-0.dist-info"
        with zipfile.ZipFile(wheel, "w") as z:  # stored, zipfile's default
            z.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: dsv41-aot-raw\nVersion: 0\n")
            z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: dsv41-aot\nRoot-Is-Purelib: false\n"
                                        "Tag: py3-none-linux_x86_64\n")
            record = []
            for name, data in sorted(libraries.items()):
                member = zipfile.ZipInfo(f"dsv41_aot_raw/{name}")
                member.external_attr = 0o100755 << 16  # a regular file, as an unpacked library would be
                z.writestr(member, data)
                record.append(f"{member.filename},,")  # auditwheel walks the files RECORD lists
            z.writestr(f"{info}/RECORD", "\n".join(record + [f"{info}/RECORD,,"]) + "\n")
        exe = shutil.which("auditwheel") or str(Path(sys.executable).with_name("auditwheel"))
        r = subprocess.run([exe, "show", str(wheel)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode:
        raise RuntimeError(f"auditwheel show failed: {r.stdout.strip()[-800:]}")
    if "requires no external shared libraries" in r.stdout:
        return []
    # "The following external shared libraries are required by the wheel: {json}"
    m = re.search(r"required by the wheel:\s*(\{.*?\})\s*(?:\n\n|$)", r.stdout, re.S)
    return sorted(json.loads(m.group(1))) if m else ["<unparsed auditwheel output>"]


def audit_problems(libraries: dict) -> tuple[list, list]:
    """auditwheel on raw libraries ``{name: bytes}``: (external libraries, problems), the judge's ``audit`` step."""
    try:
        ext = audit_raw(libraries)
    except RuntimeError as e:
        return [], [str(e)]
    bad = [x for x in ext if not x.startswith(ALLOWED_EXTERNAL)]  # besides the host's HIP runtime
    return ext, [f"auditwheel: external libraries besides libamdhip64: {', '.join(bad)}"] if bad else []


def check(wheel: Path, prebuilt: Path | None = None, auditwheel: bool = True, require_proofs: bool = False) -> dict:
    """The wheel's verdict (``aot.wheel.judge``), with auditwheel unless told not to."""
    return judge(wheel, prebuilt=prebuilt, audit=audit_problems if auditwheel else None,
                 require_proofs=require_proofs)


def print_audit(what: str, libraries: dict) -> int:
    """Run auditwheel on ``libraries``, print one line, and return the exit code."""
    _, problems = audit_problems(libraries)  # one at most: what auditwheel failed on, or what it found
    print(f"{what}: auditwheel on {len(libraries)} raw libraries: "
          f"{problems[0] if problems else 'no external library but the host HIP'}")
    return 1 if problems else 0


def audit_prebuilt(root: Path) -> int:
    """Run auditwheel on the raw libraries of a prebuilt dir's bands."""
    libraries = raw_libraries(built_rooms(Path(root)))
    if not libraries:
        print(f"ci/check_wheel.py: error: no linked bands under {root}", file=sys.stderr)
        return 2
    return print_audit(str(root), libraries)


def audit_only(wheel: Path) -> int:
    """Run auditwheel on a wheel's raw libraries: cibuildwheel's repair step."""
    with open_wheel(wheel) as z:
        libraries = raw_libraries(wheel_rooms(z))
    return print_audit(wheel.name, libraries)


# the files a wheel build reads: setup.py, pyproject.toml, the build matrix
# (ci/prebuilt.py checks each room's digest against it) and what they pack
SOURCE_FILES = ("pyproject.toml", "setup.py", "LICENSE", "NOTICE", "README.md", "build_matrix.yaml", "dsv41_aot", "ci")


def source_tree(dest: Path) -> Path:
    """Copy the files a wheel build reads into ``dest``.

    Each build gets its own copy, so concurrent builds never share
    setuptools' build/ folder.
    """
    dest.mkdir()
    for name in SOURCE_FILES:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copyfile(src, dest / name)
    return dest


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("wheels", nargs="*")
    ap.add_argument("--prebuilt", help="the prebuilt dir the wheel was built from")
    ap.add_argument("--no-auditwheel", action="store_true")
    ap.add_argument("--require-proofs", action="store_true", help="fail unless every key is proven against vLLM's JIT")
    ap.add_argument("--audit-only", action="store_true", help="only auditwheel on the raw libraries")
    ap.add_argument("--audit-prebuilt", metavar="DIR", help="auditwheel on the raw libraries of DIR's bands")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    try:
        if args.audit_prebuilt:
            return audit_prebuilt(Path(args.audit_prebuilt))
        if not args.wheels:
            ap.error("name a wheel (or --audit-prebuilt DIR)")
        if args.audit_only:
            return max(audit_only(Path(w)) for w in args.wheels)
        results = []
        for w in args.wheels:
            path = Path(w)
            if not path.is_file():
                print(f"ci/check_wheel.py: error: no wheel at {path}", file=sys.stderr)
                return 2
            r = check(path, Path(args.prebuilt) if args.prebuilt else None, not args.no_auditwheel,
                      args.require_proofs)
            results.append(r)
            if not args.json:
                what = (", ".join(f"{n} keys of {room}" for room, n in r.get("keys_by_room", {}).items())
                        or ("no kernels" if not r["arches"] else "no readable room"))
                print(f"{r['wheel']}: {r['bytes']} bytes, {what}: {'FAILED' if r['failed'] else 'ok'}")
                for p in r["problems"]:
                    print(f"  {p}", file=sys.stderr)
                if args.require_proofs and r["unproven"]:
                    print(f"  unproven: {len(r['unproven'])} key(s), e.g. {r['unproven'][0]}", file=sys.stderr)
                if r["fix"]:
                    print(f"  fix: {r['fix']}", file=sys.stderr)
    except AotError as e:  # bad input, such as a file that is not a sound zip
        print(f"ci/check_wheel.py: error: {e}", file=sys.stderr)
        return e.exit_code
    if args.json:
        print(json.dumps(results, indent=1))
    return 1 if any(r["failed"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
