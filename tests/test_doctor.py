"""dsv41-aot doctor: will this serving host get prebuilt kernels, and if not,
why. Run as a user runs it (a subprocess: DSV41_AOT_PREBUILT names the
installed prebuilt dir, DSV41_AOT_ARCH=gfx950, this machine's HIP 5.2
accepted by conftest's DSV41_AOT_ALLOW_HIP_VERSION), against a copy of the
shared full deployment (gfx950 TP4: every launch covered) and of the smoke
build (almost nothing of a real deployment)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
from _smoke import cli, copy_of

from dsv41_aot.deployment import deployment, required
from dsv41_aot.facts.arches import ARCHES
from dsv41_aot.room import Room

SHARED_FULL = Path("/work/shared/prebuilt-gfx950-tp4")
TP4 = 768  # vLLM 0.33.0 gfx950 TP4, no draft: K1 480, K2 240, FFN 48
TP4_DRAFT = 912  # with the DSpark draft (128, 3, 192): its own runner's K1 + K2


@pytest.fixture(scope="module")
def full(tmp_path_factory) -> Path:
    """A writable copy of the shared full deployment (no objects/: a wheel's rooms)."""
    if not (SHARED_FULL / "gfx950").is_dir():
        pytest.skip(f"{SHARED_FULL} is not on this machine")
    out = tmp_path_factory.mktemp("doctor") / "full"
    shutil.copytree(SHARED_FULL, out)
    for p in [out, *out.rglob("*")]:
        p.chmod(p.stat().st_mode | stat.S_IWUSR)
    return out


def doctor(prebuilt: Path, *args, env: dict | None = None, drop=()) -> subprocess.CompletedProcess:
    """``dsv41-aot doctor ARGS`` with ``prebuilt`` installed on gfx950, none
    of the plugin's or vLLM's variables set but ``env``, the ``drop`` ones unset."""
    e = {k: v for k, v in os.environ.items() if k not in (
        "DSV41_AOT_DISABLE", "DSV41_AOT_MODE", "VLLM_PLUGINS", "ARCH", "DSV41_AOT_ALLOW_SOURCE_MISMATCH")}
    e.update(DSV41_AOT_PREBUILT=str(prebuilt), DSV41_AOT_ARCH="gfx950")
    e.update(env or {})
    for name in drop:
        e.pop(name, None)
    return cli("doctor", *args, env=e)


def lines(r, status: str, check: str) -> list[str]:
    return [ln for ln in r.stdout.splitlines() if ln.startswith(f"{status:5} {check} ")]


# ---------------------------------------------------------------- verdicts


def test_the_full_deployment_serves_every_launch_exit_0(full):
    r = doctor(full, "--tp", 4)
    assert r.returncode == 0, r.stdout + r.stderr
    for check in ("vllm", "arch", "hip", "plugin", "room", "bands", "coverage"):
        assert lines(r, "ok", check), (check, r.stdout)
    assert "FAIL" not in r.stdout
    assert f"all {TP4} launches vLLM can ask for are prebuilt (K1 480, K2 240, FFN 48)" in r.stdout
    assert "vLLM 0.33.0's room" in r.stdout and "mono sources 6d37d13d1b3c9e47" in r.stdout
    assert "accepted by DSV41_AOT_ALLOW_HIP_VERSION=5.2" in r.stdout
    assert "no GPU device visible to HIP" in r.stdout  # said, and the checks carry on
    assert "mode strict" in r.stdout and r.stdout.rstrip().splitlines()[-1].startswith("verdict: this host gets")
    # the same rules coverage uses: its verdict on the room of the running release agrees
    cov = cli("coverage", "--arch", "gfx950", "--tp", 4, "--release", "0.33.0", "--dir", full)
    assert cov.returncode == 0
    r = doctor(full, "--tp", 4, "--draft", "128,3,192")
    assert r.returncode == 0 and f"all {TP4_DRAFT} launches" in r.stdout and "draft e=128 k=3 w=192" in r.stdout


def test_another_tp_is_not_prebuilt_exit_1_with_the_count_and_the_fix(full):
    r = doctor(full, "--tp", 2, "--json")
    doc = json.loads(r.stdout)
    need = [str(k) for k in required(deployment("gfx950", 2, release="0.33.0"))]
    assert r.returncode == 1 and doc["exit_code"] == 1
    assert doc["keys"] == len(need) and doc["ok"] == 0 and doc["coverage"]["missing"] == need
    assert [f["key"] for f in doc["failures"]] == need
    fix = doc["failures"][0]["fix"]
    # a wheel's room (no objects/): build elsewhere and point the loader there; strict says how to JIT meanwhile
    assert "dsv41-aot build --release 0.33.0 --arch gfx950 --profile full --out DIR" in fix
    assert "DSV41_AOT_PREBUILT=DIR" in fix and "DSV41_AOT_MODE=fallback" in fix
    assert cli("coverage", "--arch", "gfx950", "--tp", 2, "--release", "0.33.0", "--dir", full).returncode == 1


def test_the_smoke_build_exit_1_names_what_will_jit(smoke_dir, tmp_path):
    d = copy_of(smoke_dir, tmp_path / "smoke")
    r = doctor(d, "--tp", 4, "--json")
    doc = json.loads(r.stdout)
    cov = json.loads(cli("coverage", "--arch", "gfx950", "--tp", 4, "--release", "0.33.0", "--dir", d,
                         "--json").stdout)["reports"][0]
    assert r.returncode == 1 and doc["keys"] == TP4 == len(cov["required"])
    assert doc["coverage"]["missing"] == cov["missing"] and doc["ok"] == TP4 - len(cov["missing"]) > 0
    text = doctor(d, "--tp", 4)
    (line,) = lines(text, "FAIL", "coverage")
    assert f"{TP4 - len(cov['missing'])} of {TP4} launches prebuilt" in line
    assert f"{len(cov['missing'])} not prebuilt" in line and cov["missing"][0] in line
    # a room built here (objects/): the fix builds into the same directory
    assert f"fix: dsv41-aot build --release 0.33.0 --arch gfx950 --profile full --out {d}" in text.stdout
    assert text.returncode == 1


def test_a_corrupt_band_exit_1_names_the_band_and_the_fix(full, tmp_path):
    d = copy_of(full, tmp_path / "pb")
    room = Room(d, "gfx950", "0.33.0")
    band = room.links().bands[0]
    path = room.lib / band.file
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    r = doctor(d, "--tp", 4)
    assert r.returncode == 1
    (fail,) = lines(r, "FAIL", "bands")
    assert band.file in fail and "sha256" in fail
    assert f"fix: {room.fix_restore}" in r.stdout and f"copy {d} again" in r.stdout  # a copied wheel's room
    # the keys of that band are refused, the rest served; nothing was bound
    (cov,) = lines(r, "FAIL", "coverage")
    ours = sum(1 for k in band.entries if k in set(map(str, required(deployment("gfx950", 4, release="0.33.0")))))
    assert f"{TP4 - ours} of {TP4} launches prebuilt" in cov and f"{ours} refused" in cov
    doc = json.loads(doctor(d, "--tp", 4, "--json").stdout)
    assert doc["bands"]["problems"][0]["file"].endswith(band.file) and len(doc["coverage"]["refused"]) == ours


def test_without_the_hip_allowance_this_machines_hip_is_refused(full):
    r = doctor(full, "--tp", 4, drop=("DSV41_AOT_ALLOW_HIP_VERSION",))
    assert r.returncode == 1
    (fail,) = lines(r, "FAIL", "hip")
    assert "HIP 5.2" in fail and "fix: " in r.stdout and "DSV41_AOT_ALLOW_HIP_VERSION=5.2" in r.stdout
    assert lines(r, "ok", "coverage")  # the other checks still ran


# ---------------------------------------------------------------- the plugin, the arch, the room


def test_the_plugin_mode_and_what_stops_vllm_calling_it(full):
    r = doctor(full, "--tp", 2, env={"DSV41_AOT_MODE": "fallback"})
    assert lines(r, "ok", "plugin") and "mode fallback" in r.stdout
    assert "vLLM JIT-compiles them (fallback)" in r.stdout and "meanwhile" not in r.stdout
    r = doctor(full, env={"DSV41_AOT_DISABLE": "1"})
    assert r.returncode == 1 and "disabled by DSV41_AOT_DISABLE=1" in r.stdout and "fix: unset DSV41_AOT_DISABLE" in r.stdout
    r = doctor(full, env={"VLLM_PLUGINS": "someone_else"})
    assert r.returncode == 1 and "fix: VLLM_PLUGINS=someone_else,dsv41_aot" in r.stdout
    r = doctor(full, env={"DSV41_AOT_MODE": "lenient"})
    assert r.returncode == 2 and "DSV41_AOT_MODE='lenient' is not one of strict, fallback: served as strict" in r.stdout
    assert lines(r, "ok", "plugin") and "mode strict" in r.stdout  # a typo never turns the plugin off
    r = doctor(full)  # no deployment: the room and its bands decide
    assert r.returncode == 0 and "add --tp N" in r.stdout


@pytest.mark.faults
@pytest.mark.parametrize("var,value,read", [
    ("DSV41_AOT_MODE", "STRICT", "mode strict"), ("DSV41_AOT_MODE", " Fallback ", "mode fallback"),
    ("DSV41_AOT_DISABLE", "false", "mode strict"), ("DSV41_AOT_DISABLE", " 0", "mode strict"),
    ("DSV41_AOT_DISABLE", "no", "mode strict"), ("DSV41_AOT_DISABLE", "TRUE", "disabled by"),
    ("DSV41_AOT_ARCH", "GFX950", "gfx950 (MI355X"), ("DSV41_AOT_ARCH", " " + ARCHES["gfx950"].gcn_arch_name, "gfx950 (MI355X"),
])
def test_the_plugins_variables_read_one_way_everywhere(full, var, value, read):
    """P9 of the fault report at 24a0152: case and spaces do not matter, a
    boolean reads as a boolean, and an arch as ROCm spells it is normalized."""
    r = doctor(full, env={var: value})
    assert read in r.stdout and "BAD" not in r.stdout, r.stdout
    assert r.returncode == (1 if read == "disabled by" else 0), r.stdout


@pytest.mark.faults
@pytest.mark.parametrize("var,value", [("DSV41_AOT_MODE", "weird"), ("DSV41_AOT_DISABLE", "maybe"),
                                       ("DSV41_AOT_ALLOW_SOURCE_MISMATCH", "perhaps"), ("DSV41_AOT_ARCH", "gfx999"),
                                       ("DSV41_AOT_ARCH", "../x")])
def test_a_variable_the_plugin_cannot_read_is_bad_input(full, var, value):
    r = doctor(full, "--json", env={var: value})
    doc = json.loads(r.stdout)
    assert r.returncode == 2 and doc["exit_code"] == 2
    assert any(f"{var}={value!r}" in f["error"] for f in doc["failures"]), doc["failures"]


def test_an_arch_the_runner_does_not_compile_for_or_none_at_all(full):
    r = doctor(full, "--tp", 4, env={"ARCH": "gfx942"})
    assert r.returncode == 1 and "ARCH=gfx942" in r.stdout and "fix: unset ARCH, or set ARCH=gfx950" in r.stdout
    from dsv41_aot.runtime import vllm_plugin

    if vllm_plugin.kfd_arches():
        pytest.skip("this machine has a GPU: its arch is found")
    r = doctor(full, "--tp", 4, drop=("DSV41_AOT_ARCH",))
    assert r.returncode == 1 and "fix: run on the serving host, or name its arch: DSV41_AOT_ARCH=gfx950" in r.stdout
    assert "not counted, the arch is unknown" in r.stdout


def test_no_room_for_the_running_vllm(full, tmp_path):
    d = copy_of(full, tmp_path / "old-only")
    shutil.rmtree(d / "gfx950" / "vllm-0.33.0")
    r = doctor(d, "--tp", 4)
    assert r.returncode == 1
    (fail,) = lines(r, "FAIL", "room")
    assert "matches no prebuilt release" in fail and "vLLM 0.32.0" in fail
    assert "fix: install one of those vLLM releases" in r.stdout
    assert f"0 of {TP4} launches prebuilt" in r.stdout  # counted by the running release's rules


def test_in_process_no_vllm_and_no_entry_point(full, fresh, monkeypatch):
    import importlib.metadata

    from dsv41_aot.runtime import doctor as dr
    from dsv41_aot.runtime import host, rooms

    monkeypatch.setenv("DSV41_AOT_PREBUILT", str(full))
    monkeypatch.setenv("DSV41_AOT_ARCH", "gfx950")
    for name in ("DSV41_AOT_DISABLE", "DSV41_AOT_MODE", "VLLM_PLUGINS", "ARCH"):
        monkeypatch.delenv(name, raising=False)
    for module in (host, rooms):  # rooms.release_of holds its own reference
        monkeypatch.setattr(module, "installed_vllm", lambda: (None, None, None))
    real = importlib.metadata.entry_points
    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda **kw: [] if kw.get("group") == dr.ENTRY_GROUP else real(**kw))
    rep = dr.diagnose(4)
    by = {c.name: c for c in rep.checks}
    assert by["vllm"].status == "fail" and by["vllm"].fix == 'pip install "dsv41-aot[vllm]"'
    assert by["plugin"].status == "fail" and by["plugin"].fix == dr.FIX_PLUGIN
    # the loader's pick without vLLM: the newest room, still checked and counted
    assert by["room"].status == "info" and by["bands"].status == "ok" and by["coverage"].status == "ok"
    assert rep.exit_code == 1


