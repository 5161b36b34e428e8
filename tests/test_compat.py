"""dsv41_aot.compat: the project's own aiter FlyDSL helpers.

Fast tests: ``kernel_signature``, the descriptor word, the shim's registration
and identity (each shim test in a fresh interpreter: the shim edits
``sys.modules``). Slow tests: the golden keys compiled with the project's
helpers give byte-identical GPU code objects, one interpreter per
architecture (the mono package fixes its target arch at import time).

Run as a script (``python tests/test_compat.py --golden-worker ARCH``) this
file is the slow tests' worker: it compiles the arch's golden keys without
launching them and prints one JSON line per key.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).resolve().parent / "data" / "golden_code_objects.txt"
ARCHS = ("gfx950", "gfx942")


def _golden(arch=None):
    """{key: (sha256, bytes)} from tests/data, for one arch or all."""
    out = {}
    for line in GOLDEN.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        key, digest, size = line.split()
        if arch is None or key.split("@")[1].startswith(arch + ":"):
            out[key] = (digest, int(size))
    return out


def _run_python(code, **env):
    """Run ``code`` in a fresh interpreter with the repo importable; its stdout."""
    environ = {**os.environ, "PYTHONPATH": str(REPO), **env}
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=environ,
        cwd=REPO,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


# ---------------------------------------------------------------- kernel_signature


def test_kernel_signature_renders_in_order():
    from dsv41_aot.compat.kernels_common import kernel_signature

    assert kernel_signature(s=4, tp=4, r=1) == "s4_tp4_r1"
    assert kernel_signature(r=1, tp=4, s=4) == "r1_tp4_s4"
    assert kernel_signature() == ""


def test_kernel_signature_bools_are_digits():
    from dsv41_aot.compat.kernels_common import kernel_signature

    assert kernel_signature(tl=False, f=True, i=False) == "tl0_f1_i0"
    # ints 0 / 1 render the same as bools: only the value's text counts
    assert kernel_signature(f=1, i=0) == kernel_signature(f=True, i=False)


def test_kernel_signature_negatives_and_hyphens():
    from dsv41_aot.compat.kernels_common import kernel_signature

    assert kernel_signature(tk=-1, s=2) == "tk_1_s2"
    assert kernel_signature(mode="a-b", x=1.5) == "modea_b_x1.5"


def test_kernel_signature_gives_the_mono_symbol():
    """attention/device.py's kernel_symbol wraps the signature as
    _ZN5aiter<len><stem>_<sig>E; K1 s=4 tp=4 r=1 with defaults is known."""
    from dsv41_aot.compat.kernels_common import kernel_signature

    name = "dsv41_mono_k1_" + kernel_signature(s=4, tp=4, r=1, tl=False, f=True, i=False)
    assert f"_ZN5aiter{len(name)}{name}E" == "_ZN5aiter33dsv41_mono_k1_s4_tp4_r1_tl0_f1_i0E"


# ---------------------------------------------------------------- buffer descriptor


def test_descriptor_word_is_the_cdna_word_on_both_targets(monkeypatch):
    from dsv41_aot.compat import buffer_ops

    # DATA_FORMAT 7 (bits 14:12), NUM_FORMAT 4 (bits 18:15); the golden code
    # objects of both arches carry this same word
    assert buffer_ops.descriptor_flags("gfx942") == 0x27000
    assert buffer_ops.descriptor_flags("gfx950") == 0x27000
    monkeypatch.setenv("ARCH", "gfx942:sramecc+:xnack-")
    assert buffer_ops.descriptor_flags() == 0x27000  # ARCH read at call time
    monkeypatch.setenv("ARCH", "gfx1100")
    with pytest.raises(ValueError, match="gfx1100"):
        buffer_ops.descriptor_flags()


# ---------------------------------------------------------------- the shim

_SHIM_PROBE = """
    import json, sys
    from dsv41_aot.compat import install_aiter_shim
    first = install_aiter_shim()
    mods = {n: id(sys.modules.get(n)) for n in sorted(sys.modules) if n.startswith("aiter")}
    second = install_aiter_shim()
    heavy = sorted(m for m in ("torch", "vllm", "flydsl") if m in sys.modules)
    again = {n: id(sys.modules.get(n)) for n in sorted(sys.modules) if n.startswith("aiter")}
    print(json.dumps({"first": first, "second": second, "heavy": heavy,
                      "names": sorted(mods), "stable": mods == again}))
