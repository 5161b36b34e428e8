"""On AMD GPUs: the prebuilt Launcher and vLLM's FlyDSL JIT launcher of the
same key, run by vLLM's real runner in a TP process group on identical random
inputs, give bit-identical outputs, eagerly and under HIP graph replay.

Sampled calls (seeded, DSV41_AOT_ROCM_SAMPLES of them, default 6) are drawn
from what `dsv41-aot coverage` says the deployment asks for and the prebuilt
directory (DSV41_AOT_PREBUILT, else the loader's) holds: whole-layer calls
(K1 + K2 of one (width, ratio, fold, index)) and FFN calls. TP size:
DSV41_AOT_ROCM_TP (default 2; gfx942 runs TP 4 only).
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from dsv41_aot import deployment as coverage
from dsv41_aot.facts.releases import release_facts
from dsv41_aot.runtime import loader
from dsv41_aot import vllm as plugin
from dsv41_aot.keys import BuildKey
from dsv41_aot.room import Room

# the runner API _tp_worker.py drives: DSV41MonoLayer.kernels(tokens, ratio,
# fold, index) and ffn_kernel(tokens, experts, topk), vLLM 0.33.0's
WORKER_RELEASES = ("0.33.0",)

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("_tp_worker.py")
pytestmark = pytest.mark.rocm


def _deployment(root: Path):
    arches = plugin.kfd_arches()
    if len(arches) != 1:
        pytest.skip(f"needs GPUs of one arch, the KFD topology lists {arches or 'none'}")
    arch = arches[0]
    # the installed vLLM's release: the room its runner is served from (by its mono sources digest)
    release = loader.release_of(root, arch)
    if release not in WORKER_RELEASES:
        pytest.skip(f"tests/rocm/_tp_worker.py drives vLLM {', '.join(WORKER_RELEASES)}'s runner API, "
                    f"the installed vLLM is {release}")
    # default: the smallest TP the release runs on the arch (gfx942: 4 only)
    tp = int(os.environ.get("DSV41_AOT_ROCM_TP", min(release_facts(release).deploy(arch).tp_sizes)))
    import torch

    if torch.cuda.device_count() < tp:
        pytest.skip(f"TP {tp} on {arch} needs {tp} GPUs, torch sees {torch.cuda.device_count()}")
    return coverage.deployment(arch, tp, release=release)


def _calls(dep, root: Path, n: int, seed: int) -> list:
    have = set(Room(root, dep.arch, dep.release).manifest().entries)
    need = {str(k) for k in coverage.required(dep)}
    held = {BuildKey.parse(k, dep.release) for k in need & have}
    reads_index = release_facts(dep.release).deploy(dep.arch).k2_reads_index
    calls = set()
    for k in held:
        if k.kind == "ffn":
            calls.add(("ffn", k.tokens, k.experts, k.topk))
        elif k.kind == "k1" and (k.experts, k.topk) == (384, 6):  # the target's runner
            k2 = dataclasses.replace(k, kind="k2", index=k.index and reads_index)
            if k2 in held:
                calls.add(("kernels", k.tokens, k.ratio, k.fold, k.index))
    if not calls:
        pytest.skip(f"{root} holds no {dep.describe()} key pair to compare (dsv41-aot build --profile {dep.arch}-tp{dep.tp})")
    calls = sorted(calls, key=str)
    picked = random.Random(seed).sample(calls, min(n, len(calls)))
    return [list(c) for c in picked]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_aot_equals_jit_bitwise_eager_and_graph(tmp_path):
    root = loader.prebuilt_dir()
    dep = _deployment(root)
    calls = _calls(dep, root, int(os.environ.get("DSV41_AOT_ROCM_SAMPLES", "6")),
                   int(os.environ.get("DSV41_AOT_ROCM_SEED", "0")))
    report = tmp_path / "report.json"
    port = _free_port()
    procs = []
    for rank in range(dep.tp):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(dep.tp), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), PYTHONPATH=str(REPO))
        env.pop("ARCH", None)  # vLLM compiles for the GPU it finds
        procs.append(subprocess.Popen([sys.executable, str(WORKER), str(root), str(report), json.dumps(calls)],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    logs = [p.communicate(timeout=3600)[0] for p in procs]
    for rank, (p, log) in enumerate(zip(procs, logs)):
        assert p.returncode == 0, f"rank {rank} failed:\n{log[-4000:]}"
    per_rank = json.loads(report.read_text())
    assert len(per_rank) == dep.tp
    for rank, results in enumerate(per_rank):
        assert [r["call"] for r in results] == calls
        for r in results:
            where = f"rank {rank} {r['call']}"
            assert r["aot_is_launcher"], f"{where}: the installed runner did not hand out a prebuilt Launcher"
            assert r["eager_equal"], f"{where}: AOT and JIT outputs differ (eager)"
            assert r["graph_equal"], f"{where}: AOT and JIT outputs differ (graph replay)"
            assert r["graph_matches_eager"], f"{where}: graph replay differs from the eager run"
