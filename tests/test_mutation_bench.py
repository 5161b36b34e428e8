"""The mutation bench's list of equivalent mutants (pyproject.toml's
``[[tool.dsv41-aot.mutation.equivalent]]``): each entry names code that is
still there, with its reason, and a survivor is taken for one only by its
file and its change, never by its line number (docs/mutation.md)."""

from __future__ import annotations

import importlib.util
import tomllib

import pytest
from _smoke import REPO

EQUIVALENT = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["dsv41-aot"]["mutation"]["equivalent"]


def bench():
    spec = importlib.util.spec_from_file_location("mutants_bench", REPO / "bench" / "mutants.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("entry", EQUIVALENT, ids=lambda e: f"{e['file']}: {e['change'][:48]}")
def test_each_named_equivalent_is_code_still_there(entry):
    """An entry whose old line is gone (the code changed) would excuse nothing
    or, worse, a new mutant that only reads like it: it must go or be
    written again from the bench's report."""
    old, new = entry["change"].split("  ->  ")
    assert old != new and entry["why"].strip()
    lines = {line.strip() for line in (REPO / entry["file"]).read_text().splitlines()}
    gone = [line for line in old.split(" / ") if line not in lines]
    assert not gone, f"{entry['file']} no longer has {gone}: update or drop its entry in pyproject.toml"


def test_a_survivor_is_equivalent_only_by_its_file_and_its_change():
    known = bench().known_equivalent
    e = EQUIVALENT[0]
    assert known(EQUIVALENT, f"{e['file']}:1", e["change"]) == e["why"]
    assert known(EQUIVALENT, f"{e['file']}:999", e["change"]) == e["why"]  # the line moved: the same mutant
    assert known(EQUIVALENT, f"{e['file']}x:1", e["change"]) is None
    assert known(EQUIVALENT, f"{e['file']}:1", e["change"].replace("->", "=>")) is None
    assert known([], f"{e['file']}:1", e["change"]) is None