# ---------------------------------------------------------------- bad input, --json, the border


@pytest.mark.parametrize("args, words", [
    (["--tp", 3], "no vLLM release's mono path runs TP 3"),
    (["--tp", 4, "--draft", "128,3"], "experts,topk,swa_width"),
    (["--tp", 4, "--max-rows", 0], "at least one row"),
    (["--draft", "128,3,192"], "name its TP size too"),
])
def test_bad_input_exit_2(full, args, words):
    r = doctor(full, *args)
    assert r.returncode == 2 and words in r.stderr and "fix:" in r.stderr
    r = doctor(full, *args, "--json")
    doc = json.loads(r.stdout)
    assert r.returncode == 2 and doc["exit_code"] == 2 and words in doc["error"] and doc["fix"]


def test_a_draft_doctor_refuses_gets_a_fix_doctor_takes(full):
    r = doctor(full, "--tp", 4, "--draft", "0,0,0")
    assert r.returncode == 2 and "three positive integers" in r.stderr
    fix = r.stderr.split("fix: ", 1)[1].split()[:2]
    assert fix[0] == "--draft" and doctor(full, "--tp", 4, *fix).returncode in (0, 1)  # a verdict, not bad input


def test_a_prebuilt_variable_naming_a_file_is_bad_input(tmp_path):
    (tmp_path / "file").write_text("not a folder\n")
    r = doctor(tmp_path / "file")
    assert r.returncode == 2 and "DSV41_AOT_PREBUILT" in r.stderr and "not a folder" in r.stderr, r.stdout + r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.faults
