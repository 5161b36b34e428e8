"""A room, ``<dir>/<arch>/vllm-<release>/``: its paths, its records and the commands that fix it.

A room reads each of its records once, through that record's one parser;
``verdict.problems`` judges it. A room of a release this dsv41-aot does not
know (written by a newer version) is *foreign*: nothing judges, rewrites or
deletes it.

Shared core: standard library only.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from . import commands, pending
from .errors import AotError, IntegrityError, ManifestError
from .facts.releases import RELEASES
from .keys import BuildKey
from .manifest import (LIB, LIBS_JSON, MANIFEST, OBJECTS, PACKAGED, PREFIX, TIMINGS, Manifest, atomic_write,
                       read_timings, room_dir, room_name)
from .linkrecord import Band, LinkRecord
from .proof import VERIFIED, Proof

REINSTALL = "pip install --force-reinstall --no-deps dsv41-aot"  # the installed package's kernels: no objects/
ROOM_RE = re.compile(re.escape(PREFIX) + r"(\d+\.\d+\.\d+)")


# ---------------------------------------------------------------- reading a room's files


class FolderReader:
    """Reads the files of a prebuilt directory on disk by their path inside it."""

    folder = True  # a builder's folder: its objects/ may be present, a band is read from its own file

    def __init__(self, root: Path):
        self.root = Path(root)

    def has(self, relpath: str) -> bool:
        return (self.root / relpath).is_file()

    def where(self, relpath: str) -> str:
        return str(self.root / relpath)

    def read_bytes(self, relpath: str) -> bytes:
        """The file's bytes (FileNotFoundError when absent)."""
        return (self.root / relpath).read_bytes()


class ZipReader:
    """Reads a wheel's prebuilt directory (``prefix``) as FolderReader reads a folder."""

    folder = False

    def __init__(self, z, prefix: str):
        self.z, self.prefix = z, prefix
        self.names = set(z.namelist())

    def has(self, relpath: str) -> bool:
        return self.prefix + relpath in self.names

    def where(self, relpath: str) -> str:
        return self.prefix + relpath

    def read_bytes(self, relpath: str) -> bytes:
        """The member's bytes (FileNotFoundError when absent)."""
        if self.prefix + relpath not in self.names:
            raise FileNotFoundError(self.prefix + relpath)
        return self.z.read(self.prefix + relpath)


# ---------------------------------------------------------------- the room


