"""The FlyDSL releases dsv41-aot supports are data (dsv41_aot/facts/flydsl.py),
and aot/flydsl_api.py, the one module that touches FlyDSL's internals, works
under each of them: the real path (the build's compile of one key without a
launch, its export, and verify --against-jit's JIT finding the artifact in
FlyDSL's disk cache) runs under the installed FlyDSL and, in a second
environment made here, under every other supported one. This fails loudly,
naming what moved, the day a release or its internals change."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
from importlib.metadata import version
from pathlib import Path

import pytest

from dsv41_aot.aot import flydsl_api
from dsv41_aot.errors import ToolchainError
from dsv41_aot.facts.flydsl import FLYDSL, installed, supported
from dsv41_aot.facts.releases import NEWEST

REPO = Path(__file__).resolve().parents[1]
PROBE = REPO / "tests" / "_flydsl_probe.py"
KEY = "k1@gfx950:s=1,tp=2,r=0"  # the cheapest key to compile
INSTALLED = version("flydsl")
OTHERS = sorted(set(FLYDSL) - {INSTALLED})
# where a FlyDSL release may be named: its facts table (tests and docs may too)
OWNER = REPO / "dsv41_aot" / "facts" / "flydsl.py"


def _files_that_must_not_name_a_flydsl():
    for top in ("dsv41_aot", "ci", "bench", ".github"):
        for p in sorted((REPO / top).rglob("*")):
            if p.is_file() and p != OWNER and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".o", ".so"):
                yield p
    yield REPO / "setup.py"


def test_no_flydsl_version_is_written_outside_the_facts_table():
    names = [re.compile(rf"(?<![\w.]){re.escape(v)}(?![\w.])") for v in FLYDSL]
    names.append(re.compile(r"flydsl\s*(==|>=|<=|~=|!=)\s*\d", re.IGNORECASE))
    found = []
    for p in _files_that_must_not_name_a_flydsl():
        text = p.read_text(errors="replace")
        for n, line in enumerate(text.splitlines(), 1):
            if any(r.search(line) for r in names):
                found.append(f"{p.relative_to(REPO)}:{n}: {line.strip()}")
    assert not found, "name FlyDSL releases only in dsv41_aot/facts/flydsl.py (read it from there):\n" + "\n".join(found)


def test_the_build_extra_pins_a_supported_flydsl_and_bootstrap_installed_it():
    text = (REPO / "pyproject.toml").read_text()
    pins = re.findall(r'"flydsl==([^"]+)"', text)
    assert len(pins) == 1, f"pyproject.toml pins FlyDSL {pins}: the build extra pins exactly one"
    assert pins[0] in FLYDSL, f"pyproject.toml builds with FlyDSL {pins[0]}, which facts/flydsl.py does not support"
    assert INSTALLED == pins[0], "ci/bootstrap.sh installs the build extra's FlyDSL"
    assert installed().version == INSTALLED


@pytest.mark.parametrize("have", ["0.3.9", "0.4.20", "0.5.0rc1"])
def test_a_flydsl_not_in_the_table_is_refused_naming_the_supported_ones(monkeypatch, have):
    """A release is supported by its whole version: one that only starts like
    a supported one (a later patch, a release candidate) is refused too (S04)."""
    import importlib.metadata

    monkeypatch.setattr(importlib.metadata, "version", lambda name: have if name == "flydsl" else version(name))
    with pytest.raises(ToolchainError) as e:
        installed().version
    msg = str(e.value)
    assert e.value.exit_code == 2 and f"FlyDSL {have} is installed" in msg and f"FlyDSL {supported()}" in msg, msg
    assert all(f"pip install flydsl=={v}" in e.value.fix for v in FLYDSL), e.value.fix


def test_every_release_names_its_disk_artifact_in_a_way_flydsl_api_knows():
    assert {r.disk_name for r in FLYDSL.values()} <= set(flydsl_api.DISK_NAMES)
    assert all(r.version == v for v, r in FLYDSL.items())


def test_disk_cache_switch_is_the_one_worker_env_sets():
    from flydsl.utils.env import RuntimeEnvManager

    assert RuntimeEnvManager.options["enable_cache"].env_var == "FLYDSL_RUNTIME_ENABLE_CACHE"
    assert RuntimeEnvManager.options["cache_dir"].env_var == "FLYDSL_RUNTIME_CACHE_DIR"


# ---------------------------------------------------------------- the real path, under every supported FlyDSL


def _real_path(python: str, tmp_path: Path, want: str) -> None:
    """Compile KEY and JIT it under the FlyDSL ``python`` imports (two
    processes at once, as a build and a verify are separate): both name
    ``want``, the export holds the code object the build recorded, and the
    JIT found its artifact in its disk cache and built the same code object."""
    procs = {}
    for what in ("compile", "jit"):
        out = tmp_path / what
        out.mkdir()
        procs[what] = subprocess.Popen([python, str(PROBE), what, KEY, str(out)], stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True, cwd=REPO)
    got = {}
    for what, p in procs.items():
        stdout, stderr = p.communicate(timeout=600)
        assert p.returncode == 0, f"FlyDSL {want}: the {what} path failed (aot/flydsl_api.py):\n{stderr[-3000:]}"
        got[what] = json.loads(stdout.strip().splitlines()[-1])
    c, j = got["compile"], got["jit"]
    assert c["flydsl"] == j["flydsl"] == want
    assert c["toolchain_flydsl"] == c["identity_flydsl"] == c["export_meta_flydsl"] == want, c
    assert c["code_object_sha256"] == c["export_code_sha256"], "the manifest entry misstates the exported code object"
    assert j["identity_flydsl"] == want
    assert len(j["artifacts"]) == 1, f"FlyDSL {want}'s JIT wrote {j['artifacts']} to its disk cache"
    pkl = next((tmp_path / "jit" / "flydsl-cache").rglob("*.pkl"))
    import hashlib

    assert hashlib.sha256(pkl.read_bytes()).hexdigest() == j["evidence"]["artifact_sha256"], "the artifact found is not the one on disk"
    assert j["code_object_sha256"] == c["code_object_sha256"], "the JIT's code object is not the one the build exports"
    assert j["params"][-1] == ["stream", "Stream"] and len(j["params"]) > 1


@pytest.mark.slow
def test_the_real_path_under_the_installed_flydsl(tmp_path):
    _real_path(sys.executable, tmp_path, INSTALLED)


@pytest.mark.slow
@pytest.mark.parametrize("other", OTHERS)
def test_the_real_path_under_another_supported_flydsl(flydsl_python, tmp_path, other):
    py = flydsl_python(other)
    where = subprocess.run([py, "-c", "import flydsl, importlib.metadata as m; print(flydsl.__file__, m.version('flydsl'))"],
                           capture_output=True, text=True, check=True, cwd=os.path.dirname(py)).stdout.split()
    assert where[1] == other and not where[0].startswith(sysconfig.get_paths()["purelib"]), where
    _real_path(py, tmp_path, other)


# ---------------------------------------------------------------- proofs under another FlyDSL


def _verify(python: str, *args) -> dict:
    r = subprocess.run([python, "-m", "dsv41_aot.cli", "verify", *map(str, args), "--json", "--no-progress"],
                       capture_output=True, text=True, cwd=REPO, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(r.stdout)


@pytest.mark.slow
@pytest.mark.parametrize("other", OTHERS)
def test_verify_under_another_flydsl_adds_its_proof_and_rebuilds_nothing(smoke_dir, flydsl_python, tmp_path, other):
    """The smoke build (built under the installed FlyDSL) proven by vLLM's JIT
    under another supported FlyDSL, one key: the room's proof gains that
    FlyDSL's, proven (not stale), and keeps the installed one's; no object,
    manifest or band changes; verify counts the keys proven under each."""
    from _smoke import copy_of

    d = copy_of(smoke_dir, tmp_path / "p")
    key = "k1@gfx950:s=4,tp=4,r=1"  # the cheapest smoke key to JIT-build

    def served():
        return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*"))
                if p.is_file() and p.name not in ("verified.json", "timings.json") and not p.name.startswith(".")}

    # the room's proof under the installed FlyDSL, as a verify --record under it leaves one (made-up evidence:
    # tests/test_proofs.py proves the recording itself)
    from dsv41_aot.aot.jit import write_verified
    from dsv41_aot.room import Room
    from dsv41_aot.proof import Evidence, KeyProof

    man = Room(d, "gfx950", NEWEST).manifest()
    e = man.entries[key]
    jit = {"release": NEWEST, "vllm_version": e.source.vllm_version, "mono_sources": e.source.mono_sources,
           "flydsl_version": INSTALLED}
    write_verified(man, [KeyProof(key, e.code_object_sha256, jit, Evidence("1" * 64, "2" * 64, "2026-01-02T03:04:05Z"))])
    before = served()
    _verify(flydsl_python(other), "--dir", d, "--against-jit", "--record", "--key", key)
    assert served() == before, "a proof under another FlyDSL rebuilt or relinked something"
    out = _verify(sys.executable, "--dir", d)
    (room,) = [p for p in out["proofs"] if (p["arch"], p["release"]) == ("gfx950", NEWEST)]
    assert room["by_flydsl"] == {INSTALLED: 1, other: 1} and room["proven"] == 1 and room["stale"] == 0, room
    text = subprocess.run([sys.executable, "-m", "dsv41_aot.cli", "verify", "--dir", d], capture_output=True, text=True,
                          cwd=REPO).stdout
    assert f"proven under FlyDSL {INSTALLED}: 1, {other}: 1" in text, text


def test_the_build_cache_identity_covers_the_flydsl_internals_module():
    """A change to aot/flydsl_api.py changes what a compile or a JIT run
    produces, so it is part of the build cache's code identity."""
    from dsv41_aot.aot import cache

    covered = {p.resolve() for pattern in cache.CODE for p in cache.PACKAGE.glob(pattern)}
    assert Path(flydsl_api.__file__).resolve() in covered and OWNER.resolve() in covered
