"""Parallel, incremental, resumable and cached builds of a list of keys.

Keys compile on the worker pool (``aot/workers.py``). A key is up to date
when its entry has the same source identity and its stored object still
hashes to the entry's sha256. Objects and manifests are replaced atomically,
the manifests at least once a second, so a kill leaves a consistent folder.
With a build cache (``aot/cache.py``) a key seen before is copied, not
compiled. See docs/building.md ("Commands").
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .. import pending, source
from . import toolchain, toolmove
from .buildroom import RoomState, cache_hit, check_one_source, take_from_cache, up_to_date
from .cache import COMPILE, BuildCache
from .compiler import source_identity, worker_env
from ..errors import AotError, OutputDirError
from ..keys import BuildKey, by_release
from ..listing import folder_problems
from ..verdict import proof_counts
from .lock import arch_lock
from .output import progress_bar, tally
from .residency import spill_notes
from .workers import Pool, check_jobs, check_key_timeout

FLUSH_SECONDS = 1.0
# failures a rerun may not repeat: never remembered as the source's refusal
_TRANSIENT = {"MemoryError", "OSError", "FileNotFoundError", "PermissionError", "TimeoutError", "InterruptedError"}


@dataclass
class Summary:
    """What a build did, counted per key; ``as_dict`` is its --json document."""

    keys: int = 0
    compiled: int = 0
    cached: int = 0  # copied from the build cache (aot/cache.py), not compiled
    up_to_date: int = 0
    failed: int = 0
    wall_seconds: float = 0.0
    compile_seconds: float = 0.0  # worker seconds over the keys compiled (or refused) in this run
    jobs: int = 1
    libraries: int = 0  # linked libraries the built arches hold
    failures: list = field(default_factory=list)  # [{"key", "error"}]
    # keys built (or up to date) whose code object uses scratch:
    # {"key", "release", "scratch_bytes", "vgpr_spills", "sgpr_spills"}
    spills: list = field(default_factory=list)
    recovered: list = field(default_factory=list)  # corrupt manifests set aside: recover.recover's reports
    # per room with a verified.json: its keys counted by proof state, or its "error"
    proofs: list = field(default_factory=list)
    # keys built before under another FlyDSL (aot/toolmove.py), each {"key", "release"}: "kept" when
    # this toolchain compiles the same GPU code object (its stored object, entry and bands stay), "changed"
    # when it differs (rebuilt). A key kept is counted as what this run did to tell: compiled, taken from
    # the cache, or up to date when its proof under this FlyDSL told
    kept: list = field(default_factory=list)
    changed: list = field(default_factory=list)
    warnings: list = field(default_factory=list)  # what was printed as "warning: ..." (the build cache's)

    def keep(self, key: BuildKey, told_by: str) -> None:
        """Count ``key`` kept (its GPU code object is unchanged); ``told_by`` is "compiled", "cached" or "proof"."""
        if told_by == "compiled":
            self.compiled += 1
        elif told_by == "cached":
            self.cached += 1
        else:
            self.up_to_date += 1
        self.kept.append({"key": str(key), "release": key.release})

    def rebuilt(self, key: BuildKey) -> None:
        """Name ``key`` among those whose GPU code object under this toolchain differs (counted by its caller)."""
        self.changed.append({"key": str(key), "release": key.release})

    def as_dict(self) -> dict:
        """The --json document, in aot/output.py's shared counts."""
        return tally(
            self.keys, self.compiled + self.cached + self.up_to_date, self.failures,
            compiled=self.compiled,
            cached=self.cached,
            up_to_date=self.up_to_date,
            wall_seconds=round(self.wall_seconds, 3),
            compile_seconds=round(self.compile_seconds, 3),
            jobs=self.jobs,
            libraries=self.libraries,
            spills=self.spills,
            recovered=self.recovered,
            proofs=self.proofs,
            toolchain_kept=self.kept,
            toolchain_changed=self.changed,
            warnings=self.warnings,
        )


def check_out_dir(out: Path) -> None:
    """Refuse an output directory that cannot be written, before writing anything."""
    probe = out
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        raise OutputDirError(f"output directory {out} is not writable (checked {probe})", fix="pass --out DIR to a writable folder")


