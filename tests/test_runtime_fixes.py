"""Each refusal of the runtime's host checks carries the command that fixes it, and checks the vLLM it should.

Mutation testing (bench/mutants.py on runtime/host.py) found these fixes
could be dropped with every test still passing: an operator would then read
what is wrong and not what to do. Each test meets one refusal as a serving
process would and checks the fix names the variable or install it takes.
No GPU: the device's arch is the one thing stood in for (``device_arch``).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dsv41_aot.errors import HipUnavailableError, ManifestError, SourceMismatchError
from dsv41_aot.runtime import host, state


@pytest.fixture
def fresh(monkeypatch):
    """A process's empty runtime state, with neither the arch nor a source mismatch allowed by the environment."""
    for var in (host.ENV_ARCH, host.ENV_ALLOW_SOURCE):
        monkeypatch.delenv(var, raising=False)
    with state.fresh() as st:
        yield st


def test_an_arch_that_is_no_gfx_name_is_refused_naming_how_to_name_one(fresh):
    with pytest.raises(ManifestError) as e:
        host.resolve_arch("sm_90")
    assert e.value.fix == host.FIX_ARCH_NAME and f"{host.ENV_ARCH}=gfx950" in e.value.fix


def test_no_device_to_read_the_arch_from_names_the_variable_that_sets_it(fresh, monkeypatch):
    monkeypatch.setattr(fresh, "device_arch", lambda: None)  # stands in for a host without an AMD GPU
    with pytest.raises(HipUnavailableError) as e:
        host.resolve_arch()
    assert f"{host.ENV_ARCH}=gfx950" in (e.value.fix or "")


def test_an_unreadable_vllm_tree_is_refused_with_its_repair_and_the_way_around_it(fresh):
    src = SimpleNamespace(version="0.33.0")
    fresh.installed_digest = (None, src, "/site/vllm/models/deepseek_v41/amd/mono", PermissionError("denied"))
    with pytest.raises(SourceMismatchError) as e:
        host.installed_vllm()
    assert "pip install --force-reinstall vllm" in (e.value.fix or "")
    assert f"{host.ENV_ALLOW_SOURCE}=1" in e.value.fix


@pytest.mark.parametrize("where, error, said", [
    ("find", PermissionError("site-packages: denied"), "(vllm): PermissionError: site-packages: denied"),
    ("digest", OSError("layer.py: I/O error"), "(/site/mono): OSError: layer.py: I/O error"),
    ("nowhere", None, None),
], ids=["vllm-not-found", "sources-unreadable", "no-vllm"])
def test_a_vllm_whose_sources_cannot_be_read_is_no_answer_naming_what_failed(fresh, monkeypatch, where, error,
                                                                             said):
    """Finding the installed vLLM fails, or reading its mono sources does: the first load is refused naming what
    could not be read and why (never taken for "no vLLM", which checks nothing); no vLLM at all is no answer."""
    from dsv41_aot import source
    from dsv41_aot.errors import ToolchainError

    class Found:
        version, mono_dir = "0.33.0", "/site/mono"

        @property
        def digest(self):
            raise error

    def find():
        if where == "find":
            raise error
        if where == "nowhere":
            raise ToolchainError("no vLLM with the mono package")
        return Found()

    monkeypatch.setattr(source, "find", find)
    if said is None:
        assert host.installed_vllm() == (None, None, None)
        return
    with pytest.raises(SourceMismatchError) as e:
        host.installed_vllm()
    assert e.value.message == f"cannot compute the installed vLLM's mono source digest {said}", e.value.message


def test_kernels_of_other_mono_sources_are_refused_naming_the_vllm_they_were_built_from(fresh):
    src = SimpleNamespace(version="0.33.0")
    fresh.installed_digest = ("a" * 16, src, "/site/vllm/models/deepseek_v41/amd/mono", None)
    entry = SimpleNamespace(source=SimpleNamespace(mono_sources="b" * 16, vllm_version="0.32.0"))
    with pytest.raises(SourceMismatchError) as e:
        host.check_source("k1@gfx950:s=4,tp=4,r=1", entry)
    assert "vllm==0.32.0" in (e.value.fix or "") and f"{host.ENV_ALLOW_SOURCE}=1" in e.value.fix


def test_the_tree_the_runner_names_is_the_one_checked_until_it_is_forgotten(fresh, tmp_path):
    """The plugin names the mono package of the runner it patched: its digest, tree and folder are what every key
    is checked against (and the room picked anew), until it names none and the installed vLLM is found again."""
    import shutil

    from dsv41_aot import source

    installed = source.find()
    mono = tmp_path / "tree" / source.MONO_REL
    shutil.copytree(installed.mono_dir, mono, ignore=shutil.ignore_patterns("__pycache__"))
    (mono / "layer.py").write_text((mono / "layer.py").read_text() + "\n# a local edit\n")
    fresh.picked[(tmp_path, "gfx950")] = "0.33.0"
    host.running_vllm(mono)
    assert fresh.picked == {}
    digest, src, where = host.installed_vllm()
    assert digest == source.mono_digest(mono) != installed.digest
    assert src.root == tmp_path / "tree" and where == str(mono)
    host.running_vllm(None)
    assert host.installed_vllm()[0] == installed.digest


def test_no_vllm_is_no_answer_to_compare_but_a_failing_search_is_refused(fresh, monkeypatch):
    from dsv41_aot import source
    from dsv41_aot.errors import ToolchainError

    def nothing(*a, **k):
        raise ToolchainError("no vllm here")

    monkeypatch.setattr(source, "find", nothing)
    assert host.installed_vllm() == (None, None, None)

    def broken(*a, **k):
        raise RuntimeError("a broken site-packages")

    with state.fresh():
        monkeypatch.setattr(source, "find", broken)
        with pytest.raises(SourceMismatchError, match="a broken site-packages"):
            host.installed_vllm()
        monkeypatch.setenv(host.ENV_ALLOW_SOURCE, "1")
        assert host.installed_vllm() == (None, None, "vllm")


def test_a_stream_that_is_no_hip_stream_is_refused_naming_the_key_and_what_to_pass():
    """A launch's stream: None, an int, a ctypes pointer or a torch stream; anything else is refused, naming the key."""
    import ctypes

    from dsv41_aot.errors import LaunchError
    from dsv41_aot.runtime.launcher import _stream_handle

    key = "k1@gfx950:s=4,tp=4,r=1"
    assert [_stream_handle(s, key) for s in (None, 0, 7, ctypes.c_void_p(9), SimpleNamespace(cuda_stream=11))] == \
        [0, 0, 7, 9, 11]
    with pytest.raises(LaunchError) as e:
        _stream_handle("stream 7", key)
    assert key in e.value.message and "not a HIP stream" in e.value.message and "nothing was launched" in e.value.message
    assert "torch.cuda.Stream" in (e.value.fix or "")
