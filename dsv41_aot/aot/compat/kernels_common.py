"""Kernel-name helpers for the mono kernels.

The project's stand-in for ``aiter.ops.flydsl.kernels.kernels_common``: only
``kernel_signature``, the parameter suffix of every mono kernel symbol.
"""

__all__ = ["kernel_signature"]


def kernel_signature(**params) -> str:
    """The build parameters as a symbol suffix: ``name`` + value for each, in
    the order given, joined by ``_``; bools as 0 / 1, and every ``-`` (a
    negative value) as ``_``, since a hyphen is no symbol character.

    >>> kernel_signature(s=4, tp=4, tl=False, k=-1)
    's4_tp4_tl0_k_1'
    """
    parts = [f"{name}{int(value) if isinstance(value, bool) else value}" for name, value in params.items()]
    return "_".join(parts).replace("-", "_")