def build(
    keys: list[BuildKey],
    out: Path,
    *,
    jobs: int | None = None,
    key_timeout: float | None = None,
    vllm_src=(),
    digests: dict | None = None,
    progress: bool = True,
    link: bool = True,
    cache: Path | None = None,
    options=(),
) -> Summary:
    """Build ``keys`` into the prebuilt directory ``out``, link it, and return a Summary.

    A failed key does not stop the others. Each release's keys are built
    from that release's vLLM tree (``source.find_release``, from ``vllm_src``
    or elsewhere), whose mono sources must have the release's digest
    (``digests``, default build_matrix.yaml's). ``cache`` is a build cache
    folder. ``options`` are the command-line options a rebuild needs
    (``--matrix``, ``--vllm-src``, ...): printed fixes and each arch's record
    of the keys asked for (``dsv41_aot/pending.py``) carry them."""
    t_start = time.perf_counter()
    out = Path(out).resolve()
    jobs = check_jobs(jobs)
    key_timeout = check_key_timeout(key_timeout)
    log = sys.stderr
    # every check before anything is written
    check_out_dir(out)
    tools = toolchain.find()
    if digests is None:
        from . import matrix

        digests = matrix.load().releases
    trees = {release: (src, source_identity(src, tools.lld_version))
             for release, src in source.release_trees({k.release for k in keys}, digests, vllm_src).items()}
    if len(set(keys)) != len(keys):
        dup = next(k for k in keys if keys.count(k) > 1)
        raise AotError(f"key {dup.describe()} asked for twice", fix="list each key once")

    summary = Summary(keys=len(keys), jobs=jobs)
    store = BuildCache(cache, tools) if cache is not None else None
    arches = sorted({k.arch for k in keys})
    with contextlib.ExitStack() as held:
        # each arch's lock (its releases share objects and bands), held from
        # reading its manifests to the end of its link, taken in one order so
        # that two builders never wait on each other crosswise
        for arch in arches:
            held.enter_context(arch_lock(out / arch, "build", log))
        states = {room: RoomState(out, arch, release, *trees[release], summary.recovered, log)
                  for room, arch, release in sorted({(k.room, k.arch, k.release) for k in keys})}
        check_one_source(states, keys, options)
        for arch in arches:  # a kill from here on: verify's fix builds these keys
            pending.write(out / arch, by_release(k for k in keys if k.arch == arch), options)
        _build_locked(keys, states, tools, jobs, key_timeout, summary, progress, link, store, log)
        for arch in arches:
            pending.clear(out / arch)
    summary.wall_seconds = time.perf_counter() - t_start
    if summary.compiled + summary.cached + summary.up_to_date + summary.failed != summary.keys:
        raise RuntimeError(f"internal error: {summary.keys} keys but {summary.compiled} compiled + {summary.cached} "
                           f"cached + {summary.up_to_date} up to date + {summary.failed} failed: the build lost track "
                           f"of some")
    return summary


def _build_locked(keys, states, tools, jobs, key_timeout, summary, progress, link, store, log) -> None:
    """Sort the keys into up to date, cached and to compile; compile, write, link."""
    todo: list[BuildKey] = []
    for key in keys:
        st = states[key.room]
        if up_to_date(st.manifest, key, st.ident):
            summary.up_to_date += 1
        elif toolmove.moved(st.manifest, key, st.ident):
            old = st.manifest.entries[str(key)]
            if toolmove.proven_under(st.room, old, st.ident.flydsl_version):
                summary.keep(key, "proof")  # its proof under this FlyDSL compiled it already: the same code object
                continue
            st.moved[str(key)] = old
            hit = cache_hit(store, st, key)
            if hit is not None and toolmove.same_code(old, hit[0]):
                summary.keep(key, "cached")
            elif hit is not None:
                take_from_cache(st, key, hit)
                summary.cached += 1
                summary.rebuilt(key)
            else:
                todo.append(key)
        elif (known := st.manifest.refused.get(str(key))) is not None and known.get("source") == st.ident.as_dict():
            summary.failed += 1  # refused by this very source: compiling again would refuse again
            summary.failures.append({"key": str(key), "release": key.release, "error": known["error"], "known": True})
        elif (hit := cache_hit(store, st, key)) is not None:
            take_from_cache(st, key, hit)
            summary.cached += 1
        else:
            todo.append(key)
    if store is not None:
        summary.warnings += store.say(log)

    bar = progress_bar(len(todo), "build", "sym") if progress and todo else None
    try:
        if todo:
            _run(todo, states, tools, jobs, key_timeout, summary, bar, store)
    finally:
        if store is not None:
            summary.warnings += store.say(log)  # a cache write that failed: said, never fatal
        _flush(states)
        # only once every room's manifest is on disk: an object is an orphan
        # when no room of its arch names it (a room's manifest not yet
        # written would lose its objects)
        if summary.failed == 0:
            for arch_dir in sorted({st.room.arch_dir for st in states.values()}):
                for p in folder_problems(arch_dir):
                    if p.what == "object":
                        Path(p.file).unlink(missing_ok=True)
        if bar is not None:
            bar.close()
    for key in keys:  # compiled or up to date: a failed key's entry is gone
        e = states[key.room].manifest.entries.get(str(key))
        notes = spill_notes(e.resources) if e and e.resources else []
        if notes:
            res = e.resources
            summary.spills.append({"key": str(key), "release": key.release, "scratch_bytes": res["scratch_bytes"],
                                   "vgpr_spills": res["vgpr_spill_count"], "sgpr_spills": res["sgpr_spill_count"]})
            print(f"warning: {key.describe()} {'; '.join(notes)}", file=log)
    if link:
        from .link import link_room

        for st in states.values():
            if st.manifest.entries:
                summary.libraries += link_room(st.room.arch_dir, st.room.release)["libraries"]
    for st in states.values():  # the proofs the room carries, counted after the build (it never writes them)
        if st.room.verified_path.is_file():
            counted, bad, warning = proof_counts(st.room.root, st.manifest)
            summary.proofs.append(counted)
            for note in [f"{p.message}; fix: {p.fix}" for p in bad] + ([warning] if warning else []):
                print(f"warning: {note}", file=log)


