"""Read and judge a kernels wheel offline, through the room's own parsers.

:func:`judge` is the one verdict on a wheel: ``dsv41-aot verify --wheel
FILE``, ``ci/check_wheel.py`` and ``ci/release.py checkwheel`` all ask it.
No FlyDSL, torch or vLLM (auditwheel is the gate's, handed in).
"""

from __future__ import annotations

import email.parser
import zipfile
import zlib
from pathlib import Path

from .. import verdict
from ..errors import AotError, IntegrityError, ManifestError
from ..facts.releases import version_order
from ..keys import BuildKey
from ..proof import NO_EVIDENCE, PROVEN, VERIFIED, Proof
from ..manifest import LIB, TIMINGS, room_name
from ..room import Room, ZipReader
from ..listing import arch_problems, built_rooms, rooms_in_members

PKG = "dsv41_aot/kernels_prebuilt/"  # where a wheel carries its rooms
PLAT = "manylinux_2_28_x86_64"  # a kernels wheel's platform tag (host libraries, no Python extension)
FIX = "rebuild the wheel from a prebuilt dir that passes: ci/wheels.sh DIR (it checks DIR with ci/prebuilt.py)"
FIX_DOWNLOAD = f"download the wheel again (pip download --no-deps dsv41-aot), or {FIX}"
FIX_PROVE = f"prove its keys in the prebuilt dir it was built from (dsv41-aot verify --dir DIR --against-jit " \
            f"--record), then {FIX}"


def open_wheel(wheel: Path) -> zipfile.ZipFile:
    """Open a wheel for reading, after judging it as pip would.

    It must be a sound zip, every member's CRC checked (else AotError, exit
    2, naming the file), whose members all install inside the target
    folder: no absolute name, no ``..`` step, no name given twice (else
    IntegrityError, exit 1, naming the member)."""
    wheel = Path(wheel)
    try:
        z = zipfile.ZipFile(wheel)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
        raise AotError(f"{wheel}: not a wheel: not a sound zip file ({type(e).__name__}: {e})",
                       fix=FIX_DOWNLOAD) from None
    for info in z.infolist():
        try:
            z.read(info)  # whole: zipfile checks its CRC at the end
        except (zipfile.BadZipFile, zlib.error, OSError, EOFError, ValueError, NotImplementedError) as e:
            z.close()
            why = "its CRC does not match its bytes" if str(e).startswith("Bad CRC-32") else f"{type(e).__name__}: {e}"
            raise AotError(f"{wheel}: not a wheel: not a sound zip file (member {info.filename}: {why})",
                           fix=FIX_DOWNLOAD) from None
    seen = set()
    for name in z.namelist():
        if name.startswith("/") or ".." in name.split("/"):
            z.close()
            raise IntegrityError(f"{wheel}: member {name!r} is absolute or takes a `..` step: it may lie outside the "
                                 f"install tree, and pip refuses to install a wheel whose member does", fix=FIX_DOWNLOAD)
        if name in seen:
            z.close()
            raise IntegrityError(f"{wheel}: member {name!r} is in the wheel twice (which copy is installed depends "
                                 f"on the installer)", fix=FIX_DOWNLOAD)
        seen.add(name)
    found = dist_infos(seen)
    if len(found) != 1 or not {f"{found[0]}/METADATA", f"{found[0]}/WHEEL"} <= seen:
        z.close()
        raise AotError(f"{wheel}: not a wheel: it must hold one <name>.dist-info/ folder, with METADATA and WHEEL "
                       f"(it holds {', '.join(found) or 'none'})", fix=FIX_DOWNLOAD)
    return z


