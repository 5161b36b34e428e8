"""The workers' source positions (aot/flydsl_api.py read_positions_once):
FlyDSL records each op's kernel line through ``inspect.getframeinfo``, and the
compile and JIT workers read each code object's position table once instead
of walking it on every op. Its answers must be Python's own for every
instruction (the lines FlyDSL's diagnostics name), and no position may reach
what a proof compares: a JIT run whose every position is wrong agrees with a
proof vLLM's untouched JIT made on another machine."""

from __future__ import annotations

import ast
import inspect
import json
import os
import sys
import textwrap
from pathlib import Path

import pytest
from _smoke import REPO, cli, deployment

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


def test_the_two_worker_kinds_read_positions_their_own_way_and_nothing_else_does():
    """The build's compile worker and verify's JIT worker; never the runtime, the CLI or a judge."""
    package = Path(flydsl_api.__file__).parents[1]
    callers = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and "read_positions_once" in (getattr(node.func, "attr", None),
                                                                        getattr(node.func, "id", None)):
                callers.add(path.relative_to(package).as_posix())
    assert callers == {"aot/compiler.py", "aot/jit.py"}


# a K1 the gfx950 TP2 deployment carries a version 4 proof of: its code object and the digests of the JIT run's
# artifact, module and launch, made by vLLM's JIT without the table
KEY = "k1@gfx950:s=1,tp=2,r=0"


@pytest.mark.slow
def test_a_jit_run_whose_every_position_is_wrong_agrees_with_the_recorded_proof(tmp_path):
    """verify --against-jit, its JIT worker reading every position as line 7:
    the fresh proof agrees with the recorded one in every digest it carries
    (verify compares them: the "proof" check), so positions, read from a table
    or even read wrong, cannot change what a proof finds."""
    d = deployment("gfx950-tp2")
    used = tmp_path / "wrong-positions-used"
    (tmp_path / "sitecustomize.py").write_text(textwrap.dedent(f"""
        import os

        from dsv41_aot.aot import flydsl_api


        def wrong(code, index):
            if not os.path.exists({str(used)!r}):  # say it ran
                open({str(used)!r}, "w").close()
            return (7, 7, 0, 0)


        flydsl_api._code_position = wrong  # what read_positions_once puts in
    """))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO)]))
    r = cli("verify", "--dir", d, "--against-jit", "--key", KEY, "--no-cache", "--jobs", "1", "--json",
            "--no-progress", env=env)
    doc = json.loads(r.stdout)
    (rep,) = doc["reports"]
    assert r.returncode == 0 and rep["ok"], r.stdout[-3000:] + r.stderr[-3000:]
    assert {"jit", "launch", "proof"} <= set(rep["checks"]) and not rep["jit_cached"], rep
    assert used.exists()  # the JIT worker read its positions through the wrong table