def _run(keys, states, tools, jobs, key_timeout, summary, bar, store) -> None:
    """Compile ``keys`` on the worker pool, one worker per room.

    Each answer goes into its room's manifest, written at least once a second."""

    def spawn(room: str, folder: Path):
        st = states[room]
        env = worker_env(st.room.arch, str(tools.rocm_path), str(folder / "flydsl"))
        argv = [sys.executable, "-m", "dsv41_aot.aot.worker", st.room.arch, st.room.release, str(st.src.root),
                str(st.room.arch_dir), str(tools.strip), tools.lld_version]
        return argv, env

    def accept(room: str, ready: dict) -> str | None:
        ident, got = states[room].ident.as_dict(), ready.get("identity") or {}
        differ = sorted(f for f in set(got) | set(ident) if got.get(f) != ident.get(f))
        if not differ:
            return None
        why = ", ".join(f"{f} {got.get(f)} (the worker's), {ident.get(f)} (this build's)" for f in differ)
        hint = ("; the FlyDSL module Python imports is not the one pip's metadata names: reinstall FlyDSL "
                "(pip install --force-reinstall flydsl==" + ident["flydsl_version"] + ")"
                if "flydsl_version" in differ else "")
        return f"the compile worker's source identity differs: {why}{hint}"

    def fail(key: BuildKey, error: str, deterministic: bool = False) -> None:
        """Count a failed key and print it.

        A ``deterministic`` failure (the kernel source refused the key) is
        remembered for this source; a crash, a timeout or a worker that
        could not start is not."""
        st = states[key.room]
        summary.failed += 1
        summary.failures.append({"key": str(key), "release": key.release, "error": error})
        st.manifest.entries.pop(str(key), None)  # its entry no longer says what this source builds
        if deterministic:
            st.manifest.refused[str(key)] = {"error": error, "source": st.ident.as_dict()}
        st.dirty = True
        if bar is not None:
            bar.write(f"FAILED {key.describe()}: {error}", file=sys.stderr)  # stdout is --json's
            bar.update(1)
        else:
            print(f"FAILED {key.describe()}: {error}", file=sys.stderr)

    def on_answer(key: BuildKey, msg: dict) -> None:
        st = states[key.room]
        summary.compile_seconds += msg.get("seconds", 0.0)
        if not msg["ok"]:
            fail(key, msg["error"], deterministic=not msg.get("pool") and msg.get("kind") not in _TRANSIENT)
            return
        new = msg["entry"]
        if store is not None:  # the object this toolchain compiled, as the worker stored it
            data = (st.room.arch_dir / new["object"]).read_bytes()
            if hashlib.sha256(data).hexdigest() == new["sha256"]:
                store.put(COMPILE, key, st.ident, data, export_bytes=new["export_bytes"], seconds=msg["seconds"])
        if str(key) in st.moved and toolmove.same_code(st.moved[str(key)], new):
            # the same GPU code object under this toolchain: keep the stored object (the new one is an orphan)
            summary.keep(key, "compiled")
        else:
            if str(key) in st.moved:
                summary.rebuilt(key)
            st.manifest.put(new, msg["abi"], seconds=msg["seconds"])
            st.manifest.refused.pop(str(key), None)
            st.dirty = True
            summary.compiled += 1
        if bar is not None:
            bar.update(1)

    Pool(spawn, jobs=jobs, key_timeout=key_timeout, accept=accept, what="compile").run(
        keys, on_answer, on_tick=lambda: _flush(states), tick_seconds=FLUSH_SECONDS)


def _flush(states: dict) -> None:
    """Write every room's manifest that changed since it was last written."""
    for st in states.values():
        if st.dirty:
            st.manifest.write()
            st.dirty = False
