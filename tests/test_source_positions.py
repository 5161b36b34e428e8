"""The compile worker's source positions (aot/flydsl_api.py read_positions_once):
FlyDSL records each op's kernel line through ``inspect.getframeinfo``, and the
worker reads each code object's position table once instead of walking it on
every op. Its answers must be Python's own for every instruction, or the
code objects would differ from vLLM's JIT, which runs without it (the smoke
proof, tests/test_verify.py, compares the two byte for byte)."""

from __future__ import annotations

import ast
import inspect
import sys
import textwrap
from pathlib import Path

import pytest

from dsv41_aot.aot import flydsl_api

pytestmark = pytest.mark.skipif(not hasattr(inspect, "_get_code_position"), reason="Python 3.10 has no position table")
STOCK = inspect._get_code_position


def _codes(code):
    """``code`` and every code object nested in its constants."""
    yield code
    for const in code.co_consts:
        if inspect.iscode(const):
            yield from _codes(const)


def _big_code():
    """A module of one long function whose lines and columns all differ, as a kernel body's do."""
    body = "\n".join(f"    {'x' * (i % 7 + 1)} = a + {i} * (b - {i % 5})" for i in range(400))
    return compile(f"def kernel(a, b):\n{body}\n    return a\n", "<kernel>", "exec")


def test_each_instruction_s_position_is_python_s_own():
    assert STOCK is not flydsl_api._code_position  # this process is not a compile worker
    codes = [c for top in (_big_code(), flydsl_api.read_positions_once.__code__, textwrap.dedent.__code__)
             for c in _codes(top)]
    assert max(len(c.co_code) for c in codes) > 5000
    for code in codes:
        for index in (-2, -1, *range(0, len(code.co_code), 2)):
            assert flydsl_api._code_position(code, index) == STOCK(code, index), (code.co_name, index)


def test_frames_read_after_the_swap_are_read_as_before(monkeypatch):
    """``inspect.getframeinfo`` on live frames gives the same positions, filename and
    name once the worker's table is in; a Python without the table is left alone."""
    monkeypatch.setattr(inspect, "_get_code_position", STOCK)  # put back after the test

    def frames():
        f, out = sys._getframe(), []
        while f is not None:
            out.append(f)
            f = f.f_back
        return out

    live = frames()[2:]  # the test's callers: their frames stand still while it runs
    before = [inspect.getframeinfo(f, context=0) for f in live]
    assert flydsl_api.read_positions_once() is True
    assert inspect._get_code_position is flydsl_api._code_position
    after = [inspect.getframeinfo(f, context=0) for f in live]
    assert after == before and [a.positions for a in after] == [b.positions for b in before]

    monkeypatch.delattr(inspect, "_get_code_position")
    assert flydsl_api.read_positions_once() is False and not hasattr(inspect, "_get_code_position")


def test_the_table_is_bounded_and_still_right_when_it_starts_again():
    codes = [compile(f"x = {i}\ny = x * {i}\n", f"<c{i}>", "exec") for i in range(1200)]
    flydsl_api._POSITIONS.clear()
    for code in codes:
        for index in range(0, len(code.co_code), 2):
            assert flydsl_api._code_position(code, index) == STOCK(code, index)
        assert len(flydsl_api._POSITIONS) <= 512
    assert flydsl_api._POSITIONS  # it holds the latest


def test_only_the_build_s_compiler_reads_positions_its_own_way():
    """verify's JIT worker must run FlyDSL as vLLM does: a proof compares the
    build's code objects with that JIT's, so the swap stays on the build's side."""
    package = Path(flydsl_api.__file__).parents[1]
    callers = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and "read_positions_once" in (getattr(node.func, "attr", None),
                                                                        getattr(node.func, "id", None)):
                callers.add(path.relative_to(package).as_posix())
    assert callers == {"aot/compiler.py"}
