"""The launch kinds of vLLM's mono decode layer (``mono/layer.py``, ``mono/runner.py``).

For each: its builder, the MonoBuild fields it reads and how vLLM's runner asks for it.

Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import KeyFormatError


@dataclass(frozen=True)
class Kind:
    """One launch kind and how vLLM builds and asks for it."""

    name: str  # the key's KIND
    builder: str  # mono/layer.py function: build_mono_<kind>(MonoBuild) -> launcher
    # (half of) a whole layer, built per layer kind (ratio, fold, index)
    whole_layer: bool
    # MonoBuild fields the launch does not read: pinned to the release's
    # default (one symbol, one key) and left out of the key string
    unread: tuple = ()
    # fields vLLM always builds the launch with one value of (ffn_kernel: ratio 0)
    fixed: dict = field(default_factory=dict)
    # the runner method that asks for it (mono/runner.py DSV41MonoLayer) and,
    # for kernels(), which of its (K1, K2) results it is
    runner_method: str = "kernels"
    runner_index: int | None = None
    # compile seconds on a 2-core CPU at gfx950, base + per step-width token:
    # the shard balancer's guess for a key with no recorded time
    compile_estimate: tuple = (5.0, 0.1)
    what: str = ""


KINDS: dict[str, Kind] = {k.name: k for k in (
    Kind("k1", "build_mono_k1", whole_layer=True,
         runner_method="kernels", runner_index=0, compile_estimate=(1.7, 0.04),
         what="attention seam + attention front (fold is read only by K1's seam: stages/seam.py)"),
    Kind("k2", "build_mono_k2", whole_layer=True, unread=("fold",),  # no K2 stage reads fold; its symbol omits f
         runner_method="kernels", runner_index=1, compile_estimate=(6.5, 0.12),
         what="attention back + FFN seam + MoE, both TP all-reduces inside"),
    Kind("ffn", "build_mono_ffn", whole_layer=False,
         unread=("fold", "index", "ug_groups", "swa_width"), fixed={"ratio": 0},
         runner_method="ffn_kernel", compile_estimate=(4.0, 0.08),
         what="the FFN alone, for a layer whose attention vLLM runs: "
              "ffn_kernel builds MonoBuild(tokens, tp, 0, timeline, experts=, topk=)"),
)}


def kind_facts(name: str) -> Kind:
    """The facts of kind ``name``; KeyFormatError naming the known kinds otherwise."""
    try:
        return KINDS[name]
    except KeyError:
        raise KeyFormatError(
            f"unknown launch kind {name!r} (one of {', '.join(KINDS)})",
            fix="pick one of those, or add the kind to dsv41_aot/facts/kinds.py and its runner call to dsv41_aot/deployment.py",
        ) from None