class Room:
    """One room's paths and records, read from a folder or through ``reader`` (a wheel's)."""

    def __init__(self, root: Path, arch: str, release: str, reader: "FolderReader | ZipReader | None" = None):
        self.root, self.arch, self.release = Path(root), arch, release
        self.reader = reader or FolderReader(self.root)
        self.arch_dir = self.root / arch
        self.dir = room_dir(self.arch_dir, release)
        self.objects = self.arch_dir / OBJECTS
        self.lib = self.arch_dir / LIB
        self.manifest_path = self.dir / MANIFEST
        self.libs_path = self.dir / LIBS_JSON
        self.timings_path = self.dir / TIMINGS
        self.verified_path = self.dir / VERIFIED
        self._manifest: Manifest | None = None
        self._links: LinkRecord | None = None
        self._proof: Proof | None = None

    def __repr__(self) -> str:
        return f"Room({self.name} in {self.root})"

    @property
    def name(self) -> str:
        """``<arch>/vllm-<release>``: how messages and reports name the room."""
        return room_name(self.arch, self.release)

    @property
    def known(self) -> bool:
        """Whether the release is in this dsv41-aot's facts (else the room is foreign)."""
        return self.release in RELEASES

    @property
    def built_here(self) -> bool:
        """Whether stored objects are here, so the room can be relinked and rebuilt.

        A wheel's room ships without objects/."""
        return self.reader.folder and self.objects.is_dir()

    def _record(self, name: str) -> tuple[bytes | None, str]:
        """A record's bytes (None when absent) and how errors name it."""
        rel = f"{self.name}/{name}"
        try:
            return self.reader.read_bytes(rel), self.reader.where(rel)
        except FileNotFoundError:
            return None, self.reader.where(rel)

    # fixes: each one a command, run as printed

    @property
    def link_cmd(self) -> str:
        return commands.relink(self.root, arch=self.arch, release=self.release)

    @property
    def build_cmd(self) -> str:  # an unfinished build's own keys and options, when the arch records one
        return (pending.command(self.arch_dir, self.root, self.release)
                or commands.build(self.root, arch=self.arch, release=self.release))

    @property
    def prove_cmd(self) -> str:
        """The command that proves the room's keys against vLLM's JIT again and rewrites verified.json."""
        return f"dsv41-aot verify --against-jit --record --dir {self.root} --release {self.release}"

    @property
    def fix_restore(self) -> str:
        """The fix of a room not built here: reinstall the package whose kernels it is, else copy it again."""
        packaged = not self.reader.folder or Path(os.path.realpath(self.root)) == PACKAGED
        return REINSTALL if packaged else (f"copy {self.root} again from the wheel's dsv41_aot/kernels_prebuilt/ or "
                                           f"the prebuilt dir it came from: without objects/ nothing relinks it here")

    @property
    def fix_relink(self) -> str:
        """The fix for a band or link problem: relink where the room was built, else restore it."""
        return self.link_cmd if self.built_here else self.fix_restore

    @property
    def fix_rebuild(self) -> str:
        """The fix for keys a room lacks: build them where the room was built, else restore it."""
        return self.build_cmd if self.built_here else self.fix_restore

    def fix_reprove(self, key: str | None = None) -> str:
        """The fix for a proof that does not hold: prove the room (or ``key``) again where it was built, else
        restore it."""
        if not self.built_here:
            return self.fix_restore
        return f"{self.prove_cmd} --key '{key}'" if key else self.prove_cmd

    @property
    def fix_reinstall(self) -> str:
        """The fix for records and libraries that disagree: rebuild and relink where built, else restore."""
        return f"{self.build_cmd} && {self.link_cmd}" if self.built_here else self.fix_restore

    # records, parsed once

    def manifest(self, *, missing_ok: bool = False) -> Manifest:
        """The room's manifest.json, read once (empty when absent and ``missing_ok``).

        A builder's fix rebuilds it: a build sets a corrupt manifest aside
        and recovers its entries from the stored objects."""
        if self._manifest is None:
            data, where = self._record(MANIFEST)
            fix = self.build_cmd if self.reader.folder else REINSTALL
            if data is None:
                if not missing_ok:
                    raise ManifestError(f"no manifest at {where}", fix=fix)
                self._manifest = Manifest(self.arch_dir, self.arch, release=self.release)
            else:
                timings = read_timings(self.dir) if self.reader.folder else {}  # never in a wheel
                man = Manifest.parse(data, where, self.arch_dir, self.arch, self.release, fix, timings)
                for key in man.entries if self.known else ():  # a key no release builds: refused for every reader
                    try:
                        parsed = BuildKey.parse(key, self.release)
                    except AotError as e:
                        why = e.message.removeprefix(f"{key}: ")
                        raise ManifestError(f"{where}: entry {key} is no key of vLLM {self.release}: {why}",
                                            fix=fix) from None
                    if str(parsed) != key:  # every reader asks for a key as BuildKey writes it: never this entry
                        raise ManifestError(f"{where}: entry {key} is not written as its key is ({parsed})", fix=fix)
                self._manifest = man
        return self._manifest

    def links(self) -> LinkRecord:
        """The room's libs.json, read once."""
        if self._links is None:
            data, where = self._record(LIBS_JSON)
            if data is None:
                raise ManifestError(f"{where} is missing: the objects of {self.arch_dir} were never linked",
                                    fix=self.fix_relink)
            self._links = LinkRecord.parse(data, where, self.arch, self.release, self.fix_relink)
        return self._links

    def write_links(self, record: LinkRecord) -> None:
        """Replace the room's libs.json with ``record``, atomically."""
        atomic_write(self.libs_path, record.to_bytes())
        self._links = record

    def proof(self) -> Proof:
        """The room's verified.json, read once (an empty record when there is none)."""
        if self._proof is None:
            data, where = self._record(VERIFIED)
            if data is None:
                self._proof = Proof(self.arch, self.release, {})
            else:
                self._proof = Proof.parse(data, where, self.arch, self.release, self.fix_reprove())
        return self._proof

    def has(self, name: str) -> bool:
        """Whether the room holds the record ``name``."""
        return self.reader.has(f"{self.name}/{name}")

    def band_path(self, band: Band) -> Path:
        """The band's path; it must resolve to its own file directly in the arch's lib/.

        A band's fix relinks: link writes every band again and replaces a symlinked lib/ with a folder."""
        path = self.lib / band.file
        real = Path(os.path.realpath(path))
        inside = not self.lib.is_symlink() and real.parent == Path(os.path.realpath(self.arch_dir)) / LIB
        if not inside:
            raise ManifestError(f"{self.libs_path}: library {band.file} resolves to {real}, outside {self.lib}",
                                fix=self.fix_relink)
        if real.name != band.file:
            raise ManifestError(f"{self.libs_path}: library {band.file} is a symlink to {real.name}, another file in "
                                f"{self.lib}: a band must be its own plain file", fix=self.fix_relink)
        return path

    def read_band(self, band: Band) -> bytes:
        """The library inside ``band``, checked against both its digests.

        A folder's band is read through one descriptor that never follows a symlink."""
        if not self.reader.folder:
            rel = f"{self.arch}/{LIB}/{band.file}"
            try:
                data = self.reader.read_bytes(rel)
            except FileNotFoundError:
                raise IntegrityError(f"{self.reader.where(rel)} named by {self.name}/{LIBS_JSON} is not in the wheel",
                                     fix=self.fix_relink) from None
            return band.unpack(data, Path(self.reader.where(rel)), self.fix_relink)
        path = self.band_path(band)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except FileNotFoundError:
            raise self._missing_band(band, path) from None
        except OSError as e:  # ELOOP: a symlink where a band must be
            raise ManifestError(f"{path}: cannot open it as a plain file inside its lib/ folder ({e})",
                                fix=self.fix_relink) from None
        with os.fdopen(fd, "rb") as f:
            data = f.read()
        return band.unpack(data, path, self.fix_relink)

    def _missing_band(self, band: Band, path: Path) -> IntegrityError:
        """The error for a band this room's record names and lib/ no longer holds.

        When libs.json on disk no longer names it, the room was relinked
        after this object read it (a build or reinstall beside a running
        process): only a new process reads the new record."""
        try:
            now = {b.file for b in Room(self.root, self.arch, self.release, self.reader).links().bands}
        except AotError:
            now = None
        if self._links is not None and now is not None and band.file not in now:
            return IntegrityError(f"{path} is gone: {self.libs_path} was relinked after this process read it (it "
                                  f"now names other bands); a process reads its rooms once",
                                  fix="restart the process (vLLM): its next start serves the new bands")
        return IntegrityError(f"{path} is missing", fix=self.fix_relink)
