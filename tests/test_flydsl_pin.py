"""The FlyDSL releases dsv41-aot supports are data (dsv41_aot/facts/flydsl.py),
and compiler.py drives FlyDSL through internals (compile without a launch).
This fails loudly, naming what moved, the day those internals change."""

from __future__ import annotations

import inspect
import re
from importlib.metadata import version
from pathlib import Path

import pytest

from dsv41_aot.aot import toolchain
from dsv41_aot.errors import ToolchainError
from dsv41_aot.facts.flydsl import FLYDSL, supported

REPO = Path(__file__).resolve().parents[1]
INSTALLED = version("flydsl")
# where a FlyDSL release may be named: its facts table (tests and docs may too)
OWNER = REPO / "dsv41_aot" / "facts" / "flydsl.py"


def _files_that_must_not_name_a_flydsl():
    for top in ("dsv41_aot", "ci", "bench", ".github"):
        for p in sorted((REPO / top).rglob("*")):
            if p.is_file() and p != OWNER and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".o", ".so"):
                yield p
    yield REPO / "setup.py"


def test_no_flydsl_version_is_written_outside_the_facts_table():
    names = [re.compile(rf"(?<![\w.]){re.escape(v)}(?![\w.])") for v in FLYDSL]
    names.append(re.compile(r"flydsl\s*(==|>=|<=|~=|!=)\s*\d", re.IGNORECASE))
    found = []
    for p in _files_that_must_not_name_a_flydsl():
        text = p.read_text(errors="replace")
        for n, line in enumerate(text.splitlines(), 1):
            if any(r.search(line) for r in names):
                found.append(f"{p.relative_to(REPO)}:{n}: {line.strip()}")
    assert not found, "name FlyDSL releases only in dsv41_aot/facts/flydsl.py (read it from there):\n" + "\n".join(found)


def test_the_build_extra_pins_a_supported_flydsl_and_bootstrap_installed_it():
    text = (REPO / "pyproject.toml").read_text()
    pins = re.findall(r'"flydsl==([^"]+)"', text)
    assert len(pins) == 1, f"pyproject.toml pins FlyDSL {pins}: the build extra pins exactly one"
    assert pins[0] in FLYDSL, f"pyproject.toml builds with FlyDSL {pins[0]}, which facts/flydsl.py does not support"
    assert INSTALLED == pins[0], "ci/bootstrap.sh installs the build extra's FlyDSL"
    assert toolchain.flydsl_version() == INSTALLED


def test_a_flydsl_not_in_the_table_is_refused_naming_the_supported_ones(monkeypatch):
    import importlib.metadata

    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.3.9" if name == "flydsl" else version(name))
    with pytest.raises(ToolchainError) as e:
        toolchain.flydsl_version()
    msg = str(e.value)
    assert e.value.exit_code == 2 and "FlyDSL 0.3.9 is installed" in msg and f"FlyDSL {supported()}" in msg, msg
    assert all(f"pip install flydsl=={v}" in e.value.fix for v in FLYDSL), e.value.fix


def test_internal_compile_path_is_where_compiler_py_expects_it():
    from flydsl.compiler.jit_function import CompiledFunction, JitFunction

    sig = inspect.signature(JitFunction._compile_or_execute)
    assert list(sig.parameters) == ["self", "args", "kwargs", "execute", "return_compiled"], sig
    assert list(inspect.signature(JitFunction._make_compiled_function).parameters) == [
        "self", "cache_key", "bound", "call_state"
    ]
    assert list(inspect.signature(CompiledFunction.export_to_c).parameters)[:3] == ["self", "file_path", "file_name"]


def test_disk_cache_switch_is_the_one_worker_env_sets():
    from flydsl.utils.env import RuntimeEnvManager

    assert RuntimeEnvManager.options["enable_cache"].env_var == "FLYDSL_RUNTIME_ENABLE_CACHE"
    assert RuntimeEnvManager.options["cache_dir"].env_var == "FLYDSL_RUNTIME_CACHE_DIR"
