"""Shared fixtures. ``smoke_dir`` builds the matrix's smoke profile for real
(FlyDSL compile on the CPU, both arches) once per test session."""

from __future__ import annotations

import json

import pytest

from _smoke import run_cli

@pytest.fixture(scope="session")
def smoke_build(tmp_path_factory):
    """(prebuilt dir, build summary) of the smoke profile, built once."""
    # the same folder tests/_smoke.py and test_inspect.py build into: every
    # module shares this one build (a second build there compiles nothing)
    out = tmp_path_factory.getbasetemp() / "smoke-prebuilt"
    _, stdout, _ = run_cli("build", "--profile", "smoke", "--out", out, "--json", "--no-progress")
    return out, json.loads(stdout)


@pytest.fixture(scope="session")
def smoke_dir(smoke_build):
    return smoke_build[0]
