"""Building the recording HIP (the suite's and verify's stand-in for the AMD GPU) where it can be built.

A build cache that cannot hold it is a warning and the user's cache is used
(P8 of the fault report at 24a0152: verify --against-jit used to exit 70).
"""

from __future__ import annotations

import os

import pytest

from dsv41_aot.aot import hiprec
from dsv41_aot.errors import AotError


@pytest.mark.faults
@pytest.mark.parametrize("how", ["a regular file", "a read-only folder"])
def test_a_build_cache_that_cannot_hold_it_is_a_warning(tmp_path, monkeypatch, capsys, how):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    cache = tmp_path / "cache"
    if how == "a regular file":
        cache.write_text("not a folder\n")
    else:
        cache.mkdir()
        cache.chmod(0o555)
        if os.access(cache, os.W_OK):  # root writes anywhere: make the folder's child unmakeable instead
            cache.chmod(0o755)
            (cache / "recording-hip").write_text("a file where the folder goes\n")
    lib = hiprec.build(cache=cache)
    assert lib.is_file() and lib.is_relative_to(tmp_path / "xdg" / "dsv41-aot" / "recording-hip")
    err = capsys.readouterr().err
    assert f"build cache {cache} cannot hold the recording HIP" in err and "instead" in err


def test_a_folder_asked_for_by_name_that_cannot_hold_it_is_an_error_with_a_fix(tmp_path):
    folder = tmp_path / "file"
    folder.write_text("x")
    with pytest.raises(AotError) as e:
        hiprec.build(folder)
    assert str(folder) in e.value.message and e.value.fix and e.value.exit_code == 2
