"""``dsv41-aot verify``: check that a prebuilt directory is what vLLM would run.

Every room gets the integrity checks (``aot/integrity.py`` per key, then the
room's own verdict, ``verdict.problems``). ``--against-jit`` also builds the
chosen keys with vLLM's runner and FlyDSL's JIT (``aot/jit.py``) and
compares their code objects and launches through the recording HIP, the
stand-in for the AMD GPU (``aot/hiprec``); ``--record`` writes the proofs.
See docs/building.md ("Commands") for what each check compares. Every report
and failure carries its key's release.
"""

from __future__ import annotations

import random
import shlex
import time
from pathlib import Path

from .. import commands, pending, verdict
from ..errors import AotError, ManifestError, ToolchainError
from ..keys import BuildKey
from ..manifest import Manifest
from ..room import Room
from ..listing import built_rooms_or_error, folder_problems, rooms_in
from .integrity import PROOF_DIFFERS, KeyReport, ShippedCode, check_entry, key_problem
from . import hiprec
from .cache import JIT, BuildCache
from .hiprec.prebuilt import prebuilt_launches
from .jit import compare_jit, verified_record, write_verified
from .output import progress_bar, tally


# ---------------------------------------------------------------- JIT side

def choose_keys(man: Manifest, keys: list[str] | None, sample: int | None, seed: int, proven=()) -> list[str]:
    """The keys of this room to rebuild: the named ones, a seeded sample, or all.

    A sample holds at least one of the ``proven`` keys (those the room
    carries a proof of), so a sample run always compares a proof."""
    have = sorted(man.entries)
    if keys is not None:
        return [k for k in keys if k in man.entries]
    if sample is not None and sample < len(have):
        rng = random.Random(f"dsv41-aot verify {man.arch} {man.release} {seed}")
        picked = rng.sample(have, sample)
        if proven and not set(picked) & set(proven):
            picked[-1] = rng.choice(sorted(proven))
        return sorted(picked)
    return have


