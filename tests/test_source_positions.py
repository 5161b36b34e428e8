"""The workers' frame lookups (aot/flydsl_api.py cache_frame_lookups): FlyDSL
records each op's kernel lines through ``inspect.getframeinfo``, and the
compile and JIT workers read each code object's position table once instead
of walking it on every op, and find each source file on disk once instead of
on every op. The answers must be Python's own (for every instruction: the
lines FlyDSL's diagnostics name), and no position may reach what a proof
compares: a JIT run whose every position is wrong agrees with a proof vLLM's
untouched JIT made on another machine."""

from __future__ import annotations

import ast
import inspect
import json
import linecache
import os
import sys
import textwrap
from pathlib import Path

import pytest
from _smoke import REPO, cli, deployment

from dsv41_aot.aot import flydsl_api

pytestmark = pytest.mark.skipif(not hasattr(inspect, "_get_code_position"), reason="Python 3.10 has no position table")
STOCK = inspect._get_code_position
STOCK_SOURCEFILE = inspect.getsourcefile


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
    codes = [c for top in (_big_code(), flydsl_api.cache_frame_lookups.__code__, textwrap.dedent.__code__)
             for c in _codes(top)]
    assert max(len(c.co_code) for c in codes) > 5000
    for code in codes:
        for index in (-2, -1, *range(0, len(code.co_code), 2)):
            assert flydsl_api._code_position(code, index) == STOCK(code, index), (code.co_name, index)


def test_frames_read_after_the_swap_are_read_as_before(monkeypatch):
    """``inspect.getframeinfo`` on live frames gives the same positions, filename and
    name once the worker's tables are in; a Python without the position table
    keeps its own."""
    monkeypatch.setattr(inspect, "_get_code_position", STOCK)  # put back after the test
    monkeypatch.setattr(inspect, "getsourcefile", STOCK_SOURCEFILE)

    def frames():
        f, out = sys._getframe(), []
        while f is not None:
            out.append(f)
            f = f.f_back
        return out

    live = frames()[2:]  # the test's callers: their frames stand still while it runs
    before = [inspect.getframeinfo(f, context=0) for f in live]
    assert flydsl_api.cache_frame_lookups() is True
    assert inspect._get_code_position is flydsl_api._code_position
    assert inspect.getsourcefile is flydsl_api._source_file
    after = [inspect.getframeinfo(f, context=0) for f in live]
    assert after == before and [a.positions for a in after] == [b.positions for b in before]
    assert [a.filename for a in after] == [f.f_code.co_filename for f in live]  # each found on disk

    monkeypatch.delattr(inspect, "_get_code_position")
    assert flydsl_api.cache_frame_lookups() is False and not hasattr(inspect, "_get_code_position")


def test_the_table_is_bounded_and_still_right_when_it_starts_again():
    codes = [compile(f"x = {i}\ny = x * {i}\n", f"<c{i}>", "exec") for i in range(1200)]
    flydsl_api._POSITIONS.clear()
    for code in codes:
        for index in range(0, len(code.co_code), 2):
            assert flydsl_api._code_position(code, index) == STOCK(code, index)
        assert len(flydsl_api._POSITIONS) <= 512
    assert flydsl_api._POSITIONS  # it holds the latest


_BODY = "import sys\nframe = sys._getframe()\n"  # a module body that keeps its own frame


def _frame_of(filename: str):
    """A live frame of ``_BODY`` compiled under ``filename`` (on disk or not)."""
    scope: dict = {}
    exec(compile(_BODY, filename, "exec"), scope)
    return scope["frame"]


def test_a_frame_s_source_file_is_found_once_and_answered_as_python_does(tmp_path, monkeypatch):
    """A frame of a file on disk is answered from the set after its first lookup;
    a frame of code made from a string, and anything not a frame, get Python's
    own answer every time, as do frames of a file first looked up while absent."""
    monkeypatch.setattr(flydsl_api, "_SOURCE_FILES", set())
    kernel = tmp_path / "kernel.py"
    kernel.write_text(_BODY)
    on_disk, from_string, absent = _frame_of(str(kernel)), _frame_of("<kernel>"), _frame_of(str(tmp_path / "later.py"))
    objects = [on_disk, from_string, absent, textwrap.dedent, textwrap, sys._getframe()]
    before = [STOCK_SOURCEFILE(o) for o in objects]
    assert before[:3] == [str(kernel), None, None]
    assert [flydsl_api._source_file(o) for o in objects] == before
    assert flydsl_api._SOURCE_FILES == {str(kernel), __file__}

    asked = []
    real_exists = os.path.exists
    monkeypatch.setattr(os.path, "exists", lambda p: asked.append(str(p)) or real_exists(p))
    assert [flydsl_api._source_file(o) for o in objects] == before
    assert str(kernel) not in asked and __file__ not in asked  # found once: the disk is not asked again
    assert str(tmp_path / "later.py") in asked  # not found: asked every time, so a file that appears is seen
    (tmp_path / "later.py").write_text("")
    assert flydsl_api._source_file(absent) == STOCK_SOURCEFILE(absent) == str(tmp_path / "later.py")

    # a file not on disk that Python still answers with (its lines are in linecache) is never remembered:
    # once linecache lets it go, Python's answer is None, and so is this one
    held = str(tmp_path / "held.py")
    monkeypatch.setitem(linecache.cache, held, (1, None, ["x = 1\n"], held))
    frame = _frame_of(held)
    assert flydsl_api._source_file(frame) == STOCK_SOURCEFILE(frame) == held
    del linecache.cache[held]
    assert flydsl_api._source_file(frame) is STOCK_SOURCEFILE(frame) is None


def test_the_two_worker_kinds_cache_frame_lookups_and_nothing_else_does():
    """The build's compile worker and verify's JIT worker; never the runtime, the CLI or a judge."""
    package = Path(flydsl_api.__file__).parents[1]
    callers = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and "cache_frame_lookups" in (getattr(node.func, "attr", None),
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


        flydsl_api._code_position = wrong  # what cache_frame_lookups puts in
    """))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO)]))
    r = cli("verify", "--dir", d, "--against-jit", "--key", KEY, "--no-cache", "--jobs", "1", "--json",
            "--no-progress", env=env)
    doc = json.loads(r.stdout)
    (rep,) = doc["reports"]
    assert r.returncode == 0 and rep["ok"], r.stdout[-3000:] + r.stderr[-3000:]
    assert {"jit", "launch", "proof"} <= set(rep["checks"]) and not rep["jit_cached"], rep
    assert used.exists()  # the JIT worker read its positions through the wrong table
