"""The GPU architectures dsv41-aot compiles for: the limits that decide CTA residency.

They do not depend on the vLLM release (:mod:`releases` says what each
release runs where). Figures: LLVM's AMDGPUUsage and the CDNA3 / CDNA4 ISA
guides. From gfx90a each SIMD has one file of 512 vector registers per lane
(wave64), shared by arch VGPRs and AGPRs; a wave addresses at most 256 of
each, in granules of 8. A SIMD has 800 SGPRs, in granules of 16.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UnknownArchError


@dataclass(frozen=True)
class Arch:
    """One GPU architecture's facts."""

    name: str  # the LLVM target, as ARCH / FLYDSL_GPU_ARCH / gcnArchName spell it
    products: str
    gfx_target_version: int  # KFD topology's number for it (sysfs), e.g. 90402
    gcn_arch_name: str  # what HIP's device properties call it (gcnArchName): the name and its target features
    # --- per CU: the residency of one CTA of a release's persistent grid
    cus: int  # compute units of the smallest product: each CTA of the grid needs one
    lds_bytes: int
    lds_granule: int  # LDS is allocated in these (COMPUTE_PGM_RSRC2.LDS_SIZE)
    simds: int = 4
    vgprs_per_simd: int = 512
    vgpr_granule: int = 8
    max_arch_vgprs: int = 256
    max_agprs: int = 256
    sgprs_per_simd: int = 800
    sgpr_granule: int = 16
    # --- build
    compile_scale: float = 1.0  # compile seconds relative to gfx950 (matrix.estimate_seconds)

    def limits(self) -> dict:
        """The per-CU limits a residency judgement uses (inspect --json carries them)."""
        return dict(lds_bytes=self.lds_bytes, lds_granule=self.lds_granule, simds=self.simds, cus=self.cus,
                    vgprs_per_simd=self.vgprs_per_simd, vgpr_granule=self.vgpr_granule,
                    max_arch_vgprs=self.max_arch_vgprs, max_agprs=self.max_agprs,
                    sgprs_per_simd=self.sgprs_per_simd, sgpr_granule=self.sgpr_granule)


ARCHES: dict[str, Arch] = {a.name: a for a in (
    Arch(
        "gfx950", "MI355X", 90500, "gfx950:sramecc+:xnack-", cus=256, lds_bytes=160 * 1024, lds_granule=320 * 4,
    ),
    Arch(
        "gfx942", "MI300X / MI325X", 90402, "gfx942:sramecc+:xnack-", cus=304, lds_bytes=64 * 1024, lds_granule=128 * 4,
        compile_scale=1.6,  # measured: gfx942 compiles about 1.5x gfx950's time
    ),
)}


def arch_facts(name: str) -> Arch:
    """The facts of ``name``; UnknownArchError (naming the known ones) otherwise."""
    try:
        return ARCHES[name]
    except KeyError:
        raise UnknownArchError(
            f"unknown arch {name!r} (dsv41-aot knows {', '.join(ARCHES)})",
            fix="pick one of those, or add the arch to dsv41_aot/facts/arches.py and build_matrix.yaml",
        ) from None
