"""The build, list and fetch-vllm commands: arguments and output.

The work is ``aot.builder``'s, ``room``'s and ``source``'s."""

from __future__ import annotations

import sys
from pathlib import Path

from .. import commands
from ..aot.output import print_json, tally
from ..errors import AotError
from ..verdict import proof_counts, proofs_line
from . import add_dir, add_shard_args, add_worker_args


def _selected_keys(args) -> tuple:
    """The keys the command line selects, and the loaded matrix they come from."""
    from ..aot import matrix
    from ..keys import BuildKey, neighbours

    if args.any_key and not args.key:
        raise AotError("--any-key lets --key name a key the matrix does not build; without --key it would be ignored",
                       fix="pass --key KEY --any-key, or drop --any-key")
    if args.key and (args.shard or args.profile):
        raise AotError(f"--key and {'--shard' if args.shard else '--profile'} both choose the keys to build",
                       fix="pass one of them")
    if args.seconds and not args.shard:
        raise AotError("--seconds only balances the shards of --shard (its files' compile seconds cut them)",
                       fix="pass it with --shard i/N, or drop --seconds")
    if args.release:
        from ..facts.releases import release_facts

        release_facts(args.release)  # an unknown release: "unknown vLLM release", naming the known ones (exit 2)
    m = matrix.load(args.matrix)
    keys = None  # the profile's
    if args.key:
        keys = [BuildKey.parse(k, args.release or m.newest) for k in args.key]
        universe = set(m.keys)
        for k in keys:
            if k not in universe and not args.any_key:
                near = neighbours(k, universe)
                raise AotError(
                    f"{k.describe()} is not a key {m.path} builds ({m.why_not(k)}); nearest it builds: "
                    f"{', '.join(near) or 'none'}",
                    fix=f"pick a key from: {commands.listing('full', release=k.release)}  "
                        f"(or pass --any-key to build it anyway)",
                )
    return m.choose(args.profile, keys=keys, release=args.release, arches=args.arch, shard=args.shard,
                    seconds=args.seconds), m


def _rebuild_options(args) -> list[str]:
    """The options a printed rebuild must carry to build the same way."""
    out = ["--matrix", str(Path(args.matrix).resolve())] if args.matrix else []
    for t in args.vllm_src or ():
        out += ["--vllm-src", str(Path(t).resolve())]
    if args.any_key:
        out.append("--any-key")
    if args.no_cache:
        out.append("--no-cache")
    elif args.cache:
        out += ["--cache", str(Path(args.cache).resolve())]
    return out


def cmd_build(args) -> int:
    from ..aot.workers import check_jobs, check_key_timeout

    keys, m = _selected_keys(args)
    check_jobs(args.jobs)  # the builder's own checks, here for --list too
    check_key_timeout(args.key_timeout)
    if args.list:
        if args.json:
            print_json(tally(len(keys), len(keys), [], entries=[{"key": str(k), "release": k.release} for k in keys]))
        else:
            for k in keys:
                print(f"{k.release:8} {k}")
        return 0
    from ..aot import builder, cache

    if not args.out.strip():  # Path("") is the current folder: never a silent target
        raise AotError("--out '': an empty folder name", fix="pass --out DIR (e.g. --out kernels_prebuilt)")
    # each release's mono sources digest as the matrix the keys came from records it
    digests = m.releases
    summary = builder.build(
        keys, Path(args.out), jobs=args.jobs, key_timeout=args.key_timeout, vllm_src=args.vllm_src or (),
        digests=digests, progress=not args.no_progress, link=not args.no_link,
        cache=cache.cache_dir(args.cache, args.no_cache), options=_rebuild_options(args),
    )
    if args.json:
        print_json(summary.as_dict())
    else:
        print(
            f"{summary.keys} keys: {summary.compiled} compiled, {summary.cached} from the build cache, "
            f"{summary.up_to_date} up to date, "
            f"{summary.failed} failed in {summary.wall_seconds:.1f} s -> {Path(args.out).resolve()}"
        )
        if summary.kept:
            print(f"  {len(summary.kept)} key(s) built before under another FlyDSL compile to the same GPU code object "
                  f"under this one: their objects and bands are kept")
        for k in summary.changed:
            print(f"  rebuilt {k['key']} (vLLM {k['release']}): its GPU code object under this FlyDSL differs from the one built before")
        for p in summary.proofs:
            print(f"  {proofs_line(p)}")
        for f in summary.failures:
            print(f"  FAILED {f['key']}: {f['error']}", file=sys.stderr)
    return 1 if summary.failed else 0


