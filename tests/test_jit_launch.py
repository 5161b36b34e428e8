"""The prebuilt launch is the launch vLLM's JIT makes, as HIP sees it: for K1,
K2 and FFN at s=4 TP4 of the newest release on gfx950, vLLM's own layer
builds each launcher and FlyDSL's JIT compiles and launches it, and the
prebuilt Launcher of the smoke build launches the same key with the same
values, both through the recording HIP (the suite's one stand-in for the AMD
GPU, MOCK-GPU: FlyDSL's JIT runtime binds it as libamdhip64.so.7 through
LD_LIBRARY_PATH, the loader finds that same mapped copy). Compared launch by
launch: the image (sha256), kernel name, grid, block, shared memory, stream
and the argument segment's bytes.

(``verify --against-jit`` proves the code objects byte-identical; this shows
the host code of both paths hands HIP the same launch. Each key is JIT
compiled once here, on the CPU.)
"""

from __future__ import annotations

import json

import _recording_hip as rh

KEYS = ["k1@gfx950:s=4,tp=4,r=1", "k2@gfx950:s=4,tp=4,r=1", "ffn@gfx950:s=4,tp=4,r=0"]
FIELDS = ("module", "kernel", "grid", "block", "shared", "stream", "extra", "kernarg")

_BOTH = """
import inspect, json, sys
from pathlib import Path
import _recording_hip as rh
import dsv41_aot
from dsv41_aot import source
from dsv41_aot.aot import compat
from dsv41_aot.facts.kinds import KINDS
from dsv41_aot.keys import BuildKey
root, images, layouts, keys = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), json.loads(sys.argv[4])

class Stream:  # torch.cuda.current_stream(), as vLLM's runner passes it
    cuda_stream = 0x7E57

compat.install_aiter_shim()
src = source.find()
layer = source.import_mono(src, "layer")
# vLLM's parents are bare modules here (no spec to find vLLM by): the loader is told which mono package
# runs, as the plugin tells it the runner module it patched
from dsv41_aot.runtime.host import running_vllm
running_vllm(Path(layer.__file__).parent)
jits, prebuilt = [], []
for key in keys:
    k = BuildKey.parse(key, src.version)
    f = getattr(layer, KINDS[k.kind].builder)(layer.MonoBuild(**k.build_fields()))  # vLLM's own launcher
    n = sum(p.default is inspect.Parameter.empty for p in inspect.signature(f.func).parameters.values())
    f(*range(n), stream=Stream())  # FlyDSL compiles it, loads it, launches it
    jits.append((f, n))
    prebuilt.append(dsv41_aot.load_key(key, prebuilt=root))
rh.write_layouts(images, layouts)  # from the images HIP was handed
sent = []
for key, (f, n), l in zip(keys, jits, prebuilt):
    assert len(l.abi) - 1 == n, (key, n, len(l.abi))
    values = [-(j + 1) * 7919 if s["ctype"] == "int32" else ((j + 1) << 40) + j for j, s in enumerate(l.abi[:-1])]
    f(*values, stream=Stream())
    l(*values, stream=Stream())
    sent.append(key)
print(json.dumps(sent))
"""


def test_prebuilt_and_jit_launches_hand_hip_the_same_launch(smoke_dir, recording_hip, tmp_path):
    log, images, layouts = tmp_path / "hip.log", tmp_path / "images", tmp_path / "layouts.tsv"
    images.mkdir()
    from dsv41_aot.aot import compiler, toolchain

    env = compiler.worker_env("gfx950", str(toolchain.find().rocm_path), str(tmp_path / "flydsl-cache"))
    env = {k: v for k, v in env.items() if k in ("ARCH", "FLYDSL_GPU_ARCH", "ROCM_PATH") or k.startswith("FLYDSL_")}
    env.update(rh.env(recording_hip, log, arch="gfx950", images=images, layouts=layouts))
    proc = rh.python(_BOTH, smoke_dir, images, layouts, json.dumps(KEYS), env=env, timeout=900)
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == KEYS
    launches = rh.calls(log, "hipModuleLaunchKernel")
    # per key: the JIT's first launch (before the layouts), then the JIT's and the prebuilt's compared launch
    first, compared = launches[:len(KEYS)], launches[len(KEYS):]
    assert len(compared) == 2 * len(KEYS) and all(c.status == 0 for c in launches)
    for key, jit, pre in zip(KEYS, compared[0::2], compared[1::2]):
        assert all(pre[f] == jit[f] for f in FIELDS), \
            (key, {f: (pre[f][:80], jit[f][:80]) for f in FIELDS if pre[f] != jit[f]})
        assert pre["kernarg"] not in ("?", "none") and pre["stream"] == "0x7e57"
        assert pre["fn"] != jit["fn"] and pre["grid"] == "256,1,1"  # two modules of one image, each its own function
    # the JIT looks its kernel up before every launch; the prebuilt band once per device
    lookups = [c["kernel"] for c in rh.calls(log, "hipModuleGetFunction")]
    assert sorted(lookups) == sorted([c["kernel"] for c in first] * 3)
