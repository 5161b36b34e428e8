"""A room while a build writes it: its source identity, and which keys are up to date.

Also the rule that a room holds keys of one source, and keys taken from the
build cache.
"""

from __future__ import annotations

from pathlib import Path

from .. import commands, source
from . import toolmove
from ..errors import AotError, ManifestError, message_of
from ..keys import BuildKey
from ..manifest import Manifest, SourceIdentity
from ..room import Room
from .cache import COMPILE
from .compiler import describe_object, store_object
from .integrity import check_entry
from .recover import recover, recovered


def up_to_date(m: Manifest, key: BuildKey, ident: SourceIdentity) -> bool:
    """Whether the key's entry is what a clean build would write.

    It must have the same source identity, not be recovered from its object
    (``recover.recovered``), and pass ``integrity.check_entry``, so that
    verify's fix ``build --key`` fixes it."""
    e = m.entries.get(str(key))
    if e is None or e.source != ident or recovered(e):
        return False
    return check_entry(m, str(key))[0].ok


class RoomState:
    """One room's manifest during a build, under its arch's lock.

    Its keys are built from ``src`` under source identity ``ident``. A corrupt
    manifest is set aside and rebuilt from the stored objects (aot/recover.py)."""

    def __init__(self, out: Path, arch: str, release: str, src: source.MonoSource, ident: SourceIdentity,
                 reports: list, log):
        self.room = Room(out, arch, release)
        self.src, self.ident = src, ident
        try:
            self.manifest = self.room.manifest(missing_ok=True)
        except ManifestError as e:
            self.manifest, report = recover(self.room, ident)
            reports.append(report)
            print(f"warning: {e.message}\n  set aside as {report['set_aside']}; "
                  f"{report['recovered']} entries recovered from {self.room.objects}"
                  + (f", {len(report['skipped'])} objects not (their keys compile again)" if report["skipped"] else "")
                  + ("; no object holds FlyDSL's unstripped export size (export_bytes): the recovered keys are taken "
                     "from the build cache or compiled again" if report["recovered"] else ""),
                  file=log, flush=True)
        self.dirty = self.manifest.migrated  # compile seconds still in the manifest: move them out
        self.moved: dict = {}  # key -> its entry built under another toolchain, compiled now to compare (aot/toolmove.py)


def check_one_source(states: dict, keys: list, options=()) -> None:
    """Refuse a build that would leave a room holding keys of two source identities.

    Exit 2, before anything is written. Every key built from another identity
    must be in the build too, unless it moved toolchain only and is proven
    under this FlyDSL. The fix
    carries the build's own ``options`` (``--matrix``, ``--vllm-src``)."""
    asked: dict = {}
    for k in keys:
        asked.setdefault(k.room, set()).add(str(k))
    for room, st in states.items():
        stale = sorted(k for k, e in st.manifest.entries.items() if e.source != st.ident and k not in asked[room]
                       and not _toolchain_moved_and_proven(st, e))
        if not stale:
            continue
        was = st.manifest.entries[stale[0]].source
        rebuild = commands.build(st.room.root, release=st.room.release, keys=asked[room] | set(stale), options=options)
        if all(st.manifest.entries[k].source.served == st.ident.served for k in stale):
            raise AotError(
                f"{st.manifest.room}: {len(stale)} key(s) of vLLM {st.room.release} on {st.room.arch} were built with "
                f"FlyDSL {was.flydsl_version} (linker {was.linker}), this build's is "
                f"{st.ident.flydsl_version} (linker {st.ident.linker}), and no proof under this FlyDSL says "
                f"their GPU code objects are unchanged; building only some keys could leave the room serving code "
                f"of two toolchains",
                fix=f"prove the room under this FlyDSL first (dsv41-aot verify --dir {st.room.root} --against-jit "
                    f"--record), or build the whole room (each key compiles once and keeps its object where its code "
                    f"object is unchanged): " + rebuild)
        raise AotError(
            f"{st.manifest.room}: {len(stale)} key(s) of vLLM {st.room.release} on {st.room.arch} were built from "
            f"mono sources {was.mono_sources} (vLLM {was.vllm_version}), this build's are "
            f"{st.ident.mono_sources} (vLLM {st.ident.vllm_version}); {', '.join(was.differences(st.ident))} differ. "
            f"Building only some keys would leave the room of two sources, which no installed vLLM matches",
            fix="rebuild the whole room: " + rebuild)


def _toolchain_moved_and_proven(st: RoomState, e) -> bool:
    """Whether ``e`` differs from the build's identity only in FlyDSL or linker, and is proven under this FlyDSL.

    Only such a key may stay beside the build's keys: any other difference
    (vLLM's sources, the helpers) makes a room no installed vLLM matches,
    whatever its proofs say."""
    return e.source.served == st.ident.served and toolmove.proven_under(st.room, e, st.ident.flydsl_version)


def cache_hit(store, st: RoomState, key: BuildKey) -> tuple | None:
    """``key``'s object in the build cache, checked like a compile: (entry, ABI, seconds, bytes).

    None without a cache, on a miss, or when its blob fails the checks (the
    record is then dropped)."""
    hit = store.get(COMPILE, key, st.ident) if store is not None else None
    if hit is None:
        return None
    rec, data = hit
    try:
        entry, abi = describe_object(key, data, st.ident)
    except (AotError, ValueError) as e:  # an intact blob, but not this key's object (elf.ElfError is a ValueError)
        store.reject(COMPILE, key, st.ident, f"names a blob that is not its object ({message_of(e)})")
        return None
    return entry.replace(export_bytes=rec["export_bytes"]), abi, rec["seconds"], data


def take_from_cache(st: RoomState, key: BuildKey, hit: tuple) -> None:
    """Store a ``cache_hit`` as ``key``'s object and entry in its room."""
    entry, abi, seconds, data = hit
    store_object(st.room.arch_dir, entry, data)
    st.manifest.put(entry, abi, seconds=seconds)  # timings keep what the compile took
    st.manifest.refused.pop(str(key), None)
    st.dirty = True
