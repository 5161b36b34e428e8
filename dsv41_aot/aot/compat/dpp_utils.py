"""Data-parallel-primitive (DPP) lane moves for the mono kernels.

The project's stand-in for ``aiter.ops.flydsl.kernels.dpp_utils``: only the
32-bit ``update_dpp`` the mono package's lane reductions use.
"""

import flydsl.expr as fx

__all__ = ["update_dpp_i32"]


def update_dpp_i32(old, src, dpp_ctrl: int, row_mask: int = 0xF, bank_mask: int = 0xF, bound_ctrl: bool = False):
    """``llvm.amdgcn.update.dpp.i32``: each lane reads ``src`` from the lane
    ``dpp_ctrl`` selects; lanes outside ``row_mask`` / ``bank_mask`` keep
    ``old``. The controls are immediates (Python ints / bool). Returns the i32
    ``ir.Value``."""
    return fx.rocdl.update_dpp(
        fx.Int32.ir_type,
        fx.Int32(old).ir_value(),
        fx.Int32(src).ir_value(),
        int(dpp_ctrl),
        int(row_mask),
        int(bank_mask),
        bool(bound_ctrl),
    )
