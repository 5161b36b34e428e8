"""The vLLM releases whose mono decode layer dsv41-aot builds for, and what
each one's mono path does (paths relative to ``vllm/models/deepseek_v41/``
in that release).

A release's kernels are named by its own keys: the fields of its
``MonoBuild`` (``amd/mono/layer.py``), which its runner module builds every
launch from. A field a release's ``MonoBuild`` does not have is pinned to the
value the launch behaves as (its ``defaults``): one launch, one key. The
release a process runs is told apart by its mono sources digest
(``source.mono_digest``), recorded per release in each manifest.

Adding a release is one :data:`RELEASES` entry (what its sources say: the
rules of which keys its runner asks for read it, in :mod:`coverage`) plus
its entry in ``build_matrix.yaml`` (its digest, and what a build covers).

Standard library only (the runtime reads it too).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import KeyFormatError, UnknownArchError
from .arches import ARCHES

# every MonoBuild field any release has, in key order (keys.BuildKey)
ALL_FIELDS = ("tokens", "tp", "ratio", "fold", "index", "experts", "topk", "ug_groups", "swa_width", "timeline")
# the MonoBuild fields that have a default (all but tokens, tp, ratio)
DEFAULTED = ALL_FIELDS[3:]
# MonoBuild's routing fields: the ones a runner is built with
ROUTING = ("experts", "topk", "ug_groups", "swa_width")


@dataclass(frozen=True)
class Deploy:
    """What one release's mono path does on one arch."""

    tp_sizes: tuple  # amd/mono_decode.py MonoDecodeLayer._create: TP sizes it accepts
    max_rows: int  # amd/mono_decode.py: a step takes the kernels at 1..max_rows rows
    k2_reads_index: bool = True  # amd/mono/runner.py kernels(): K2 built with index=False when not
    # how a DSpark draft layer runs: "whole" (K1 + K2 on the draft's runner),
    # "ffn" (FFN launch on the target's runner), None (not on the mono path)
    draft_layers: str | None = "whole"
    # the value the runner module's arch flag (Release.arch_flag) has when it
    # compiles for this arch; the plugin refuses a runner whose flag disagrees
    runner_flag: bool = False


@dataclass(frozen=True)
class Release:
    version: str
    mono_fields: tuple  # MonoBuild's dataclass fields (amd/mono/layer.py)
    arches: dict  # arch -> Deploy: the arches the release's mono path runs on
    # kernel name parameters per kind (attention/device.py kernel_symbol(stem,
    # **params)), in order; "?name" only where the field differs from its default
    symbol_params: dict
    # the persistent grid every mono launch runs (attention/device.py): THREADS
    # a CTA and BLOCKS CTAs, all resident at once, one a CU (aot/residency.py)
    cta_threads: int
    grid_ctas: int
    # the runner module's attribute that says which arch it compiles for
    # (amd/mono/runner.py imports GFX942 from common/arch.py); each Deploy's
    # runner_flag is its value there. None: the runner has no such flag
    arch_flag: str | None = None
    # compress ratios whose layers run whole (K1 + K2); any other layer takes
    # the FFN launch (amd/mono_decode.py MonoDecodeLayer._create)
    whole_ratios: tuple = (0, 1, 2)
    max_tokens: int = 48  # amd/mono/layer.py MAX_TOKENS
    # MonoBuild's default of each field in DEFAULTED (amd/mono/layer.py). A
    # field the release's MonoBuild lacks holds the value its launch behaves as
    defaults: dict = field(default_factory=dict)
    # the routing (ROUTING fields) the target model's runner is built with
    # (amd/mono_decode.py _mono_runner); a field MonoBuild lacks is ignored
    target: dict = field(default_factory=dict)
    # ug_groups of the DSpark draft's own runner (amd/mono_decode.py
    # DRAFT_UG_GROUPS); None when no draft layer runs whole on the mono path
    draft_ug_groups: int | None = None
    source: str = ""
    notes: tuple = field(default_factory=tuple)

    def reads(self, name: str) -> bool:
        """Whether this release's MonoBuild has field ``name``."""
        return name in self.mono_fields

    def deploy(self, arch: str) -> Deploy:
        try:
            return self.arches[arch]
        except KeyError:
            raise UnknownArchError(
                f"vLLM {self.version}'s mono path does not run on {arch} (it runs on {', '.join(self.arches)})",
                fix=f"pick one of those arches for vLLM {self.version}, or another vLLM release",
            ) from None

    @property
    def folder(self) -> str:
        """The release's folder in an arch folder of a prebuilt directory."""
        from ..manifest import folder_name

        return folder_name(self.version)


# vLLM 0.33.0's MonoBuild defaults (amd/mono/layer.py): EXPERTS, TOPK = 384, 6
# (stages/moe_shape.py), ug_groups=2, swa_width=WINDOW = 128 (attention/plan.py)
_MONO_0_33_0 = dict(fold=True, index=False, experts=384, topk=6, ug_groups=2, swa_width=128, timeline=False)

