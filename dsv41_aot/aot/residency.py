"""Whether one persistent mono CTA can be resident on one CU.

Judged from a kernel's figures (``codeobject.code_object_resources``) and the
arch's limits (``facts/arches.py``). The mono launches are persistent: a grid
of ``grid_ctas`` CTAs of ``cta_threads`` threads (each release's,
``facts/releases.py``), all resident at once, handing work over through
mailboxes. A CTA that cannot be resident deadlocks on the GPU, so that fails
its key. A kernel that spills to scratch still runs, only slower, and vLLM's
JIT launches the same code object, so a spill is recorded, never refused.
SGPR spills alone go to VGPR lanes (scratch 0) and are no spill here.

Named ``residency`` so it can never shadow the standard library's ``inspect``.
"""

from __future__ import annotations

from ..facts.arches import arch_facts
from ..facts.releases import release_facts

# the resources that decide residency, in the order inspect shows them
RESOURCES = ("lds", "vgprs", "agprs", "sgprs")
UNITS = {"lds": "bytes", "vgprs": "registers", "agprs": "registers", "sgprs": "registers"}


def _round_up(n: int, granule: int) -> int:
    """``n`` rounded up to a multiple of ``granule``."""
    return -(-n // granule) * granule


def waves_per_cta(res: dict, release: str) -> int:
    """How many waves one CTA of vLLM ``release``'s launches has."""
    return -(-release_facts(release).cta_threads // res["wavefront_size"])


def waves_per_cta_simd(res: dict, arch: str, release: str) -> int:
    """How many of one CTA's waves share each SIMD of the CU."""
    return -(-waves_per_cta(res, release) // arch_facts(arch).simds)


def usage(res: dict, arch: str, release: str) -> dict:
    """Map each resource to (use, limit) for one CTA of ``release`` on one CU.

    LDS bytes (as the note gives them) against the CU's LDS; VGPRs as
    allocated (arch VGPRs + AGPRs, in granules) against a wave's share of
    the SIMD's file; AGPRs against what a wave addresses; SGPRs as allocated
    against a wave's share of the SIMD's SGPRs."""
    lim = arch_facts(arch).limits()
    per_simd = waves_per_cta_simd(res, arch, release)
    return {
        "lds": (res["lds_bytes"], lim["lds_bytes"]),
        "vgprs": (vgpr_alloc(res, arch), lim["vgprs_per_simd"] // per_simd),
        "agprs": (res["agpr_count"], lim["max_agprs"]),
        "sgprs": (sgpr_alloc(res, arch), lim["sgprs_per_simd"] // per_simd),
    }


def vgpr_alloc(res: dict, arch: str) -> int:
    """The VGPRs a wave is given.

    That is the kernel descriptor's allocation, and at least the note's
    unified count rounded up to the arch's granule."""
    granule = arch_facts(arch).vgpr_granule
    return max(res.get("vgpr_alloc", 0), _round_up(max(res["vgpr_count"], 1), granule))


def sgpr_alloc(res: dict, arch: str) -> int:
    """The SGPRs a wave is given: its count rounded up to the arch's granule."""
    return _round_up(max(res["sgpr_count"], 1), arch_facts(arch).sgpr_granule)


def residency_problems(res: dict, arch: str, release: str) -> list[str]:
    """Why one CTA of this kernel cannot be resident on one CU of ``arch``.

    The grid is vLLM ``release``'s. Each reason names the figure and the
    limit; an empty list means it can be resident. A spill is no reason."""
    lim = arch_facts(arch).limits()
    threads, ctas = release_facts(release).cta_threads, release_facts(release).grid_ctas
    use = usage(res, arch, release)
    per_simd = waves_per_cta_simd(res, arch, release)
    waves = waves_per_cta(res, release)
    out = []
    if ctas > lim["cus"]:
        out.append(f"a grid of {ctas} CTAs needs a CU each: {arch} has {lim['cus']}")
    if res["max_flat_workgroup_size"] < threads:
        out.append(f"max_flat_workgroup_size {res['max_flat_workgroup_size']} < {threads} threads per CTA")
    lds = _round_up(res["lds_bytes"], lim["lds_granule"])
    if lds > lim["lds_bytes"]:
        out.append(
            f"LDS {res['lds_bytes']} bytes ({lds} allocated in {lim['lds_granule']}-byte granules)"
            f" > {lim['lds_bytes']} bytes per CU on {arch}"
        )
    # .vgpr_count is the unified total, arch VGPRs (rounded up to 4) + AGPRs
    arch_vgprs = res["vgpr_count"] - res["agpr_count"]
    if arch_vgprs > lim["max_arch_vgprs"]:
        out.append(f"{arch_vgprs} arch VGPRs > {lim['max_arch_vgprs']} a wave can address")
    if res["agpr_count"] > lim["max_agprs"]:
        out.append(f"{res['agpr_count']} AGPRs > {lim['max_agprs']} a wave can address")
    alloc, budget = use["vgprs"]
    if alloc > budget:
        out.append(
            f"VGPRs {res['vgpr_count']} (AGPRs {res['agpr_count']}; {alloc} allocated in granules of"
            f" {lim['vgpr_granule']}) > {budget} per wave: {waves} waves of {res['wavefront_size']} are {per_simd} per"
            f" SIMD, sharing {lim['vgprs_per_simd']} registers per lane on {arch}"
        )
    sgprs, sgpr_budget = use["sgprs"]
    if sgprs > sgpr_budget:
        out.append(
            f"SGPRs {res['sgpr_count']} ({sgprs} allocated) x {per_simd} waves per SIMD"
            f" > {lim['sgprs_per_simd']} per SIMD on {arch}"
        )
    return out


def spill_notes(res: dict) -> list[str]:
    """What the kernel spills to scratch or a dynamic stack (empty when nothing): recorded, not refused."""
    if not (res["scratch_bytes"] or res["dynamic_stack"]):
        return []
    return [
        f"spills: scratch {res['scratch_bytes']} bytes per lane"
        f"{' and a dynamic stack' if res['dynamic_stack'] else ''}"
        f" (VGPR spills {res['vgpr_spill_count']}, SGPR spills {res['sgpr_spill_count']})"
    ]


def waves_per_simd(res: dict, arch: str) -> int:
    """How many waves of this kernel one SIMD can hold by registers alone."""
    lim = arch_facts(arch).limits()
    return min(lim["vgprs_per_simd"] // vgpr_alloc(res, arch), lim["sgprs_per_simd"] // sgpr_alloc(res, arch))
