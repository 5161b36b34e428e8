"""Read a kernels wheel offline, through the room's own parsers.

Used by ``dsv41-aot verify --wheel FILE`` and ``ci/check_wheel.py``; both
open the file with :func:`open_wheel`. No auditwheel, FlyDSL, torch or vLLM.
"""

from __future__ import annotations

import email.parser
import zipfile
import zlib
from pathlib import Path

from ..errors import AotError, IntegrityError
from ..keys import BuildKey
from ..proof import NO_EVIDENCE, PROVEN, VERIFIED, Proof
from ..manifest import LIB
from ..room import Room, ZipReader
from ..listing import rooms_in_members

PKG = "dsv41_aot/kernels_prebuilt/"  # where a wheel carries its rooms
FIX = "rebuild the wheel from a prebuilt dir that passes: python ci/prebuilt.py DIR"
FIX_DOWNLOAD = "download the wheel again (pip download --no-deps dsv41-aot), or rebuild it"


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
        raise AotError(f"{wheel}: not a wheel: not a sound zip file ({e or type(e).__name__})",
                       fix=FIX_DOWNLOAD) from None
    try:
        bad = z.testzip()
    except (zipfile.BadZipFile, zlib.error, OSError, EOFError, ValueError, NotImplementedError) as e:
        bad, why = "?", str(e) or type(e).__name__
    else:
        why = "its CRC does not match its bytes"
    if bad is not None:
        z.close()
        raise AotError(f"{wheel}: not a wheel: not a sound zip file (member {bad}: {why})", fix=FIX_DOWNLOAD)
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
    info = dist_info(seen)
    if info is None or not {f"{info}/METADATA", f"{info}/WHEEL"} <= seen:
        z.close()
        raise AotError(f"{wheel}: not a wheel: no <name>.dist-info/ folder holding METADATA and WHEEL",
                       fix=FIX_DOWNLOAD)
    return z


def dist_info(names) -> str | None:
    """The one top-level ``*.dist-info`` folder among a wheel's members, or None."""
    found = {n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info") and "/" in n}
    return found.pop() if len(found) == 1 else None


def rooms_in_wheel(names) -> dict:
    """The rooms a wheel's member names hold, as {arch: [release, ...]}."""
    out: dict = {}
    for arch, release in rooms_in_members(names, PKG):
        out.setdefault(arch, []).append(release)
    return out


def wheel_rooms(z: zipfile.ZipFile) -> list[Room]:
    """The rooms a wheel holds, each reading its records from the wheel's members."""
    reader = ZipReader(z, PKG)
    return [Room(Path(PKG), arch, release, reader) for arch, release in rooms_in_members(reader.names, PKG)]


def wheel_problems(z: zipfile.ZipFile) -> list[str]:
    """What each room's own verdict (``Room.problems``) finds wrong in a wheel."""
    return [p.message for room in wheel_rooms(z) for p in room.problems(objects=False)]


def wheel_bands(z: zipfile.ZipFile) -> dict:
    """A wheel's rooms and raw bands: {arch: ({release: Room}, {band file: bytes})}.

    The first band that cannot be read raises AotError; :func:`wheel_problems`
    lists them all."""
    out: dict = {}
    for room in wheel_rooms(z):
        rooms, raw = out.setdefault(room.arch, ({}, {}))
        try:
            for band in room.links().bands:
                if band.file not in raw:
                    raw[band.file] = room.read_band(band)
        except AotError as e:
            raise type(e)(e.message, fix=FIX) from None
        rooms[room.release] = room
    return out


def report(wheel: Path) -> dict:
    """Report what a kernels wheel holds and whether it holds together.

    Per (arch, vLLM release, TP): the keys, their kinds and token widths,
    and how many are proven (``proof.Proof.verdict`` is PROVEN).
    ``problems`` is what each room's verdict finds wrong (empty: the wheel
    holds together); ``unproven`` lists the keys without a matching proof."""
    out = {"wheel": Path(wheel).name, "bytes": Path(wheel).stat().st_size, "rooms": [], "bands": [],
           "problems": [], "unproven": []}
    problems = out["problems"]
    try:
        z = open_wheel(wheel)  # not a sound zip: AotError (exit 2)
    except IntegrityError as e:
        problems.append(e.message)
        return out
    with z:
        meta = email.parser.Parser().parsestr(z.read(f"{dist_info(z.namelist())}/METADATA").decode(errors="replace"))
        out.update(name=meta["Name"], version=meta["Version"])
        rooms = wheel_rooms(z)
        if not rooms:
            problems.append(f"no room under {PKG}: a wheel without kernels")
        problems += wheel_problems(z)
        for room in rooms:
            try:
                man, links = room.manifest(), room.links()
            except AotError:
                continue  # its problem is listed above
            try:
                proof = room.proof()
            except AotError:
                proof = Proof(room.arch, room.release, {})  # unreadable: listed above, every key unproven
            release = room.release
            for band in links.bands:
                if room.reader.has(f"{room.arch}/{LIB}/{band.file}"):
                    out["bands"].append({"room": room.name, "file": f"{room.arch}/{LIB}/{band.file}",
                                         "bytes": band.bytes, "raw_bytes": band.raw_bytes, "keys": len(band.entries)})
            by_tp: dict = {}
            for key, e in sorted(man.entries.items()):
                k = BuildKey.parse(key, release)
                state = proof.verdict(key, e)  # PROVEN, NO_EVIDENCE (no JIT-only evidence), STALE or None
                proven = state == PROVEN
                if not proven:
                    out["unproven"].append(f"{key} (vLLM {release})"
                                           + (": its proof carries no JIT-only evidence" if state == NO_EVIDENCE
                                              else ": its proof names another code object" if state else ""))
                t = by_tp.setdefault(k.tp, {"keys": 0, "proven": 0, "kinds": {}, "tokens": [k.tokens, k.tokens]})
                t["keys"] += 1
                t["proven"] += proven
                t["kinds"][k.kind] = t["kinds"].get(k.kind, 0) + 1
                t["tokens"] = [min(t["tokens"][0], k.tokens), max(t["tokens"][1], k.tokens)]
            out["rooms"].append({
                "arch": room.arch, "release": release, "mono_sources": man.mono_sources, "keys": len(man.entries),
                "proven": sum(t["proven"] for t in by_tp.values()), "verified_json": room.has(VERIFIED),
                "tp": {str(tp): by_tp[tp] for tp in sorted(by_tp)},
            })
    return out
