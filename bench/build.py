#!/usr/bin/env python
"""Build figures, measured in one run on this machine.

    .venv/bin/python bench/build.py [--jobs 2] [--widths 1,16,48] [--out DIR]

Builds a sample of keys (K1, K2, FFN x step widths x both arches, TP 4,
ratio 1) into a fresh prebuilt directory with ``jobs`` workers and prints,
beside each target: compile seconds by kind / width / arch; parallel
efficiency (sum of per-symbol seconds / (wall x jobs)); the same for
``verify --against-jit`` of the keys just built (same jobs, same run: vLLM's
JIT rebuilds each one on the worker pool), and its wall beside the build's;
the no-op rebuild;
stored bytes per symbol beside FlyDSL's unstripped export; the key count of
the ``full`` profile and its CPU time extrapolated from the sample; and the
anchor: what vLLM's FlyDSL JIT pays for the same symbols at a cold start
(the serial sum of the same compiles). That anchor is low: the build's and
verify's workers answer FlyDSL's frame lookups from tables
(``flydsl_api.cache_frame_lookups``), and vLLM in serving does not, which
costs it about 1.8 times as much (the ten smoke keys' JIT builds, one after
the other, load 1.1: 63.2 s without the tables, 38.7 s with the position
tables only, 35.8 s with both).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dsv41_aot.aot import matrix  # noqa: E402
from dsv41_aot.facts.kinds import KINDS, kind_facts  # noqa: E402
from dsv41_aot.facts.releases import NEWEST, release_facts  # noqa: E402
from dsv41_aot.keys import BuildKey  # noqa: E402
from dsv41_aot.room import Room  # noqa: E402

ARCHES = tuple(release_facts(NEWEST).arches)  # the sample: the newest release's keys on each arch it runs on


def sample_key(kind: str, arch: str, tokens: int) -> BuildKey:
    """The sample's key of ``kind`` at ``tokens``: TP 4, compress ratio 1
    (the ratio a kind fixes, e.g. the FFN's 0)."""
    return BuildKey(kind, arch, tokens, 4, kind_facts(kind).fixed.get("ratio", 1), release=NEWEST)


def cli(*args) -> dict:
    """A build's JSON summary (a build with failed keys exits 1 and still
    prints one: the failures are reported, not fatal, here)."""
    proc = subprocess.run([sys.executable, "-m", "dsv41_aot.cli", *map(str, args)], cwd=REPO, capture_output=True, text=True)
    if proc.returncode not in (0, 1) or not proc.stdout.strip():
        raise SystemExit(f"dsv41-aot {' '.join(map(str, args[:1]))} failed ({proc.returncode}):\n{proc.stderr}")
    return json.loads(proc.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--widths", default="1,16,42")
    ap.add_argument("--out", help="prebuilt dir (default: a fresh temp dir)")
    args = ap.parse_args()
    widths = [int(w) for w in args.widths.split(",")]
    keys = [sample_key(kind, arch, s) for arch in ARCHES for s in widths for kind in KINDS]
    out = Path(args.out or tempfile.mkdtemp(prefix="dsv41-bench-")) / "kernels_prebuilt"
    print(f"sample: {len(keys)} keys ({', '.join(KINDS)} x widths {widths} x {'/'.join(ARCHES)}, TP 4), jobs={args.jobs}, out={out}")

    cold = cli("build", "--key", *map(str, keys), "--any-key", "--out", out, "--jobs", args.jobs, "--json", "--no-progress")
    check = cli("verify", "--dir", out, "--against-jit", "--jobs", args.jobs, "--json", "--no-progress")
    t = time.perf_counter()
    noop = cli("build", "--key", *map(str, keys), "--any-key", "--out", out, "--jobs", args.jobs, "--json", "--no-progress")
    noop_wall = time.perf_counter() - t

    for f in cold["failures"]:
        print(f"  refused: {f['error']}")
    entries, secs = {}, {}
    for arch in ARCHES:
        man = Room(out, arch, NEWEST).manifest()  # the sample's keys are the newest release's (its room)
        entries.update(man.entries)
        secs.update(man.timings)  # the room's timings.json: the manifest holds nothing measured

    print("\n== compile seconds by kind, width and arch (one worker's view; 2 busy cores) ==")
    print(f"{'kind':5} {'arch':7} " + " ".join(f"s={w:<6}" for w in widths))
    for kind in KINDS:
        for arch in ARCHES:
            row = [secs.get(str(sample_key(kind, arch, w)), float("nan")) for w in widths]
            # nan: the key was refused (see above); its time is not recorded
            print(f"{kind:5} {arch:7} " + " ".join(f"{x:<8.2f}" for x in row))

    total = cold["compile_seconds"]  # every compile of the cold run, refused keys included
    eff = total / (cold["wall_seconds"] * args.jobs)
    print("\n== the build ==")
    print(f"{'':34} {'anchor / target':>18} {'dsv41-aot':>12}")
    print(f"{'cold start, these symbols (s)':34} {total:>18.1f} {cold['wall_seconds']:>12.1f}   "
          "(anchor: the same compiles one by one; vLLM's JIT pays more)")
    print(f"{'parallel efficiency':34} {'>= 0.90':>18} {eff:>12.2f}   (sum of symbol s / (wall x {args.jobs} jobs))")
    jit_total = sum(r["jit_seconds"] or 0.0 for r in check["reports"])
    veff = jit_total / (check["wall_seconds"] * args.jobs)
    print(f"{'verify --against-jit wall (s)':34} {cold['wall_seconds']:>18.1f} {check['wall_seconds']:>12.1f}   "
          f"(anchor: the build's wall; {check['jit_checked']} keys, {check['failed']} failed)")
    print(f"{'verify parallel efficiency':34} {'>= 0.90':>18} {veff:>12.2f}   (sum of JIT s / (wall x {args.jobs} jobs))")
    print(f"{'no-op rebuild (s)':34} {'<= 5.0':>18} {noop_wall:>12.2f}   ({noop['compiled']} compiled, {noop['up_to_date']} up to date)")

    stored = [e.bytes for e in entries.values()]
    naive = [e.export_bytes or 0 for e in entries.values()]
    code = [e.code_object_bytes for e in entries.values()]
    print("\n== bytes per symbol (min / median / max) ==")
    for name, xs in (("FlyDSL export_to_c, unstripped", naive), ("dsv41-aot stored (stripped)", stored), ("GPU code object inside", code)):
        print(f"{name:34} {min(xs):>9,} {int(statistics.median(xs)):>9,} {max(xs):>9,}")
    print(f"{'target: stored <= 160 KB':34} {'':>9} {'':>9} {'ok' if max(stored) <= 160_000 else 'MISSED':>9}")

    # full profile: per (kind, arch) a line through the measured widths
    fit = {}
    for kind in KINDS:
        for arch in ARCHES:
            pts = [(w, secs[k]) for w in widths if (k := str(sample_key(kind, arch, w))) in secs]
            if len(pts) > 1:
                slope = (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0])
            else:
                slope = 0.0
            fit[kind, arch] = (pts[0][1] - slope * pts[0][0], slope)
    full = matrix.load().select("full")
    cpu = defaultdict(float)  # (arch, release) -> CPU seconds; every release's keys on the sample's fit
    count = defaultdict(int)
    for k in full:
        a, b = fit[k.kind, k.arch]
        cpu[k.arch, k.release] += a + b * k.tokens
        count[k.arch, k.release] += 1
    print("\n== the full profile (the sample is vLLM 0.33.0's keys; other releases' keys on the same fit) ==")
    for (arch, release), secs_ in sorted(cpu.items()):
        print(f"{arch} vLLM {release}: {count[arch, release]} keys, ~{secs_ / 3600:.1f} CPU-hours extrapolated "
              f"(~{secs_ / 3600 / args.jobs / max(eff, 0.01):.1f} h on {args.jobs} cores; split into CI shards)")
    print(f"total: {len(full)} keys, ~{sum(cpu.values()) / 3600:.1f} CPU-hours")
    return 0


if __name__ == "__main__":
    sys.exit(main())
