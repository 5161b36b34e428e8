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


@pytest.mark.parametrize("xdg", [True, False], ids=["xdg-set", "xdg-empty"])
def test_the_user_cache_folders_share_one_root(tmp_path, monkeypatch, xdg):
    """The band cache, the vLLM tree cache, the recording HIP and the shim sit
    in one dsv41-aot folder; an empty XDG_CACHE_HOME counts as unset."""
    import subprocess
    import sys

    from dsv41_aot import source
    from dsv41_aot.aot import hiprec
    from dsv41_aot.runtime import bands

    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg") if xdg else "")
    monkeypatch.delenv(bands.ENV_CACHE, raising=False)
    monkeypatch.delenv(source.ENV_TREES, raising=False)
    root = (tmp_path / "xdg" if xdg else home / ".cache") / "dsv41-aot"
    # SHIM_DIR is fixed when toolchain is imported: read it from a fresh process
    shim = subprocess.run([sys.executable, "-c", "from dsv41_aot.aot import toolchain; print(toolchain.SHIM_DIR)"],
                          capture_output=True, text=True, check=True).stdout.strip()
    assert [bands.cache_dir(), source.trees_dir(), hiprec.default_folder(), Path(shim)] == \
        [root, root / "vllm", root / "recording-hip", root / "rocm"]