def _against_jit(chosen: dict, reports: dict, codes: dict, *, jobs: int, key_timeout: float,
                 trees, matrix_path, progress: bool, record: bool, cache: Path | None = None) -> list[str]:
    """JIT-build ``chosen`` (room -> BuildKeys) and add what differs to each report; return its warnings.

    With ``record``, each key that passed gets its proof in its room's
    verified.json. With ``cache``, a key whose JIT code object is cached under
    the same build identity is compared with that instead, and every JIT build
    is stored (a cache that cannot be used is a warning, never a failure).
    No key chosen: nothing runs (the caller fails the run that proved none)."""
    import tempfile

    from . import jit, toolchain

    todo = [k for ks in chosen.values() for k in ks]
    if not todo:
        return []
    mans = {room: codes[ks[0]][0] for room, ks in chosen.items() if ks}
    tools = toolchain.find()  # an unsupported FlyDSL or no linker: exit 2 before anything is written
    from .. import source
    from . import matrix  # PyYAML: only for a JIT run

    # each release's tree by the matrix's digest, else its manifest's (an installed wheel ships no matrix)
    digests = {m.release: m.mono_sources for m in mans.values()}
    if matrix_path is not None or matrix.DEFAULT_MATRIX.is_file():
        digests |= matrix.load(matrix_path).releases
    sources = source.release_trees({k.release for k in todo}, digests, trees)
    have = {release: tree.digest for release, tree in sources.items()}
    for k in todo:  # a key of another tree: its launch would be refused after its JIT build
        if (built := codes[k][0].entries[str(k)].source.mono_sources) != have[k.release]:
            raise ToolchainError(f"{codes[k][0].path}: {k.describe()} was built from mono sources {built}; the vLLM "
                                 f"{k.release} tree found ({sources[k.release].root}) has {have[k.release]}, so its "
                                 f"JIT build cannot prove it", fix=f"pass --vllm-src with the vLLM {k.release} tree "
                                 f"whose mono sources are {built}, and --matrix with a build matrix recording it")
    store, idents, hits, warned, doubted = None, {}, [], [], {}  # doubted: key -> its cached code object
    if cache is not None:
        from .compiler import source_identity

        store = BuildCache(cache, tools)
        idents = {release: source_identity(src, tools.lld_version) for release, src in sources.items()}
        for k in todo:
            hit = store.get(JIT, k, idents[k.release])
            evidence = hit[0].get("evidence") if hit is not None else None
            if isinstance(evidence, dict) and isinstance(evidence.get("launch"), dict):  # else JIT-built again
                hits.append((k, hit))
        cached = {k for k, _ in hits}
        todo = [k for k in todo if k not in cached]
        warned += store.say()
    shipped = {room: _room_proofs(man) for room, man in mans.items()}  # each run's proof is compared with them
    here = {room: Room(m.dir.parent, m.arch, m.release).built_here for room, m in mans.items()}
    proofs = {room: _room_proofs(man, warned) for room, man in mans.items()} if record else {}
    hip = hiprec.build(cache=cache, warn=warned.append)
    launches: dict = {}  # key -> the prebuilt launch (hiprec.recorded_launch), or what went wrong
    bar = progress_bar(len(todo) + len(hits), "verify --against-jit", "key") if progress else None

    def on_answer(key: BuildKey, msg: dict) -> None:
        rep = reports[key]
        man, code = codes[key]
        rep.checks.append("jit")
        rep.jit_seconds = msg.get("seconds")
        rep.jit_cached = bool(msg.get("cached"))
        if store is not None and msg.get("ok") and not msg.get("cached"):
            data = Path(msg["code"]).read_bytes()
            if doubted.get(key, data) != data:  # the cached answer was not the JIT's: the cache was wrong
                store.reject(JIT, key, idents[key.release], "disagrees with this JIT run's answer")
            store.put(JIT, key, idents[key.release], data, params=msg["params"],
                      identity=msg.get("identity") or {}, evidence=msg.get("evidence"), seconds=msg.get("seconds"))
        rep.problems += compare_jit(man, str(key), code, msg)
        if "error" not in msg and not isinstance(msg.get("evidence"), dict):
            rep.problems.append("the JIT answer carries no evidence of its run (artifact / module sha256, time)")
        elif "error" not in msg:
            rep.checks.append("launch")
            rep.problems += _compare_launches(launches.get(key), msg["evidence"].get("launch"), code)
        mine = None
        if rep.ok:  # this run's proof, compared with each the room carries (under any FlyDSL: KeyProof.differences)
            mine = verified_record(str(key), code, msg.get("identity"), msg["evidence"])
            theirs = [p for (k, _), p in shipped[key.room].items() if k == str(key)]
            rep.checks += ["proof"] if theirs else []
            for p in theirs:
                if diffs := p.differences(mine):
                    why = f"{PROOF_DIFFERS} (recorded under FlyDSL {p.flydsl or '?'}, now): {', '.join(diffs)}"
                    if record and here[key.room]:  # where the fix is this command: this run's proof replaces it
                        warned.append(f"{key.describe()}: {why}; replaced by this run's proof")
                        proofs[key.room].pop((str(key), p.flydsl), None)
                    else:
                        rep.problems.append(why)
                        mine = None
        if record:  # a key's proof under this run's FlyDSL; those under other FlyDSL releases are kept
            flydsl = (msg.get("identity") or {}).get("flydsl_version") or ""
            if mine is not None:
                proofs[key.room][str(key), flydsl] = mine
            else:
                proofs[key.room].pop((str(key), flydsl), None)
        if bar is not None:
            bar.update(1)

    try:
        with tempfile.TemporaryDirectory(prefix="dsv41-jit-cached-") as tmp:
            for room, man in mans.items():
                launches.update(prebuilt_launches(man, sources[man.release].mono_dir,
                                                  {k: codes[k][1] for k in chosen[room]}, hip, Path(tmp) / room))
            for k, (rec, data) in hits:
                path = Path(tmp) / f"{k.entry}.jit.co"
                path.write_bytes(data)
                msg = {"ok": True, "key": str(k), "code": str(path), "params": rec.get("params") or [],
                       "identity": rec.get("identity"), "evidence": rec["evidence"],
                       "seconds": rec.get("seconds"), "cached": True}
                if compare_jit(codes[k][0], str(k), codes[k][1], msg):  # never fail a key on a cached answer
                    doubted[k] = data  # the JIT runs for real: its answer decides which side is wrong
                    todo.append(k)
                    continue
                on_answer(k, msg)
        if todo:
            jit.run(todo, on_answer, jobs=jobs, key_timeout=key_timeout, sources=sources, hip=hip)
    finally:
        if bar is not None:
            bar.close()
        if store is not None:
            warned += store.say()
        for room, recs in proofs.items():
            write_verified(mans[room], list(recs.values()))
    return warned


