"""The vLLM releases dsv41-aot compiles for, and what each one's mono path does.

Upstream paths are relative to ``vllm/models/deepseek_v41/`` in that
release. A key holds the fields of its release's ``MonoBuild``
(``amd/mono/layer.py``); a field that MonoBuild lacks is pinned to the value
the launch behaves as (``defaults``), so one launch has one key. How to
add a release: docs/building.md, "vLLM releases".

Standard library only (the runtime reads it too).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import KeyFormatError, UnknownArchError
from .arches import ARCHES

# every MonoBuild field any release has, in key order (keys.BuildKey)
ALL_FIELDS = ("tokens", "tp", "ratio", "fold", "index", "experts", "topk", "ug_groups", "swa_width", "timeline")
DEFAULTED = ALL_FIELDS[3:]  # the fields with a default
ROUTING = ("experts", "topk", "ug_groups", "swa_width")  # the fields a runner is built with


@dataclass(frozen=True)
class Deploy:
    """What one release's mono path does on one arch."""

    tp_sizes: tuple  # amd/mono_decode.py MonoDecodeLayer._create: the TP sizes it accepts
    max_rows: int  # amd/mono_decode.py: a step takes the kernels at 1..max_rows rows
    k2_reads_index: bool = True  # amd/mono/runner.py kernels(): else K2 is built with index=False
    # a DSpark draft layer: "whole" (K1 + K2 on the draft's runner), "ffn"
    # (the FFN launch on the target's runner), None (off the mono path)
    draft_layers: str | None = "whole"
    # Release.arch_flag's value for this arch; the plugin refuses a runner that disagrees
    runner_flag: bool = False


@dataclass(frozen=True)
class Release:
    """What one vLLM release's mono package says, read from its sources."""

    version: str
    mono_fields: tuple  # MonoBuild's dataclass fields (amd/mono/layer.py)
    arches: dict  # arch -> Deploy: the arches the release's mono path runs on
    # kernel name parameters per kind, in order (attention/device.py
    # kernel_symbol); "?name" only where the field differs from its default
    symbol_params: dict
    # the persistent grid (attention/device.py THREADS and BLOCKS): all CTAs
    # resident at once, one per CU (aot/residency.py)
    cta_threads: int
    grid_ctas: int
    # the runner module's flag naming the arch it compiles for (amd/mono/runner.py
    # imports GFX942 from common/arch.py); None: the runner has no such flag
    arch_flag: str | None = None
    # compress ratios whose layers run whole (K1 + K2); others take the FFN launch
    whole_ratios: tuple = (0, 1, 2)
    max_tokens: int = 48  # amd/mono/layer.py MAX_TOKENS
    # MonoBuild's default of each DEFAULTED field (amd/mono/layer.py), or the
    # value a launch behaves as for a field that MonoBuild lacks
    defaults: dict = field(default_factory=dict)
    # the routing the target model's runner is built with (amd/mono_decode.py _mono_runner)
    target: dict = field(default_factory=dict)
    # amd/mono_decode.py DRAFT_UG_GROUPS; None when no draft layer runs whole
    draft_ug_groups: int | None = None
    source: str = ""
    notes: tuple = field(default_factory=tuple)

    def reads(self, name: str) -> bool:
        """Whether this release's MonoBuild has field ``name``."""
        return name in self.mono_fields

    def deploy(self, arch: str) -> Deploy:
        """What the release's mono path does on ``arch``; UnknownArchError if it does not run there."""
        try:
            return self.arches[arch]
        except KeyError:
            raise UnknownArchError(
                f"vLLM {self.version}'s mono path does not run on {arch} (it runs on {', '.join(self.arches)})",
                fix=f"pick one of those arches for vLLM {self.version}, or another vLLM release",
            ) from None


# vLLM 0.33.0's MonoBuild defaults (amd/mono/layer.py): EXPERTS, TOPK = 384, 6
# (stages/moe_shape.py), ug_groups=2, swa_width=WINDOW = 128 (attention/plan.py)
_MONO_0_33_0 = dict(fold=True, index=False, experts=384, topk=6, ug_groups=2, swa_width=128, timeline=False)

