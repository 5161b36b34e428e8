"""Check a built dsv41-aot wheel before it is uploaded.

    python ci/check_wheel.py WHEEL [--prebuilt DIR] [--no-auditwheel] [--json]
    python ci/check_wheel.py --audit-only WHEEL      (cibuildwheel's repair step)
    python ci/check_wheel.py --audit-prebuilt DIR    (before packing: the raw libraries of DIR's bands)

What a downloaded wheel holds, and its proofs, is ``dsv41-aot verify --wheel``.

A wheel must:

- be a sound zip that pip would install (``aot.wheel.open_wheel``);
- be tagged ``py3-none-manylinux_2_28_x86_64`` when it holds kernels (host
  shared libraries, no Python extension), else ``py3-none-any``, and carry
  no local version label;
- need nothing at run time: FlyDSL and torch only in the ``build`` extra,
  vLLM in ``build`` or ``vllm``; the ``vllm`` extra admits every release
  the wheel holds a room of and the README names each; LICENSE and NOTICE;
- hold only sound rooms (``Room.problems``), no band that no room names, no
  timings.json and no raw ``.so``; with ``--prebuilt``, exactly the
  prebuilt dir's rooms, byte for byte;
- pass ``auditwheel show`` on its raw libraries (unpacked from xz into a
  scratch wheel): no external library but the host's libamdhip64.

Exit 0 ok, 1 a check failed, 2 bad input.
"""

from __future__ import annotations

import argparse
import email.parser
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

from ci.check_installed import HEAVY  # noqa: E402
from ci.prebuilt import admits  # noqa: E402
from dsv41_aot.facts.releases import version_order  # noqa: E402
from dsv41_aot.manifest import TIMINGS  # noqa: E402
from dsv41_aot.listing import built_arches, built_releases, built_rooms  # noqa: E402
from dsv41_aot.aot.wheel import PKG, dist_info, open_wheel, rooms_in_wheel as _rooms, wheel_bands, wheel_problems  # noqa: E402

PLAT = "manylinux_2_28_x86_64"
ALLOWED_EXTERNAL = ("libamdhip64.so",)  # prefix: any SONAME version of the host's HIP runtime


