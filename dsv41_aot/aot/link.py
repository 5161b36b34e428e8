"""Link one room's stored objects into its bands and write its libs.json.

A band is one xz-compressed shared library per chunk: the keys of one TP and
eight adjacent step widths (``libdsv41_gfx950_tp4_s09-16``). Its SONAME and
file name come from its content, so a chunk two releases link from the same
objects is one band, and two different libraries never share a SONAME. Each
library leaves every HIP and libc symbol undefined, records no DT_NEEDED and
is linked ``-z now``; the raw ``.so`` exists only in a temporary folder while
it is checked. See docs/loader.md ("Loadable form") for why.

Build side (runs the linker); the loader reads libs.json and the bands only.
"""

from __future__ import annotations

import hashlib
import lzma
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from .. import commands
from ..errors import AotError, IntegrityError, ManifestError, ToolchainError
from ..keys import BuildKey
from ..manifest import Manifest, sha256_file
from ..linkrecord import Band, LinkRecord, band_file, soname
from ..room import Room
from ..verdict import band_problems, library_problems
from ..listing import built_rooms_or_error, folder_problems

XZ_PRESET = 6  # measured: preset 9, extreme and an x86 BCJ filter gain under 1% on these libraries
BAND = 8  # step widths per chunk
FIX_LD = "install lld (Debian: apt-get install lld-19) or name it with DSV41_AOT_LD=/path/to/ld.lld"
LINK_FLAGS = (
    "-shared", "--build-id=none", "-z", "now", "-z", "relro", "-z", "noexecstack",
    "--hash-style=gnu", "--strip-all", "--no-undefined-version",
)


def find_linker() -> str:
    """The ld.lld to link with: DSV41_AOT_LD, the build's own, or PATH's.

    The build's own is ``toolchain.llvm_tool``'s: ROCm's, then Debian's newest."""
    from .toolchain import llvm_tool

    for path in (os.environ.get("DSV41_AOT_LD"), llvm_tool("ld.lld"), shutil.which("ld.lld")):
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    raise ToolchainError("no ld.lld found to link the kernel libraries", fix=FIX_LD)


def chunk_name(key: BuildKey) -> str:
    """The library a key links into: arch, TP and its band of step widths."""
    lo = (key.tokens - 1) // BAND * BAND + 1
    return f"libdsv41_{key.arch}_tp{key.tp}_s{lo:02d}-{lo + BAND - 1:02d}"


def _check_library(data: bytes, path: str, entries: dict) -> None:
    """Refuse a library just linked that the room's verdict (``verdict.library_problems``) would refuse."""
    whole, lost = library_problems(data, entries)
    if whole:
        raise AotError(f"{path}: {whole[0]}; the kernel libraries must need nothing but the ROCm host")
    if lost:  # refuse_unsound_entries checked each entry against its object: a linker's fault, not input
        raise IntegrityError(f"{path}: entries not exported: {', '.join(list(lost.values())[:5])}",
                             fix=f"check the linker ({FIX_LD}), then link again")


def refuse_unsound_entries(room: Room, man: Manifest) -> None:
    """Refuse to link a key whose object is corrupt or whose entry does not describe it, naming each.

    Those are ``integrity.check_entry``'s verdicts on what link itself
    reads (the object, and the entry that names its symbol and resources):
    such a key is never linked in or kept linked, and its fix rebuilds it.
    Verify's other refusals (an ABI the kernel's kernargs disagree with,
    an object of another key) stay verify's: the link is not wrong there."""
    from .integrity import ENTRY_DIFFERS, check_entry

    for key in man.entries:  # a missing or corrupt object: its own error and fix
        man.check_object(key)
    bad = {}
    for key in sorted(man.entries):
        wrong = [p for p in check_entry(man, key)[0].problems if p.startswith(ENTRY_DIFFERS)]
        if wrong:
            bad[key] = "; ".join(wrong)
    if bad:
        first = next(iter(bad))
        raise IntegrityError(f"{room.name}: {len(bad)} key(s) whose entry verify refuses are not linked: {first}: "
                             f"{bad[first]}",
                             fix=commands.build(room.root, release=room.release, keys=bad))


