"""The launches vLLM can ask for on one deployment: each rule written once.

The rules follow each release's runner, reading :mod:`facts.releases`' facts
(paths relative to ``vllm/models/deepseek_v41/``). The build matrix
(``aot/matrix.py``), ``dsv41-aot coverage`` and ``doctor`` all call
:func:`runner_calls` or :func:`required`, so a rule changed here changes all three.

Shared core: standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import AotError
from .facts.arches import ARCHES
from .facts.kinds import KINDS
from .facts.releases import release_facts
from .keys import BuildKey
from .manifest import LIBS_JSON

# amd/mono_decode.py _mono_runner: every runner is built with timeline=False
TIMELINE = False


class CoverageInputError(AotError):
    """A deployment coverage cannot describe (unknown arch, unsupported TP...)."""


class NotDeployed(CoverageInputError):
    """A deployment (arch or TP) one release's mono path does not run.

    Skipped when every release is checked; bad input when that release is named."""


@dataclass(frozen=True)
class Deployment:
    """One vLLM deployment of the mono path.

    ``draft`` is the DSpark draft's (experts, topk, swa_width), if it has one."""

    release: str
    arch: str
    tp: int
    max_rows: int
    draft: tuple | None = None

    def describe(self) -> str:
        """The deployment in words, for reports."""
        if self.draft is None:
            d = "no draft"
        elif release_facts(self.release).deploy(self.arch).draft_layers is None:
            d = "draft layers off the mono path"
        else:
            d = "draft e=%d k=%d w=%d" % self.draft
        return f"vLLM {self.release} {self.arch} TP{self.tp}, steps of 1..{self.max_rows} rows, {d}"


def deployment(arch: str, tp: int, max_rows: int | None = None, draft: tuple | None = None, *,
               release: str) -> Deployment:
    """A deployment checked against vLLM ``release``'s own refusals.

    CoverageInputError when it is wrong; NotDeployed when the release does
    not run the arch or TP."""
    rel = release_facts(release)
    runs = "; ".join(f"{a}: TP {' or '.join(map(str, d.tp_sizes))}" for a, d in rel.arches.items())
    fix = f"name an arch and TP vLLM {release} runs ({runs})"  # coverage's --arch, doctor's device or DSV41_AOT_ARCH
    if arch not in ARCHES:
        raise CoverageInputError(f"unknown arch {arch!r}: dsv41-aot knows {', '.join(ARCHES)}", fix=fix)
    if arch not in rel.arches:
        raise NotDeployed(f"vLLM {release}'s mono path does not run on {arch} (amd/mono_decode.py: it runs on "
                          f"{', '.join(rel.arches)})", fix=fix)
    dep = rel.deploy(arch)
    if tp not in dep.tp_sizes:
        raise NotDeployed(
            f"vLLM {release}'s mono path refuses {arch} at TP {tp} (amd/mono_decode.py MonoDecodeLayer._create: "
            f"{arch} takes tensor parallel size {' or '.join(map(str, dep.tp_sizes))})",
            fix=f"pass --tp {' or --tp '.join(map(str, dep.tp_sizes))} (vLLM {release} runs {runs})",
        )
    if max_rows is None:
        max_rows = dep.max_rows
    if max_rows < 1:
        raise CoverageInputError(f"--max-rows {max_rows}: a step has at least one row", fix=f"pass --max-rows 1..{dep.max_rows}")
    if draft is not None:
        if len(draft) != 3 or any(not isinstance(v, int) or v < 1 for v in draft):
            raise CoverageInputError(f"--draft {draft}: expected three positive integers experts,topk,swa_width",
                                     fix="--draft 128,3,192  (V4.1-Flash's DSpark draft)")  # a preset name only where the matrix is read
    return Deployment(release, arch, tp, min(max_rows, dep.max_rows), tuple(draft) if draft else None)


def parse_draft(text: str | None, presets: dict | None = None) -> tuple | None:
    """Parse ``--draft``: ``experts,topk,swa_width``, or the name of one of ``presets``.

    ``presets`` are the build matrix's drafts, when the caller has the matrix."""
    if text is None:
        return None
    presets = presets or {}
    if text in presets:
        return tuple(presets[text])
    try:
        parts = tuple(int(p) for p in text.split(","))
    except ValueError:
        parts = ()
    if len(parts) != 3:
        named = f" or a draft of the matrix ({', '.join(presets)})" if presets else ""
        raise CoverageInputError(f"--draft {text!r}: expected experts,topk,swa_width{named}",
                                 fix="--draft 128,3,192  (V4.1-Flash's DSpark draft)")
    return parts


@dataclass(frozen=True)
class RunnerCall:
    """One call vLLM's runner (runner.py ``DSV41MonoLayer``) makes for a step, and its keys.

    ``method`` is ``kernels`` (K1 and K2 of a whole layer) or ``ffn_kernel``;
    ``args`` follow its release's signature; ``runner`` holds what the runner
    was built with (the target's or the DSpark draft's)."""

    method: str
    args: tuple
    runner: dict
    keys: tuple

    def as_json(self) -> list:
        """``[method, *args, {runner fields}]``: how tests/_vllm_probe.py and bench/load.py ask for it."""
        return [self.method, *self.args, dict(self.runner)]