def auditwheel_externals(wheel: Path) -> tuple[list, str]:
    """Run ``auditwheel show`` on a wheel: (the external libraries it names, its output)."""
    exe = shutil.which("auditwheel") or str(Path(sys.executable).with_name("auditwheel"))
    r = subprocess.run([exe, "show", str(wheel)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    text = r.stdout
    if r.returncode:
        raise RuntimeError(f"auditwheel show failed: {text.strip()[-800:]}")
    libs = []
    if "requires no external shared libraries" not in text:
        # "The following external shared libraries are required by the wheel: {json}"
        m = re.search(r"required by the wheel:\s*(\{.*?\})\s*(?:\n\n|$)", text, re.S)
        if m:
            libs = sorted(json.loads(m.group(1)))
        else:
            libs = ["<unparsed auditwheel output>"]
    return libs, text


def audit_raw(libraries: dict) -> list:
    """The external libraries auditwheel finds in raw libraries ``{name: bytes}``.

    The libraries are packed as .so files into a scratch platform wheel.
    """
    with tempfile.TemporaryDirectory(prefix="dsv41-audit-") as tmp:
        wheel = Path(tmp) / "dsv41_aot_raw-0-py3-none-linux_x86_64.whl"
        info = "dsv41_aot_raw-0.dist-info"
        with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as z:
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
        return auditwheel_externals(wheel)[0]


def not_allowed(externals: list) -> list:
    """The external libraries besides the host's HIP runtime."""
    return [x for x in externals if not x.startswith(ALLOWED_EXTERNAL)]


def raw_libraries(contents: dict) -> dict:
    """Name the raw libraries of ``wheel_bands``' result as ``<arch>/<band without .xz>``."""
    return {f"{arch}/{f[:-3]}": b for arch, (_, raw) in contents.items() for f, b in raw.items()}


def requirement_problems(requires: list, provided: list) -> tuple[list, str | None]:
    """Judge a wheel's ``Requires-Dist`` lines: (problems, the vllm extra's range or None).

    ``provided`` is the wheel's ``Provides-Extra`` names. Every requirement
    must sit in an extra, FlyDSL and torch only in ``build``, vLLM in
    ``build`` or ``vllm``."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    problems, spec = [], None
    extras = sorted(set(provided) | {"build", "vllm"})
    for line in requires:
        try:
            req = Requirement(line)
        except InvalidRequirement as e:
            problems.append(f"Requires-Dist {line!r} is not a PEP 508 requirement ({e})")
            continue
        name = canonicalize_name(req.name)
        marker = req.marker
        inside = [x for x in extras if marker is not None and marker.evaluate({"extra": x})]
        if marker is None or marker.evaluate({"extra": ""}) or not inside:
            problems.append(f"runtime requirement {line!r}: the runtime needs only the standard library")
        elif name in HEAVY and set(inside) - ({"build", "vllm"} if name == "vllm" else {"build"}):
            problems.append(f"{line!r} outside the build extra")
        elif name == "vllm" and "vllm" in inside:
            spec = str(req.specifier)
    return problems, spec


def check(wheel: Path, prebuilt: Path | None = None, auditwheel: bool = True) -> dict:
    """Run the checks above on one wheel file and return its summary.

    A file that is not a sound zip raises AotError (exit 2).
    """
    from dsv41_aot.errors import AotError, IntegrityError

    problems: list = []
    out = {"wheel": wheel.name, "bytes": wheel.stat().st_size, "problems": problems, "arches": []}
    try:
        z = open_wheel(wheel)  # a sound zip whose members all install inside the target folder
    except IntegrityError as e:
        problems.append(e.message)
        return out
    with z:
        names = z.namelist()
        info = dist_info(names)  # open_wheel: one, holding METADATA and WHEEL
        meta = email.parser.Parser().parsestr(z.read(f"{info}/METADATA").decode(errors="replace"))
        tags = [v for k, v in email.parser.Parser().parsestr(z.read(f"{info}/WHEEL").decode(errors="replace")).items()
                if k == "Tag"]
        out.update(name=meta["Name"], version=meta["Version"], tags=tags)
        arches = sorted({n[len(PKG):].split("/")[0] for n in names if n.startswith(PKG) and n.count("/") > 2})
        out["arches"] = arches
        found, spec = requirement_problems(meta.get_all("Requires-Dist") or [], meta.get_all("Provides-Extra") or [])
        problems += found
        for lic in ("LICENSE", "NOTICE"):
            if not any(n.startswith(info) and n.rsplit("/", 1)[-1] == lic for n in names):
                problems.append(f"{lic} missing from {info}")
        if "+" in meta["Version"]:
            problems.append(f"local version label in {meta['Version']}: an index refuses it")
        raw_so = [n for n in names if n.endswith(".so") or ".so." in n.rsplit("/", 1)[-1] and not n.endswith(".xz")]
        if raw_so:
            problems.append(f"raw shared libraries in the wheel: {', '.join(raw_so[:5])}")
        measured = [n for n in names if n.startswith(PKG) and n.rsplit("/", 1)[-1] == TIMINGS]
        if measured:
            problems.append(f"timings in the wheel (measured, never shipped): {', '.join(measured[:3])}")

        if not arches:
            if tags != ["py3-none-any"]:
                problems.append(f"a wheel without kernels tagged {tags}, expected py3-none-any")
            return out
        if tags != [f"py3-none-{PLAT}"]:
            problems.append(f"kernels wheel tagged {tags}, expected py3-none-{PLAT}")
        if wheel.name != f"dsv41_aot-{meta['Version']}-py3-none-{PLAT}.whl":
            problems.append(f"file name {wheel.name} is not dsv41_aot-{meta['Version']}-py3-none-{PLAT}.whl")
        problems += wheel_problems(z)  # each room's own verdict (Room.problems): records, links, bands
        try:
            contents = wheel_bands(z)
        except AotError:
            return out  # a room or band that cannot be read: its problem is listed above
        out["keys"], out["keys_by_arch"], out["keys_by_room"] = 0, {}, {}
        libraries = raw_libraries(contents)
        served = set()
        for arch in arches:
            if arch not in contents:
                problems.append(f"{PKG}{arch}/ holds no room (vllm-<release>/manifest.json)")
        for arch, (rooms, _) in contents.items():
            base = f"{PKG}{arch}/"
            named = set()
            for release, room in rooms.items():
                served.add(release)
                named |= {band.file for band in room.links().bands}
                n = len(room.manifest().entries)
                out["keys_by_room"][room.name] = n
                out["keys_by_arch"][arch] = out["keys_by_arch"].get(arch, 0) + n
                out["keys"] += n
            stray = sorted(n for n in names if n.startswith(f"{base}lib/") and n[len(base) + 4:] not in named)
            if stray:
                problems.append(f"bands no room names: {', '.join(stray[:3])}")
        out["vllm"] = sorted(served, key=version_order)
        if spec is None:
            problems.append("no vllm extra: a kernels wheel must say which vLLM releases it serves")
        else:
            out["vllm_extra"] = spec
            for release in out["vllm"]:  # spec is packaging's own text of a specifier: admits accepts it
                if not admits(spec, release):
                    problems.append(f"the vllm extra (vllm{spec}) does not admit vLLM {release}, which the wheel serves")
                if f"vLLM {release}" not in (meta.get_payload() or ""):
                    problems.append(f"the README (long description) does not name vLLM {release}")
        out["kernel_bytes"] = sum(z.getinfo(n).file_size for n in names if n.startswith(PKG))
        out["kernel_compressed_bytes"] = sum(z.getinfo(n).compress_size for n in names if n.startswith(PKG))
        out["raw_library_bytes"] = sum(len(b) for b in libraries.values())
        if prebuilt is not None:
            have = {d.name: built_releases(d) for d in built_arches(Path(prebuilt))}
            if have != {a: list(rs) for a, (rs, _) in contents.items()}:
                problems.append(f"the wheel holds rooms {_rooms(names)}, the prebuilt dir {prebuilt} {have}")
            for n in names:
                if n.startswith(PKG) and not n.endswith("/"):
                    rel = n[len(PKG):]
                    src = Path(prebuilt) / rel
                    if not src.is_file() or src.read_bytes() != z.read(n):
                        problems.append(f"{n} differs from {src}")
    if auditwheel:
        try:
            ext = audit_raw(libraries)
        except RuntimeError as e:
            problems.append(str(e))
        else:
            out["auditwheel_external"] = ext
            bad = not_allowed(ext)
            if bad:
                problems.append(f"auditwheel: external libraries besides libamdhip64: {', '.join(bad)}")
    return out


def print_audit(what: str, libraries: dict) -> int:
    """Run auditwheel on ``libraries``, print one line, and return the exit code."""
    bad = not_allowed(audit_raw(libraries))
    print(f"{what}: auditwheel on {len(libraries)} raw libraries: "
          f"{'external ' + ', '.join(bad) if bad else 'no external library but the host HIP'}")
    return 1 if bad else 0


def audit_prebuilt(root: Path) -> int:
    """Run auditwheel on the raw libraries of a prebuilt dir's bands."""
    libraries = {}
    for room in built_rooms(Path(root)):
        for band in room.links().bands:
            name = f"{room.arch}/{band.file[:-3]}"
            if name not in libraries:  # a band two rooms name is one library
                libraries[name] = room.read_band(band)
    if not libraries:
        print(f"ci/check_wheel.py: error: no linked bands under {root}", file=sys.stderr)
        return 2
    return print_audit(str(root), libraries)


def audit_only(wheel: Path) -> int:
    """Run auditwheel on a wheel's raw libraries: cibuildwheel's repair step."""
    with open_wheel(wheel) as z:
        libraries = raw_libraries(wheel_bands(z))
    return print_audit(wheel.name, libraries)


# the files a wheel build reads: setup.py, pyproject.toml, the build matrix
# (ci/prebuilt.py checks each room's digest against it) and what they pack
SOURCE_FILES = ("pyproject.toml", "setup.py", "LICENSE", "NOTICE", "README.md", "build_matrix.yaml", "dsv41_aot", "ci")


def source_tree(dest: Path, root: Path = Path(__file__).resolve().parents[1]) -> Path:
    """Copy the files a wheel build reads into ``dest``.

    Each build gets its own copy, so concurrent builds never share
    setuptools' build/ folder.
    """
    dest.mkdir(parents=True)
    for name in SOURCE_FILES:
        src = root / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copyfile(src, dest / name)
    return dest


def main(argv=None) -> int:
    from dsv41_aot.errors import AotError

    try:
        return _main(argv)
    except AotError as e:  # bad input, such as a file that is not a sound zip
        print(f"ci/check_wheel.py: error: {e}", file=sys.stderr)
        return e.exit_code


def _main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("wheels", nargs="*")
    ap.add_argument("--prebuilt", help="the prebuilt dir the wheel was built from")
    ap.add_argument("--no-auditwheel", action="store_true")
    ap.add_argument("--audit-only", action="store_true", help="only auditwheel on the raw libraries")
    ap.add_argument("--audit-prebuilt", metavar="DIR", help="auditwheel on the raw libraries of DIR's bands")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.audit_prebuilt:
        return audit_prebuilt(Path(args.audit_prebuilt))
    if not args.wheels:
        ap.error("name a wheel (or --audit-prebuilt DIR)")
    if args.audit_only:
        return max(audit_only(Path(w)) for w in args.wheels)
    results, rc = [], 0
    for w in args.wheels:
        path = Path(w)
        if not path.is_file():
            print(f"ci/check_wheel.py: error: no wheel at {path}", file=sys.stderr)
            return 2
        r = check(path, Path(args.prebuilt) if args.prebuilt else None, not args.no_auditwheel)
        results.append(r)
        rc |= bool(r["problems"])
        if not args.json:
            what = (", ".join(f"{n} keys of {room}" for room, n in r.get("keys_by_room", {}).items())
                    if r["arches"] else "no kernels")
            print(f"{r['wheel']}: {r['bytes']} bytes, {what}: {'FAILED' if r['problems'] else 'ok'}")
            for p in r["problems"]:
                print(f"  {p}", file=sys.stderr)
    if args.json:
        print(json.dumps(results, indent=1))
    return 1 if rc else 0


if __name__ == "__main__":
    sys.exit(main())