def link_room(arch_dir: Path, release: str, *, linker: str | None = None, log=None) -> dict:
    """Link every chunk of one room, keeping those already up to date.

    Returns {"arch", "release", "keys", "libraries", "linked", "up_to_date",
    "removed", "seconds"}."""
    t0 = time.perf_counter()
    arch_dir = Path(arch_dir).resolve()  # the linker runs in arch_dir: its output path must not be relative
    room = Room(arch_dir.parent, arch_dir.name, release)
    man = room.manifest()
    refuse_unsound_entries(room, man)
    chunks: dict[str, list[str]] = {}
    for key in sorted(man.entries):
        chunks.setdefault(chunk_name(BuildKey.parse(key, release)), []).append(key)
    try:
        old = {band.chunk: band for band in room.links().bands}
    except ManifestError:  # never linked, or a record the room refuses: every chunk is linked again
        old = {}
    if room.lib.is_symlink():  # the loader refuses bands outside the arch's own lib/: make it a real folder
        room.lib.unlink()
    room.lib.mkdir(parents=True, exist_ok=True)
    libraries, linked, kept = [], 0, 0
    for chunk, keys in sorted(chunks.items()):
        members = {k: man.entries[k].sha256 for k in keys}
        prev = old.get(chunk)
        # kept only when the room finds nothing wrong with it (the loader's checks)
        if prev and prev.entries == members and not band_problems(room, prev, man):
            libraries.append(prev)
            kept += 1
            continue
        linker = linker or find_linker()
        libraries.append(_link_chunk(room, chunk, keys, man, members, linker))
        linked += 1
        if log:
            log(f"linked {libraries[-1].file} ({len(keys)} keys)")
    room.write_links(LinkRecord.of(man.arch, release, libraries))
    os.chmod(room.libs_path, 0o644)  # installed read-only for every user, like the libraries
    removed = _remove_unnamed_bands(arch_dir)  # after libs.json: this room's new bands are named
    return {"arch": man.arch, "release": release, "keys": len(man.entries), "libraries": len(libraries),
            "linked": linked, "up_to_date": kept, "removed": removed, "seconds": round(time.perf_counter() - t0, 3)}


def _remove_unnamed_bands(arch_dir: Path) -> list[str]:
    """Remove the bands in ``arch_dir/lib`` that no room names (``listing.folder_problems``); return their names."""
    removed = []
    for p in folder_problems(arch_dir):
        if p.what == "band":
            Path(p.file).unlink()
            removed.append(Path(p.file).name)
    return removed


def _link_chunk(room: Room, chunk: str, keys: list[str], man: Manifest, members: dict, linker: str) -> Band:
    """Link, check and store one chunk's band; return its libs.json record."""
    objects = sorted(dict.fromkeys(man.entries[k].object for k in keys))
    # named by what is linked in: same members, same library (across releases); every reader checks it
    so_name = soname(chunk, members)
    with tempfile.TemporaryDirectory(dir=room.lib, prefix=".link-") as tmp:
        out = Path(tmp) / f"{chunk}.so"
        cmd = [linker, *LINK_FLAGS, f"-soname={so_name}", "-o", str(out), *objects]
        r = subprocess.run(cmd, cwd=room.arch_dir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if r.returncode:
            raise AotError(
                f"linking {chunk} ({len(keys)} keys) failed: {(r.stderr or r.stdout).strip()[:2000]}",
                fix=f"rebuild the objects: {commands.build(room.root, arch=room.arch, release=room.release)}",
            )
        raw = out.read_bytes()
        _check_library(raw, chunk, {k: man.entries[k].entry for k in keys})
        band = compress_band(raw)
        digest = hashlib.sha256(band).hexdigest()
        name = band_file(chunk, digest)
        final = room.lib / name
        if final.is_symlink() or not final.is_file() or sha256_file(final) != digest:
            staged = Path(tmp) / name
            staged.write_bytes(band)
            os.chmod(staged, 0o644)  # data, never executed from disk: the loader dlopens a memfd copy
            os.replace(staged, final)
    return Band(chunk, name, digest, len(band), hashlib.sha256(raw).hexdigest(), len(raw), dict(members))


def compress_band(raw: bytes) -> bytes:
    """A library as its band: xz, deterministic (same bytes in, same bytes out)."""
    return lzma.compress(raw, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, preset=XZ_PRESET)


def link_dir(root: Path, arches=None, *, release: str | None = None, log=None) -> list[dict]:
    """Link every room of a prebuilt directory, or those of ``arches`` / ``release``.

    Each room is linked under its arch lock (``aot/lock.py``), so it waits
    for a build writing the same arch."""
    from .lock import arch_lock

    out = []
    for r in built_rooms_or_error(Path(root), release, arches or ()):
        with arch_lock(r.arch_dir, "link"):
            out.append(link_room(r.arch_dir, r.release, log=log))
    return out
