"""A room: ``<dir>/<arch>/vllm-<release>/``, the keys of one vLLM release on
one arch, and the one judge of whether it can serve.

A room owns its paths (its records manifest.json, libs.json, timings.json
and verified.json; the arch's ``objects/`` and ``lib/``, shared with the
arch's other rooms) and reads each record once through its one parser.
:meth:`Room.problems` lists every problem it can have, typed, each naming
its file (and key) and the command that fixes it. Everything that judges a
room asks it: the loader (the band it binds), ``dsv41-aot verify``,
``link`` (relinks a band with a problem), ``build``, the wheel gate
(``ci/prebuilt.py``), ``verify --wheel`` and ``ci/check_wheel.py`` (a
wheel's room, read through :class:`ZipReader`).

A room of a release this dsv41-aot does not know (written by a newer
version) is *foreign*: nobody judges, rewrites or deletes it. Shared core:
standard library only.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from . import pending
from .elf import ElfError, dynamic_info
from .errors import AotError, IntegrityError, ManifestError
from .facts.releases import RELEASES
from .manifest import LIB, LIBS_JSON, MANIFEST, OBJECTS, PREFIX, TIMINGS, Manifest, atomic_write, folder_name
from .linkrecord import Band, LinkRecord
from .proof import VERIFIED, Proof

REINSTALL = "pip install --force-reinstall --no-deps dsv41-aot"  # a wheel's room: no objects/ to relink from
ROOM_RE = re.compile(re.escape(PREFIX) + r"(\d+\.\d+\.\d+)")


def room_dir(arch_dir: Path, release: str) -> Path:
    """The folder of ``release``'s keys in an arch folder (a release this
    dsv41-aot does not know has one too: Room leaves it as it is)."""
    return Path(arch_dir) / folder_name(release)


# ---------------------------------------------------------------- problems


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a room. ``serving``: the loader refuses it (a
    user of the room hits it); otherwise only a builder cares (objects/ is
    not shipped, a key that cannot be resident is reported apart)."""

    what: str  # a stable name: "manifest", "libs", "band", "link", "sources", "object", ...
    message: str
    file: str | None
    fix: str
    key: str | None = None
    band: str | None = None  # the band file it concerns (the loader checks only the one it binds)
    serving: bool = True

    def error(self) -> AotError:
        cls = IntegrityError if self.what in ("band", "object") else ManifestError
        return cls(self.message, fix=self.fix)

    def as_dict(self) -> dict:
        return {"what": self.what, "key": self.key, "file": self.file, "error": self.message, "fix": self.fix,
                "serving": self.serving}


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
    """Reads the members of a wheel's prebuilt directory (``prefix``) by their
    path inside that directory, as FolderReader reads a folder's files."""

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
    """``<root>/<arch>/vllm-<release>/``: one room's paths and the reading of
    its records, from a folder (the default) or through ``reader`` (a
    wheel's members: ZipReader). ``release`` is always given."""

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

    @classmethod
    def at(cls, folder: Path) -> "Room":
        """The room whose folder is ``folder`` (``<root>/<arch>/vllm-<release>``)."""
        folder = Path(folder)
        m = ROOM_RE.fullmatch(folder.name)
        if not m:
            raise ManifestError(f"{folder} is not a room folder (<arch>/vllm-<release>)",
                                fix="name the folder of one vLLM release's keys, <dir>/<arch>/vllm-<release>")
        return cls(folder.parent.parent, folder.parent.name, m.group(1))

    def __repr__(self) -> str:
        return f"Room({self.name} in {self.root})"

    @property
    def name(self) -> str:
        """``<arch>/vllm-<release>``: how messages and reports name the room."""
        return f"{self.arch}/{self.dir.name}"

    @property
    def known(self) -> bool:
        """A release of this dsv41-aot's facts (a foreign room is left as it is)."""
        return self.release in RELEASES

    @property
    def built_here(self) -> bool:
        """Stored objects are present: the room can be relinked and rebuilt
        (a wheel's room ships without objects/)."""
        return self.reader.folder and self.objects.is_dir()

    def _record(self, name: str) -> tuple[bytes | None, str]:
        """One of the room's records (``<arch>/vllm-<release>/<name>``), read
        through its reader: its bytes (None when absent) and how errors name it."""
        rel = f"{self.name}/{name}"
        try:
            return self.reader.read_bytes(rel), self.reader.where(rel)
        except FileNotFoundError:
            return None, self.reader.where(rel)

    # fixes: each a command, run as printed

    @property
    def link_cmd(self) -> str:
        return f"dsv41-aot link --dir {self.root} --arch {self.arch} --release {self.release}"

    @property
    def build_cmd(self) -> str:  # an unfinished build's own keys and options, when the arch records one
        return (pending.command(self.arch_dir, self.root, self.release)
                or f"dsv41-aot build --arch {self.arch} --release {self.release} --out {self.root}")

    @property
    def prove_cmd(self) -> str:
        """Proves the room's keys against vLLM's JIT again and rewrites its
        verified.json (an unreadable one is set aside first)."""
        return f"dsv41-aot verify --against-jit --record --dir {self.root} --release {self.release}"

    @property
    def fix_proof(self) -> str:
        """Prove it again where it was built (objects/ present: the JIT is
        compared with them), else reinstall the wheel."""
        return self.prove_cmd if self.built_here else REINSTALL

    @property
    def fix_relink(self) -> str:
        """Relink where it was built (objects/ present: link replaces a band
        or link record with a problem), else reinstall the wheel."""
        return self.link_cmd if self.built_here else REINSTALL

    @property
    def fix_reinstall(self) -> str:
        """Rebuild where it was built (objects/ present), else reinstall the wheel."""
        return f"{self.build_cmd} && {self.link_cmd}" if self.built_here else REINSTALL

    # records, parsed once

    def manifest(self, *, missing_ok: bool = False) -> Manifest:
        """The room's manifest.json, read once by its one parser (ManifestError
        when unreadable; an empty one when absent and ``missing_ok``). A
        builder's fix rebuilds it (a build sets a corrupt manifest aside and
        recovers its entries from the stored objects); a wheel's reinstalls."""
        if self._manifest is None:
            data, where = self._record(MANIFEST)
            fix = self.build_cmd if self.reader.folder else REINSTALL
            if data is None:
                if not missing_ok:
                    raise ManifestError(f"no manifest at {where}", fix=fix)
                self._manifest = Manifest(self.arch_dir, self.arch, release=self.release)
            else:
                self._manifest = Manifest.parse(data, where, self.arch_dir, self.arch, self.release, fix)
        return self._manifest

    def links(self) -> LinkRecord:
        """The room's libs.json, read once by its one parser (linkrecord.LinkRecord)."""
        if self._links is None:
            data, where = self._record(LIBS_JSON)
            if data is None:
                raise ManifestError(f"{where} is missing: the objects of {self.arch_dir} were never linked",
                                    fix=self.fix_relink)
            self._links = LinkRecord.parse(data, where, self.arch, self.release, self.fix_relink)
        return self._links

    def write_links(self, record: LinkRecord) -> None:
        """Replace the room's libs.json with ``record`` (atomically)."""
        atomic_write(self.libs_path, record.to_bytes())
        self._links = record

    def proof(self) -> Proof:
        """The room's verified.json (an empty record when there is none)."""
        if self._proof is None:
            data, where = self._record(VERIFIED)
            if data is None:
                self._proof = Proof(self.arch, self.release, {})
            else:
                self._proof = Proof.parse(data, where, self.arch, self.release, self.fix_proof)
        return self._proof

    def has(self, name: str) -> bool:
        """The room holds the record ``name`` (a file, or a wheel's member)."""
        return self.reader.has(f"{self.name}/{name}")

    def band_path(self, band: Band) -> Path:
        """The band's path, which must resolve to a file directly inside the
        arch folder's own lib/ (no symlinked band or lib/ leading elsewhere)."""
        path = self.lib / band.file
        real = Path(os.path.realpath(path))
        inside = not self.lib.is_symlink() and real.parent == Path(os.path.realpath(self.arch_dir)) / LIB
        if not inside:
            raise ManifestError(f"{self.libs_path}: library {band.file} resolves to {real}, outside {self.lib}",
                                fix=self.fix_band)
        if real.name != band.file:
            raise ManifestError(f"{self.libs_path}: library {band.file} is a symlink to {real.name}, another file in "
                                f"{self.lib}: a band must be its own plain file", fix=self.fix_band)
        return path

    @property
    def fix_band(self) -> str:
        """A band with a problem: link writes it again (a symlinked lib/
        folder is replaced by a real one)."""
        return self.fix_relink

    def read_band(self, band: Band) -> bytes:
        """The library inside ``band``, read through one descriptor that
        never follows a symlink (a wheel's: its member), and checked twice
        (sha256, raw_sha256)."""
        if not self.reader.folder:
            rel = f"{self.arch}/{LIB}/{band.file}"
            try:
                data = self.reader.read_bytes(rel)
            except FileNotFoundError:
                raise IntegrityError(f"{self.reader.where(rel)} named by {self.name}/{LIBS_JSON} is not in the wheel",
                                     fix=self.fix_band) from None
            return band.unpack(data, Path(self.reader.where(rel)), self.fix_band)
        path = self.band_path(band)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except FileNotFoundError:
            raise IntegrityError(f"{path} is missing", fix=self.fix_band) from None
        except OSError as e:  # ELOOP: a symlink where a band must be
            raise ManifestError(f"{path}: cannot open it as a plain file inside its lib/ folder ({e})",
                                fix=self.fix_band) from None
        with os.fdopen(fd, "rb") as f:
            data = f.read()
        return band.unpack(data, path, self.fix_band)

    # the verdict

    def problems(self, *, bands: bool = True, objects: bool = True, proof: bool = True) -> list[Problem]:
        """Every problem of this room: the manifest's, the link record's
        against it, each band's (``bands``: read, decompressed and checked
        to export its keys' entries), the stored objects' (``objects``;
        builder-only problems), an unreadable verified.json (``proof``; a
        builder's problem too: the loader never reads it). Empty for a
        sound room."""
        if not self.known:
            return []
        try:
            man = self.manifest()
        except ManifestError as e:  # a build recovers it from objects/; a wheel's room is reinstalled
            return [Problem("manifest", e.message, str(self.manifest_path),
                            e.fix if self.built_here else REINSTALL)]
        out = self._source_problems(man)
        if proof:
            out += self.proof_problems()
        if not self.has(LIBS_JSON) and not man.entries:
            return out  # nothing built here (only refused keys): nothing to link or load
        try:
            links = self.links()
        except ManifestError as e:
            return out + [Problem("libs", e.message, str(self.libs_path), e.fix)]
        for key, e in sorted(man.entries.items()):
            band = links.band_of.get(key)
            if band is None:
                out.append(Problem("link", f"{key} is in {man.path} but no library links it", str(self.libs_path),
                                   self.fix_relink, key=key))
            elif band.entries[key] != e.sha256:
                out.append(Problem("link", f"{key} (vLLM {self.release}): not linked from its object: {self.libs_path} "
                                           f"links it from object {band.entries[key][:16]}, the manifest names "
                                           f"{e.sha256[:16]}", str(self.libs_path),
                                   self.fix_relink, key=key, band=band.file))
        for key in sorted(set(links.band_of) - set(man.entries)):
            out.append(Problem("link", f"{key} is linked (in {links.band_of[key].file}) but not in {man.path}",
                               str(self.libs_path), self.fix_relink, key=key))
        if bands:
            for band in links.bands:
                out += self.band_problems(band, man)
        if objects and self.built_here:
            out += self.object_problems(man)
        return out

    def band_problems(self, band: Band, man: Manifest | None = None) -> list[Problem]:
        """What is wrong with ``band``: its path and bytes (what the loader
        refuses), a DT_NEEDED (it would tie users to the build machine's
        libraries) and (with ``man``) an entry of its keys it does not export."""
        try:
            raw = self.read_band(band)
            needed = dynamic_info(raw)["needed"]
        except (ManifestError, IntegrityError) as e:
            return [Problem("band", e.message, str(self.lib / band.file), e.fix, band=band.file)]
        except (ElfError, IndexError):
            needed = []  # not an ELF this reader knows: dlopen judges it
        out = []
        if needed:
            out.append(Problem("band", f"{self.lib / band.file} records DT_NEEDED {needed}: it would tie users to "
                                       f"this build machine's libraries", str(self.lib / band.file), self.fix_relink,
                               band=band.file))
        for key in sorted(band.entries):
            e = man.entries.get(key) if man else None
            if e and e.entry and (e.entry.encode() + b"\0") not in raw:
                out.append(Problem("band", f"{key} (vLLM {self.release}): {self.libs_path} lists it under {band.file}, "
                                           f"which does not export {e.entry}", str(self.libs_path), self.fix_relink,
                                   key=key, band=band.file))
        return out

    def proof_problems(self) -> list[Problem]:
        """An unreadable verified.json (its fix proves the room again)."""
        try:
            self.proof()
        except ManifestError as e:
            return [Problem("proof", e.message, str(self.verified_path), e.fix, serving=False)]
        return []

    def object_problems(self, man: Manifest) -> list[Problem]:
        """Stored objects missing or altered: a builder's problem (the room
        still serves from its bands; build compiles them again)."""
        out = []
        for key in sorted(man.entries):
            try:
                man.check_object(key)
            except IntegrityError as e:
                out.append(Problem("object", e.message, str(man.object_path(key)), e.fix,
                                   key=key, serving=False))
        return out

    def _source_problems(self, man: Manifest) -> list[Problem]:
        """One source identity a room: no installed vLLM matches a mix."""
        sources: dict = {}
        for key, e in sorted(man.entries.items()):
            sources.setdefault(json.dumps(e.source, sort_keys=True), []).append(key)
        if len(sources) < 2:
            return []
        fewest = min(sources.values(), key=len)
        return [Problem("sources", f"{man.path} mixes {len(sources)} source identities ({len(fewest)} key(s) "
                                   f"differ from the rest, e.g. {fewest[0]})", str(man.path),
                        pending.rebuild_cmd(self.root, self.release, fewest, pending.options(self.arch_dir)))]
