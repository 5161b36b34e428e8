"""Serving every launch vLLM runs: a key whose code object spills to scratch
is built, linked and shipped with its spill recorded (vLLM's JIT launches the
very same code object); keys that cannot run (FlyDSL refuses one, one could
never be resident) fail alone and are not compiled again; a key that is not
prebuilt names its real neighbours."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from _smoke import REPO, room, run_cli

from dsv41_aot.facts.releases import NEWEST
from dsv41_aot.manifest import LIBS_JSON
from dsv41_aot.room import Room

pytestmark = pytest.mark.slow

# measured here: vLLM 0.33.0's gfx950 TP4 FFN at 16 rows uses scratch (about
# 10 s to compile); gfx942 FFN s=33 tp=2 trips stages/moe.py's shared_units
# assert; gfx942 K2 s=17 tp=2 r=2 compiles but needs 77,056 B of LDS (64 KiB
# per CU) and 325 VGPRs: a persistent CTA that could never be resident
SPILL = "ffn@gfx950:s=16,tp=4,r=0"
REFUSED = "ffn@gfx942:s=33,tp=2,r=0"
UNRESIDENT = "k2@gfx942:s=17,tp=2,r=2"
# --jobs 1: the two gfx942 keys share a worker (a second one's start costs more CPU than it saves)
BUILD = ["build", "--key", REFUSED, UNRESIDENT, "--key", SPILL, "--any-key", "--json", "--no-progress", "--jobs", "1"]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The three keys built once, as ``--key A B --key C``: (out, exit code,
    summary, stderr)."""
    out = tmp_path_factory.mktemp("every-launch") / "pb"
    code, stdout, stderr = run_cli(*BUILD, "--out", out, check=False)
    return out, code, json.loads(stdout), stderr


def _python(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=300, env=env, cwd=REPO)


def test_keys_that_cannot_run_fail_alone_and_are_not_compiled_again(built):
    out, code, s, _ = built
    assert code == 1
    assert (s["keys"], s["compiled"] + s["cached"], s["failed"]) == (3, 1, 2)  # every key of both --key
    errors = {f["key"]: f["error"] for f in s["failures"]}
    assert "moe.py" in errors[REFUSED]
    assert UNRESIDENT in errors[UNRESIDENT] and "LDS 77056" in errors[UNRESIDENT]
    assert "65536" in errors[UNRESIDENT].replace(",", "") and "scratch" not in errors[UNRESIDENT]
    m = Room(out, "gfx942", NEWEST).manifest()
    assert list(m.entries) == [] and set(m.refused) == {REFUSED, UNRESIDENT}
    # the same source refuses them again: reported, not recompiled
    code, stdout, _ = run_cli(*BUILD, "--out", out, check=False)
    again = json.loads(stdout)
    assert code == 1 and (again["compiled"], again["up_to_date"], again["failed"], again["compile_seconds"]) == (0, 1, 2, 0)
    assert {f["key"]: f["error"] for f in again["failures"]} == errors and all(f["known"] for f in again["failures"])


def test_a_spilling_key_ships(built):
    out, _, s, stderr = built
    (spill,) = s["spills"]  # a record naming its release, as failures do
    assert (spill["key"], spill["release"]) == (SPILL, "0.33.0")
    assert spill["scratch_bytes"] > 0 and spill["vgpr_spills"] > 0 and spill["sgpr_spills"] >= 0
    warnings = [line for line in stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and warnings[0].startswith(f"warning: {SPILL} (vLLM 0.33.0) spills: scratch ")

    # the manifest keeps the spill's figures
    res = Room(out, "gfx950", NEWEST).manifest().entries[SPILL].resources
    assert res["scratch_bytes"] > 0 and res["vgpr_spill_count"] > 0
    assert f"scratch {res['scratch_bytes']} bytes per lane (VGPR spills {res['vgpr_spill_count']}" in warnings[0]
    # linked into a library the loader opens, and loadable (lazily: no GPU here)
    libs = json.loads((room(out, "gfx950") / LIBS_JSON).read_text())
    assert any(SPILL in lib["entries"] for lib in libs["libraries"])
    proc = _python(f"""
        import dsv41_aot
        launcher = dsv41_aot.load_key({SPILL!r}, prebuilt={str(out)!r})
        print(launcher.key, launcher.kernel_name)
    """)
    assert proc.returncode == 0 and proc.stdout.split()[0] == SPILL, proc.stderr

    # verify's integrity check passes it; inspect shows it and exits 0
    code, stdout, stderr = run_cli("verify", "--dir", out, "--no-progress", check=False)
    assert code == 0, stdout + stderr
    code, stdout, _ = run_cli("inspect", "--dir", out, "--json")
    doc = json.loads(stdout)
    (row,) = doc["rows"]
    assert row["key"] == SPILL and row["resident"] and row["spills"]
    assert doc["summary"][0]["spills"] == [SPILL]
    code, stdout, _ = run_cli("inspect", "--dir", out)
    assert f"spills (1): {SPILL}" in stdout and "1 symbol, 0 cannot be resident" in stdout and ", 1 spilling" in stdout

    # a rerun: up to date, still reported as spilling
    code, stdout, stderr = run_cli("build", "--key", SPILL, "--out", out, "--json", "--no-progress")
    s = json.loads(stdout)
    assert (s["up_to_date"], s["compiled"], s["spills"]) == (1, 0, [spill])
    assert sum(line.startswith("warning:") for line in stderr.splitlines()) == 1


def test_a_key_not_prebuilt_names_the_same_launch_at_the_nearest_width(smoke_dir):
    smoke = smoke_dir
    proc = _python(f"""
        import dsv41_aot
        from dsv41_aot.errors import KeyNotPrebuiltError
        try:
            dsv41_aot.load_key("k2@gfx950:s=13,tp=4,r=1", prebuilt={str(smoke)!r})
        except KeyNotPrebuiltError as e:
            print(str(e).split("closest: ")[1].splitlines()[0])
    """)
    # smoke holds k2 s=4 r=1 and s=44 r=1 i=1 at gfx950: the same launch is s=4 alone
    # (a string match offered k1 keys and the s=44 index key as well)
    assert proc.stdout.strip() == "k2@gfx950:s=4,tp=4,r=1", proc.stderr