RELEASES: dict[str, Release] = {r.version: r for r in (
    Release(
        "0.33.0",
        mono_fields=ALL_FIELDS,
        arches={
            # amd/mono_decode.py CDNA_VERSIONS = (3, 4): TP 2 or 4, MAX_ROWS = 48;
            # the draft runs whole layers on its own runner
            "gfx950": Deploy(tp_sizes=(2, 4), max_rows=48),
            # amd/mono_decode.py: "gfx942 builds for tensor parallel size 4 only",
            # MAX_ROWS_GFX942 = 42, "On gfx942 the DSpark draft layers take the FFN
            # launch"; amd/mono/runner.py: "k2 = replace(b, index=False) if GFX942".
            # Beyond unused, the kernel source refuses gfx942 at TP 2 (measured):
            # FFN s=33 fails stages/moe.py's `shared_units <= BLOCKS` assert, and
            # K2 s=17 r=2 needs 77,056 B of LDS (limit 64 KiB)
            "gfx942": Deploy(tp_sizes=(4,), max_rows=42, k2_reads_index=False, draft_layers="ffn", runner_flag=True),
        },
        symbol_params={
            "k1": ("s", "tp", "r", "tl", "f", "i", "?e", "?k", "?g", "?w"),
            "k2": ("s", "tp", "r", "tl", "i", "?e", "?k", "?g", "?w"),
            "ffn": ("s", "tp", "tl", "?e"),
        },
        # attention/device.py: BLOCKS = 256, THREADS = 512 (common/plan.py repeats them)
        cta_threads=512,
        grid_ctas=256,
        arch_flag="GFX942",
        defaults=_MONO_0_33_0,
        # amd/mono_decode.py MonoDecodeLayer._create: ``experts, topk = 384, 6``;
        # _mono_runner leaves ug_groups and swa_width at MonoBuild's defaults
        target=dict(experts=384, topk=6, ug_groups=2, swa_width=128),
        # amd/mono_decode.py DRAFT_UG_GROUPS = 1: _mono_runner(draft=...) builds
        # the draft's runner with it and the draft's experts / topk / swa_width
        draft_ug_groups=1,
        source="amd/mono/layer.py, amd/mono/runner.py, amd/mono_decode.py",
    ),
    Release(
        "0.32.0",
        # amd/mono/layer.py: MonoBuild(tokens, tp, ratio, timeline=False)
        mono_fields=("tokens", "tp", "ratio", "timeline"),
        # amd/mono_decode.py CDNA_VERSIONS = (4,); "needs tensor parallel size
        # 2 or 4"; MAX_ROWS = 48; a draft layer is refused ("draft layer")
        arches={"gfx950": Deploy(tp_sizes=(2, 4), max_rows=48, draft_layers=None)},
        # amd/mono/layer.py: kernel_symbol("dsv41_mono_k1", s=, tp=, r=, tl=),
        # the same for k2, kernel_symbol("dsv41_mono_ffn", s=, tp=)
        symbol_params={"k1": ("s", "tp", "r", "tl"), "k2": ("s", "tp", "r", "tl"), "ffn": ("s", "tp")},
        # attention/device.py: BLOCKS = 256, THREADS = 512; the package has no
        # common/arch.py and its runner no arch flag (it runs on gfx950 only)
        cta_threads=512,
        grid_ctas=256,
        arch_flag=None,
        # amd/mono_decode.py: a layer runs whole with compress ratio 1 or 2 and no
        # compressor / indexer / Engram; any other mono layer takes ffn_kernel(tokens)
        whole_ratios=(1, 2),
        # MonoBuild(tokens, tp, ratio, timeline=False): the fields it lacks
        # behave as 0.33.0's defaults (384 experts, top 6: stages/moe_shape.py)
        defaults=_MONO_0_33_0,
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


def deployed_arches() -> list[str]:
    """Every arch some release's mono path runs on, in the arch table's order
    (what CI builds: ``dsv41-aot facts --json``'s ``arches``)."""
    return [a for a in ARCHES if any(a in r.arches for r in RELEASES.values())]


# the newest release: what the CLI takes when a command's --release is left
# out and its help says so (never a default below the CLI)
NEWEST = oldest_first()[-1].version


def release_facts(version: str) -> Release:
    """The facts of vLLM ``version``; a KeyFormatError naming the known releases otherwise."""
    try:
        return RELEASES[version]
    except (KeyError, TypeError):
        raise KeyFormatError(
            f"unknown vLLM release {version!r} (dsv41-aot knows {', '.join(RELEASES)})",
            fix="pick one of those, or add the release to dsv41_aot/facts/releases.py and build_matrix.yaml",
        ) from None

