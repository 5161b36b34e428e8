"""compiler.py drives FlyDSL 0.4.2 through internals (compile without a
launch). This fails loudly, naming what moved, the day the pin or those
internals change; update compiler.py with them."""

from __future__ import annotations

import inspect
from importlib.metadata import version

from dsv41_aot.aot import toolchain


def test_flydsl_is_the_pinned_version():
    assert version("flydsl") == toolchain.FLYDSL_VERSION, "compiler.py is written against this FlyDSL"


def test_internal_compile_path_is_where_compiler_py_expects_it():
    from flydsl.compiler.jit_function import CompiledFunction, JitFunction

    sig = inspect.signature(JitFunction._compile_or_execute)
    assert list(sig.parameters) == ["self", "args", "kwargs", "execute", "return_compiled"], sig
    assert sig.parameters["execute"].kind is inspect.Parameter.KEYWORD_ONLY
    assert list(inspect.signature(JitFunction._make_compiled_function).parameters) == [
        "self", "cache_key", "bound", "call_state"
    ]
    # compiler.py reads the fresh artifact's cache key from here
    assert "self._last_compiled = (cache_key, compiled_func)" in inspect.getsource(JitFunction._compile_or_execute)
    assert list(inspect.signature(CompiledFunction.export_to_c).parameters)[:3] == ["self", "file_path", "file_name"]


def test_disk_cache_switch_is_the_one_worker_env_sets():
    from flydsl.utils.env import RuntimeEnvManager

    assert RuntimeEnvManager.options["enable_cache"].env_var == "FLYDSL_RUNTIME_ENABLE_CACHE"
    assert RuntimeEnvManager.options["cache_dir"].env_var == "FLYDSL_RUNTIME_CACHE_DIR"
