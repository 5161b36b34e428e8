"""One TP rank of tests/rocm/test_aot_vs_jit.py (started with torchrun-like
environment by the test: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).

The rank builds vLLM's real ``DSV41MonoLayer`` (peer memory over its gloo
group), random weights in the layouts vLLM's own ``check`` / ``check_942``
assert, valid decode metadata, then for each sampled call runs the layer with
vLLM's FlyDSL JIT launchers and with the prebuilt Launchers on identical
inputs, eagerly and under HIP graph replay, and compares every output bit for
bit. Rank 0 writes the JSON report.

    python _tp_worker.py PREBUILT REPORT CALLS_JSON
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist

from dsv41_aot import vllm as plugin
from dsv41_aot.runtime.loader import Launcher

HC = 4


def _rand_bytes(shape, gen, dev, mask=0x77):
    """Random bytes, exponent bits masked so no FP8 / E8M0 code is NaN or inf."""
    return (torch.randint(0, 256, shape, generator=gen, dtype=torch.int32) & mask).to(torch.uint8).to(dev)


def _f32(shape, gen, dev, scale=0.1):
    return (torch.randn(shape, generator=gen) * scale).to(dev)


def weights(mod, tp: int, experts: int, ratio: int, gen, dev, attention: bool):
    """MonoLayerWeights of random values in vLLM's loaded layout (gfx950) or
    its gfx942 copies, validated by vLLM's own checks."""
    from vllm.models.deepseek_v41.amd.mono.attention.plan import HIDDEN, Dims
    from vllm.models.deepseek_v41.amd.mono.stages.dims import Dims as MoeDims

    gfx942 = mod.GFX942
    fp8 = (lambda s: _rand_bytes(s, gen, dev)) if gfx942 else (lambda s: _rand_bytes(s, gen, dev).view(torch.float8_e4m3fn))
    e8m0 = lambda s: (torch.randint(120, 128, s, generator=gen, dtype=torch.int32)).to(torch.uint8).to(dev)  # noqa: E731
    bf16 = lambda s: _f32(s, gen, dev).to(torch.bfloat16)  # noqa: E731
    attn = None
    if attention:
        d = Dims(tp)
        h, g = d.heads, d.groups
        attn = mod.AttnWeights(
            layer_id=3, wqkv=fp8((1792, HIDDEN)), wqkv_scale=e8m0((56, HIDDEN // 32)), q_norm=bf16((1280,)),
            kv_norm=bf16((512,)), wq_b=fp8((h * 512, 1280)), wq_b_scale=e8m0((h * 16, 40)),
            wo_a=fp8((g * 1024, d.group_k)), wo_a_scale=e8m0((g * 32, d.group_k // 32)),
            wo_b=fp8((HIDDEN, g * 1024)), wo_b_scale=e8m0((HIDDEN // 32, g * 32)),
            attn_sink=_f32((64,), gen, dev), cos_sin=_f32((4096, 64), gen, dev, 1.0), ratio=ratio,
        )
        attn.check(d)
    md = MoeDims(tp)
    common = dict(
        attn=attn, hc_attn_fn=_f32((24, HC * HIDDEN), gen, dev, 0.01), hc_attn_scale=_f32((3,), gen, dev),
        hc_attn_base=_f32((24,), gen, dev), attn_norm=bf16((HIDDEN,)), hc_ffn_fn=_f32((24, HC * HIDDEN), gen, dev, 0.01),
        hc_ffn_scale=_f32((3,), gen, dev), hc_ffn_base=_f32((24,), gen, dev), ffn_norm=bf16((HIDDEN,)),
        gate_w=bf16((experts, HIDDEN)), bias=_f32((experts,), gen, dev),
    )
    if gfx942:
        inter, kp = md.inter_real, -(-md.sh_inter // 128) * 128
        moe = dict(
            w13=_rand_bytes((experts, 2 * inter, HIDDEN // 2), gen, dev), w13_s=e8m0((experts, 2 * inter, HIDDEN // 32)),
            w2=_rand_bytes((experts, HIDDEN, inter // 2), gen, dev), w2_s=e8m0((experts, HIDDEN, inter // 32)),
            sgu=fp8((2 * md.sh_inter, HIDDEN)), sgu_s=e8m0((2 * md.sh_inter // 32, HIDDEN // 32)),
            sw2=fp8((HIDDEN, kp)), sw2_s=e8m0((HIDDEN // 32, kp // 32)),
        )
    else:
        fp4 = lambda s: _rand_bytes(s, gen, dev).view(torch.float4_e2m1fn_x2)  # noqa: E731
        moe = dict(
            w13=fp4((experts, 2 * md.inter, HIDDEN // 2)), w13_s=e8m0((experts * 2 * md.inter, HIDDEN // 32)),
            w2=fp4((experts, HIDDEN, md.inter // 2)), w2_s=e8m0((experts * HIDDEN, md.down_scale_cols)),
            sgu=fp8((2 * md.sh_inter, HIDDEN)), sgu_s=e8m0((2 * md.sh_inter // 32, HIDDEN // 32)),
            sw2=fp8((HIDDEN, md.sh_inter)), sw2_s=e8m0((HIDDEN // 32, md.sh_inter // 32)),
        )
    w = mod.MonoLayerWeights(**common, **moe)
    w.check_942(experts) if gfx942 else w.check(tp, experts)
    return w


def layer_inputs(M: int, ratio: int, swa_width: int, gen, dev) -> dict:
    """A decode step's tensors and metadata with every index in range: M
    tokens of M requests, 64-slot blocks, SWA windows over written slots, a
    top-k of local compressed rows below (position + 1) // ratio."""
    hidden, block, blocks = 5120, 64, 64
    pos = torch.randint(200, 3000, (M,), generator=gen)
    t = dict(
        x=_f32((M, hidden), gen, dev).to(torch.bfloat16), residual=_f32((M, HC, hidden), gen, dev).to(torch.bfloat16),
        post_mix=_f32((M, HC, 1), gen, dev), res_mix=_f32((M, HC, HC), gen, dev), pre_mix=_f32((M, HC), gen, dev),
        positions=pos.to(dev), slot_mapping=(torch.randperm(blocks * block, generator=gen)[:M]).to(dev),
        swa_cache=_rand_bytes((blocks, block, 584), gen, dev),
        token_to_req=torch.arange(M, dtype=torch.int32).to(dev),
    )
    lens = torch.randint(1, swa_width + 1, (M,), generator=gen, dtype=torch.int32)
    idx = torch.randint(0, blocks * block, (M, 1, swa_width), generator=gen, dtype=torch.int32)
    idx[torch.arange(swa_width).expand(M, 1, swa_width) >= lens.view(M, 1, 1)] = -1
    t.update(swa_indices=idx.to(dev), swa_lens=lens.to(dev))
    if ratio:
        cblock, nb = 64, 64
        n = torch.clamp((pos + 1) // ratio, max=nb * cblock)
        topk = torch.full((M, 512), -1, dtype=torch.int32)
        for i in range(M):
            k = int(min(n[i], 512))
            topk[i, :k] = torch.randperm(int(n[i]), generator=gen)[:k].to(torch.int32)
        t.update(topk_indices=topk.to(dev), comp_cache=_rand_bytes((nb * M, cblock, 584), gen, dev),
                 comp_block_table=torch.arange(nb * M, dtype=torch.int32).view(M, nb).to(dev))
    return t


def clone_inputs(t: dict) -> dict:
    return {k: v.clone() for k, v in t.items()}


def run_layer(runner, w, t: dict, fold: bool, index: bool):
    kw = {k: t[k] for k in ("topk_indices", "comp_cache", "comp_block_table") if k in t}
    if index:
        kw["select"] = lambda normed, qr: None  # the top-k is already in topk_indices
    return runner.forward(w, t["x"], t["residual"], t["post_mix"], t["res_mix"], t["pre_mix"], t["positions"],
                          t["slot_mapping"], t["swa_cache"], t["swa_indices"], t["swa_lens"], t["token_to_req"],
                          fold=fold, **kw)


def run_ffn(runner, w, t: dict, topk: int):
    return runner.ffn(w, t["x"], t["residual"], t["post_mix"], t["res_mix"], t["pre_mix"], topk=topk)


def bits(outs) -> list:
    return [o.detach().contiguous().view(torch.uint8).clone() for o in outs]


def same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(x.shape == y.shape and torch.equal(x, y) for x, y in zip(a, b))


def compare(runner, memo, jit, aot, step, inputs: dict) -> dict:
    """Eager and graph-replay outputs of the JIT and AOT launchers on clones of
    the same inputs (caches included: K1 writes the KV record)."""
    out = {}
    results = {}
    for name, launchers in (("jit", jit), ("aot", aot)):
        runner._kernels[memo] = launchers
        t = clone_inputs(inputs)
        torch.cuda.synchronize()
        results[name] = bits(step(t))
        # graph: capture on static inputs (warmed up eagerly above), replay twice
        t = clone_inputs(inputs)
        step(t)  # eager warm-up on the static buffers
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            with torch.cuda.graph(g, stream=s):
                static_out = step(t)
        torch.cuda.current_stream().wait_stream(s)
        fresh = clone_inputs(inputs)
        for k in t:
            t[k].copy_(fresh[k])
        g.replay()
        torch.cuda.synchronize()
        results[name + "_graph"] = bits(static_out)
        dist.barrier()
    out["eager_equal"] = same(results["jit"], results["aot"])
    out["graph_equal"] = same(results["jit_graph"], results["aot_graph"])
    out["graph_matches_eager"] = same(results["aot"], results["aot_graph"])
    out["aot_is_launcher"] = all(isinstance(x, Launcher) for x in (aot if isinstance(aot, tuple) else (aot,)))
    return out


def main(prebuilt: str, report: str, calls: list) -> int:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from vllm.models.deepseek_v41.amd.mono import runner as mod

    runner = mod.DSV41MonoLayer(world, rank, dist.group.WORLD, dev)
    results = []
    for i, call in enumerate(calls):
        gen = torch.Generator().manual_seed(1000 + i)  # activations: same on every rank
        wgen = torch.Generator().manual_seed(2000 + 31 * i + rank)  # this rank's weight shard
        plugin.uninstall()
        runner._kernels.clear()
        if call[0] == "kernels":
            _, M, ratio, fold, index = call
            jit = runner.kernels(M, ratio, fold, index)
            runner._kernels.clear()
            plugin.install("strict", prebuilt=prebuilt)
            aot = runner.kernels(M, ratio, fold, index)
            w = weights(mod, world, runner.experts, ratio, wgen, dev, attention=True)
            inputs = layer_inputs(M, ratio, runner.swa_width, gen, dev)
            res = compare(runner, (M, ratio, fold, index), jit, aot, lambda t: run_layer(runner, w, t, fold, index), inputs)
        else:
            _, M, experts, topk = call
            jit = runner.ffn_kernel(M, experts, topk)
            runner._kernels.clear()
            plugin.install("strict", prebuilt=prebuilt)
            aot = runner.ffn_kernel(M, experts, topk)
            w = weights(mod, world, experts, 0, wgen, dev, attention=False)
            inputs = layer_inputs(M, 0, runner.swa_width, gen, dev)
            res = compare(runner, (M, "ffn", experts, topk), jit, aot, lambda t: run_ffn(runner, w, t, topk), inputs)
        res["call"] = call
        results.append(res)
    gathered = [None] * world
    dist.all_gather_object(gathered, results)
    if rank == 0:
        with open(report, "w") as f:
            json.dump(gathered, f)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3])))
