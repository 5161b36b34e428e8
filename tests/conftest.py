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


def pytest_configure(config):
    """One fresh build cache for the session (aot/cache.py), never kept
    between runs: a key compiles once per session, however many folders the
    tests build it into; a test that must compile (kills, identity changes,
    failures) passes --no-cache or changes the identity. Every subprocess
    inherits it."""
    import tempfile

    from dsv41_aot.aot.cache import ENV_BUILD_CACHE

    config._dsv41_cache = tempfile.mkdtemp(prefix="dsv41-aot-test-cache-")
    os.environ[ENV_BUILD_CACHE] = config._dsv41_cache


def pytest_unconfigure(config):
    import shutil

    if getattr(config, "_dsv41_cache", None):
        shutil.rmtree(config._dsv41_cache, ignore_errors=True)


@pytest.fixture(scope="session")
def smoke_dir(tmp_path_factory):
    """Built and linked; read it, copy it to change it."""
    if os.environ.get(FAST):
        pytest.fail(f"{FAST} is set (ci/test.sh --fast) but this test needs the smoke build: it compiles")
    return _smoke.smoke_dir(tmp_path_factory)


@pytest.fixture(scope="session")
def flydsl_python(tmp_path_factory):
    """``flydsl_python(version)``: the Python of a second environment whose
    FlyDSL is ``version`` and whose everything else (torch, vLLM's source,
    pyyaml) is this environment's: a venv holding only that FlyDSL (installed
    by this environment's pip), and a .pth naming this environment's
    site-packages, which Python puts after the venv's own (so the venv's
    FlyDSL is the one imported). Made once a session (tests/test_flydsl_pin.py)."""
    import subprocess
    import sys
    import sysconfig
    from pathlib import Path

    made: dict = {}

    def make(v: str) -> str:
        if v not in made:
            env = tmp_path_factory.mktemp(f"flydsl-{v}")
            subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, capture_output=True)
            py = str(env / "bin" / "python")
            pip = subprocess.run([sys.executable, "-m", "pip", "--python", py, "install", "-q", "--disable-pip-version-check",
                                  f"flydsl=={v}"], capture_output=True, text=True)
            assert pip.returncode == 0, f"pip install flydsl=={v} failed:\n{pip.stdout}\n{pip.stderr}"
            site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True).stdout.strip()
            Path(site, "dsv41-aot-first-env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
            made[v] = py
        return made[v]

    return make


FAST = "DSV41_AOT_TEST_FAST"  # ci/test.sh --fast: a compile is a test-selection bug


def pytest_collection_modifyitems(config, items):
    """A test that reaches the smoke build compiles (once a session): it is
    slow, whatever its own marks say, so ``-m "not slow"`` never compiles."""
    for item in items:
        if "smoke_dir" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def fresh(monkeypatch):
    """The runtime loader with no process state (each test opens what it
    needs: a new ``state.Prebuilt``, the one object every runtime module
    reaches through ``state.current()``) and no arch or source override from
    the environment."""
    from dsv41_aot.runtime import loader, state

    monkeypatch.delenv(loader.ENV_ARCH, raising=False)
    monkeypatch.delenv(loader.ENV_ALLOW_SOURCE, raising=False)
    with state.fresh():
        yield loader


def pytest_terminal_summary(terminalreporter, config):
    """Name the shuffled order (pytest-randomly) even under -q, which hides the
    header that says it: the line to replay a failing order with."""
    seed = getattr(config.option, "randomly_seed", None)
    if isinstance(seed, int):
        terminalreporter.write_line(f"test order: shuffled by pytest-randomly; replay it with --randomly-seed={seed}")


@pytest.fixture(scope="session")
def recording_hip(tmp_path_factory):
    """The recording HIP (dsv41_aot/aot/hiprec/recording_hip.c), the suite's
    one stand-in for the AMD GPU (MOCK-GPU), built once a session by the
    package's own builder: its libamdhip64.so.7. Processes use it through
    ``_recording_hip.env``."""
    import _recording_hip

    return _recording_hip.build(tmp_path_factory.mktemp("recording-hip"))
