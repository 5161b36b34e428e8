"""``dsv41-aot verify``'s arguments and output; ``aot.verify`` does the work."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..aot.cache import cache_dir
from ..aot.output import print_json, tally
from ..aot.shipped import installed_kernels, verify_shipped
from ..aot.verify import verify
from ..errors import AotError
from ..facts.releases import NEWEST
from ..keys import BuildKey
from ..proof import flydsl_text
from ..verdict import proofs_line
from . import add_dir, add_shard_args, add_worker_args
from .cache import add_args


def register(sub) -> None:
    p = sub.add_parser("verify", help="check prebuilt objects; with --against-jit, against vLLM's own JIT build")
    add_dir(p)
    p.add_argument("--against-jit", action="store_true",
                   help="rebuild keys through vLLM's runner and FlyDSL's JIT and compare code objects, and each "
                        "key's launch by the JIT and the prebuilt Launcher through the recording HIP (the "
                        "stand-in for the AMD GPU, built with cc)")
    p.add_argument("--wheel", metavar="FILE",
                   help="check a kernels wheel (e.g. from pip download) offline instead of a folder: what it holds per "
                        "(arch, vLLM release, TP), RECORD, its proofs, every band; exit 1 unless every key is proven "
                        "and the wheel sound. With --against-jit its keys are proven from its bands (--record prints "
                        "the proofs; nothing is written into the wheel)")
    pick = p.add_mutually_exclusive_group()
    pick.add_argument("--sample", type=int, metavar="N", help="with --against-jit: N keys per (arch, release), seeded")
    pick.add_argument("--key", action="extend", nargs="+", metavar="KEY", help="only these keys (--key A B, or --key A --key B)")
    pick.add_argument("--shard", metavar="i/N",
                      help="only the keys `dsv41-aot build --shard i/N` builds (with the same --profile/--arch/--seconds)")
    p.add_argument("--release", help="only this vLLM release's rooms; with --key: the release the keys name "
                                     "(default: every room; keys of the newest release)")
    p.add_argument("--matrix", help="build matrix file (default: build_matrix.yaml): --shard's keys, and each "
                                    "release's mono sources digest --against-jit checks its vLLM tree against")
    add_shard_args(p, "with --shard: ")
    p.add_argument("--seed", type=int, default=0, help="seed of --sample (default 0)")
    add_worker_args(p, "JIT build", "with --against-jit: ")
    p.add_argument("--record", action="store_true",
                   help="with --against-jit: write <arch>/vllm-<release>/verified.json, the proof of each key that passed")
    p.add_argument("--json", action="store_true", help="print one JSON report")
    add_args(p, "vLLM's JIT code objects (with --against-jit)")
    p.set_defaults(func=run)


def run(args) -> int:
    if args.wheel and not Path(args.wheel).is_file():
        raise AotError(f"--wheel {args.wheel}: no such file",
                       fix="pip download --no-deps dsv41-aot, then pass its file")
    if args.sample is not None and args.sample < 1:
        raise AotError(f"--sample {args.sample}: must be at least 1", fix="pass --sample N with N >= 1")
    if args.sample is not None and not args.against_jit:
        raise AotError(f"--sample {args.sample} picks the keys vLLM's JIT builds again; without --against-jit it would "
                       f"be ignored", fix=f"pass --against-jit --sample {args.sample} (or drop --sample: every key's "
                                          f"integrity is checked)")
    if args.record and not args.against_jit:
        raise AotError("--record writes the proof of a JIT comparison", fix="pass --against-jit --record")
    keys = None
    if args.key:  # key strings name launches of --release, else of the newest release
        keys = [BuildKey.parse(k, args.release or NEWEST) for k in args.key]
    if args.shard:
        from ..aot import matrix  # PyYAML: only for a shard of the matrix

        keys = matrix.load(args.matrix).choose(args.profile, release=args.release, arches=args.arch,
                                               shard=args.shard, seconds=args.seconds)
    elif args.profile or args.arch or args.seconds:
        raise AotError("--profile, --arch and --seconds choose a shard's keys", fix="pass them with --shard i/N")
    if args.wheel and not args.against_jit:  # the whole wheel's verdict: no option that picks keys
        if picked := next((o for o in ("key", "shard", "release") if getattr(args, o)), None):
            raise AotError(f"--{picked} picks keys, but verify --wheel without --against-jit judges the whole "
                           f"wheel: it would be ignored", fix=f"pass --against-jit to prove only those keys, or drop "
                                                              f"--{picked}")
        from ..aot.wheel import judge

        r = judge(Path(args.wheel))
        if args.json:
            fields = {k: v for k, v in r.items() if k not in ("keys", "failed")}  # tally's own counts
            print_json(tally(sum(room["keys"] for room in r["rooms"]), sum(room["proven"] for room in r["rooms"]),
                             [{"key": None, "error": p, "fix": r["fix"]} for p in r["problems"]]
                             + [{"key": k, "error": "no proof against vLLM's JIT", "fix": r["fix"]}
                                for k in r["unproven"]], **fields))
        else:
            print_wheel_report(r)
        return 1 if r["failed"] else 0
    options = dict(against_jit=args.against_jit, keys=keys, sample=args.sample, seed=args.seed,
                   vllm_src=args.vllm_src or (), progress=args.against_jit and not args.no_progress,
                   jobs=args.jobs, key_timeout=args.key_timeout, record=args.record, release=args.release,
                   matrix_path=args.matrix, cache=cache_dir(args.cache, args.no_cache) if args.against_jit else None)
    if args.wheel:  # with --against-jit: the wheel's kernels proven from a scratch copy, the wheel untouched
        report = verify_shipped(wheel=Path(args.wheel), **options)
    elif args.record and installed_kernels(Path(args.dir)):  # pip's files: --record prints, never rewrites them
        report = verify_shipped(folder=Path(args.dir), **options)
    else:
        report = verify(Path(args.dir), **options)
    if args.json:
        print_json(report)
        for w in report["warnings"]:
            print(f"warning: {w}", file=sys.stderr)
    else:
        for r in report["reports"]:
            status = "ok" if r["ok"] else "FAILED"
            jit = f"  jit {r['jit_seconds']:.1f} s" if r["jit_seconds"] is not None else ""
            jit += " (build cache)" if r["jit_cached"] else ""
            print(f"{status:6} {r['release']:7} {r['key']:44} {'+'.join(r['checks'])}{jit}")
            for prob in r["problems"]:
                print(f"         {prob}")
        libs = [f for f in report["failures"] if f["file"] is not None]
        for f in libs:
            of = f" (vLLM {f['release']})" if f["release"] else ""  # an arch's file (a band, lib/) is no release's
            print(f"FAILED {f['file']}{of}: {f['error']}")
        for p in report["proofs"]:
            print(proofs_line(p))
        for w in report["warnings"]:
            print(f"warning: {w}", file=sys.stderr)
        print(f"{report['keys']} keys checked ({report['jit_checked']} against vLLM's JIT, "
              f"{report['jit_cached']} of those from the build cache): "
              f"{report['keys'] - report['ok']} failed; {len(libs)} library problems")
        for fix in report["fixes"]:
            print(f"fix: {fix}", file=sys.stderr)
        for room, doc in report.get("recorded", {}).items():
            print(f"verified.json of {room} as this run recorded it (nothing was written where the kernels are "
                  f"installed):")
            print(json.dumps(doc, indent=1, sort_keys=True))
    return 1 if report["failed"] else 0


def print_wheel_report(r: dict) -> None:
    """Print a wheel's verdict (``aot.wheel.judge``)."""
    print(f"{r['wheel']}: {r.get('name')} {r.get('version')}, {r['bytes'] / 1e6:.2f} MB")
    for room in r["rooms"]:
        print(f"  {room['arch']} vLLM {room['release']} (mono sources {room['mono_sources']}): {room['keys']} keys, "
              f"{room['proven']} proven against vLLM's JIT{flydsl_text(room['by_flydsl'])}"
              f"{'' if room['verified_json'] else ' (no verified.json)'}")
        for tp, t in room["tp"].items():
            kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(t["kinds"].items()))
            print(f"    TP{tp}: {t['keys']} keys ({kinds}), tokens {t['tokens'][0]}-{t['tokens'][1]}, "
                  f"{t['proven']} proven")
    for b in r["bands"]:
        print(f"  band {b['file']} ({b['room']}): {b['keys']} keys, {b['bytes']} bytes xz -> {b['raw_bytes']} bytes, "
              f"sha256 ok")
    for p in r["problems"]:
        print(f"  problem: {p}")
    if r["unproven"]:
        print(f"  unproven: {len(r['unproven'])} key(s), e.g. {r['unproven'][0]}")
    print(f"{r['wheel']}: {'FAILED' if r['failed'] else 'ok'}")
    if r["fix"]:
        print(f"fix: {r['fix']}", file=sys.stderr)
