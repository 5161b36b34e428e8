"""Listing rooms: of an arch folder, of a prebuilt directory, of a wheel.

``rooms_of`` lists every room folder, foreign ones included; ``rooms_in``
the known rooms, readable or not; ``built_*`` those holding a manifest.
``named_by_rooms`` and ``orphan_objects`` serve garbage collection.

Shared core: standard library only.
"""

from __future__ import annotations

from pathlib import Path

from . import commands, pending
from .errors import AotError
from .facts.releases import release_facts, version_order
from .manifest import BAND_SUFFIX, LIB, LIBS_JSON, MANIFEST, OBJECTS, PREFIX
from .room import ROOM_RE, Room


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


def built_rooms_or_error(root: Path, release: str | None = None) -> list[Room]:
    """:func:`built_rooms`, or an error naming the build that fills the directory if none."""
    if release is not None:
        release_facts(release)
    found = built_rooms(root, release)
    if not found:
        what = f"vLLM {release} kernels" if release else "prebuilt architecture"
        # a build killed before its first manifest write left the keys it was asked for
        unfinished = [c for d in sorted(Path(root).iterdir()) if d.is_dir()
                      for c in pending.read(d, release)] if Path(root).is_dir() else []
        if unfinished:
            raise AotError(f"{root} holds no {what} (no <arch>/{PREFIX}<release>/{MANIFEST}): a build of it was "
                           f"stopped before it wrote one", fix=" && ".join(unfinished))
        raise AotError(f"{root} holds no {what} (no <arch>/{PREFIX}<release>/{MANIFEST})",
                       fix=commands.build(root, release=release))
    return found


def named_by_rooms(arch_dir: Path) -> tuple[set, set] | None:
    """(object paths, band file names) some room of the arch names, foreign rooms included.

    None when a room's records cannot be read: then nothing may be collected."""
    objs, bands = set(), set()
    for room in rooms_of(arch_dir):
        try:
            if room.has(MANIFEST):
                man = room.manifest()
                objs |= {man.object_path(key) for key in man.entries}
            if room.has(LIBS_JSON):
                bands |= {b.file for b in room.links().bands}
        except AotError:
            return None
    return objs, bands


def is_band_file(name: str) -> bool:
    """Whether a file name in an arch's lib/ is a band (or a schema-1 raw library)."""
    return name.startswith("libdsv41_") and name.endswith((".so", BAND_SUFFIX))


def unnamed_in_lib(root: Path, arch_dir: Path) -> list[tuple[Path, str]]:
    """The files in an arch's lib/ that no room's libs.json names, each with the command that removes it.

    The one judge of a lib/ folder's strays, which verify and the wheel gate
    refuse: a band is removed by ``link`` (it keeps only the bands a room
    names), anything else by hand (``rm``, ``rm -r`` for a folder). None is
    listed while a room's records cannot be read or a room is not linked:
    that room's own problem says so."""
    named = named_by_rooms(arch_dir)
    lib = Path(arch_dir) / LIB
    unlinked = any(r.has(MANIFEST) and not r.has(LIBS_JSON) for r in rooms_of(arch_dir))
    if named is None or unlinked or not lib.is_dir():
        return []
    out = []
    for p in sorted(lib.iterdir()):
        if p.name in named[1] or p.name.startswith("."):
            continue
        if is_band_file(p.name) and not p.is_dir():
            fix = f"dsv41-aot link --dir {root} --arch {Path(arch_dir).name}"
        else:
            fix = f"rm -r '{p}'" if p.is_dir() and not p.is_symlink() else f"rm '{p}'"
        out.append((p, fix))
    return out


def orphan_objects(arch_dir: Path) -> list[Path]:
    """Stored objects of an arch that no room names (none while a room is unreadable)."""
    named = named_by_rooms(arch_dir)
    objdir = Path(arch_dir) / OBJECTS
    if named is None or not objdir.is_dir():
        return []
    return sorted(p for p in objdir.glob("*.o") if p not in named[0])
