"""FlyDSL's internals, in the one module that reaches into them.

The mono launchers take only scalars, so FlyDSL's public ``flyc.compile``
would try to launch them; this module drives FlyDSL's JIT compile without a
launch (``JitFunction._compile_or_execute(..., execute=False)``) and exports
the result. How each FlyDSL release differs is data in ``facts/flydsl.py``;
``tests/test_flydsl_pin.py`` runs this path under every supported release.
Imported only inside a compile or JIT worker.
"""

from __future__ import annotations

import inspect
import os
import pickle
from pathlib import Path

from ..facts.flydsl import installed


# code object id -> (the code object, its co_positions() as a tuple)
_POSITIONS: dict[int, tuple] = {}


def _code_position(code, instruction_index: int) -> tuple:
    """``inspect._get_code_position`` from a table read once per code object."""
    if instruction_index < 0:
        return (None, None, None, None)
    hit = _POSITIONS.get(id(code))  # each entry keeps its code object alive: no other has its id
    if hit is None:
        if len(_POSITIONS) >= 512:
            _POSITIONS.clear()
        hit = _POSITIONS[id(code)] = (code, tuple(code.co_positions()))
    return hit[1][instruction_index // 2]


_GETSOURCEFILE = inspect.getsourcefile
# the file names of frames inspect.getsourcefile answered with the file itself, found on disk
_SOURCE_FILES: set[str] = set()


def _source_file(object) -> str | None:
    """``inspect.getsourcefile``, which asks the disk on every call, asking it once per frame's file.

    A frame's answer depends only on its code's file name while that file
    exists: the name itself. So a name once found on disk is answered from
    the set; any other object, or a frame of a file not on disk (code made
    from a string), gets Python's own answer every time. A worker's sources
    stay in place for its life (the pool checks their identity as it starts)."""
    name = object.f_code.co_filename if inspect.isframe(object) else None
    if name in _SOURCE_FILES:
        return name
    found = _GETSOURCEFILE(object)
    if name is not None and found == name and os.path.exists(name):
        _SOURCE_FILES.add(name)
    return found


def cache_frame_lookups() -> bool:
    """Answer FlyDSL's two per-op frame lookups from tables; False where Python has no position table.

    FlyDSL gives each op the kernel lines that built it: ``inspect.getframeinfo``
    on up to five user frames per op. For each, Python (3.11 on) walks the
    frame's whole position table, and checks that its source file exists:
    together about half of a K2's compile. Here each code object's positions are
    read once and each source file is found once; the answers are Python's own.
    None of them reaches what a proof compares: a JIT run whose every position
    is wrong gives the same code object, artifact, module and launch. Both
    worker kinds call it: the build's compile worker and verify's JIT worker."""
    inspect.getsourcefile = _source_file
    if not callable(getattr(inspect, "_get_code_position", None)):
        return False
    inspect._get_code_position = _code_position
    return True


def compile_without_launch(launcher, args: tuple):
    """Compile a ``@flyc.jit`` function for ``args``, without a launch; its cache key."""
    launcher._compile_or_execute(args, {}, execute=False)
    cache_key, _ = launcher._last_compiled
    return cache_key


def export_c(launcher, args: tuple, cache_key, folder: Path, name: str) -> Path:
    """Export the artifact compiled under ``cache_key`` as ``folder/<name>.o``."""
    bound = launcher._sig.bind(*args)
    bound.apply_defaults()
    compiled = launcher._make_compiled_function(cache_key, bound, None)
    compiled.export_to_c(str(folder), name)
    return Path(folder) / f"{name}.o"


def _key_text(launcher, cache_key) -> str:
    """The ``key_text`` disk name: the cache key's text, which the cache hashes."""
    return launcher._cache_key_to_str(cache_key)


def _disk_cache_key(launcher, cache_key) -> str:
    """The ``disk_cache_key`` disk name: the artifact key namespaced by FlyDSL's own files."""
    from flydsl.compiler import jit_function

    return jit_function._disk_cache_key(cache_key)


# facts/flydsl.py FlyDSLRelease.disk_name -> how that release names its disk artifact
DISK_NAMES = {"key_text": _key_text, "disk_cache_key": _disk_cache_key}


def disk_artifact(launcher, cache_key) -> Path:
    """The path of the artifact compiled under ``cache_key`` in the JIT's disk cache.

    RuntimeError when the disk cache is off or holds no such file."""
    mgr = launcher.cache_manager
    if mgr is None:
        raise RuntimeError("FlyDSL's disk cache is off: FLYDSL_RUNTIME_CACHE_DIR / ENABLE_CACHE not honoured")
    name = DISK_NAMES[installed().disk_name](launcher, cache_key)
    path = Path(mgr._cache_file(name))
    if not path.is_file():
        raise RuntimeError(f"FlyDSL {installed().version} wrote no cache artifact at {path}")
    return path


def artifact_ir(raw: bytes) -> str:
    """The compiled IR in a disk-cache artifact's bytes (a pickled ``CompiledArtifact``)."""
    return pickle.loads(raw)._ir_text


def gpu_binary(ir_text: str) -> bytes:
    """The one GPU code object in a FlyDSL artifact's IR (its ``gpu.binary`` op's)."""
    from flydsl._mlir import ir
    from flydsl._mlir.dialects import gpu
    from flydsl.compiler.jit_function import _create_mlir_context

    with _create_mlir_context():
        module = ir.Module.parse(ir_text)
        objs = [
            gpu.ObjectAttr(a).object
            for op in module.body.operations
            if op.operation.name == "gpu.binary"
            for a in ir.ArrayAttr(op.operation.attributes["objects"])
        ]
    if len(objs) != 1:
        raise RuntimeError(f"FlyDSL artifact holds {len(objs)} GPU objects, expected 1")
    return bytes(objs[0])
