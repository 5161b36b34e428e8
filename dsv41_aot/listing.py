"""Listing rooms: of an arch folder, of a prebuilt directory, of a wheel.

``rooms_of`` lists every room folder, foreign ones included; ``rooms_in``
the known rooms, readable or not; ``built_*`` those holding a manifest.
``arch_problems`` judges what an arch folder holds that no room names
(verify, the wheel gates and the judge ask it; build and link remove what
it finds).

Shared core: standard library only.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from . import commands, pending
from .errors import AotError
from .facts.arches import arch_facts
from .facts.releases import RELEASES, release_facts, version_order
from .manifest import BAND_SUFFIX, LIB, LIBS_JSON, MANIFEST, OBJECTS, PREFIX
from .proof import VERIFIED
from .room import ROOM_RE, Room
from .verdict import Problem


def rooms_in_members(names, prefix: str) -> list[tuple[str, str]]:
    """(arch, release) of every room manifest among a wheel's member ``names``, sorted."""
    found = []
    for n in names:
        parts = n[len(prefix):].split("/") if n.startswith(prefix) else []
        if len(parts) == 3 and (m := ROOM_RE.fullmatch(parts[1])) and parts[2] == MANIFEST:
            found.append((parts[0], m.group(1)))
    return sorted(found, key=lambda ar: (ar[0], version_order(ar[1])))


def rooms_of(arch_dir: Path) -> list[Room]:
    """Every room folder of an arch folder (``vllm-X.Y.Z``), known or foreign."""
    arch_dir = Path(arch_dir)
    if not arch_dir.is_dir():
        return []
    found = [m.group(1) for p in arch_dir.iterdir() if (m := ROOM_RE.fullmatch(p.name)) and p.is_dir()]
    return [Room(arch_dir.parent, arch_dir.name, v) for v in sorted(found, key=version_order)]


def rooms_in(root: Path, release: str | None = None) -> list[Room]:
    """The known rooms of a prebuilt directory (of ``release`` when given), readable or not."""
    root = Path(root)
    arches = sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    return [r for a in arches for r in rooms_of(a) if r.known and release in (None, r.release)]


def built_releases(arch_dir: Path) -> list[str]:
    """The known releases an arch folder holds a manifest for, oldest first."""
    return [r.release for r in rooms_of(arch_dir) if r.known and r.manifest_path.is_file()]


def built_arches(root: Path) -> list[Path]:
    """The arch folders of a prebuilt directory holding a manifest of some known release."""
    return sorted({r.arch_dir for r in built_rooms(root)})


def built_rooms(root: Path, release: str | None = None) -> list[Room]:
    """The known rooms that hold a manifest (of ``release`` when given), sorted."""
    return [r for r in rooms_in(root, release) if r.manifest_path.is_file()]


def built_rooms_or_error(root: Path, release: str | None = None, arches=()) -> list[Room]:
    """:func:`built_rooms` (of ``arches`` only, when given), or an error naming the build that fills the directory.

    An unknown release or arch is "unknown ...", naming the known ones (exit 2)."""
    if release is not None:
        release_facts(release)
    for a in arches:
        arch_facts(a)
    found = [r for r in built_rooms(root, release) if not arches or r.arch in arches]
    if not found:
        what = f"vLLM {release} kernels" if release else "prebuilt architecture"
        what += f" of {', '.join(arches)}" if arches else ""
        # a build killed before its first manifest write left the keys it was asked for
        unfinished = [c for d in sorted(Path(root).iterdir()) if d.is_dir()
                      for c in pending.read(d, release)] if Path(root).is_dir() else []
        if unfinished:
            raise AotError(f"{root} holds no {what} (no <arch>/{PREFIX}<release>/{MANIFEST}): a build of it was "
                           f"stopped before it wrote one", fix=" && ".join(unfinished))
        raise AotError(f"{root} holds no {what} (no <arch>/{PREFIX}<release>/{MANIFEST})",
                       fix=commands.build(root, release=release))
    return found


def is_band_file(name: str) -> bool:
    """Whether a file name in an arch's lib/ is a band (or a schema-1 raw library)."""
    return name.startswith("libdsv41_") and name.endswith((".so", BAND_SUFFIX))


