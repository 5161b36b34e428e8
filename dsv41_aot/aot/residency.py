"""Whether one persistent mono CTA is resident on one CU, from a kernel's
figures (``codeobject.code_object_resources``) and the arch's limits
(``facts/arches.py``).

The mono launches are persistent: a grid of ``grid_ctas`` CTAs of
``cta_threads`` threads (each release's, ``facts/releases.py``), all
resident at once, handing work over through mailboxes. A CTA that cannot be
resident one per CU deadlocks on the GPU: that fails its key
(``residency_problems``, by the grid of the key's own release). A kernel
that spills to scratch still runs, only slower; vLLM's JIT builds
and launches the very same code object, so a spill is recorded and shown
(``spill_notes``), never refused. SGPR spills alone go to VGPR lanes
(scratch 0) and are no spill here.

Named ``residency`` so it can never shadow the standard library's ``inspect``.
"""

from __future__ import annotations

from ..facts.arches import arch_facts
from ..facts.releases import release_facts

# the resources that decide residency, in the order inspect shows them
RESOURCES = ("lds", "vgprs", "agprs", "sgprs")
UNITS = {"lds": "bytes", "vgprs": "registers", "agprs": "registers", "sgprs": "registers"}


def _round_up(n: int, granule: int) -> int:
    return -(-n // granule) * granule


def grid(release: str) -> tuple[int, int]:
    """(threads a CTA, CTAs) of vLLM ``release``'s persistent grid
    (``Release.cta_threads``, ``grid_ctas``)."""
    rel = release_facts(release)
    return rel.cta_threads, rel.grid_ctas


def cta_threads(release: str) -> int:
    """Threads a CTA of vLLM ``release``'s mono launches."""
    return grid(release)[0]


def waves_per_cta_simd(res: dict, arch: str, release: str) -> int:
    """How many of one CTA's waves share a SIMD (its waves spread over the CU's SIMDs)."""
    waves = -(-cta_threads(release) // res["wavefront_size"])
    return -(-waves // arch_facts(arch).simds)


def usage(res: dict, arch: str, release: str) -> dict:
    """resource -> (use, limit) for one CTA of vLLM ``release``'s launches
    on one CU of ``arch``: LDS bytes (as the note gives them) against the CU's LDS;
    VGPRs as allocated (unified arch VGPRs + AGPRs, in granules) against a
    wave's share of the SIMD's file; AGPRs against what a wave addresses;
    SGPRs as allocated against a wave's share of the SIMD's SGPRs."""
    lim = arch_facts(arch).limits()
    per_simd = waves_per_cta_simd(res, arch, release)
    return {
        "lds": (res["lds_bytes"], lim["lds_bytes"]),
        "vgprs": (vgpr_alloc(res, arch), lim["vgprs_per_simd"] // per_simd),
        "agprs": (res["agpr_count"], lim["max_agprs"]),
        "sgprs": (_round_up(max(res["sgpr_count"], 1), lim["sgpr_granule"]), lim["sgprs_per_simd"] // per_simd),
    }


def vgpr_alloc(res: dict, arch: str) -> int:
    """VGPRs a wave is given: the kernel descriptor's allocation, at least the
    note's unified count rounded to the arch's granule."""
    granule = arch_facts(arch).vgpr_granule
    return max(res.get("vgpr_alloc", 0), _round_up(max(res["vgpr_count"], 1), granule))


def residency_problems(res: dict, arch: str, release: str) -> list[str]:
    """Why one CTA of this kernel, a launch of vLLM ``release`` (its grid:
    ``Release.cta_threads`` threads a CTA, ``grid_ctas`` CTAs), cannot be resident on one CU of ``arch`` (empty when it
    can). Each reason names the figure and the limit. A spill is not one
    (see ``spill_notes``)."""
    lim = arch_facts(arch).limits()
    threads, ctas = grid(release)
    use = usage(res, arch, release)
    per_simd = waves_per_cta_simd(res, arch, release)
    waves = -(-threads // res["wavefront_size"])
    out = []
    if ctas > lim["cus"]:
        out.append(f"a grid of {ctas} CTAs needs a CU each: {arch} has {lim['cus']}")
    if res["max_flat_workgroup_size"] < threads:
        out.append(f"max_flat_workgroup_size {res['max_flat_workgroup_size']} < {threads} threads a CTA")
    lds = _round_up(res["lds_bytes"], lim["lds_granule"])
    if lds > lim["lds_bytes"]:
        out.append(
            f"LDS {res['lds_bytes']} bytes ({lds} allocated in {lim['lds_granule']}-byte granules)"
            f" > {lim['lds_bytes']} bytes a CU on {arch}"
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
            f" {lim['vgpr_granule']}) > {budget} a wave: {waves} waves of {res['wavefront_size']} are {per_simd} a SIMD"
            f" sharing {lim['vgprs_per_simd']} registers a lane on {arch}"
        )
    sgprs, sgpr_budget = use["sgprs"]
    if sgprs > sgpr_budget:
        out.append(
            f"SGPRs {res['sgpr_count']} ({sgprs} allocated) x {per_simd} waves a SIMD"
            f" > {lim['sgprs_per_simd']} a SIMD on {arch}"
        )
    return out


def spills(res: dict) -> bool:
    """Whether the kernel uses scratch (spilled registers) or a dynamic stack."""
    return bool(res["scratch_bytes"] or res["dynamic_stack"])


def spill_notes(res: dict) -> list[str]:
    """What the kernel spills (empty when it does not): recorded, not refused."""
    if not spills(res):
        return []
    return [
        f"spills: scratch {res['scratch_bytes']} bytes a lane"
        f"{' and a dynamic stack' if res['dynamic_stack'] else ''}"
        f" (VGPR spills {res['vgpr_spill_count']}, SGPR spills {res['sgpr_spill_count']})"
    ]


def waves_per_simd(res: dict, arch: str) -> int:
    """How many waves of this kernel one SIMD can hold by registers alone."""
    lim = arch_facts(arch).limits()
    sgprs = _round_up(max(res["sgpr_count"], 1), lim["sgpr_granule"])
    return min(lim["vgprs_per_simd"] // vgpr_alloc(res, arch), lim["sgprs_per_simd"] // sgprs)
