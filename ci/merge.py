"""Merge shard prebuilt dirs into one prebuilt dir, then link it.

    python ci/merge.py --out kernels_prebuilt shards/gfx950-0 shards/gfx950-1 ...

Each shard's ``<arch>/vllm-<release>/`` joins the same room of the output; a
key's identity is (release, key). Refused, naming the room and key or the
folder, with nothing written (exit 1):

- a room without manifest.json; a shard's missing or altered object, or an
  entry that does not describe its object (``integrity.key_problems``);
- one key in two shards with a different object or served source identity
  (``SourceIdentity.served``: FlyDSL and linker aside, as the loader serves);
- one room built from several served source identities;
- when shard plans (ci/build_shard.py) are present: a planned key no shard
  holds, a missing shard, a key its plan did not give its shard, or a
  shard with no plan.

verified.json is merged too, keeping the proofs of the merged objects;
``--require-verified`` refuses a key without a proof that matches its entry
and carries evidence only a JIT run produces.

The output is what one build of every key would write, linked. It is
assembled in a temporary sibling of ``--out`` and moved into place when
complete, so ``--out`` is never seen half written.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from dsv41_aot.errors import AotError, IntegrityError, ManifestError  # noqa: E402
from dsv41_aot.aot.integrity import key_problems  # noqa: E402
from dsv41_aot.aot.jit import VERIFIED, write_verified  # noqa: E402
from dsv41_aot.aot.link import link_room  # noqa: E402
from dsv41_aot.aot.output import error_doc, print_json  # noqa: E402
from dsv41_aot.facts.releases import version_order  # noqa: E402
from dsv41_aot.manifest import MANIFEST, OBJECTS, Manifest, room_name  # noqa: E402
from dsv41_aot.listing import rooms_in  # noqa: E402
from dsv41_aot.proof import NO_EVIDENCE, PROVEN  # noqa: E402
from ci.build_shard import PLANS, pairs  # noqa: E402


class MergeError(IntegrityError):
    """Shards that cannot be merged into one consistent prebuilt dir."""


def _plans(shards: list[Path]) -> dict:
    """Map each arch to the plan dicts found in the shard dirs."""
    out: dict = {}
    for d in shards:
        for p in sorted(d.glob(PLANS)):
            try:
                plan = json.loads(p.read_bytes())
                sound = isinstance(plan["arch"], str) and 0 <= plan["index"] < plan["count"]
            except (ValueError, KeyError, TypeError):  # not JSON, a field missing, or not numbers
                sound = False
            if not sound:
                raise MergeError(f"{p}: not a shard plan ci/build_shard.py writes (an arch, an index below its "
                                 f"count)", fix=f"rm {shlex.quote(str(p))}  # then merge again: it names the shard "
                                                f"to rebuild")
            plan["_file"], plan["_dir"] = str(p), d
            out.setdefault(plan["arch"], []).append(plan)
    return out


def _show(pair) -> str:
    return f"{pair[1]} (vLLM {pair[0]})"


def _check_plans(arch: str, plans: list, held_by: dict) -> None:
    """Check that the shards match their plans and together hold every planned key.

    ``held_by`` maps a shard arch dir to its (release, key) pairs.
    """
    counts = {p["count"] for p in plans}
    universes = {tuple(pairs(p["all_keys"])) for p in plans}
    if len(counts) != 1 or len(universes) != 1:
        raise MergeError(f"{arch}: shard plans disagree (counts {sorted(counts)}, {len(universes)} key sets): "
                         f"cells built from different matrices or seconds",
                         fix="rerun every cell of the arch with the same --profile/--seconds (ci/build_shard.py)")
    count = counts.pop()
    have = sorted({p["index"] for p in plans})
    if have != list(range(count)):
        missing = sorted(set(range(count)) - set(have))
        raise MergeError(f"{arch}: shards {missing} of {count} are missing (have {have})",
                         fix=f"run ci/build_shard.py --arch {arch} --shard {missing[0]}/{count} and merge again")
    planned = {p["_dir"] / arch: p for p in plans}
    for adir, keys in sorted(held_by.items()):
        p = planned.get(adir)
        if p is None:
            raise MergeError(f"{adir}: holds {len(keys)} {arch} key(s) but no shard plan (shard-{arch}-*of{count}.json)",
                             fix=f"build it with ci/build_shard.py --arch {arch} --shard i/{count}, or leave it out")
        extra = sorted(set(keys) - set(pairs(p["keys"])))
        if extra:
            raise MergeError(f"{adir}: holds {len(extra)} key(s) its plan {p['_file']} did not give it, "
                             f"e.g. {_show(extra[0])}",
                             fix=f"rebuild the shard into an empty dir: ci/build_shard.py --arch {arch} "
                                 f"--shard {p['index']}/{count} --out NEW_DIR, and merge that")
    expected = set(universes.pop())
    held = {k for keys in held_by.values() for k in keys}  # every (release, key) some shard holds
    lost = sorted(expected - held)
    if lost:
        raise MergeError(f"{arch}: {len(lost)} planned key(s) in no shard, e.g. {_show(lost[0])}",
                         fix=f"rebuild its shard: ci/build_shard.py --arch {arch} --shard i/{count} (see the plans)")
    for p in plans:
        stray = [k for k in pairs(p["keys"]) if k not in held]
        if stray:
            raise MergeError(f"{p['_file']}: key {_show(stray[0])} planned but not built", fix="rerun that shard")


def _proofs(room: str, rooms: list, entries: dict, require: bool) -> dict:
    """The shard rooms' proofs (key -> KeyProof) of the merged entries' code objects.

    A proof with evidence only a JIT run produces is preferred.
    """
    proofs: dict = {}
    for r in rooms:
        for key, p in r.proof().keys.items():
            state = p.verdict(entries[key]) if key in entries else None
            if state == PROVEN or (state == NO_EVIDENCE and key not in proofs):
                proofs[key] = p
    if require:
        bare = sorted(k for k, p in proofs.items() if p.verdict(entries[k]) == NO_EVIDENCE)
        missing = sorted(set(entries) - set(proofs))
        shard = str(rooms[0].root) if len(rooms) == 1 else "SHARD"  # every shard of the room
        fix = (f"rerun its shard with ci/build_shard.py (it verifies), or: dsv41-aot verify --against-jit --record "
               f"--dir {shard} --release {rooms[0].release}")
        if missing:
            raise MergeError(f"room {room}: {len(missing)} key(s) carry no proof against vLLM's JIT ({VERIFIED}), "
                             f"e.g. {missing[0]}", fix=fix)
        if bare:
            raise MergeError(f"room {room}: {len(bare)} key(s) carry a proof without evidence only a JIT run "
                             f"produced (the old format of {VERIFIED}, or copied from the manifest), e.g. {bare[0]}",
                             fix=fix)
    return proofs


def _merge_room(arch: str, release: str, rooms: list, held_by: dict, require_verified: bool) -> tuple:
    """Merge one room from the shards' rooms of it."""
    room = room_name(arch, release)
    entries, abis, origin, sources, timings = {}, {}, {}, {}, {}
    for r in rooms:
        adir, man = r.arch_dir, r.manifest()
        held_by.setdefault(adir, []).extend((release, k) for k in sorted(man.entries))
        timings.update(man.timings)
        if bad := key_problems(r):  # each entry against its object, as verify judges it
            raise type(bad[0].error())(f"shard {r.root}: {bad[0].message}", fix=bad[0].fix)
        for key, e in sorted(man.entries.items()):
            prev = entries.get(key)
            if prev is not None:
                if prev.sha256 != e.sha256 or prev.source.served != e.source.served:
                    what = "object" if prev.sha256 != e.sha256 else "source identity"
                    raise MergeError(
                        f"{key} (vLLM {release}): {origin[key]} and {adir} hold different {what}s "
                        f"({prev.sha256[:12]} vs {e.sha256[:12]})",
                        fix=f"rebuild both shards from one vLLM {release} / FlyDSL (ci/build_shard.py), then merge",
                    )
                continue
            entries[key], origin[key] = e, adir
            abis[e.abi] = man.abis[e.abi]
            sources.setdefault(e.source.served, key)
    if len(sources) > 1:
        ex = sorted(sources.values())
        raise MergeError(f"room {room}: shards built from {len(sources)} source identities (e.g. {ex[0]} from "
                         f"{origin[ex[0]]}, {ex[1]} from {origin[ex[1]]})",
                         fix=f"rebuild every shard from one vLLM {release} / FlyDSL (ci/build_shard.py), then merge")
    proofs = _proofs(room, rooms, entries, require_verified)
    return entries, abis, origin, timings, proofs


