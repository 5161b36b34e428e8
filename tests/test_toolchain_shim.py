"""The ROCM_PATH shim (aot/toolchain.py): a folder laid out like ROCm's whose
``llvm/bin/ld.lld`` links to the LLVM found, shared by every build of the
machine. A process whose ROCM_PATH is the shim itself (what a compile worker
is given) must leave it pointing at a real ld.lld, never at itself."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dsv41_aot.aot import toolchain


@pytest.fixture
def shim(tmp_path, monkeypatch) -> Path:
    monkeypatch.setattr(toolchain, "SHIM_DIR", tmp_path / "rocm")
    monkeypatch.delenv("ROCM_PATH", raising=False)
    if toolchain.llvm_tool("ld.lld") is None:
        pytest.skip("no ld.lld on this machine")
    return tmp_path / "rocm"


def test_find_with_the_shim_as_rocm_path_keeps_it_a_link_to_a_real_lld(shim, monkeypatch):
    first = toolchain.find()
    if first.rocm_path != shim:
        pytest.skip(f"a real ROCm ({first.rocm_path}): no shim is made")
    link = shim / "llvm" / "bin" / "ld.lld"
    assert Path(os.readlink(link)) == first.lld
    monkeypatch.setenv("ROCM_PATH", str(shim))  # a compile worker's environment
    again = toolchain.find()
    assert again.lld == first.lld and Path(os.readlink(link)) == first.lld
    assert Path(os.path.realpath(link)).is_file()
