"""Shared fixtures. ``smoke_dir`` is the session's one smoke prebuilt
directory (tests/_smoke.py): built for real (FlyDSL compiles on the CPU, both
arches) and linked by whichever test asks first, in any test order."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

import pytest

# This machine's libamdhip64 is Debian's ROCm 5.2, the stand-in the suite
# dlopens the kernel libraries against (there is no GPU either way). The
# loader refuses HIP outside ROCm 6.x-7.x at bind; the suite accepts exactly
# this version the documented way, and every subprocess inherits it.
# tests/test_faults_runtime.py checks the refusal without it.
os.environ.setdefault("DSV41_AOT_ALLOW_HIP_VERSION", "5.2")

import _smoke  # noqa: E402


SHARED = "DSV41_AOT_TEST_SHARED"  # the session's folder, shared by every pytest-xdist worker


def pytest_configure(config):
    """One session folder, made by the process that runs the session and
    inherited by its pytest-xdist workers and every subprocess: the build
    cache (aot/cache.py), never kept between runs, so a key compiles once per
    session however many folders and workers build it (a test that must
    compile passes --no-cache or changes the identity), and the locks that
    let one worker make what the others then reuse."""
    import tempfile

    from dsv41_aot.aot.cache import ENV_BUILD_CACHE

    if not os.environ.get(SHARED):  # the controller (or a run without workers)
        config._dsv41_shared = tempfile.mkdtemp(prefix="dsv41-aot-test-session-")
        os.environ[SHARED] = config._dsv41_shared
        os.environ[ENV_BUILD_CACHE] = str(Path(config._dsv41_shared) / "cache")
    config.stash[SUMMARY] = []


def pytest_unconfigure(config):
    if getattr(config, "_dsv41_shared", None):
        shutil.rmtree(config._dsv41_shared, ignore_errors=True)


SUMMARY = pytest.StashKey[list]()  # lines a test module leaves for the end of the run


@pytest.fixture(scope="session")
def summary_lines(request) -> list:
    """Lines to print in the run's closing summary (from a pytest-xdist worker too)."""
    return request.config.stash[SUMMARY]


def pytest_sessionfinish(session):
    if hasattr(session.config, "workeroutput"):  # a worker: hand its lines to the controller
        session.config.workeroutput["dsv41_summary"] = session.config.stash[SUMMARY]


def pytest_testnodedown(node, error):
    node.config.stash[SUMMARY].extend(node.workeroutput.get("dsv41_summary", []))


