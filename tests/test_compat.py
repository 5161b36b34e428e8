"""dsv41_aot.aot.compat: the project's own aiter FlyDSL helpers.

``kernel_signature``, the descriptor word, operand unwrapping, and the shim's
registration and identity (each shim test in a fresh interpreter: the shim
edits ``sys.modules``). That the helpers give upstream's golden code objects
byte for byte is proven through the builder itself (tests/test_build.py).
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


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
    from dsv41_aot.aot.compat.kernels_common import kernel_signature

    assert kernel_signature(s=4, tp=4, r=1) == "s4_tp4_r1"
    assert kernel_signature(r=1, tp=4, s=4) == "r1_tp4_s4"
    assert kernel_signature() == ""


def test_kernel_signature_bools_are_digits():
    from dsv41_aot.aot.compat.kernels_common import kernel_signature

    assert kernel_signature(tl=False, f=True, i=False) == "tl0_f1_i0"
    # ints 0 / 1 render the same as bools: only the value's text counts
    assert kernel_signature(f=1, i=0) == kernel_signature(f=True, i=False)


def test_kernel_signature_negatives_and_hyphens():
    from dsv41_aot.aot.compat.kernels_common import kernel_signature

    assert kernel_signature(tk=-1, s=2) == "tk_1_s2"
    assert kernel_signature(mode="a-b", x=1.5) == "modea_b_x1.5"


def test_kernel_signature_gives_the_mono_symbol():
    """attention/device.py's kernel_symbol wraps the signature as
    _ZN5aiter<len><stem>_<sig>E; K1 s=4 tp=4 r=1 with defaults is known."""
    from dsv41_aot.aot.compat.kernels_common import kernel_signature

    name = "dsv41_mono_k1_" + kernel_signature(s=4, tp=4, r=1, tl=False, f=True, i=False)
    assert f"_ZN5aiter{len(name)}{name}E" == "_ZN5aiter33dsv41_mono_k1_s4_tp4_r1_tl0_f1_i0E"


# ---------------------------------------------------------------- buffer descriptor


def test_descriptor_word_is_the_cdna_word_on_both_targets(monkeypatch):
    from dsv41_aot.aot.compat import buffer_ops
    from dsv41_aot.facts.arches import ARCHES

    # DATA_FORMAT 7 (bits 14:12), NUM_FORMAT 4 (bits 18:15); the golden code
    # objects of both arches carry this same word
    assert buffer_ops.descriptor_flags("gfx942") == 0x27000
    assert buffer_ops.descriptor_flags("gfx950") == 0x27000
    monkeypatch.setenv("ARCH", ARCHES["gfx942"].gcn_arch_name)  # as HIP names it
    assert buffer_ops.descriptor_flags() == 0x27000  # ARCH read at call time
    monkeypatch.setenv("ARCH", "gfx1100")
    with pytest.raises(ValueError, match="gfx1100"):
        buffer_ops.descriptor_flags()


# ---------------------------------------------------------------- the shim

_SHIM_PROBE = """
    import json, sys
    from dsv41_aot.aot.compat import install_aiter_shim
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
    from dsv41_aot.aot.compat import compat_digest

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
        from dsv41_aot.aot.compat import install_aiter_shim
        install_aiter_shim()
        from aiter.ops.flydsl.kernels.kernels_common import kernel_signature
        from aiter.ops.flydsl.kernels import buffer_ops as bo
        import dsv41_aot.aot.compat.kernels_common as kc
        assert kernel_signature is kc.kernel_signature
        assert bo is sys.modules["dsv41_aot.aot.compat.buffer_ops"]
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
        from dsv41_aot.aot.compat import install_aiter_shim
        ident = install_aiter_shim()
        from aiter.ops.flydsl.kernels import buffer_ops
        print(json.dumps([ident, buffer_ops.REAL]))
        """,
        PYTHONPATH=f"{REPO}{os.pathsep}{tmp_path}",
    )
    assert json.loads(out) == [{"impl": "aiter", "version": "9.9.9"}, True]


def test_shim_keeps_an_aiter_without_flydsl_ops(tmp_path):
    """An aiter without FlyDSL ops (amd-aiter 0.1.7, as published) stays the ``aiter`` in
    sys.modules; the missing levels below it come from the shim."""
    (tmp_path / "aiter" / "ops").mkdir(parents=True)
    (tmp_path / "aiter" / "__init__.py").write_text("MARK = 'real'\n")
    (tmp_path / "aiter" / "ops" / "__init__.py").touch()
    out = _run_python(
        """
        import json, aiter
        from dsv41_aot.aot.compat import install_aiter_shim
        ident = install_aiter_shim()
        from aiter.ops.flydsl.kernels import dpp_utils
        import aiter as again
        print(json.dumps([ident["impl"], again.MARK, dpp_utils.__name__]))
        """,
        PYTHONPATH=f"{REPO}{os.pathsep}{tmp_path}",
    )
    assert json.loads(out) == ["dsv41_aot.compat", "real", "dsv41_aot.aot.compat.dpp_utils"]


def test_compat_digest_of_known_helper_files(tmp_path, monkeypatch):
    r"""The digest's definition, pinned: helpers whose contents are "a", "b",
    "c" digest to a value derived outside Python, by
    printf 'buffer_ops.py\0a\0dpp_utils.py\0b\0kernels_common.py\0c\0' | sha256sum
    (name, NUL, contents, NUL, in name order; the first 16 hex digits)."""
    from dsv41_aot.aot import compat

    for name, text in (("buffer_ops.py", "a"), ("dpp_utils.py", "b"), ("kernels_common.py", "c")):
        (tmp_path / name).write_text(text)
    (tmp_path / "__init__.py").write_text("anything")  # not a helper: not digested
    monkeypatch.setattr(compat, "_HERE", tmp_path)
    assert compat.compat_digest() == "c0aa10ec7d0fa2c6"
    # the names count, not only the contents: the same three texts in other files differ
    (tmp_path / "buffer_ops.py").write_text("b")
    (tmp_path / "dpp_utils.py").write_text("a")
    assert compat.compat_digest() != "c0aa10ec7d0fa2c6"


def _digest_of_copy(tmp_path, edit=None) -> str:
    """compat_digest() as a copy of the package computes it, ``edit`` applied
    to the copy's compat folder first (a fresh interpreter imports the copy)."""
    root = tmp_path / "copy"
    shutil.copytree(REPO / "dsv41_aot", root / "dsv41_aot", ignore=shutil.ignore_patterns("__pycache__"))
    if edit:
        edit(root / "dsv41_aot" / "aot" / "compat")
    proc = subprocess.run(
        [sys.executable, "-c", "import dsv41_aot.aot.compat as c; print(c.__file__); print(c.compat_digest())"],
        capture_output=True, text=True, cwd=root, env={**os.environ, "PYTHONPATH": str(root)}, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    where, digest = proc.stdout.split()
    assert Path(where).is_relative_to(root)
    return digest


def _flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("helper", ["buffer_ops.py", "dpp_utils.py", "kernels_common.py"])
def test_compat_digest_changes_with_one_byte_of_any_helper(helper, tmp_path):
    from dsv41_aot.aot.compat import compat_digest

    assert _digest_of_copy(tmp_path / "same") == compat_digest()
    assert _digest_of_copy(tmp_path / "edited", lambda d: _flip_last_byte(d / helper)) != compat_digest()


def test_compat_digest_ignores_the_shim_plumbing(tmp_path):
    """Editing __init__.py (registration, no kernel code) or adding a file
    beside the helpers rebuilds nothing."""
    from dsv41_aot.aot.compat import compat_digest

    def edit(d):
        (d / "__init__.py").write_text((d / "__init__.py").read_text() + "\n# plumbing\n")
        (d / "NOTES.txt").write_text("not a helper\n")

    assert _digest_of_copy(tmp_path, edit) == compat_digest()


# ---------------------------------------------------------------- operand unwrapping


def test_operands_are_unwrapped_as_aiter_unwraps_them():
    """A wrapper holding the traced value as ``value`` / ``_value`` (the mono
    package's mailbox ``Addr``) reaches the ops as that value; a K2 of an
    index source depends on it (the smoke build compiles one)."""
    code = textwrap.dedent("""
        from dataclasses import dataclass
        from flydsl._mlir import ir
        from flydsl._mlir.dialects import arith
        from flydsl.compiler.jit_function import _create_mlir_context
        from dsv41_aot.aot.compat.buffer_ops import _value

        @dataclass(frozen=True)
        class Addr:  # the shape of mono/common/sync.py's Addr
            region: str
            value: object

        class Held:
            def __init__(self, v):
                self._value = v

        with _create_mlir_context(), ir.Location.unknown():
            module = ir.Module.create()
            with ir.InsertionPoint(module.body):
                i64 = ir.IntegerType.get_signless(64)
                v = arith.ConstantOp(i64, ir.IntegerAttr.get(i64, 7)).result
                assert _value(v) is v or _value(v) == v
                assert _value(Addr("krdy", v)) == v
                assert _value(Addr("krdy", Held(v))) == v
                assert _value(3) == 3  # a Python int is left for the caller
        print("ok")
    """)
    assert _run_python(code, ARCH="gfx950").strip().endswith("ok")