RELEASES: dict[str, Release] = {r.version: r for r in (
    Release(
        "0.33.0",
        mono_fields=ALL_FIELDS,
        arches={
            # amd/mono_decode.py CDNA_VERSIONS = (3, 4), TP 2 or 4, MAX_ROWS = 48
            "gfx950": Deploy(tp_sizes=(2, 4), max_rows=48),
            # amd/mono_decode.py: TP 4 only, MAX_ROWS_GFX942 = 42, draft layers take
            # the FFN launch; amd/mono/runner.py: K2 built with index=False on GFX942.
            # The kernel source also refuses gfx942 at TP 2 (measured): FFN s=33 fails
            # stages/moe.py's `shared_units <= BLOCKS`; K2 s=17 r=2 needs 77,056 B of LDS
            "gfx942": Deploy(tp_sizes=(4,), max_rows=42, k2_reads_index=False, draft_layers="ffn", runner_flag=True),
        },
        symbol_params={
            "k1": ("s", "tp", "r", "tl", "f", "i", "?e", "?k", "?g", "?w"),
            "k2": ("s", "tp", "r", "tl", "i", "?e", "?k", "?g", "?w"),
            "ffn": ("s", "tp", "tl", "?e"),
        },
        cta_threads=512,  # attention/device.py THREADS and BLOCKS (common/plan.py repeats them)
        grid_ctas=256,
        arch_flag="GFX942",
        defaults=_MONO_0_33_0,
        # MonoDecodeLayer._create: experts, topk = 384, 6; the rest at MonoBuild's defaults
        target=dict(experts=384, topk=6, ug_groups=2, swa_width=128),
        draft_ug_groups=1,  # the draft's runner: its own experts, topk and swa_width
        source="amd/mono/layer.py, amd/mono/runner.py, amd/mono_decode.py",
    ),
    Release(
        "0.32.0",
        # amd/mono/layer.py: MonoBuild(tokens, tp, ratio, timeline=False)
        mono_fields=("tokens", "tp", "ratio", "timeline"),
        # amd/mono_decode.py CDNA_VERSIONS = (4,), TP 2 or 4, MAX_ROWS = 48, no draft layer
        arches={"gfx950": Deploy(tp_sizes=(2, 4), max_rows=48, draft_layers=None)},
        # amd/mono/layer.py: kernel_symbol("dsv41_mono_k1", s=, tp=, r=, tl=),
        # the same for k2, kernel_symbol("dsv41_mono_ffn", s=, tp=)
        symbol_params={"k1": ("s", "tp", "r", "tl"), "k2": ("s", "tp", "r", "tl"), "ffn": ("s", "tp")},
        cta_threads=512,  # attention/device.py; no common/arch.py, so no arch flag
        grid_ctas=256,
        arch_flag=None,
        # amd/mono_decode.py: whole with ratio 1 or 2 and no compressor, indexer or Engram
        whole_ratios=(1, 2),
        defaults=_MONO_0_33_0,  # the fields its MonoBuild lacks behave as 0.33.0's defaults
        target={},  # no routing fields: the runner has one routing
        source="amd/mono/layer.py, amd/mono/runner.py, amd/mono_decode.py",
    ),
)}

def version_order(version: str) -> tuple:
    """Sort key of a release version string (newest last)."""
    return tuple(int(p) if p.isdigit() else 0 for p in version.split("."))


def oldest_first() -> list[Release]:
    """Every release the tables know, in version order: the last is the newest."""
    return [RELEASES[v] for v in sorted(RELEASES, key=version_order)]


def releases_on(arch: str) -> list[str]:
    """The releases whose mono path runs on ``arch``, oldest first."""
    return [r.version for r in oldest_first() if arch in r.arches]


def deployed_arches() -> list[str]:
    """Every arch some release's mono path runs on, in the arch table's order (what CI builds)."""
    return [a for a in ARCHES if releases_on(a)]


# what the CLI takes when --release is left out (never a default below the CLI)
NEWEST = oldest_first()[-1].version


def release_facts(version: str) -> Release:
    """The facts of vLLM ``version``; KeyFormatError naming the known releases otherwise."""
    try:
        return RELEASES[version]
    except (KeyError, TypeError):
        raise KeyFormatError(
            f"unknown vLLM release {version!r} (dsv41-aot knows {', '.join(RELEASES)})",
            fix="pick one of those, or add the release to dsv41_aot/facts/releases.py and build_matrix.yaml",
        ) from None

