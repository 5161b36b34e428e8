"""A room, ``<dir>/<arch>/vllm-<release>/``: its paths, its records and its verdict.

A room reads each of its records once, through that record's one parser.
:meth:`Room.problems` is the one judge of whether a room is sound: the
loader, verify, link, build, the wheel gate and ``ci/check_wheel.py`` all ask
it. A room of a release this dsv41-aot does not know (written by a newer
version) is *foreign*: nothing judges, rewrites or deletes it.

Shared core: standard library only.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from pathlib import Path

from . import commands, pending
from .elf import ElfError, dynamic_info
from .errors import AotError, IntegrityError, ManifestError
from .facts.releases import RELEASES
from .manifest import (LIB, LIBS_JSON, MANIFEST, OBJECTS, PREFIX, TIMINGS, Manifest, atomic_write, read_timings,
                       room_dir, room_name, sha256_file)
from .manifest import folder_name  # noqa: F401 - tests and benches take a room folder's name from here
from .linkrecord import Band, LinkRecord
from .proof import NO_EVIDENCE, PROVEN, STALE, VERIFIED, Proof, flydsl_text

REINSTALL = "pip install --force-reinstall --no-deps dsv41-aot"  # a wheel's room: no objects/ to relink from
ROOM_RE = re.compile(re.escape(PREFIX) + r"(\d+\.\d+\.\d+)")


def _installed_digest() -> str | None:
    """The installed vLLM's mono sources digest (None: no vLLM with the mono package)."""
    from . import source

    try:
        return source.find().digest
    except AotError:
        return None


# the symbols a band may leave undefined besides hip*: what the ROCm host
# process (glibc, the C++ runtime's TLS) provides when the loader dlopens it
HOST_SYMBOLS = frozenset(
    "__tls_get_addr calloc malloc free realloc dlsym dlopen dlerror fprintf stderr abort memcpy memset "
    "strlen strcmp getenv pthread_mutex_init pthread_mutex_destroy pthread_mutex_lock pthread_mutex_unlock "
    "pthread_rwlock_rdlock pthread_rwlock_wrlock pthread_rwlock_unlock pthread_once __cxa_finalize "
    "_ITM_registerTMCloneTable _ITM_deregisterTMCloneTable __gmon_start__".split()
)


def library_problems(raw: bytes, entries: dict) -> tuple[list[str], dict]:
    """What the loader could not bind in a band's library: the one judge of a band's exports.

    ``entries`` maps a key to the entry symbol it launches. Returns
    (problems of the whole library: a DT_NEEDED, an undefined symbol no
    ROCm host provides; {key: what it lacks}: its entry or the entry's
    ``__module_load``, both of which the launcher binds). ElfError when
    the bytes are no ELF this reader knows."""
    info = dynamic_info(raw)
    whole = []
    if info["needed"]:
        whole.append(f"records DT_NEEDED {info['needed']}: it would tie users to this build machine's libraries")
    stray = sorted(s for s in info["undefined"] if not s.startswith("hip") and s not in HOST_SYMBOLS)
    if stray:
        whole.append(f"leaves undefined symbols no ROCm host provides: {', '.join(stray[:10])}")
    defined = set(info["defined"])
    lost = {key: " and ".join(s for s in (entry, f"{entry}__module_load") if s not in defined)
            for key, entry in entries.items() if entry}
    return whole, {k: v for k, v in lost.items() if v}