def test_a_tp_the_hosts_arch_does_not_run_is_bad_input(full):
    r = doctor(full, "--tp", 2, env={"DSV41_AOT_ARCH": "gfx942"})
    assert r.returncode == 2 and "gfx942 takes tensor parallel size 4" in r.stderr
    # the fix names the host's arch's TP, not another arch's (N9 of the fault report at 24a0152), and works
    fix = r.stderr.split("fix: ", 1)[1]
    assert fix.startswith("pass --tp 4 ") and "gfx950" not in fix.split("(")[0], fix
    assert doctor(full, "--tp", 4, env={"DSV41_AOT_ARCH": "gfx942"}).returncode in (0, 1)  # a verdict, not bad input


def test_json_is_one_document(full):
    r = doctor(full, "--tp", 4, "--json")
    doc = json.loads(r.stdout)  # the whole of stdout
    assert r.returncode == 0 and doc["command"] == "doctor" and doc["exit_code"] == 0
    assert doc["keys"] == doc["ok"] == TP4 and doc["failed"] == 0 and doc["failures"] == []
    assert [c["check"] for c in doc["checks"]] == ["vllm", "arch", "hip", "device", "plugin", "room", "bands",
                                                  "flydsl", "coverage"]
    # the host's FlyDSL, and how many keys of the room are proven under it
    fly = doc["flydsl"]
    assert fly["version"] == version("flydsl") and fly["keys"] == doc["room"]["keys"]
    assert fly["proven"] == fly["by_flydsl"].get(fly["version"], 0)
    assert doc["vllm"]["version"] == "0.33.0" and doc["arch"] == {"arch": "gfx950", "from": "DSV41_AOT_ARCH"}
    assert doc["plugin"]["mode"] == "strict" and doc["room"]["release"] == "0.33.0"
    assert doc["hip"]["version"] == "5.2" and doc["hip"]["devices"] == 0 and doc["bands"]["checked"] == 6


