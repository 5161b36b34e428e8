"""Build and prove one shard of one arch's keys: one cell of the CI matrix.

    python ci/build_shard.py --arch gfx950 --shard 2/8 --out shards/gfx950-2 \
        [--profile full] [--seconds PREVIOUS/timings.json ...] [--vllm-src TREE ...] [--jobs N] [--no-verify]

Every cell must cut the same partition whatever its cache holds, or a key
would land in two shards or none. So the partition comes only from shared
inputs: the profile's (release, key) pairs for the arch, across releases,
and the compile seconds of earlier builds (``--seconds``; the rest are
estimated), balanced longest first by ``dsv41_aot.aot.shards.shard``.

The cell builds once per release, then runs ``dsv41-aot verify
--against-jit --record --shard i/N`` (the same partition), which writes each
room's verified.json. Only then does it write its plan,
``<out>/shard-<arch>-<i>of<N>.json``, from which ci/merge.py proves that the
shards together cover the profile.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from dsv41_aot import commands  # noqa: E402
from dsv41_aot.aot import matrix, shards  # noqa: E402
from dsv41_aot.errors import AotError  # noqa: E402
from dsv41_aot.keys import by_release  # noqa: E402
from dsv41_aot.manifest import atomic_write  # noqa: E402
from ci.stages import cli  # noqa: E402


def pairs(plan_keys: dict) -> list:
    """The sorted (release, key) pairs of a plan's ``keys`` or ``all_keys``."""
    return sorted((r, k) for r, ks in plan_keys.items() for k in ks)


def plan(arch: str, index: int, count: int, profile: str | None = None, matrix_path: str | None = None,
         seconds: dict | None = None) -> dict:
    """The shard plan, which every cell computes identically.

    ``all_keys`` (the arch's) and ``keys`` (this shard's) map each release
    to its key strings.
    """
    m = matrix.load(matrix_path)
    keys = [k for k in m.select(profile) if k.arch == arch]
    if not keys:
        raise AotError(f"profile {profile or m.default_profile!r} has no key for {arch}",
                       fix=commands.listing(profile or m.default_profile, matrix=matrix_path))
    mine = shards.shard(keys, index, count, seconds)
    cost = sum(shards.key_seconds(k, seconds) for k in mine)
    return {
        "arch": arch, "index": index, "count": count, "profile": profile or m.default_profile,
        "all_keys": by_release(keys), "keys": by_release(mine),
        "estimated_seconds": round(cost, 3),
    }


PLANS = "shard-*of*.json"  # what plan_name's names match


def plan_name(arch: str, index: int, count: int) -> str:
    return f"shard-{arch}-{index}of{count}.json"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", required=True)
    ap.add_argument("--shard", required=True, help="i/N, from 0")
    ap.add_argument("--out", required=True, help="this shard's prebuilt directory")
    ap.add_argument("--profile", help="matrix profile (default: the matrix's default)")
    ap.add_argument("--matrix", help="build matrix file")
    ap.add_argument("--seconds", nargs="*", default=[], help="timings.json files with recorded compile seconds")
    ap.add_argument("--vllm-src", action="append", default=[], metavar="TREE",
                    help="a vLLM tree to build its release's keys from (repeatable; default: the installed vllm, "
                         "then the tree cache: dsv41-aot fetch-vllm R)")
    ap.add_argument("--jobs", "-j", type=int)
    ap.add_argument("--no-verify", action="store_true", help="build only; skip the check against vLLM's JIT")
    ap.add_argument("--plan-only", action="store_true", help="print the plan, build nothing")
    args = ap.parse_args(argv)
    try:
        i, n = shards.parse_shard(args.shard)
        p = plan(args.arch, i, n, args.profile, args.matrix, shards.recorded_seconds(args.seconds))
    except (AotError, OSError, ValueError) as e:
        print(f"ci/build_shard.py: error: {e}", file=sys.stderr)
        return getattr(e, "exit_code", 2)
    if args.plan_only:
        print(json.dumps(p, indent=1))
        return 0
    mine = pairs(p["keys"])
    print(f"shard {i}/{n} of {args.arch}: {len(mine)} of {len(pairs(p['all_keys']))} keys "
          f"({', '.join(f'vLLM {r}: {len(ks)}' for r, ks in p['keys'].items()) or 'none'}), "
          f"~{p['estimated_seconds']:.0f} CPU-s", file=sys.stderr)
    out = Path(args.out)
    common = (["--matrix", args.matrix] if args.matrix else []) + (["--jobs", str(args.jobs)] if args.jobs else [])
    trees = [a for t in args.vllm_src for a in ("--vllm-src", t)]
    for release, keys in p["keys"].items():
        r = subprocess.run(cli("build", "--out", out, "--no-progress", "--json", *common, *trees,
                               "--release", release, "--key", *keys), cwd=ROOT)
        if r.returncode:
            return r.returncode
    if mine and not args.no_verify:
        cmd = cli("verify", "--dir", out, "--against-jit", "--record", "--no-progress", *common,
                  "--shard", args.shard, "--arch", args.arch, "--profile", p["profile"], *trees)
        if args.seconds:
            cmd += ["--seconds", *args.seconds]
        r = subprocess.run(cmd, cwd=ROOT)
        if r.returncode:
            return r.returncode
    atomic_write(out / plan_name(args.arch, i, n), (json.dumps(p, indent=1) + "\n").encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