def merge(shards: list[Path], out: Path, *, link: bool = True, log=print, require_verified: bool = False) -> dict:
    """Merge ``shards`` into ``out`` (replaced as a whole) and return a summary."""
    shards = [Path(s).resolve() for s in shards]
    out = Path(out).resolve()
    for s in shards:
        if not s.is_dir():
            raise ManifestError(f"shard {s} is not a directory", fix="pass the shard dirs ci/build_shard.py wrote")
    by_room: dict = {}  # (arch, release) -> the shards' rooms of it
    for s in shards:
        for r in rooms_in(s):  # a room whose manifest is gone is refused, never passed over
            by_room.setdefault((r.arch, r.release), []).append(r)
    if not by_room:
        raise ManifestError(f"no shard holds a built room (<arch>/vllm-<release>/{MANIFEST}) in "
                            f"{', '.join(map(str, shards))}",
                            fix="build the shards first: ci/build_shard.py --arch A --shard i/N --out DIR")
    plans = _plans(shards)

    merged: dict = {}  # arch -> {release: (entries, abis, origin, timings, proofs)}
    for arch in sorted({a for a, _ in by_room}):
        held_by: dict = {}
        releases = sorted((r for a, r in by_room if a == arch), key=version_order)
        merged[arch] = {r: _merge_room(arch, r, by_room[arch, r], held_by, require_verified) for r in releases}
        if arch in plans:
            _check_plans(arch, plans[arch], held_by)

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.merge-"))
    summary = {"out": str(out), "arches": {}}
    try:
        for arch, by_release in merged.items():
            adir = tmp / arch
            (adir / OBJECTS).mkdir(parents=True)
            arch_summary = summary["arches"][arch] = {"rooms": {}}
            for release, (entries, abis, origin, timings, proofs) in by_release.items():
                for key, e in entries.items():
                    if not (adir / e.object).exists():  # one object, however many rooms name it
                        shutil.copyfile(origin[key] / e.object, adir / e.object)
                man = Manifest(adir, arch, entries, abis, timings=timings, release=release)
                man.write()
                if proofs:
                    write_verified(man, proofs)
                proven = sum(p.verdict(entries[k]) == PROVEN for k, p in proofs.items())
                arch_summary["rooms"][release] = {"keys": len(entries), "shards": len(by_room[arch, release]),
                                                  "verified": proven, "without_evidence": len(proofs) - proven}
            arch_summary["keys"] = sum(r["keys"] for r in arch_summary["rooms"].values())
            if link:  # after every room's manifest: the arch's rooms share its bands
                for release in by_release:
                    arch_summary["rooms"][release]["link"] = link_room(adir, release)
        _replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if log:
        for arch, a in summary["arches"].items():
            for release, r in a["rooms"].items():
                bare = f" ({r['without_evidence']} more of the old format, without JIT evidence)" \
                    if r["without_evidence"] else ""
                log(f"{arch} vLLM {release}: {r['keys']} keys from {r['shards']} shard(s), {r['verified']} verified"
                    + bare)
            if link:
                log(f"{arch}: linked")
    return summary