"""


def test_shim_registers_the_project_helpers():
    out = json.loads(_run_python(_SHIM_PROBE))
    from dsv41_aot.compat import compat_digest

    assert out["first"] == {"impl": "dsv41_aot.compat", "digest": compat_digest()}
    assert out["second"] == out["first"] and out["stable"], "install_aiter_shim is not idempotent"
    assert out["heavy"] == [], f"installing the shim imported {out['heavy']}"
    kernels = "aiter.ops.flydsl.kernels"
    assert out["names"] == sorted(
        ["aiter", "aiter.ops", "aiter.ops.flydsl", kernels]
        + [f"{kernels}.{h}" for h in ("buffer_ops", "dpp_utils", "kernels_common")]
    )


def test_shim_modules_are_the_project_modules():
    out = _run_python(
        """
        import sys
        from dsv41_aot.compat import install_aiter_shim
        install_aiter_shim()
        from aiter.ops.flydsl.kernels.kernels_common import kernel_signature
        from aiter.ops.flydsl.kernels import buffer_ops as bo
        import dsv41_aot.compat.kernels_common as kc
        assert kernel_signature is kc.kernel_signature
        assert bo is sys.modules["dsv41_aot.compat.buffer_ops"]
        assert "flydsl" not in sys.modules  # buffer_ops not yet run: lazy
        assert callable(bo.create_buffer_resource_from_addr)
        assert "flydsl" in sys.modules  # ... and run on first use
        print(kernel_signature(a=True, b=-2))
        """
    )
    assert out.strip() == "a1_b_2"


def test_shim_defers_to_real_aiter(tmp_path):
    kernels = tmp_path / "aiter" / "ops" / "flydsl" / "kernels"
    kernels.mkdir(parents=True)
    (tmp_path / "aiter" / "__init__.py").write_text("__version__ = '9.9.9'\n")
    for d in (tmp_path / "aiter" / "ops", kernels.parent, kernels):
        (d / "__init__.py").touch()
    (kernels / "buffer_ops.py").write_text("REAL = True\n")
    out = _run_python(
        """
        import json
        from dsv41_aot.compat import install_aiter_shim
        ident = install_aiter_shim()
        from aiter.ops.flydsl.kernels import buffer_ops
        print(json.dumps([ident, buffer_ops.REAL]))
        """,
        PYTHONPATH=f"{REPO}{os.pathsep}{tmp_path}",
    )
    assert json.loads(out) == [{"impl": "aiter", "version": "9.9.9"}, True]


def test_shim_keeps_an_aiter_without_flydsl_ops(tmp_path):
    """An aiter without FlyDSL ops (amd-aiter on PyPI) stays the ``aiter`` in
    sys.modules; the missing levels below it come from the shim."""
    (tmp_path / "aiter" / "ops").mkdir(parents=True)
    (tmp_path / "aiter" / "__init__.py").write_text("MARK = 'real'\n")
    (tmp_path / "aiter" / "ops" / "__init__.py").touch()
    out = _run_python(
        """
        import json, aiter
        from dsv41_aot.compat import install_aiter_shim
        ident = install_aiter_shim()
        from aiter.ops.flydsl.kernels import dpp_utils
        import aiter as again
        print(json.dumps([ident["impl"], again.MARK, dpp_utils.__name__]))
        """,
        PYTHONPATH=f"{REPO}{os.pathsep}{tmp_path}",
    )
    assert json.loads(out) == ["dsv41_aot.compat", "real", "dsv41_aot.compat.dpp_utils"]


def test_compat_digest_covers_the_helper_files():
    from dsv41_aot import compat

    digest = compat.compat_digest()
    assert len(digest) == 16 and int(digest, 16) >= 0
    h = hashlib.sha256()
    for name in ("buffer_ops.py", "dpp_utils.py", "kernels_common.py"):
        h.update(name.encode() + b"\0" + (REPO / "dsv41_aot" / "compat" / name).read_bytes() + b"\0")
    assert digest == h.hexdigest()[:16]


# ---------------------------------------------------------------- golden code objects


def _ld_lld():
    """An ld.lld for FlyDSL's ROCDL serializer, or None."""
    rocm = os.environ.get("ROCM_PATH")
    if rocm and (Path(rocm) / "llvm" / "bin" / "ld.lld").exists():
        return Path(rocm) / "llvm" / "bin" / "ld.lld"
    for cand in sorted(Path("/usr/lib").glob("llvm-*/bin/ld.lld"), reverse=True):
        return cand
    found = shutil.which("ld.lld")
    return Path(found) if found else None