def test_doctor_imports_nothing_heavy(full):
    code = ("import contextlib, io, sys\nfrom dsv41_aot.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n    rc = main(['doctor', '--tp', '4'])\n"
            "print(rc, sorted({m.split('.')[0] for m in sys.modules} & {'yaml', 'flydsl', 'torch', 'vllm', "
            "'numpy', 'tqdm', 'msgpack'}))")
    env = dict(os.environ, DSV41_AOT_PREBUILT=str(full), DSV41_AOT_ARCH="gfx950")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    assert r.stdout.split("\n")[0] == "0 []", r.stdout + r.stderr


def _sources_edited(full: Path, monkeypatch) -> None:
    """This process serves ``full`` on gfx950, none of the plugin's variables
    set, and its vLLM 0.33.0's mono sources edited: no room matches them."""
    from dsv41_aot.runtime import host, rooms

    monkeypatch.setenv("DSV41_AOT_PREBUILT", str(full))
    monkeypatch.setenv("DSV41_AOT_ARCH", "gfx950")
    for name in ("DSV41_AOT_DISABLE", "DSV41_AOT_MODE", "VLLM_PLUGINS", "ARCH"):
        monkeypatch.delenv(name, raising=False)
    _, src, mono = host.installed_vllm()
    for module in (host, rooms):
        monkeypatch.setattr(module, "installed_vllm", lambda: ("0" * 16, src, mono))


