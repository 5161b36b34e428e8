"""AMD buffer loads and stores for the mono kernels, on FlyDSL's ROCDL dialect.

The project's stand-in for ``aiter.ops.flydsl.kernels.buffer_ops``, limited to
what vLLM's mono package calls: a buffer resource built from a raw 64-bit
device address, and raw buffer loads / stores whose offsets count elements of
the value's type. The ops built here must lower to the same machine code as
aiter's helpers (``tests/test_compat.py`` holds the proof: golden code
objects reproduced byte for byte).

Offsets reach the hardware in bytes; the soffset operand is always 0; a
cache modifier is the instruction's CPol ``aux`` bits (0: no attribute).
"""

import os

from flydsl._mlir import ir
from flydsl._mlir.dialects import arith, llvm, rocdl

__all__ = ["create_buffer_resource_from_addr", "buffer_load", "buffer_store", "descriptor_flags"]

# The largest byte count a descriptor's 32-bit NUM_RECORDS field holds: the
# size of a resource made without a bound.
_UNBOUNDED = 0xFFFFFFFF

# Word 3 (bits 127:96) of a CDNA (gfx9) buffer descriptor, as LLVM's
# AMDGPUToROCDL builds it for raw buffer access: DST_SEL 0, DATA_FORMAT 7
# (bits 14:12) and NUM_FORMAT 4 (bits 18:15), both nonzero as the hardware
# requires; no swizzle, no added thread id, type 0. gfx942 and gfx950 (the
# mono package's targets) take the same word: the RDNA-only fields (bit 24,
# OOB_SELECT in bits 29:28) stay 0 on CDNA.
_CDNA_FLAGS = (7 << 12) | (4 << 15)


def _target_arch() -> str:
    """The architecture being compiled for, read as the mono package reads it
    (``mono/common/arch.py``): ``ARCH``, else FlyDSL's probe (which honours
    ``FLYDSL_GPU_ARCH``)."""
    arch = os.environ.get("ARCH")
    if not arch:
        from flydsl.runtime.device import get_rocm_arch

        arch = get_rocm_arch()
    return arch.lower().split(":")[0]


def descriptor_flags(arch=None) -> int:
    """Word 3 of a buffer descriptor for ``arch`` (default: the target arch,
    read at call time). Only CDNA (gfx9) targets are supported."""
    arch = (arch or _target_arch()).lower()
    if not arch.startswith("gfx9"):
        raise ValueError(
            f"dsv41_aot.compat.buffer_ops: no buffer descriptor for {arch!r}; "
            "the mono kernels target gfx942 and gfx950 (set ARCH)"
        )
    return _CDNA_FLAGS


def _value(x):
    """The ``ir.Value`` behind ``x``, unwrapped as aiter's helpers unwrap their
    operands: a FlyDSL scalar / vector gives its ``ir_value()``; any other
    wrapper is followed through its ``_value`` or ``value`` attribute, a few
    levels deep (the mono package hands its mailbox ``Addr``, whose ``value``
    is the traced address, straight to ``create_buffer_resource_from_addr``);
    what is left is returned as is."""
    if hasattr(x, "ir_value") and not isinstance(x, ir.Value):
        return x.ir_value()
    for _ in range(10):
        if isinstance(x, ir.Value):
            break
        if hasattr(x, "_value"):
            x = x._value
        elif hasattr(x, "value"):
            x = x.value
        else:
            break
    return x


def _const(ty, value: int) -> ir.Value:
    return arith.ConstantOp(ty, ir.IntegerAttr.get(ty, value)).result


def _i32(value: int) -> ir.Value:
    """An i32 constant; values past 2**31 - 1 wrap to their two's complement."""
    if value > 0x7FFFFFFF:
        value -= 1 << 32
    return _const(ir.IntegerType.get_signless(32), value)


