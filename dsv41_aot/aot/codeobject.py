"""Reading a GPU code object: what its one kernel asks of a CU.

Figures come from two places in the AMDGPU ELF (code object v5):

- the ``NT_AMDGPU_METADATA`` note (owner ``AMDGPU``, type 32), a MessagePack
  map whose ``amdhsa.kernels[0]`` holds register counts, LDS and scratch
  bytes and the kernarg layout;
- the 64-byte kernel descriptor (``<kernel>.kd``), whose
  ``COMPUTE_PGM_RSRC1`` / ``RSRC3`` fields are what the hardware allocates.

Build side only. What the figures mean for residency is ``residency.py``'s.
"""

from __future__ import annotations

import struct

from ..elf import Elf, ElfError

NT_AMDGPU_METADATA = 32


def amdgpu_metadata(code: bytes) -> dict:
    """The decoded NT_AMDGPU_METADATA note of a GPU code object."""
    try:
        import msgpack  # the build extra; imported here so the CLI starts without it
    except ImportError:
        from ..errors import ToolchainError

        raise ToolchainError("reading a GPU code object needs msgpack", fix="pip install 'dsv41-aot[build]'") from None
    for owner, ntype, desc in Elf(code).notes():
        if owner == "AMDGPU" and ntype == NT_AMDGPU_METADATA:
            try:
                doc = msgpack.unpackb(desc, raw=False)
            except (msgpack.UnpackException, ValueError) as e:
                raise ElfError(f"AMDGPU metadata note is not one MessagePack value: {e}") from None
            if not isinstance(doc, dict):
                raise ElfError("AMDGPU metadata note is not a map")
            return doc
    raise ElfError("GPU code object has no AMDGPU metadata note (NT_AMDGPU_METADATA)")


def kernel_descriptor(code: bytes, kd_symbol: str) -> dict:
    """The figures in kernel descriptor ``kd_symbol`` (AMDGPUUsage, "Kernel Descriptor")."""
    elf = Elf(code)
    sym = next((s for s in elf.symbols() if s.name == kd_symbol), None)
    if sym is None or not 0 < sym.shndx < len(elf.sections):
        raise ElfError(f"GPU code object has no kernel descriptor {kd_symbol}")
    sec = elf.sections[sym.shndx]
    off = sym.value - sec.addr
    kd = elf.section_bytes(sec)[off : off + 64]
    if len(kd) != 64:
        raise ElfError(f"kernel descriptor {kd_symbol} is cut short")
    lds, scratch, kernarg = struct.unpack_from("<III", kd, 0)
    rsrc3, rsrc1 = struct.unpack_from("<II", kd, 44)  # COMPUTE_PGM_RSRC3, then RSRC1
    return {
        "lds_bytes": lds,
        "scratch_bytes": scratch,
        "kernarg_bytes": kernarg,
        # GRANULATED_WORKITEM_VGPR_COUNT: (granules - 1), granule 8 on gfx90a+
        "vgpr_granules": (rsrc1 & 0x3F) + 1,
        # ACCUM_OFFSET (gfx90a+): first AGPR, in units of 4, minus 1
        "accum_offset": ((rsrc3 & 0x3F) + 1) * 4,
    }


def code_object_resources(code: bytes) -> dict:
    """The JSON-ready figures of the one kernel in GPU code object ``code``."""
    doc = amdgpu_metadata(code)
    kernels = doc.get("amdhsa.kernels") or []
    if len(kernels) != 1:
        raise ElfError(f"GPU code object holds {len(kernels)} kernels, a mono launch has exactly 1")
    k = kernels[0]

    def need(field):
        if field not in k:
            raise ElfError(f"AMDGPU metadata of {k.get('.name', '?')} lacks {field}")
        return k[field]

    res = {
        "name": need(".name"),
        "symbol": need(".symbol"),
        "target": doc.get("amdhsa.target", ""),
        "vgpr_count": need(".vgpr_count"),
        "agpr_count": k.get(".agpr_count", 0),
        "sgpr_count": need(".sgpr_count"),
        "vgpr_spill_count": k.get(".vgpr_spill_count", 0),
        "sgpr_spill_count": k.get(".sgpr_spill_count", 0),
        "lds_bytes": need(".group_segment_fixed_size"),
        "scratch_bytes": need(".private_segment_fixed_size"),
        "dynamic_stack": bool(k.get(".uses_dynamic_stack", False)),
        "kernarg_bytes": need(".kernarg_segment_size"),
        "wavefront_size": need(".wavefront_size"),
        "max_flat_workgroup_size": need(".max_flat_workgroup_size"),
        "args": [
            {"offset": a[".offset"], "size": a[".size"], "value_kind": a[".value_kind"]}
            for a in k.get(".args", [])
        ],
    }
    kd = kernel_descriptor(code, res["symbol"])
    res["vgpr_alloc"] = kd["vgpr_granules"] * 8
    res["accum_offset"] = kd["accum_offset"]
    for figure in ("lds_bytes", "scratch_bytes", "kernarg_bytes"):
        if kd[figure] != res[figure]:
            raise ElfError(
                f"{res['name']}: kernel descriptor says {figure}={kd[figure]}, metadata note says {res[figure]}"
            )
    return res


def manifest_figures(res: dict) -> dict:
    """What a manifest entry keeps of ``code_object_resources``: all but ``args``.

    The kernarg layout would triple the manifest the runtime parses; ``verify``
    reads it from the code object itself."""
    out = {k: v for k, v in res.items() if k != "args"}
    out["kernarg_count"] = len(res["args"])
    return out
