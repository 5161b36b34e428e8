"""GPU-only tests: AOT Launchers against vLLM's FlyDSL JIT launchers on real
AMD GPUs (MI300X gfx942 at TP 4, MI355X gfx950 at TP 2 / 4). Skipped, with the
reason, on a machine without them. How to run: docs/rocm-tests.md."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def rocm_gpus() -> tuple[int, str]:
    """(number of ROCm GPUs torch sees, why none when 0)."""
    if not Path("/dev/kfd").exists():
        return 0, "no /dev/kfd: no AMD GPU driver on this machine"
    try:
        import torch
    except ImportError:
        return 0, "torch is not installed"
    if getattr(torch.version, "hip", None) is None:
        return 0, f"torch {torch.__version__} is not a ROCm build"
    n = torch.cuda.device_count()
    return n, "" if n else "torch sees no ROCm device (HIP_VISIBLE_DEVICES?)"


def pytest_collection_modifyitems(config, items):
    n, why = rocm_gpus()
    need = int(os.environ.get("DSV41_AOT_ROCM_TP", "2"))
    for item in items:
        if "tests/rocm" not in str(item.fspath).replace(os.sep, "/"):
            continue
        item.add_marker(pytest.mark.rocm)
        if n == 0:
            item.add_marker(pytest.mark.skip(reason=f"needs AMD GPUs: {why}"))
        elif n < need:
            item.add_marker(pytest.mark.skip(reason=f"needs {need} AMD GPUs for TP {need}, torch sees {n}"))