def _kernels(dep: Deployment, tokens: int, ratio: int, fold: bool, index: bool, routing: dict) -> RunnerCall:
    """kernels(tokens, ratio[, fold, index]) (0.32.0's takes tokens and ratio) and its K1 and K2 keys.

    A field the release's MonoBuild lacks is pinned by BuildKey itself."""
    rel = release_facts(dep.release)
    args = (tokens, ratio) + ((fold, index) if rel.reads("fold") and rel.reads("index") else ())
    b = dict(arch=dep.arch, tokens=tokens, tp=dep.tp, ratio=ratio, fold=fold, index=index, timeline=TIMELINE, **routing)
    k2 = b if rel.deploy(dep.arch).k2_reads_index else dict(b, index=False)
    keys = (BuildKey(kind="k1", release=dep.release, **b), BuildKey(kind="k2", release=dep.release, **k2))
    return RunnerCall("kernels", args, dict(tp=dep.tp, timeline=TIMELINE, **routing), keys)


def _ffn_kernel(dep: Deployment, tokens: int, runner: dict, routing: dict) -> RunnerCall:
    """ffn_kernel(tokens[, experts, topk]) on ``runner``'s runner, for a layer of ``routing``, and its key.

    The key has ratio 0 and the layer's routing (0.32.0's takes none); the
    fields the FFN launch does not read (facts/kinds.py) are pinned by BuildKey."""
    rel = release_facts(dep.release)
    args = (tokens,) + ((routing["experts"], routing["topk"]) if rel.reads("experts") else ())
    key = BuildKey(kind="ffn", release=dep.release, arch=dep.arch, tokens=tokens, tp=dep.tp, ratio=0,
                   timeline=TIMELINE, **routing)
    return RunnerCall("ffn_kernel", args, dict(tp=dep.tp, timeline=TIMELINE, **runner), (key,))


def runner_calls(dep: Deployment) -> list[RunnerCall]:
    """Every call ``dep.release``'s runners can make for ``dep``, widths ascending."""
    rel = release_facts(dep.release)
    facts = rel.deploy(dep.arch)
    # amd/mono_decode.py: fold=False on the model's first layer and after an
    # Engram write, True elsewhere; index where the layer has an indexer. A
    # field the release's MonoBuild lacks takes its default
    folds = (False, True) if rel.reads("fold") else (rel.defaults["fold"],)
    indexes = (False, True) if rel.reads("index") else (rel.defaults["index"],)
    # the (ratio, fold, index) of the target's whole layers: the ratios attention.py allows that run
    # whole; amd/mono/runner.py forward(): `assert not index or ratio`
    whole = [(r, f, i) for r in rel.whole_ratios for f in folds for i in indexes if r or not i]
    calls: list = []
    for tokens in range(1, dep.max_rows + 1):
        # the target's whole layers (MonoDecodeLayer.__call__ -> runner.forward
        # -> kernels(M, attn.compress_ratio[, fold, select is not None]))
        calls += [_kernels(dep, tokens, ratio, fold, index, rel.target) for ratio, fold, index in whole]
        # any other mono layer (0.33.0: an MXFP8 KV cache, another indexer;
        # 0.32.0: ratio 0, a compressor / indexer, Engram): MonoDecodeLayer(
        # ffn_only=True).ffn -> ffn_kernel(M[, gate_w rows = 384, 6])
        calls.append(_ffn_kernel(dep, tokens, rel.target, rel.target))
        if dep.draft is None or facts.draft_layers is None:
            continue  # 0.32.0 mono_decode._create: a "draft layer" leaves the mono path
        experts, topk, swa_width = dep.draft
        if facts.draft_layers == "ffn":
            # 0.33.0 mono_decode._create: "On gfx942 the DSpark draft layers take
            # the FFN launch, built for the draft's routing" on the target's runner
            calls.append(_ffn_kernel(dep, tokens, rel.target, dict(experts=experts, topk=topk)))
        else:
            # the draft's own runner: DSV41MonoLayer(experts, topk,
            # ug_groups=DRAFT_UG_GROUPS, swa_width) running whole draft layers;
            # amd/mono_decode.py MonoDecodeLayer._create: a draft layer with
            # compressed keys or an indexer is refused
            routing = dict(experts=experts, topk=topk, ug_groups=rel.draft_ug_groups, swa_width=swa_width)
            calls += [_kernels(dep, tokens, 0, fold, False, routing) for fold in folds]
    return calls


def required(dep: Deployment) -> list[BuildKey]:
    """Every key of :func:`runner_calls` for ``dep``, sorted."""
    return sorted({k for call in runner_calls(dep) for k in call.keys})


# ---------------------------------------------------------------- against what is there


def held(room) -> tuple[set, set | None]:
    """(keys in a ``room.Room``'s manifest, keys its libs.json links or None if unlinked)."""
    have = set(room.manifest().entries)
    linked = set(room.links().band_of) if room.has(LIBS_JSON) else None
    return have, linked


def compare(dep: Deployment, have: set, linked: set | None, against: str) -> dict:
    """The coverage report of ``dep`` against the key strings a room has and links.

    ``unlinked`` keys are present but not linked: the loader would refuse them."""
    need = required(dep)
    texts = [str(k) for k in need]
    missing = [t for t in texts if t not in have]
    unlinked = [t for t in texts if t in have and (linked is None or t not in linked)]
    counts = {kind: sum(1 for k in need if k.kind == kind) for kind in KINDS}
    return {"release": dep.release, "arch": dep.arch, "tp": dep.tp, "deployment": dep.describe(),
            "against": against, "counts": counts, "required": texts, "missing": missing, "unlinked": unlinked}


def counts_text(counts: dict) -> str:
    """A report's per-kind counts for a person: ``K1 384, K2 384, FFN 144``."""
    return ", ".join(f"{kind.upper()} {counts[kind]}" for kind in KINDS)
