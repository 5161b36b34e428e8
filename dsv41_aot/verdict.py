"""The verdict on a room: every problem it has, each naming its key, its file and its fix.

:func:`problems` is the one judge the loader, verify, link, build and the wheel gates ask. Shared core: stdlib only."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from . import commands, pending
from .elf import ElfError, dynamic_info, embedded_code_objects
from .errors import AotError, IntegrityError, ManifestError
from .linkrecord import Band, kernel_problem
from .manifest import LIBS_JSON, Manifest, sha256_file
from .proof import NO_EVIDENCE, PROVEN, STALE, VERIFIED, flydsl_text
from .room import Room


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
    exported = set(info["exported"])
    lost = {key: " and ".join(s for s in (entry, f"{entry}__module_load") if s not in exported)
            for key, entry in entries.items() if entry}
    return whole, {k: v for k, v in lost.items() if v}


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


def problems(room: Room, *, objects: bool = True, proof: bool = True, bands: bool = True) -> list[Problem]:
    """Every problem of this room; empty for a sound room.

    Always the manifest's and the link record's against it; ``bands`` each
    band's (the loader judges a band when it binds it); ``objects`` the
    stored objects and ``proof`` verified.json (both builder-only problems)."""
    if not room.known:
        return []
    try:
        man = room.manifest()
    except ManifestError as e:  # a build recovers it from objects/; a wheel's room is restored
        return [Problem("manifest", e.message, str(room.manifest_path), e.fix if room.built_here else room.fix_restore)]
    out = _source_problems(room, man)
    if proof:
        out += proof_problems(room)
    if not room.has(LIBS_JSON) and not man.entries:
        return out  # nothing built here (only refused keys): nothing to link or load
    try:
        links = room.links()
    except ManifestError as e:
        return out + [Problem("libs", e.message, str(room.libs_path), e.fix)]
    out += [p for key, e in sorted(man.entries.items()) if (p := link_problem(room, key, e, links.band_of.get(key)))]
    for key in sorted(set(links.band_of) - set(man.entries)):
        out.append(Problem("link", f"{key} is linked (in {links.band_of[key].file}) but not in {man.path}",
                           str(room.libs_path), room.fix_relink, key=key))
    for band in links.bands if bands else ():
        out += band_problems(room, band, man)
    if objects and room.built_here:
        out += object_problems(man)
    return out


def band_problems(room: Room, band: Band, man: Manifest, raw: bytes | None = None) -> list[Problem]:
    """What is wrong with ``band``: its path, its bytes, what :func:`library_problems` finds of its entries.

    ``raw``: the library the caller read from it (``Room.read_band``)."""
    path = str(room.lib / band.file)
    entries = {key: e.entry for key in band.entries if (e := man.entries.get(key))}
    try:
        raw = room.read_band(band) if raw is None else raw
        whole, lost = library_problems(raw, entries)
    except (ManifestError, IntegrityError) as e:
        return [Problem("band", e.message, path, e.fix, band=band.file)]
    except ElfError:
        return []  # not an ELF this reader knows: dlopen judges it
    out = [Problem("band", f"{path} {what}", path, room.fix_relink, band=band.file) for what in whole]
    out += [Problem("band", f"{key} (vLLM {room.release}): {room.libs_path} lists it under {band.file}, which "
                            f"does not export {what}", str(room.libs_path), room.fix_relink, key=key, band=band.file)
            for key, what in sorted(lost.items())]
    codes = embedded_code_objects(raw)  # each key's code object must hold its kernel (kernel_problem)
    out += [Problem("band", f"{key} (vLLM {room.release}): {path} {why}", path, room.fix_relink, key=key,
                    band=band.file) for key in sorted(entries)
            if (why := kernel_problem(codes, man.entries[key], room.release))]
    return out


def link_problem(room: Room, key: str, e, band: Band | None) -> Problem | None:
    """Why ``band`` (libs.json's for ``key``, None: no band) does not link the object entry ``e`` names; else None.

    The fix is the one that works: relink when the object was rebuilt
    after the link, rebuild when the entry no longer describes its object,
    restore where there are no objects (a wheel's room)."""
    if band is not None and band.entries[key] == e.sha256:
        return None
    what = (f"{key} (vLLM {room.release}) is in {room.manifest_path} but no library of {room.libs_path} links it"
            if band is None else
            f"{key} (vLLM {room.release}): not linked from its object: {room.libs_path} links it from object "
            f"{band.entries[key][:16]}, {room.manifest_path} records object sha256 {e.sha256[:16]}")
    problem = functools.partial(Problem, "link", file=str(room.libs_path), key=key, band=band and band.file)
    if not room.built_here:
        return problem(f"{what}: the installed manifest and libraries disagree", fix=room.fix_restore)
    try:
        actual = sha256_file(room.arch_dir / e.object)
    except OSError:
        actual = None
    if actual == e.sha256:
        return problem(f"{what}: the object was rebuilt after the last link", fix=room.link_cmd)
    stored = "is missing" if actual is None else f"has sha256 {actual[:16]}, not the manifest's"
    rebuild = commands.build(room.root, release=room.release, keys=[key])
    return problem(f"{what}; the stored object {e.object} {stored}: the manifest entry no longer describes its "
                   f"object", fix=f"{rebuild} && {room.link_cmd}")


def problem_keys(room: Room, p: Problem) -> list[str]:
    """The keys problem ``p`` of this room concerns: its own, its band's, else every key (the room's records).

    AotError when the room's records cannot say (an unreadable manifest or libs.json)."""
    if p.key:
        return [p.key]
    if p.band:
        return sorted(k for k, band in room.links().band_of.items() if band.file == p.band)
    return sorted(room.manifest().entries)


def proof_problems(room: Room) -> list[Problem]:
    """An unreadable verified.json (its fix proves the room again)."""
    try:
        room.proof()
    except ManifestError as e:
        return [Problem("proof", e.message, str(room.verified_path), e.fix, serving=False)]
    return []


def object_problems(man: Manifest) -> list[Problem]:
    """Stored objects missing or altered (the room still serves from its bands)."""
    out = []
    for key in sorted(man.entries):
        try:
            man.check_object(key)
        except IntegrityError as e:
            out.append(Problem("object", e.message, str(man.object_path(key)), e.fix,
                               key=key, serving=False))
    return out


def _source_problems(room: Room, man: Manifest) -> list[Problem]:
    """The problem of a room whose entries mix source identities (no installed vLLM matches a mix), else [].

    Entries that differ only in FlyDSL or linker (``SourceIdentity.served``) are of one source: each kept its
    object because its GPU code object is unchanged."""
    sources: dict = {}
    for key, e in sorted(man.entries.items()):
        sources.setdefault(e.source.served, []).append(key)
    if len(sources) < 2:
        return []
    options = pending.options(room.arch_dir)  # a stopped build's own --matrix / --vllm-src: its tree rebuilds the room
    from . import source

    try:  # the installed vLLM's mono sources digest (None: no vLLM with the mono package)
        installed = None if options else source.find().digest
    except AotError:
        installed = None
    keep = next((ks for ks in sources.values() if installed
                 and man.entries[ks[0]].source.mono_sources == installed), None)
    rebuild = sorted(k for ks in sources.values() if ks is not keep for k in ks) if keep else \
        min(sources.values(), key=len)
    how = (f"; the fix builds every key from the tree of the stopped build ({pending.PENDING})" if options else
           f"; the fix rebuilds them from the installed vLLM (mono sources {installed}); to keep theirs instead, "
           f"build the other keys with --vllm-src and --matrix naming their tree" if keep else
           "; no source is the installed vLLM's: the fix rebuilds the fewest from it; pass --vllm-src and "
           "--matrix to build from another tree")
    return [Problem("sources", f"{man.path} mixes {len(sources)} source identities ({len(rebuild)} key(s) "
                               f"differ from the rest, e.g. {rebuild[0]}){how}", str(man.path),
                    commands.build(room.root, release=room.release, keys=sorted(man.entries) if options else rebuild,
                                   options=options))]


def proof_counts(root: Path, man: Manifest) -> tuple[dict, list, str | None]:
    """Count one room's keys by proof state: (``proofs`` entry, problems, warning).

    The one count build, list and verify report. An unreadable verified.json
    gives its problem instead of counts; the file is read anew (a fresh Room),
    so counts made after a record see what it wrote."""
    room = Room(root, man.arch, man.release)
    head = {"arch": man.arch, "release": man.release}
    bad = proof_problems(room)
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
