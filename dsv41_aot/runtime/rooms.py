"""The loader's view of rooms: the prebuilt directory, room indexes, the pick.

``resolve_root`` finds the prebuilt directory once per way of naming it;
``RoomIndex`` is a room's manifest and link record, read once; ``index_of``
makes a release's index once per process; ``release_of`` picks the room
that serves the running vLLM, once per directory and arch.
"""

from __future__ import annotations

import os
from pathlib import Path

from . import state
from .. import commands, verdict
from .abi import Abi
from .host import ARCH_RE, ENV_ALLOW_SOURCE, FIX_ARCH_NAME, installed_vllm, mismatch_allowed
from ..manifest import ENV_PREBUILT, MANIFEST, prebuilt_dir
from ..room import PREFIX, Room
from ..listing import built_releases, rooms_of
from ..facts.releases import NEWEST, RELEASES, version_order
from ..errors import ArchMismatchError, ManifestError, ReleaseMismatchError


def resolve_root(prebuilt=None) -> Path:
    """The absolute prebuilt directory: ``prebuilt``, else ``manifest.prebuilt_dir()``.

    Resolved once per process for each way of naming it (the argument or the
    variable's value, with the working directory when relative), so a key's
    Launcher costs a dict lookup, not a ``Path.resolve`` per call. A symlink
    re-pointed while the process runs is not followed again."""
    named = os.environ.get(ENV_PREBUILT) if prebuilt is None else os.fspath(prebuilt)
    how = ("env" if prebuilt is None else "arg", named)
    if named and not os.path.isabs(named):
        how += (os.getcwd(),)
    roots = state.current().roots
    if how not in roots:
        roots[how] = prebuilt_dir() if prebuilt is None else Path(named).resolve()
    return roots[how]


class RoomIndex:
    """The loader's view of one room: which band links each key, and its ABIs.

    ``room.Room`` owns the paths and reads the records; ABIs are compiled on
    first use."""

    def __init__(self, room: Room):
        self.room = room
        self.manifest = room.manifest()
        self.entries = self.manifest.entries
        # band file -> its path as a string (the Launcher's ``library``, the key of the band's handle)
        self.band_paths = {band.file: str(room.lib / band.file) for band in room.links().bands}
        self.abis: dict = {}
        # each key the room's verdict refuses to serve -> its first problem (its source, its link; the bands are
        # judged when bound: bands.open_library)
        self.refused: dict = {}
        for p in verdict.problems(room, objects=False, proof=False, bands=False):
            if p.serving:
                for key in verdict.problem_keys(room, p):
                    self.refused.setdefault(key, p)

    def abi(self, aid: str) -> Abi:
        """The compiled ABI ``aid`` (``Manifest.parse`` checked that its slots hash to its id)."""
        a = self.abis.get(aid)
        if a is None:
            a = self.abis[aid] = Abi(self.manifest.abis[aid], aid)
        return a


def index_of(root: Path, arch: str, release: str | None = None) -> RoomIndex:
    """The index of vLLM ``release``'s room on ``arch`` (default: :func:`release_of`)."""
    if not isinstance(arch, str) or not ARCH_RE.fullmatch(arch):  # never a path: no "/", no ".."
        raise ManifestError(f"arch {arch!r} is not a GPU arch name (gfx...): refusing to look for it under {root}",
                            fix=FIX_ARCH_NAME)
    if release is None:
        release = release_of(root, arch)
    idx = state.current().indexes.get((root, arch, release))
    if idx is None:
        with state.current().lock:
            idx = state.current().indexes.get((root, arch, release))
            if idx is None:
                held = built_releases(root / arch)
                if release not in held:
                    _no_room(root, arch, release, held)
                room = room_of(root, arch, release)
                state.current().read_rooms.pop((root, arch, release), None)  # the index holds it from here
                idx = state.current().indexes[(root, arch, release)] = RoomIndex(room)
    return idx


def room_of(root: Path, arch: str, release: str) -> Room:
    """The Room of ``release`` on ``arch``, the one release_of read when it can be.

    That Room is reused while its manifest file is unchanged, so the
    manifest release_of parsed to pick the room is not parsed again."""
    read = state.current().read_rooms.get((root, arch, release))
    if read and read[1] is not None and read[1] == _file_version(read[0].manifest_path):
        return read[0]
    return Room(root, arch, release)