def dist_infos(names) -> list[str]:
    """The top-level ``*.dist-info`` folders among a wheel's members, sorted: a wheel has one."""
    return sorted({n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info") and "/" in n})


def wheel_rooms(z: zipfile.ZipFile) -> list[Room]:
    """The rooms a wheel holds, each reading its records from the wheel's members."""
    reader = ZipReader(z, PKG)
    return [Room(Path(PKG), arch, release, reader) for arch, release in rooms_in_members(reader.names, PKG)]


def raw_libraries(rooms, strict: bool = True) -> dict:
    """The raw libraries of known ``rooms``' bands, named as auditwheel sees them: {"<arch>/<band>.so": bytes}.

    For a wheel's rooms or a prebuilt dir's; a band two rooms name is one
    library, read once. A room whose records or bands cannot be read is
    left out (its own verdict names the problem); ``strict`` raises
    AotError at the first instead: with the room's own fix in a prebuilt
    dir, a wheel's rebuild in a wheel."""
    out: dict = {}
    for room in rooms:
        if not room.known:
            continue
        try:
            raw = {name: room.read_band(band) for band in room.links().bands
                   if (name := f"{room.arch}/{band.file[:-3]}") not in out}
            room.manifest()
        except AotError as e:
            if strict:
                raise (e if room.reader.folder else type(e)(e.message, fix=FIX)) from None
            continue
        out.update(raw)
    return out


def record_problems(z: zipfile.ZipFile, info: str) -> list[str]:
    """What pip's installer would find wrong with a wheel's RECORD.

    RECORD must list every member but itself (and its signature files) once,
    each with the sha256 (urlsafe base64, unpadded) and size of its bytes,
    and no file the wheel lacks."""
    import base64
    import csv
    import hashlib
    import io

    name = f"{info}/RECORD"
    if name not in z.namelist():
        return [f"no {name}: pip refuses to install a wheel without one"]
    listed: dict = {}
    for row in csv.reader(io.StringIO(z.read(name).decode(errors="replace"))):
        if row:
            listed[row[0]] = row[1:]
    out = []
    for member in z.namelist():
        if member.endswith("/") or member in (name, f"{info}/RECORD.jws", f"{info}/RECORD.p7s"):
            continue
        row = listed.pop(member, None)
        if row is None:
            out.append(f"{member} is not in {name}: an added file")
            continue
        data = z.read(member)
        digest = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        if len(row) < 2 or row[0] != digest or row[1] != str(len(data)):
            out.append(f"{member} differs from its {name} line (hash or size): an edited file")
    listed.pop(name, None)
    out += [f"{n} is listed in {name} but not in the wheel" for n in sorted(listed)]
    return out


def kernel_problems(z: zipfile.ZipFile, rooms: list[Room]) -> list[str]:
    """What is wrong with the kernels a wheel carries: each arch folder's verdict, then each room's (``rooms``)."""
    out = [] if rooms else [f"no room under {PKG}: a wheel without kernels"]
    members: dict = {}  # arch folder ("" for the kernels folder itself) -> its members' paths
    for n in z.namelist():
        if n.startswith(PKG) and not n.endswith("/"):
            arch, _, rest = n[len(PKG):].partition("/")
            members.setdefault(arch if rest else "", []).append(rest or arch)
    for arch, names in sorted(members.items()):
        here = [r for r in rooms if r.arch == arch]  # none for the kernels folder itself
        out += [p.message for p in arch_problems(here, names, PKG + arch if arch else PKG.rstrip("/"), shipped=True)]
    return out + [p.message for room in rooms for p in verdict.problems(room, objects=False)]


def room_summary(room: Room) -> dict | None:
    """One room's keys per TP with their proofs, and the keys without a proof (None: unreadable records)."""
    try:
        man = room.manifest()
        room.links()
    except AotError:
        return None  # its problem is listed
    try:
        proof = room.proof()
    except AotError:
        proof = Proof(room.arch, room.release, {})  # unreadable: listed, every key unproven
    by_tp: dict = {}
    unproven = []
    for key, e in sorted(man.entries.items()):
        k = BuildKey.parse(key, room.release)
        state = proof.verdict(key, e)  # PROVEN, NO_EVIDENCE (no JIT-only evidence), STALE or None
        proven = state == PROVEN
        if not proven:
            unproven.append(f"{key} (vLLM {room.release})"
                            + (": its proof carries no JIT-only evidence" if state == NO_EVIDENCE
                               else ": its proof names another code object" if state else ""))
        t = by_tp.setdefault(k.tp, {"keys": 0, "proven": 0, "kinds": {}, "tokens": [k.tokens, k.tokens]})
        t["keys"] += 1
        t["proven"] += proven
        t["kinds"][k.kind] = t["kinds"].get(k.kind, 0) + 1
        t["tokens"] = [min(t["tokens"][0], k.tokens), max(t["tokens"][1], k.tokens)]
    return {"arch": room.arch, "release": room.release, "mono_sources": man.mono_sources, "keys": len(man.entries),
            "proven": sum(t["proven"] for t in by_tp.values()), "verified_json": room.has(VERIFIED),
            "by_flydsl": proof.flydsl_counts(man.entries),
            "tp": {str(tp): by_tp[tp] for tp in sorted(by_tp)}, "unproven": unproven}


def judge(wheel: Path, *, prebuilt: Path | None = None, audit=None, require_proofs: bool = True) -> dict:
    """The one verdict on a kernels wheel: what it holds, and everything wrong with it.

    ``verify --wheel``, ``ci/check_wheel.py`` and ``ci/release.py
    checkwheel`` all ask it. ``problems`` lists what pip or RECORD would
    show, the tags and requirements, foreign rooms and stray files, and
    each room's own verdict; ``unproven`` the keys without a proof against
    vLLM's JIT (a failure when ``require_proofs``); ``fix`` the command that
    mends a failed wheel (None when it passes). With ``prebuilt`` the
    kernels must be that folder's, byte for byte; ``audit`` (raw libraries
    ``{name: bytes}`` -> (external libraries, problems)) is the gate's
    auditwheel step. A file that
    is not a sound zip raises AotError (exit 2)."""
    wheel = Path(wheel)
    problems: list = []
    out = {"wheel": wheel.name, "bytes": wheel.stat().st_size, "problems": problems, "unproven": [], "rooms": [],
           "bands": [], "arches": [], "failed": True, "fix": None}
    libraries: dict = {}
    try:
        z = open_wheel(wheel)  # a sound zip whose members all install inside the target folder
    except IntegrityError as e:
        problems.append(e.message)
        out["fix"] = e.fix
        return out
    with z:
        names = z.namelist()
        (info,) = dist_infos(names)  # open_wheel: one, holding METADATA and WHEEL
        problems += record_problems(z, info)
        meta = email.parser.Parser().parsestr(z.read(f"{info}/METADATA").decode(errors="replace"))
        tags = [v for k, v in email.parser.Parser().parsestr(z.read(f"{info}/WHEEL").decode(errors="replace")).items()
                if k == "Tag"]
        out.update(name=meta["Name"], version=meta["Version"], tags=tags)
        reqs, extra = requirement_problems(meta.get_all("Requires-Dist") or [], meta.get_all("Provides-Extra") or [])
        problems += reqs + metadata_problems(out["version"], names, info)
        arches = sorted({n[len(PKG):].split("/")[0] for n in names if n.startswith(PKG) and n.count("/") > 2})
        out["arches"] = arches
        if not arches:
            if tags != ["py3-none-any"]:
                problems.append(f"a wheel without kernels tagged {tags}, expected py3-none-any")
            out.update(failed=bool(problems), fix=FIX_DOWNLOAD if problems else None)
            return out
        if tags != [f"py3-none-{PLAT}"]:
            problems.append(f"kernels wheel tagged {tags}, expected py3-none-{PLAT}")
        wanted = f"dsv41_aot-{out['version']}-py3-none-{PLAT}.whl"
        if wheel.name != wanted:
            problems.append(f"file name {wheel.name} is not {wanted}")
        rooms = wheel_rooms(z)  # each reads its records once, for every check below
        problems += kernel_problems(z, rooms)
        for room in rooms:
            summary = room_summary(room) if room.known else None
            if summary is None:
                continue
            out["unproven"] += summary.pop("unproven")
            out["rooms"].append(summary)
            for band in room.links().bands:
                if room.reader.has(f"{room.arch}/{LIB}/{band.file}"):
                    out["bands"].append({"room": room.name, "file": f"{room.arch}/{LIB}/{band.file}",
                                         "bytes": band.bytes, "raw_bytes": band.raw_bytes, "keys": len(band.entries)})
        out["keys"] = sum(r["keys"] for r in out["rooms"])
        out["keys_by_room"] = {room_name(r["arch"], r["release"]): r["keys"] for r in out["rooms"]}
        out["keys_by_arch"] = {a: sum(r["keys"] for r in out["rooms"] if r["arch"] == a) for a in arches}
        served = sorted({r["release"] for r in out["rooms"]}, key=version_order)
        out["vllm"] = served
        problems += vllm_extra_problems(meta, extra, served, out)
        out["kernel_bytes"] = sum(z.getinfo(n).file_size for n in names if n.startswith(PKG))
        out["kernel_compressed_bytes"] = sum(z.getinfo(n).compress_size for n in names if n.startswith(PKG))
        libraries = raw_libraries(rooms, strict=False)
        out["raw_library_bytes"] = sum(len(b) for b in libraries.values())
        if prebuilt is not None:
            problems += prebuilt_problems(z, Path(prebuilt))
    if audit is not None:
        out["auditwheel_external"], found = audit(libraries)
        problems += found
    out["failed"] = bool(problems or (require_proofs and out["unproven"]))
    out["fix"] = FIX_DOWNLOAD if problems else FIX_PROVE if out["failed"] else None
    return out


def metadata_problems(version: str, names: list, info: str) -> list[str]:
    """A wheel judged beside its requirements: licence files, METADATA's version; no raw library, no timings."""
    out = []
    for lic in ("LICENSE", "NOTICE"):
        if not any(n.startswith(info) and n.rsplit("/", 1)[-1] == lic for n in names):
            out.append(f"{lic} missing from {info}")
    if "+" in version:
        out.append(f"local version label in {version}: an index refuses it")
    raw_so = [n for n in names if n.endswith(".so") or ".so." in n.rsplit("/", 1)[-1] and not n.endswith(".xz")]
    if raw_so:
        out.append(f"raw shared libraries in the wheel: {', '.join(raw_so[:5])}")
    measured = [n for n in names if n.startswith(PKG) and n.rsplit("/", 1)[-1] == TIMINGS]
    if measured:
        out.append(f"timings in the wheel (measured, never shipped): {', '.join(measured[:3])}")
    return out


def vllm_extra_problems(meta, spec: str | None, served: list, out: dict) -> list[str]:
    """The vllm extra (``spec``, requirement_problems') and the README must admit and name every release served."""
    if spec is None:
        return ["no vllm extra: a kernels wheel must say which vLLM releases it serves"]
    out["vllm_extra"] = spec
    problems = []
    for release in served:  # spec is packaging's own text of a specifier: admits accepts it
        if not admits(spec, release):
            problems.append(f"the vllm extra (vllm{spec}) does not admit vLLM {release}, which the wheel serves")
        if f"vLLM {release}" not in (meta.get_payload() or ""):
            problems.append(f"the README (long description) does not name vLLM {release}")
    return problems


def prebuilt_problems(z: zipfile.ZipFile, prebuilt: Path) -> list[str]:
    """Where a wheel's kernels differ from the prebuilt dir it was built from: rooms, then file by file."""
    names = z.namelist()
    have = [(r.arch, r.release) for r in built_rooms(prebuilt)]
    held = rooms_in_members(names, PKG)
    out = []
    if set(have) != set(held):
        out.append(f"the wheel holds rooms {held}, the prebuilt dir {prebuilt} {have}")
    for n in names:
        if n.startswith(PKG) and not n.endswith("/"):
            src = prebuilt / n[len(PKG):]
            if not src.is_file() or src.read_bytes() != z.read(n):
                out.append(f"{n} differs from {src}")
    return out


HEAVY = ("flydsl", "torch", "vllm")  # what a serving process never imports, and a wheel never requires


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


def admits(spec: str, version: str) -> bool:
    """Whether the PEP 440 specifier ``spec`` admits ``version``."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    try:
        return SpecifierSet(spec).contains(version, prereleases=True)
    except InvalidSpecifier:
        raise ManifestError(f"vllm extra {spec!r} is not a PEP 440 version specifier",
                            fix="write the vllm extra as e.g. vllm>=0.32.0,<0.34") from None