def _as_i32(x) -> ir.Value:
    """An offset as i32: Python ints become constants, wider integers are
    truncated, narrower ones sign-extended, ``index`` values cast."""
    if isinstance(x, int):
        return _i32(x)
    v = _value(x)
    i32 = ir.IntegerType.get_signless(32)
    if isinstance(v.type, ir.IntegerType):
        width = ir.IntegerType(v.type).width
        if width == 32:
            return v
        if width > 32:
            return arith.TruncIOp(i32, v).result
        return arith.ExtSIOp(i32, v).result
    return arith.IndexCastOp(i32, v).result


def _num_records(nbytes) -> ir.Value:
    """The descriptor's byte count as i64: unbounded for ``None``, a clamped
    constant for a Python int, else the traced value widened to i64."""
    i64 = ir.IntegerType.get_signless(64)
    if nbytes is None:
        return _const(i64, _UNBOUNDED)
    if isinstance(nbytes, int):
        return _const(i64, max(0, min(nbytes, _UNBOUNDED)))
    v = _value(nbytes)
    if isinstance(v.type, ir.IntegerType):
        if ir.IntegerType(v.type).width == 64:
            return v
        return arith.ExtSIOp(i64, v).result
    return arith.IndexCastOp(i64, v).result


def _elem_bytes(ty) -> int:
    """Bytes of one element of a scalar or vector type."""
    if isinstance(ty, ir.VectorType):
        ty = ir.VectorType(ty).element_type
    return ty.width // 8


def _byte_offset(offset, elem_bytes: int) -> ir.Value:
    """An element offset scaled to the byte offset a buffer instruction takes."""
    return arith.MulIOp(_as_i32(offset), _i32(elem_bytes)).result


def _aux(cache_modifier: int):
    """The CPol bits as the ops' ``aux`` attribute; none for 0."""
    if not cache_modifier:
        return None
    return ir.IntegerAttr.get(ir.IntegerType.get_signless(32), int(cache_modifier))


def create_buffer_resource_from_addr(addr_i64, *, num_records_bytes=None):
    """A buffer resource (``!llvm.ptr<8>``) whose base is the raw device address
    ``addr_i64`` (an i64 value), stride 0, covering ``num_records_bytes`` bytes
    (an int or a traced integer; ``None``: unbounded). Offsets given to
    :func:`buffer_load` / :func:`buffer_store` count from that address."""
    base = llvm.IntToPtrOp(ir.Type.parse("!llvm.ptr"), _value(addr_i64)).result
    flags = _i32(descriptor_flags())
    stride = _const(ir.IntegerType.get_signless(16), 0)
    records = _num_records(num_records_bytes)
    return rocdl.MakeBufferRsrcOp(ir.Type.parse("!llvm.ptr<8>"), base, stride, records, flags).result


def buffer_load(rsrc, offset, vec_width: int = 4, dtype=None, cache_modifier: int = 0):
    """Load ``vec_width`` elements of ``dtype`` (an ``ir.Type`` or a FlyDSL
    numeric class; default f32) at element ``offset`` of ``rsrc``. Returns the
    scalar (``vec_width`` 1) or vector ``ir.Value``."""
    if dtype is None:
        dtype = ir.F32Type.get()
    elif hasattr(dtype, "ir_type"):
        dtype = dtype.ir_type
    result = dtype if vec_width == 1 else ir.VectorType.get([vec_width], dtype)
    return rocdl.RawPtrBufferLoadOp(
        result,
        _value(rsrc),
        _byte_offset(offset, _elem_bytes(dtype)),
        _i32(0),
        aux=_aux(cache_modifier),
    ).result


def buffer_store(data, rsrc, offset, cache_modifier: int = 0):
    """Store ``data`` (a scalar or vector value) at element ``offset`` of
    ``rsrc``; the element is the data's element type."""
    data = _value(data)
    rocdl.RawPtrBufferStoreOp(
        data,
        _value(rsrc),
        _byte_offset(offset, _elem_bytes(data.type)),
        _i32(0),
        aux=_aux(cache_modifier),
    )