def cmd_list(args) -> int:
    from ..listing import built_arches, built_rooms_or_error, rooms_of

    root = Path(args.dir)
    entries, seconds, proofs, warnings = [], [], [], []
    for room in built_rooms_or_error(root, args.release):
        m = room.manifest()
        counted, bad, _ = proof_counts(room.root, m)
        proofs.append(counted)
        if bad:  # verified.json unreadable: a warning names the file and its fix, and list still lists
            warnings.append(bad[0].message + (f"; fix: {bad[0].fix}" if bad[0].fix else ""))
        proof = None if bad else room.proof()
        for key in sorted(m.entries):
            seconds.append(m.timings.get(key))
            entries.append(dict(m.entries[key].to_dict(), release=room.release, abi=m.abi(key),
                                proof=proof.verdict(key, m.entries[key]) if proof else None))
    foreign = [f"{r.dir}: {r.dir.name} is a release this dsv41-aot does not know; left as it is"
               for d in built_arches(root) for r in rooms_of(d) if not r.known]
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    if args.json:
        print_json(tally(len(entries), len(entries), [], dir=str(root.resolve()), entries=entries, foreign=foreign,
                         proofs=proofs))
        return 0
    short = {"proven": "jit", "no_evidence": "old", "stale": "stale", None: "-"}
    print(f"{'release':8} {'key':44} {'bytes':>8} {'code obj':>8} {'compile s':>9} {'proof':>5}  symbol")
    for row, secs in zip(entries, seconds):
        secs = f"{secs:9.2f}" if secs is not None else f"{'-':>9}"
        print(f"{row['release']:8} {row['key']:44} {row['bytes']:8d} {row['code_object_bytes']:8d} {secs} "
              f"{short[row['proof']]:>5}  {row['symbol']}")
    for line in foreign:
        print(line)
    print(f"{len(entries)} symbols in {root} (proof: jit, proven against vLLM's JIT; old, a proof without JIT "
          f"evidence)")
    for p in proofs:
        print(proofs_line(p))
    return 0


def cmd_fetch_vllm(args) -> int:
    from .. import source
    from ..facts.releases import release_facts

    release_facts(args.release)
    if args.dest is not None and (not args.dest or Path(args.dest).exists() and not Path(args.dest).is_dir()):
        raise AotError(f"--dest {args.dest!r}: not a folder to unpack into", fix="pass --dest DIR (a folder, or a new path)")
    src = source.fetch(args.release, Path(args.dest) if args.dest else None,
                       log=lambda m: print(m, file=sys.stderr))
    if args.json:
        print_json(tally(1, 1, [], release=args.release, tree=str(src.root), mono_sources=src.digest))
    else:
        print(f"vLLM {src.version} at {src.root}: mono sources {src.digest}")
    return 0


def register(sub) -> None:
    from .cache import add_args

    p = sub.add_parser("build", help="compile launch symbols ahead of time (no GPU needed)")
    p.add_argument("--matrix", help="build matrix file (default: build_matrix.yaml)")
    add_shard_args(p)
    p.add_argument("--shard", help="build shard i of N (i/N, from 0), balanced by compile seconds")
    p.add_argument("--key", action="extend", nargs="+", help="build these keys instead of a profile (--key A B, or --key A --key B)")
    p.add_argument("--any-key", action="store_true", help="with --key: allow keys the matrix does not list")
    add_worker_args(p, "compile")
    add_dir(p, "--out")
    p.add_argument("--release", help="only keys of this vLLM release; with --key: the release the keys name "
                                     "launches of (default: the matrix's newest)")
    p.add_argument("--list", action="store_true", help="print the selected keys and exit")
    p.add_argument("--json", action="store_true", help="print one JSON summary at the end")
    p.add_argument("--no-link", action="store_true", help="store objects only; skip `dsv41-aot link`")
    add_args(p, "compiled objects")
    p.set_defaults(func=cmd_build)

    p = sub.add_parser("list", help="what a prebuilt directory holds")
    add_dir(p)
    p.add_argument("--release", help="only this vLLM release's keys")
    p.add_argument("--json", action="store_true", help="one JSON document: its entries carry their release")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("fetch-vllm", help="fetch a vLLM release's kernel source (its wheel, unpacked in part) "
                                          "to build that release's keys")
    p.add_argument("release", help="vLLM release, e.g. 0.32.0")
    p.add_argument("--dest", help="folder to unpack into (default: the tree cache, $DSV41_AOT_VLLM_TREES "
                                  "or vllm/<release> in $XDG_CACHE_HOME/dsv41-aot, default ~/.cache/dsv41-aot)")
    p.add_argument("--json", action="store_true", help="one JSON document")
    p.set_defaults(func=cmd_fetch_vllm)
