"""Shared fixtures. ``smoke_dir`` is the session's one smoke prebuilt
directory (tests/_smoke.py): built for real (FlyDSL compiles on the CPU, both
arches) and linked by whichever test asks first, in any test order."""

from __future__ import annotations

import os

import pytest

# This machine's libamdhip64 is Debian's ROCm 5.2, the stand-in the suite
# dlopens the kernel libraries against (there is no GPU either way). The
# loader refuses HIP outside ROCm 6.x-7.x at bind; the suite accepts exactly
# this version the documented way, and every subprocess inherits it.
# tests/test_faults_runtime.py checks the refusal without it.
os.environ.setdefault("DSV41_AOT_ALLOW_HIP_VERSION", "5.2")

import _smoke  # noqa: E402


@pytest.fixture(scope="session")
def smoke_dir(tmp_path_factory):
    """Built and linked; read it, copy it to change it."""
    return _smoke.smoke_dir(tmp_path_factory)


@pytest.fixture
def fresh(monkeypatch):
    """The runtime loader with no process state (each test opens what it
    needs) and no arch or source override from the environment."""
    from dsv41_aot.runtime import loader

    monkeypatch.setattr(loader, "_state", loader._State())
    monkeypatch.delenv(loader.ENV_ARCH, raising=False)
    monkeypatch.delenv(loader.ENV_ALLOW_SOURCE, raising=False)
    return loader


def pytest_terminal_summary(terminalreporter, config):
    """Name the shuffled order (pytest-randomly) even under -q, which hides the
    header that says it: the line to replay a failing order with."""
    seed = getattr(config.option, "randomly_seed", None)
    if isinstance(seed, int):
        terminalreporter.write_line(f"test order: shuffled by pytest-randomly; replay it with --randomly-seed={seed}")