# ---------------------------------------------------------------- problems


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a room, naming its file, key and fix.

    ``serving``: the loader refuses the room for it. Otherwise only a
    builder cares (a missing object, an unreadable proof)."""

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
    def fix_proof(self) -> str:
        """The fix for a proof problem: prove again where the room was built (objects/ present), else reinstall."""
        return self.prove_cmd if self.built_here else REINSTALL

    @property
    def fix_relink(self) -> str:
        """The fix for a band or link problem: relink where the room was built, else reinstall the wheel."""
        return self.link_cmd if self.built_here else REINSTALL

    @property
    def fix_reinstall(self) -> str:
        """The fix for records and libraries that disagree: rebuild and relink where built, else reinstall."""
        return f"{self.build_cmd} && {self.link_cmd}" if self.built_here else REINSTALL

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
                self._manifest = Manifest.parse(data, where, self.arch_dir, self.arch, self.release, fix, timings)
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
                self._proof = Proof.parse(data, where, self.arch, self.release, self.fix_proof)
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

    # the verdict

    def problems(self, *, objects: bool = True, proof: bool = True) -> list[Problem]:
        """Every problem of this room; empty for a sound room.

        Always the manifest's, the link record's against it and each band's;
        ``objects`` the stored objects and ``proof`` verified.json (both
        builder-only problems)."""
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
        out += [p for key, e in sorted(man.entries.items()) if (p := self.link_problem(key, e, links.band_of.get(key)))]
        for key in sorted(set(links.band_of) - set(man.entries)):
            out.append(Problem("link", f"{key} is linked (in {links.band_of[key].file}) but not in {man.path}",
                               str(self.libs_path), self.fix_relink, key=key))
        for band in links.bands:
            out += self.band_problems(band, man)
        if objects and self.built_here:
            out += self.object_problems(man)
        return out

    def band_problems(self, band: Band, man: Manifest) -> list[Problem]:
        """What is wrong with ``band``: its path, its bytes, what :func:`library_problems` finds of its entries."""
        path = str(self.lib / band.file)
        entries = {key: e.entry for key in band.entries if (e := man.entries.get(key))}
        try:
            whole, lost = library_problems(self.read_band(band), entries)
        except (ManifestError, IntegrityError) as e:
            return [Problem("band", e.message, path, e.fix, band=band.file)]
        except ElfError:
            return []  # not an ELF this reader knows: dlopen judges it
        out = [Problem("band", f"{path} {what}", path, self.fix_relink, band=band.file) for what in whole]
        out += [Problem("band", f"{key} (vLLM {self.release}): {self.libs_path} lists it under {band.file}, which "
                                f"does not export {what}", str(self.libs_path), self.fix_relink, key=key, band=band.file)
                for key, what in sorted(lost.items())]
        return out

    def link_problem(self, key: str, e, band: Band | None) -> Problem | None:
        """Why ``band`` (libs.json's for ``key``, None: no band) does not link the object entry ``e`` names; else None.

        The fix is the one that works: relink when the object was rebuilt
        after the link, rebuild when the entry no longer describes its object,
        reinstall where there are no objects (a wheel's room)."""
        if band is not None and band.entries[key] == e.sha256:
            return None
        what = (f"{key} (vLLM {self.release}) is in {self.manifest_path} but no library of {self.libs_path} links it"
                if band is None else
                f"{key} (vLLM {self.release}): not linked from its object: {self.libs_path} links it from object "
                f"{band.entries[key][:16]}, {self.manifest_path} records object sha256 {e.sha256[:16]}")
        problem = functools.partial(Problem, "link", file=str(self.libs_path), key=key, band=band and band.file)
        if not self.built_here:
            return problem(f"{what}: the installed manifest and libraries disagree", fix=REINSTALL)
        try:
            actual = sha256_file(self.arch_dir / e.object)
        except OSError:
            actual = None
        if actual == e.sha256:
            return problem(f"{what}: the object was rebuilt after the last link", fix=self.link_cmd)
        stored = "is missing" if actual is None else f"has sha256 {actual[:16]}, not the manifest's"
        rebuild = commands.build(self.root, release=self.release, keys=[key])
        return problem(f"{what}; the stored object {e.object} {stored}: the manifest entry no longer describes its "
                       f"object", fix=f"{rebuild} && {self.link_cmd}")

    def problem_keys(self, p: Problem) -> list[str]:
        """The keys problem ``p`` of this room concerns: its own, its band's, else every key (the room's records).

        AotError when the room's records cannot say (an unreadable manifest or libs.json)."""
        if p.key:
            return [p.key]
        if p.band:
            return sorted(k for k, band in self.links().band_of.items() if band.file == p.band)
        return sorted(self.manifest().entries)

    def proof_problems(self) -> list[Problem]:
        """An unreadable verified.json (its fix proves the room again)."""
        try:
            self.proof()
        except ManifestError as e:
            return [Problem("proof", e.message, str(self.verified_path), e.fix, serving=False)]
        return []

    def object_problems(self, man: Manifest) -> list[Problem]:
        """Stored objects missing or altered (the room still serves from its bands)."""
        out = []
        for key in sorted(man.entries):
            try:
                man.check_object(key)
            except IntegrityError as e:
                out.append(Problem("object", e.message, str(man.object_path(key)), e.fix,
                                   key=key, serving=False))
        return out

    def _source_problems(self, man: Manifest) -> list[Problem]:
        """The problem of a room whose entries mix source identities (no installed vLLM matches a mix), else [].

        Entries that differ only in FlyDSL or linker (``SourceIdentity.served``) are of one source: each kept its
        object because its GPU code object is unchanged."""
        sources: dict = {}
        for key, e in sorted(man.entries.items()):
            sources.setdefault(e.source.served, []).append(key)
        if len(sources) < 2:
            return []
        options = pending.options(self.arch_dir)  # a stopped build's own --matrix / --vllm-src: its source wins
        installed = None if options else _installed_digest()
        keep = next((ks for ks in sources.values() if installed
                     and man.entries[ks[0]].source.mono_sources == installed), None)
        rebuild = sorted(k for ks in sources.values() if ks is not keep for k in ks) if keep else \
            min(sources.values(), key=len)
        how = "" if options else (
            f"; the fix rebuilds them from the installed vLLM (mono sources {installed}); to keep theirs instead, "
            f"build the other keys with --vllm-src and --matrix naming their tree" if keep else
            "; no source is the installed vLLM's: the fix rebuilds the fewest from it; pass --vllm-src and "
            "--matrix to build from another tree")
        return [Problem("sources", f"{man.path} mixes {len(sources)} source identities ({len(rebuild)} key(s) "
                                   f"differ from the rest, e.g. {rebuild[0]}){how}", str(man.path),
                        commands.build(self.root, release=self.release, keys=rebuild, options=options))]


def proof_counts(root: Path, man: Manifest) -> tuple[dict, list, str | None]:
    """Count one room's keys by proof state: (``proofs`` entry, problems, warning).

    The one count build, list and verify report. An unreadable verified.json
    gives its problem instead of counts; the file is read anew (a fresh Room),
    so counts made after a record see what it wrote."""
    room = Room(root, man.arch, man.release)
    head = {"arch": man.arch, "release": man.release}
    bad = room.proof_problems()
    if bad:
        return dict(head, keys=len(man.entries), error=bad[0].message), bad, None
    proof = room.proof()
    counts = dict(proof.counts(man.entries), by_flydsl=proof.flydsl_counts(man.entries))
    notes = []
    if counts[NO_EVIDENCE]:
        notes.append(f"{counts[NO_EVIDENCE]} proof(s) carry no evidence only a JIT run produced (verified.json "
                     f"version 1, written by an older dsv41-aot, or copied)")
    if counts[STALE]:
        why = ", ".join(f"{what} changed ({n})" for what, n in sorted(proof.changes(man.entries).items()))
        notes.append(f"{counts[STALE]} proof(s) are stale: {why}")
    how = (f"prove them again: {room.prove_cmd}" if room.built_here else
           f"the room ships without objects/: prove them from its bands, {room.prove_cmd}")
    warning = f"{room.verified_path}: {'; '.join(notes)}; {how}" if notes else None
    return dict(head, **counts), [], warning


def proofs_line(counted: dict) -> str:
    """A :func:`proof_counts` entry as the one line build, list and verify print."""
    head = f"proofs {counted['arch']} vLLM {counted['release']}"
    if "error" in counted:
        return f"{head}: {VERIFIED} unreadable ({counted['error']})"
    more = "".join(f", {counted[f]} {what}" for f, what in (
        (NO_EVIDENCE, "without JIT-only evidence (old format)"), (STALE, "stale")) if counted[f])
    return (f"{head}: {counted[PROVEN]} of {counted['keys']} keys carry a proof against vLLM's JIT matching their "
            f"entry{more}{flydsl_text(counted.get('by_flydsl') or {})}")