def arch_problems(rooms: list[Room], members: list[str], where: str, *, shipped: bool,
                  fix_band: str = "", remove=None) -> list[Problem]:
    """What an arch folder holds that no room names: the one verdict on an arch folder, beside ``verdict.problems``.

    ``rooms`` are the folder's room folders, foreign ones included, each
    reading through its reader (a folder's or a wheel's); ``members`` the
    paths judged, relative to the folder at ``where``. A builder's folder
    (``shipped`` False) keeps every room's objects and bands, a foreign
    room's too; a shipped one (a wheel) holds only its known rooms' records
    and bands. ``fix_band`` is the command that removes a stray band,
    ``remove(member)`` the one that removes any other stray. While a room's
    records cannot be read nothing is judged stray, and one problem says so;
    while a room is not linked (its own problem, whose fix links the arch),
    nothing in lib/ is, so link removes no band until every room is linked."""
    out: list[Problem] = []
    named: set = set()
    linked = True  # every room with a manifest has its libs.json: lib/ can be judged
    unknown = f"{where}: some room's records cannot be read, so what it names is unknown"
    for room in rooms:
        rel = room.dir.name
        if not room.known:
            out.append(Problem("room", f"{room.dir}: {rel} is a release this dsv41-aot does not know (it knows "
                                       f"{', '.join(sorted(RELEASES, key=version_order))})", str(room.dir),
                               fix=remove(rel + "/") if remove else "", serving=False))
            if shipped:
                continue  # a shipped foreign room names nothing
        try:
            if room.has(MANIFEST):
                man = room.manifest()
                named |= {f"{rel}/{n}" for n in (MANIFEST, VERIFIED)}
                if not shipped:
                    named |= {e.object for e in man.entries.values()}
                linked = linked and room.has(LIBS_JSON)  # else its own problem: it names no band yet
            if room.has(LIBS_JSON):
                named |= {f"{rel}/{LIBS_JSON}"} | {f"{LIB}/{b.file}" for b in room.links().bands}
        except AotError:
            return out + [Problem("unreadable", f"{unknown}: nothing in it is removed by build or link until "
                                                f"they can", where, fix="see that room's failure, or remove a "
                                                                        "foreign room you do not need", serving=False)]
    for m in members:
        if m in named or (m.startswith(LIB + "/") and not linked):
            continue
        if m.startswith(OBJECTS + "/"):
            what, msg = "object", f"{where}/{m}: a stored object no room's manifest names (left by an older or " \
                                  f"interrupted build; the next build into the folder removes it)"
        elif m.startswith(LIB + "/") and is_band_file(m[len(LIB) + 1:]):
            what, msg = "band", f"{where}/{m} is named by no room's {LIBS_JSON}"
        else:
            what, msg = "file", f"{where}/{m} is a {'folder' if m.endswith('/') else 'file'} no room names"
            folder = m.split("/")[0]
            if ROOM_RE.fullmatch(folder) and f"{folder}/{MANIFEST}" not in members:  # the room's records, orphaned
                msg += f": {where}/{folder}/ has no {MANIFEST}"
        out.append(Problem(what, msg, f"{where}/{m}", fix=fix_band if what == "band" else
                           (remove(m) if remove else ""), serving=False))
    return out


def folder_problems(arch_dir: Path, root: Path | None = None) -> list[Problem]:
    """:func:`arch_problems` of an arch folder on disk: its objects/ and lib/ judged (``root``: the fixes' directory)."""
    arch_dir = Path(arch_dir)
    root = Path(root) if root is not None else arch_dir.parent
    members = [f"{OBJECTS}/{p.name}" for p in sorted((arch_dir / OBJECTS).glob("*.o"))]
    lib = arch_dir / LIB
    if lib.is_dir():
        members += [f"{LIB}/{p.name}" + ("/" if p.is_dir() and not p.is_symlink() else "")  # a folder: its rm -r
                    for p in sorted(lib.iterdir()) if not p.name.startswith(".")]

    def remove(member: str) -> str:  # a member ending in / is a folder
        return f"rm {'-r ' if member.endswith('/') else ''}{shlex.quote(str(arch_dir / member.rstrip('/')))}"
    return arch_problems(rooms_of(arch_dir), members, str(arch_dir), shipped=False, remove=remove,
                         fix_band=commands.relink(root, arch=arch_dir.name))