def test_golden_data_is_six_keys():
    golden = _golden()
    assert len(golden) == 6
    for arch in ARCHS:
        assert {k.split("@")[0] for k in _golden(arch)} == {"k1", "k2", "ffn"}


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_golden_code_objects(arch, tmp_path):
    """The project's helpers reproduce upstream's code objects byte for byte."""
    lld = _ld_lld()
    if lld is None:
        pytest.fail("no ld.lld for FlyDSL's ROCDL serializer: apt-get install lld-19")
    rocm = tmp_path / "rocm"
    (rocm / "llvm" / "bin").mkdir(parents=True)
    (rocm / "llvm" / "bin" / "ld.lld").symlink_to(lld)
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "ARCH": arch,
        "FLYDSL_GPU_ARCH": arch,
        "ROCM_PATH": str(rocm),
        "FLYDSL_RUNTIME_CACHE_DIR": str(tmp_path / "cache"),
    }
    proc = subprocess.run(
        [sys.executable, __file__, "--golden-worker", arch],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    lines = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    ident = lines[0]
    if ident.get("impl") != "dsv41_aot.compat":
        pytest.skip(f"real aiter is installed ({ident}): the build did not use the project's helpers")
    got = {x["key"]: (x["sha256"], x["bytes"]) for x in lines[1:]}
    assert got == _golden(arch)


# ---------------------------------------------------------------- the worker


def _isolate_mono():
    """Import vLLM's mono package without vLLM: its parents become bare
    packages over the installed folders."""
    import importlib.util
    import types

    root = Path(importlib.util.find_spec("vllm").submodule_search_locations[0])
    parts = ("vllm", "models", "deepseek_v41", "amd")
    for n in range(1, len(parts) + 1):
        name = ".".join(parts[:n])
        module = types.ModuleType(name)
        module.__path__ = [str(root.joinpath(*parts[1:n]))]
        module.__package__ = name
        sys.modules[name] = module
    from vllm.models.deepseek_v41.amd.mono import layer

    return layer


def _compile_without_launch(launcher):
    """Compile a mono launcher (a @flyc.jit function of Int64 / Int32 scalars)
    without a GPU. -> (CompiledFunction, the cached CompiledArtifact)."""
    import inspect

    args = [p.annotation(0) for p in inspect.signature(launcher.func).parameters.values() if p.default is p.empty]
    launcher._compile_or_execute(tuple(args), {}, execute=False)
    bound = launcher._sig.bind(*args)
    bound.apply_defaults()
    key = launcher._build_full_cache_key(
        bound.arguments, owner_cls=None, bound_self=None, effective_hints=launcher._effective_compile_hints()
    )
    return launcher._make_compiled_function(key, bound, None), launcher._mem_cache[key]


def _code_object(artifact) -> bytes:
    """The GPU code object (an ELF) in a compiled artifact's gpu.binary."""
    from flydsl._mlir import ir
    from flydsl._mlir.dialects import gpu
    from flydsl.compiler.jit_function import _create_mlir_context

    with _create_mlir_context():
        module = ir.Module.parse(artifact._ir_text)
        objects = [
            gpu.ObjectAttr(obj).object
            for op in module.body.operations
            if op.operation.name == "gpu.binary"
            for obj in ir.ArrayAttr(op.operation.attributes["objects"])
        ]
    assert len(objects) == 1, f"expected one GPU object, found {len(objects)}"
    assert objects[0][:4] == b"\x7fELF", "the GPU object is not an ELF code object"
    return objects[0]


def _golden_worker(arch):
    import time

    assert os.environ.get("ARCH") == arch, "set ARCH before the mono package is imported"
    from dsv41_aot.compat import install_aiter_shim

    print(json.dumps(install_aiter_shim()), flush=True)
    layer = _isolate_mono()
    for key in _golden(arch):
        kind, rest = key.split("@")
        fields = dict(kv.split("=") for kv in rest.split(":")[1].split(","))
        build = layer.MonoBuild(tokens=int(fields["s"]), tp=int(fields["tp"]), ratio=int(fields["r"]))
        start = time.perf_counter()
        _, artifact = _compile_without_launch(getattr(layer, f"build_mono_{kind}")(build))
        code = _code_object(artifact)
        row = {"key": key, "sha256": hashlib.sha256(code).hexdigest(), "bytes": len(code)}
        print(json.dumps({**row, "seconds": round(time.perf_counter() - start, 1)}), flush=True)


if __name__ == "__main__" and sys.argv[1:2] == ["--golden-worker"]:
    _golden_worker(sys.argv[2])