def _compare_launches(prebuilt, jit_launch, code: bytes) -> list[str]:
    """The problems of one key's launch comparison (``hiprec.compare_launch``)."""
    if not isinstance(jit_launch, dict):
        return ["the JIT answer carries no launch through the recording HIP (stand-in for the AMD GPU)"]
    if not isinstance(prebuilt, dict):
        return [f"prebuilt launch through the recording HIP failed: {prebuilt}"]
    return hiprec.compare_launch(prebuilt, jit_launch, hiprec.kernel_metadata(code))


def _room_proofs(man: Manifest, warned: list | None = None) -> dict:
    """The proofs a room carries: (key, FlyDSL) -> KeyProof ({} when verified.json does not read).

    With ``warned`` (the proofs ``--record`` starts from), an unreadable
    verified.json is also set aside, with a warning added to ``warned``;
    without, proof_counts reports it."""
    from .recover import set_aside

    room = Room(man.dir.parent, man.arch, man.release)
    try:
        return {(p.key, p.flydsl): p for p in room.proof().all()}
    except ManifestError as e:
        if warned is not None:
            warned.append(f"{e.message}; set aside as {set_aside(room.verified_path)}: the keys proven now are "
                          f"recorded anew")
        return {}


# ---------------------------------------------------------------- command


