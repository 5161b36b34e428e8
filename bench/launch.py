"""The host cost of one launch: the prebuilt Launcher beside vLLM's own JIT
launcher (FlyDSL), K1, K2 and FFN, in one run.

    .venv/bin/python bench/launch.py [--dir DIR] [--batches 51] [--per-batch 200]

Both launch through the recording HIP (dsv41_aot/aot/hiprec/recording_hip.c,
built here with cc), the stand-in for the AMD GPU no machine here has: it
answers each HIP call without GPU work, so what is timed is the host side of
a launch, from the Python call to hipModuleLaunchKernel's return: the
Launcher's packing and its band's exported host code (hipGetDevice +
hipModuleLaunchKernel a launch), against FlyDSL's JIT call path (argument
conversion, its cache lookup, hipModuleGetFunction before every launch, then
hipModuleLaunchKernel). The stand-in records nothing while timed (no
RECORDING_HIP_LOG); a short recorded run before the timing counts the HIP
calls each launch makes.

DIR is the shared gfx950 TP4 deployment by default (any built and linked
prebuilt folder holding the keys works, a smoke build too); the keys are
vLLM 0.33.0's K1 s=4 tp=4 r=1, K2 s=4 tp=4 r=1 and FFN s=4 tp=4 (the smoke
profile has them). vLLM's JIT compiles each key once first, into a temporary
FlyDSL cache (tens of seconds on 2 cores, not timed). Each figure is the
median, over ``--batches`` batches, of the mean launch of a batch of
``--per-batch`` back-to-back launches (with the min and max batch). The load
average is printed before and after. No timing is asserted anywhere.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for p in (REPO, REPO / "tests"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))
# the workplace's shared deployment: beside the checkout, or beside a worktree's parent
SHARED = next((p / "shared" / "prebuilt-gfx950-tp4" for p in (REPO.parent, REPO.parents[1])
               if (p / "shared" / "prebuilt-gfx950-tp4").is_dir()), REPO.parent / "shared" / "prebuilt-gfx950-tp4")
ARCH, RELEASE = "gfx950", "0.33.0"
KEYS = {"K1": "k1@gfx950:s=4,tp=4,r=1", "K2": "k2@gfx950:s=4,tp=4,r=1", "FFN": "ffn@gfx950:s=4,tp=4,r=0"}

# the timing loop both sides run: ``go()`` is one launch
_TIMING = """
import time
def timed(go, batches, per_batch):
    for _ in range(per_batch):  # warm: caches, branch predictors, the thread's buffer
        go()
    means = []
    for _ in range(batches):
        t = time.perf_counter_ns()
        for _ in range(per_batch):
            go()
        means.append((time.perf_counter_ns() - t) / per_batch / 1000)
    return means
def hip_calls(log):
    import _recording_hip as rh
    from pathlib import Path
    return [c.name for c in rh.calls(Path(log))]
"""

_PREBUILT = _TIMING + """
import json, os, sys
import dsv41_aot
root, keys, batches, per_batch, log = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
out = {}
for name, key in keys.items():
    l = dsv41_aot.preload([key], release=%r, prebuilt=root)[0]
    args = list(range(100, 100 + len(l.abi) - 1))
    os.environ["RECORDING_HIP_LOG"] = log  # two recorded launches: the calls one makes
    l(*args, stream=0x5150)
    open(log, "w").close()
    l(*args, stream=0x5150)
    calls = hip_calls(log)
    del os.environ["RECORDING_HIP_LOG"]
    out[name] = dict(us=timed(lambda: l(*args, stream=0x5150), batches, per_batch), calls=calls)
print(json.dumps(out))
""" % RELEASE

_JIT = _TIMING + """
import inspect, json, os, sys
from dsv41_aot import source
from dsv41_aot.aot import compat
from dsv41_aot.facts.kinds import KINDS
from dsv41_aot.keys import BuildKey
keys, batches, per_batch, log = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
compat.install_aiter_shim()
src = source.find()
layer = source.import_mono(src, "layer")
out = {}
for name, key in keys.items():
    k = BuildKey.parse(key, src.version)
    f = getattr(layer, KINDS[k.kind].builder)(layer.MonoBuild(**k.build_fields()))  # as vLLM's runner builds it
    n = sum(p.default is inspect.Parameter.empty for p in inspect.signature(f.func).parameters.values())
    args = list(range(100, 100 + n))
    f(*args, stream=0x5150)  # compiles (not timed), then launches
    os.environ["RECORDING_HIP_LOG"] = log
    open(log, "w").close()
    f(*args, stream=0x5150)
    calls = hip_calls(log)
    del os.environ["RECORDING_HIP_LOG"]
    out[name] = dict(us=timed(lambda: f(*args, stream=0x5150), batches, per_batch), calls=calls)
print(json.dumps(out))
"""


def py(code: str, *args, env: dict) -> dict:
    """``code`` in a fresh process: its last stdout line, as JSON."""
    full = {k: v for k, v in os.environ.items() if not k.startswith(("DSV41_AOT_", "FLYDSL_", "RECORDING_HIP_"))}
    full.update(PYTHONPATH=f"{REPO}{os.pathsep}{REPO / 'tests'}", **env)
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *map(str, args)], capture_output=True,
                       text=True, env=full, timeout=3600, cwd=REPO, check=False)
    if r.returncode:
        raise RuntimeError(f"bench subprocess failed:\n{r.stderr[-4000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def figure(values: list) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return f.read().strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, default=SHARED, help="a linked prebuilt folder holding the keys")
    ap.add_argument("--batches", type=int, default=51)
    ap.add_argument("--per-batch", type=int, default=200)
    a = ap.parse_args()
    import _recording_hip as rh
    from dsv41_aot.aot import compiler, toolchain

    work = Path(tempfile.mkdtemp(prefix="dsv41-bench-launch-"))
    try:
        lib = rh.build(work / "hip")
        log = work / "hip.log"
        hip_env = rh.env(lib, None, arch=ARCH)
        before = loadavg()
        jit_env = compiler.worker_env(ARCH, str(toolchain.find().rocm_path), str(work / "flydsl-cache"))
        jit_env = {k: v for k, v in jit_env.items() if k in ("ARCH", "FLYDSL_GPU_ARCH", "ROCM_PATH")
                   or k.startswith("FLYDSL_")}
        jit = py(_JIT, json.dumps(KEYS), a.batches, a.per_batch, log, env={**hip_env, **jit_env})
        prebuilt = py(_PREBUILT, a.dir.resolve(), json.dumps(KEYS), a.batches, a.per_batch, log, env=hip_env)
        after = loadavg()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"Host cost of one launch through the recording HIP (stand-in for the AMD GPU), {ARCH}, vLLM {RELEASE};")
    print(f"microseconds: median (min-max) of {a.batches} batches of {a.per_batch} launches' mean\n")
    print(f"| launch | prebuilt Launcher | vLLM's JIT launcher (FlyDSL) | JIT / prebuilt |")
    print("| --- | --- | --- | --- |")
    for name, key in KEYS.items():
        p, j = prebuilt[name]["us"], jit[name]["us"]
        print(f"| {name} `{key}` | {figure(p)} | {figure(j)} | {statistics.median(j) / statistics.median(p):.1f}x |")
    print("\nHIP calls per launch (a recorded launch after the first):")
    for side, out in (("prebuilt", prebuilt), ("JIT", jit)):
        print(f"- {side}: " + "; ".join(f"{name}: {' + '.join(out[name]['calls'])}" for name in KEYS))
    print(f"\n/proc/loadavg before: {before}; after: {after}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