@contextlib.contextmanager
def session_lock(name: str):
    """Hold the session's lock ``name`` (an flock): what one worker makes under
    it, the next worker to take it finds made."""
    import fcntl

    with open(os.path.join(os.environ[SHARED], f"{name}.lock"), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


@pytest.fixture(scope="session")
def smoke_dir(tmp_path_factory):
    """Built and linked; read it, copy it to change it."""
    if os.environ.get(FAST):
        pytest.fail(f"{FAST} is set (ci/test.sh --fast) but this test needs the smoke build: it compiles")
    with session_lock("smoke"):  # one worker compiles; the others build theirs from the cache it filled
        return _smoke.smoke_dir(tmp_path_factory)


@pytest.fixture(scope="session")
def smoke_jit(smoke_dir):
    """The smoke build, with every key's JIT build in the session's build
    cache: ``verify --against-jit`` ran once over it, by whichever worker
    asked first. JIT comparisons of smoke keys then come from the cache, so
    two workers never JIT-build the same keys side by side. A test that must
    see the JIT run passes --no-cache."""
    done = Path(os.environ[SHARED], "smoke-jit-done")
    with session_lock("smoke-jit"):
        if not done.exists():
            r = _smoke.cli("verify", "--dir", smoke_dir, "--against-jit", "--no-progress")
            assert r.returncode == 0, r.stdout + r.stderr
            done.touch()
    return smoke_dir


@pytest.fixture(scope="session")
def flydsl_python():
    """``flydsl_python(version)``: the Python of a second environment whose
    FlyDSL is ``version`` and whose everything else (torch, vLLM's source,
    pyyaml) is this environment's: a venv holding only that FlyDSL (installed
    by this environment's pip), and a .pth naming this environment's
    site-packages, which Python puts after the venv's own (so the venv's
    FlyDSL is the one imported). Made once per session, in the session folder
    every worker shares (tests/test_flydsl_pin.py)."""
    import subprocess
    import sys
    import sysconfig

    def make(v: str) -> str:
        env = Path(os.environ[SHARED], f"flydsl-{v}")
        py = str(env / "bin" / "python")
        with session_lock(f"flydsl-{v}"):
            if (env / "made").exists():
                return py
            shutil.rmtree(env, ignore_errors=True)  # a half-made one, from a worker that died
            subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, capture_output=True)
            pip = subprocess.run([sys.executable, "-m", "pip", "--python", py, "install", "-q", "--disable-pip-version-check",
                                  "--no-compile", f"flydsl=={v}"], capture_output=True, text=True)
            assert pip.returncode == 0, f"pip install flydsl=={v} failed:\n{pip.stdout}\n{pip.stderr}"
            site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True).stdout.strip()
            Path(site, "dsv41-aot-first-env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
            (env / "made").touch()
        return py

    return make


FAST = "DSV41_AOT_TEST_FAST"  # ci/test.sh --fast: a compile is a test-selection bug


# The order test files start in (ci/test.sh keeps it: --no-loadscope-reorder;
# pytest-xdist would otherwise sort files by how many tests each holds).
# pytest-xdist hands each worker whole files (--dist loadfile): the first to
# the first worker, the second to the other, then each file to whichever
# worker runs short. test_verify.py goes first: its first test builds the
# smoke profile (about 30 s on 2 cores, both of them) and then proves it
# against vLLM's JIT, the run's longest stretch. The files after it need no
# smoke build for their first minute or more, so the other worker compiles
# its own keys meanwhile instead of waiting on the smoke build's lock (at
# 551cfd5 it waited 70 s); then the longest files, so that the run ends on
# short ones. Wall seconds on 2 cores at 551cfd5: 172, 55, 105, 40, 43, 13,
# 13, 96, 121 (70 of them waiting), 86, 54, 56, 24, 27.
FIRST = ["test_verify.py", "test_cache.py", "test_vllm_plugin.py", "test_shipped_proof.py", "test_every_launch.py",
         "test_toolchain_move.py", "test_full_deployment.py", "test_build.py", "test_wheel.py", "test_workers.py",
         "test_faults_build.py", "test_tamper_matrix.py", "test_release.py", "test_flydsl_pin.py"]


def pytest_collection_modifyitems(config, items):
    """A test that reaches the smoke build compiles (once per session): it is
    slow, whatever its own marks say, so ``-m "not slow"`` never compiles.
    Unless pytest-randomly shuffles them, files start in ``FIRST``'s order."""
    for item in items:
        if "smoke_dir" in getattr(item, "fixturenames", ()):  # smoke_jit's too
            item.add_marker(pytest.mark.slow)
    if not config.pluginmanager.hasplugin("randomly"):
        rank = {name: i for i, name in enumerate(FIRST)}
        items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file keeps its own order


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
    """The lines test modules left, and the shuffled order (pytest-randomly)
    even under -q, which hides the header that says it: the line to replay a
    failing order with."""
    for line in config.stash[SUMMARY]:
        terminalreporter.write_line(line)
    seed = getattr(config.option, "randomly_seed", None)
    if isinstance(seed, int):
        terminalreporter.write_line(f"test order: shuffled by pytest-randomly; replay it with --randomly-seed={seed}")


@pytest.fixture(scope="session")
def recording_hip(tmp_path_factory):
    """The recording HIP (dsv41_aot/aot/hiprec/recording_hip.c), the suite's
    one stand-in for the AMD GPU (MOCK-GPU), built once per session by the
    package's own builder: its libamdhip64.so.7. Processes use it through
    ``_recording_hip.env``."""
    import _recording_hip

    return _recording_hip.build(tmp_path_factory.mktemp("recording-hip"))