def verify(root: Path, *, against_jit: bool, keys: list | None = None, sample: int | None = None,
           seed: int = 0, vllm_src=(), progress: bool = False, jobs: int | None = None,
           key_timeout: float | None = None, record: bool = False, release: str | None = None,
           matrix_path=None, cache: Path | None = None) -> dict:
    """Verify the prebuilt directory ``root`` and return the JSON report.

    Checks the rooms of ``release``, or every room. ``keys`` (BuildKeys) must
    all be in ``root``. ``vllm_src`` lists vLLM trees to JIT-build from, one
    per release. ``cache`` is the build cache whose JIT code objects stand in
    for JIT builds of the same identity (None: every key is JIT-built)."""
    from .workers import check_jobs, check_key_timeout

    t0 = time.perf_counter()
    jobs, key_timeout = check_jobs(jobs), check_key_timeout(key_timeout)
    root = Path(root)
    found = rooms_in(root, release) or built_rooms_or_error(root, release)  # none at all: bad input, naming the fix
    reports, codes, chosen, lib_failures, warnings, served_bad = {}, {}, {}, [], {}, set()
    mans = {}  # Room -> its manifest, for the rooms whose manifest reads
    for room in found:
        try:
            mans[room] = room.manifest()
        except ManifestError:  # the room's manifest problem (with its fix); its keys cannot be checked
            lib_failures += [dict(p.as_dict(), release=room.release) for p in verdict.problems(room, objects=False)]
    wanted = None if keys is None else set(keys)
    if wanted is not None:
        known = {BuildKey.parse(k, m.release) for m in mans.values() for k in m.entries}
        unknown = sorted(wanted - known)
        if unknown:
            shown = [k.describe() for k in unknown[:5]]
            first = unknown[0].release
            raise AotError(f"{root} does not hold {len(unknown)} of the keys asked for: {', '.join(shown)}",
                           fix="build them: " + commands.build(root, release=first,
                                                               keys=[k for k in unknown if k.release == first]))
    for arch_dir in sorted({room.arch_dir for room in found}):
        for p in folder_problems(arch_dir, root):  # what no room names (once per arch)
            if p.what in ("band", "file"):  # what a wheel would refuse to ship
                lib_failures.append(dict(p.as_dict(), release=None))
            elif p.what == "room":  # a newer dsv41-aot's room: kept, with all it names
                warnings[p.file] = f"{p.message}; left as it is (its objects and bands are kept)"
            else:  # an orphan object (the next build removes it), or records no one can read
                warnings[p.file] = f"{p.message}: {p.fix}"
        for left in sorted(arch_dir.glob(".*.tmp")) + sorted(arch_dir.glob("*/.*.tmp")):  # a killed atomic write's
            warnings[left] = (f"{left}: a temporary file a killed write left (the file it was for is whole); "
                              f"remove it: rm {shlex.quote(str(left))}")
        if bad := pending.problem(arch_dir):  # never echoed into a fix, never silently dropped
            warnings[arch_dir / pending.PENDING] = (f"{bad}: its keys are not rebuilt by any printed fix; remove it: "
                                                   f"rm {shlex.quote(str(arch_dir / pending.PENDING))}")
        for rel, ks in pending.asked(arch_dir).items():  # a killed build: the keys it did not get to
            built = next((m.entries for m in mans.values() if (m.arch, m.release) == (arch_dir.name, rel)), {})
            if missing := [k for k in ks if k not in built]:
                warnings[arch_dir / f"{pending.PENDING}#{rel}"] = (
                    f"{arch_dir}: a build was stopped (or is running) before it built {len(missing)} of the "
                    f"{len(ks)} vLLM {rel} key(s) it was asked for; finish it: "
                    + pending.command(arch_dir, root.resolve(), rel))
    for room, man in mans.items():
        # the room's one verdict (what the loader refuses); stored objects are checked key by key below
        for p in verdict.problems(room, objects=False, proof=False):
            keys_ = verdict.problem_keys(room, p)
            lib_failures.append(dict(p.as_dict(), release=man.release, keys=keys_))
            if p.serving:  # a key counts as ok only when its room serves it too
                served_bad |= {(man.release, k) for k in keys_}
        parsed = {k: BuildKey.parse(k, man.release) for k in sorted(man.entries)}
        names = [k for k, bk in parsed.items() if wanted is None or bk in wanted]
        shipped = None if room.built_here else ShippedCode(room)  # its code objects come from its bands
        for k in names:
            reports[parsed[k]], code = check_entry(man, k, shipped)
            codes[parsed[k]] = (man, code)
        if against_jit:
            proven = {k for k, _ in _room_proofs(man)} if sample is not None else ()
            picked = choose_keys(man, None if wanted is None else names, sample, seed, proven)
            chosen[room.name] = [parsed[k] for k in picked if codes[parsed[k]][1] is not None]
    if against_jit:
        said = _against_jit(chosen, reports, codes, jobs=jobs, key_timeout=key_timeout, trees=vllm_src,
                            matrix_path=matrix_path, progress=progress, record=record, cache=cache)
        warnings.update((("against-jit", i), w) for i, w in enumerate(said))
        if not any(chosen.values()):  # asked for a proof, and none was made: never a silent pass
            if wanted == set():  # keys asked for are all known (else bad input above): an empty --shard asks none
                why, fix = "the shard asked for holds no key", "pass --shard i/N with fewer shards (a smaller N)"
            elif not reports and mans:  # rooms that read and hold no key: a build whose every key was refused
                why = "the rooms checked hold no key"
                fix = " && ".join(dict.fromkeys(r.fix_rebuild for r in mans))
            else:
                why = "no room holds a key that passed its integrity checks (see the failures)"
                fix = f"dsv41-aot verify --dir {root} (its failures name what to fix first)"
            lib_failures.append({"key": None, "release": release, "file": str(root), "what": "jit", "serving": False,
                                 "error": f"asked to check against vLLM's JIT, but no key was checked: {why}",
                                 "fix": fix})
    proofs = []
    for room, man in mans.items():  # after --record wrote them: proof_counts reads verified.json anew
        counts, bad, warning = verdict.proof_counts(root, man)
        proofs.append(counts)
        lib_failures += [dict(p.as_dict(), release=man.release) for p in bad]
        if warning:
            warnings[room.verified_path] = warning
    order = list(reports.values())
    room_of = {(room.arch, room.release): room for room in mans}
    failures = [_key_failure(r, room_of[r.arch, r.release]) for r in order if not r.ok] + lib_failures
    return tally(len(order), sum(r.ok and (r.release, r.key) not in served_bad for r in order), failures,
                 dir=str(root.resolve()),
                 jit_checked=sum(len(v) for v in chosen.values()),
                 jit_cached=sum(r.jit_cached for r in order), jobs=jobs,
                 wall_seconds=round(time.perf_counter() - t0, 3), warnings=list(warnings.values()),
                 proofs=proofs, reports=[r.as_dict() for r in order], fixes=fixes(failures, root))


def _key_failure(rep: KeyReport, room: Room) -> dict:
    """The failure of one key's own checks (``integrity.key_problem``), as a failures-list row."""
    p, rebuild = key_problem(rep, room)
    return dict(p.as_dict(), release=rep.release, error="; ".join(rep.problems), rebuild=rebuild)


def fixes(failures: list, root: Path) -> list[str]:
    """The commands that fix ``failures`` (rows of a report), each once: one build per release for the keys to rebuild."""
    rebuild: dict = {}
    for f in failures:
        if f.get("rebuild"):
            rebuild.setdefault(f["release"], []).append(f["key"])
    built = [commands.build(root, release=rel, keys=ks) for rel, ks in rebuild.items()]
    return list(dict.fromkeys(built + [f["fix"] for f in failures if not f.get("rebuild")]))