def test_in_process_sources_accepted_by_the_allowance_warn(full, fresh, monkeypatch):
    from dsv41_aot.runtime import doctor as dr
    from dsv41_aot.runtime import rooms

    _sources_edited(full, monkeypatch)
    by = {c.name: c for c in dr.diagnose().checks}
    assert by["room"].status == "fail" and "matches no prebuilt release" in by["room"].text
    assert "DSV41_AOT_ALLOW_SOURCE_MISMATCH=1" in by["room"].fix
    from dsv41_aot.runtime import decision

    with rooms.state.fresh():  # the environment the plugin is given, not this process's, holds the allowance
        d = decision.decide(dict(os.environ, DSV41_AOT_ALLOW_SOURCE_MISMATCH="1"))
    assert d.serve and d.warning and "with DSV41_AOT_ALLOW_SOURCE_MISMATCH=1" in d.why, d
    monkeypatch.setenv("DSV41_AOT_ALLOW_SOURCE_MISMATCH", "1")
    with rooms.state.fresh():  # the room picked above is forgotten
        rep = dr.diagnose(4)
    by = {c.name: c for c in rep.checks}
    assert by["room"].status == "warn" and "only because DSV41_AOT_ALLOW_SOURCE_MISMATCH=1" in by["room"].text
    assert by["room"].fix == "install the vLLM they were built from: pip install --no-deps vllm==0.33.0"
    assert by["coverage"].status == "ok" and rep.exit_code == 0  # served, with a warning


@pytest.mark.faults
def test_a_boolean_the_plugin_cannot_read_keeps_every_check(full, fresh, monkeypatch):
    """DSV41_AOT_DISABLE=maybe does not disable and DSV41_AOT_ALLOW_SOURCE_MISMATCH=perhaps
    does not allow (S08): each reads as unset, the reading that keeps every
    check, and is reported as bad input (exit 2)."""
    from dsv41_aot.runtime import doctor as dr

    _sources_edited(full, monkeypatch)
    monkeypatch.setenv("DSV41_AOT_DISABLE", "maybe")
    monkeypatch.setenv("DSV41_AOT_ALLOW_SOURCE_MISMATCH", "perhaps")
    rep = dr.diagnose(4)
    bad = [c.text for c in rep.checks if c.status == "bad"]
    assert rep.exit_code == 2 and len(bad) == 2, bad
    assert "DSV41_AOT_DISABLE='maybe'" in bad[0] and "DSV41_AOT_ALLOW_SOURCE_MISMATCH='perhaps'" in bad[1], bad
    by = {c.name: c for c in rep.checks}
    assert by["plugin"].status == "ok" and "mode strict" in by["plugin"].text, by["plugin"]  # not disabled
    assert by["room"].status == "fail" and "matches no prebuilt release" in by["room"].text, by["room"]  # not allowed
