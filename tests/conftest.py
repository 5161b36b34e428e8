"""Shared fixtures. ``smoke_dir`` builds the matrix's smoke profile for real
(FlyDSL compile on the CPU, both arches) once per test session."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run_cli(*args, check=True, env=None, timeout=1800):
    """``dsv41-aot ARGS`` in a subprocess: (exit code, stdout, stderr)."""
    proc = subprocess.run(
        [sys.executable, "-m", "dsv41_aot.cli", *map(str, args)],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"dsv41-aot {' '.join(map(str, args))} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc.returncode, proc.stdout, proc.stderr


@pytest.fixture(scope="session")
def smoke_build(tmp_path_factory):
    """(prebuilt dir, build summary) of the smoke profile, built once."""
    out = tmp_path_factory.mktemp("prebuilt") / "kernels_prebuilt"
    _, stdout, _ = run_cli("build", "--profile", "smoke", "--out", out, "--json", "--no-progress")
    return out, json.loads(stdout)


@pytest.fixture(scope="session")
def smoke_dir(smoke_build):
    return smoke_build[0]