def _replace_dir(new: Path, out: Path) -> None:
    """Swap ``new`` in as ``out``: readers see the old tree or the new one."""
    os.chmod(new, 0o755)
    if not out.exists():
        os.rename(new, out)
        return
    old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.old-"))
    os.rename(out, old / "tree")
    os.rename(new, out)
    shutil.rmtree(old, ignore_errors=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shards", nargs="+", help="shard prebuilt dirs (ci/build_shard.py --out)")
    ap.add_argument("--out", required=True, help="merged prebuilt dir (replaced as a whole)")
    ap.add_argument("--no-link", action="store_true", help="merge only (the wheel build needs the link)")
    ap.add_argument("--require-verified", action="store_true",
                    help="refuse a key whose shard room holds no proof against vLLM's JIT (its verified.json)")
    ap.add_argument("--json", action="store_true", help="print one JSON summary")
    args = ap.parse_args(argv)
    try:
        s = merge([Path(p) for p in args.shards], Path(args.out), link=not args.no_link,
                  log=None if args.json else print, require_verified=args.require_verified)
    except AotError as e:
        print(f"ci/merge.py: error: {e}", file=sys.stderr)
        if args.json:  # still one document on stdout, saying why
            print_json(error_doc("ci/merge.py", e))
        return e.exit_code
    if args.json:
        print(json.dumps(s, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