def _file_version(path: Path) -> tuple | None:
    """What tells a file rewritten since (inode, size, mtime), None when absent."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def _no_room(root: Path, arch: str, release: str, held: list) -> None:
    """Raise the error saying why ``root`` has no room of ``release`` on ``arch``."""
    folder = root / arch
    if root.exists() and not root.is_dir():
        raise ManifestError(f"prebuilt directory {root} is a file, not a folder",
                            fix=f"point {ENV_PREBUILT} (or prebuilt=) at a prebuilt directory, or unset it")
    if not held and any(root.glob(f"{PREFIX}*/{MANIFEST}")):  # an arch folder named for the directory above it
        raise ManifestError(f"{root} is an arch folder (it holds {PREFIX}<release>/{MANIFEST}), not a prebuilt "
                            f"directory", fix=f"point {ENV_PREBUILT} (or prebuilt=) at its parent: "
                                              f"{ENV_PREBUILT}={root.parent}")
    _lost_manifest(folder, release if held else None)  # with no room at all, any room folder without one
    build = commands.build(root, arch=arch, release=release, link=True)
    if held:
        raise ReleaseMismatchError(
            f"{folder} holds prebuilt kernels for vLLM {', '.join(held)}, not vLLM {release}",
            fix=f"install the dsv41-aot wheel that serves vLLM {release}, or build: {build}")
    foreign = [r.release for r in rooms_of(folder) if not r.known and r.manifest_path.is_file()]
    if foreign:  # a newer dsv41-aot's rooms only
        raise ReleaseMismatchError(
            f"{folder} holds prebuilt kernels only for vLLM {', '.join(foreign)}, a release this dsv41-aot does not "
            f"know (it knows {', '.join(sorted(RELEASES, key=version_order))})",
            fix=f"install the dsv41-aot that built them (pip install --upgrade dsv41-aot), or build vLLM {release}'s: "
                f"{build}")
    others = sorted({p.parent.parent.name for p in root.glob(f"*/{PREFIX}*/{MANIFEST}")} - {arch})
    if others:
        raise ArchMismatchError(
            f"{root} holds prebuilt kernels for {', '.join(others)}, not {arch}",
            fix=f"install the {arch} wheel, or build: {commands.build(root, arch=arch, link=True)}",
        )
    raise ManifestError(f"no prebuilt kernels for {arch} at {folder} (no vllm-<release>/manifest.json)",
                        fix=f"build them: {build}")


def _lost_manifest(folder: Path, release: str | None) -> None:
    """Raise the verdict on vLLM ``release``'s room folder (None: any) when it is there without its manifest."""
    for room in rooms_of(folder):
        if room.known and release in (None, room.release) and not room.manifest_path.is_file():
            raise verdict.problems(room, objects=False, proof=False)[0].error()


def release_of(root: Path, arch: str) -> str:
    """The release whose room serves this process on ``arch``, picked once.

    The room whose manifest records the installed vLLM's mono sources digest
    (without vLLM: the newest). No match is a ReleaseMismatchError, or with
    DSV41_AOT_ALLOW_SOURCE_MISMATCH=1 a warning and the room of vLLM's
    version (else the newest)."""
    picked = state.current().picked.get((root, arch))
    if picked is not None:
        return picked
    folder = root / arch
    held = built_releases(folder)
    if not held:
        _no_room(root, arch, NEWEST, held)
    digest, src, mono = installed_vllm()
    if digest is None:
        pick = held[-1]
    else:
        mans, broken = {}, {}
        for release in reversed(held):  # newest first: the newest room of the digest is the pick
            room = Room(root, arch, release)
            seen = _file_version(room.manifest_path)
            try:
                mans[release] = room.manifest()
            except ManifestError as e:
                broken[release] = e  # a corrupt room is reported when it is the one asked for
                continue
            if mans[release].mono_sources == digest:
                # the room about to be indexed: index_of takes this parse over (once, if the file is unchanged)
                state.current().read_rooms[(root, arch, release)] = (room, seen)
                pick = release
                break
        else:  # no room of the digest
            if src.version in broken:  # the running release's own room is corrupt: say so, not "no release"
                raise broken[src.version]
            _lost_manifest(folder, src.version)
            have = ", ".join(f"vLLM {r} ({mans[r].mono_sources_text()})" for r in held if r in mans) or "none readable"
            msg = (f"running vLLM {src.version} mono sources ({mono}) digest {digest} matches no prebuilt "
                   f"release in {folder}: {have}")
            fallback = src.version if src.version in held else held[-1]
            if not mismatch_allowed():
                own = (f"build this one's kernels ({commands.build(root, arch=arch, release=src.version, link=True)})"
                       if src.version in RELEASES
                       else f"upgrade dsv41-aot to one that knows vLLM {src.version} (pip install --upgrade dsv41-aot)")
                raise ReleaseMismatchError(
                    msg, fix=f"install one of those vLLM releases, or {own}, or run vLLM {fallback}'s kernels "
                             f"anyway with {ENV_ALLOW_SOURCE}=1")
            state.current().warn_once(("release", digest), f"{msg}; using vLLM {fallback}'s ({ENV_ALLOW_SOURCE}=1)")
            pick = fallback
    state.current().picked[(root, arch)] = pick
    return pick
