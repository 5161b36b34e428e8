"""dsv41-aot coverage: the keys each vLLM release can ask for, from that
release's rules, checked against prebuilt directories (one room a release)
and matrix profiles; and one rule changed in the facts moving ``build
--list``, ``coverage`` and ``doctor`` together."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from _smoke import cli, copy_of, stand_in_entry

from dsv41_aot.aot import matrix
from dsv41_aot import deployment as coverage
from dsv41_aot.facts.releases import NEWEST
from dsv41_aot.keys import BuildKey
from dsv41_aot.manifest import LIBS_JSON, Manifest
from dsv41_aot.room import room_dir

DRAFT = (128, 3, 192)  # V4.1-Flash's DSpark draft (build_matrix.yaml drafts.dspark)


@pytest.fixture(scope="module")
def m():
    return matrix.load()


def keys_of(arch, tp, max_rows=None, draft=None, release="0.33.0") -> list[BuildKey]:
    return coverage.required(coverage.deployment(arch, tp, max_rows, draft, release=release))


def only(doc: dict, release: str) -> dict:
    """The one report of ``release`` in a coverage --json document."""
    (rep,) = [r for r in doc["reports"] if r["release"] == release]
    return rep


# ---------------------------------------------------------------- vLLM's rules


def test_gfx950_tp4_counts_and_widths():
    keys = keys_of("gfx950", 4)
    assert {k.tokens for k in keys} == set(range(1, 49))  # mono_decode.py MAX_ROWS
    by_kind = {kind: [k for k in keys if k.kind == kind] for kind in ("k1", "k2", "ffn")}
    # every layer kind runner.forward accepts: ratio 0 with fold 0/1, ratio 1 and 2
    # with fold 0/1 x index 0/1 = 10 a width; K2 ignores fold: 5 distinct (ratio, index)
    assert len(by_kind["k1"]) == 48 * 10 and len(by_kind["k2"]) == 48 * 5 and len(by_kind["ffn"]) == 48
    assert BuildKey.parse("k1@gfx950:s=13,tp=4,r=2,f=0", NEWEST) in keys and BuildKey.parse("k1@gfx950:s=13,tp=4,r=1,f=0", NEWEST) in keys
    assert any(k.index for k in by_kind["k2"])
    assert all((k.experts, k.topk, k.ug_groups, k.swa_width) == (384, 6, 2, 128) for k in keys)
    assert not any(k.timeline for k in keys)


def test_gfx942_rules():
    keys = keys_of("gfx942", 4)
    assert max(k.tokens for k in keys) == 42  # MAX_ROWS_GFX942
    assert not any(k.index for k in keys if k.kind == "k2")  # runner.py: K2 built with index=False
    assert any(k.index for k in keys if k.kind == "k1")
    assert BuildKey.parse("k2@gfx942:s=4,tp=4,r=1", NEWEST) in keys


def test_draft_on_gfx950_is_its_own_runner_on_gfx942_the_ffn_launch():
    plain = set(keys_of("gfx950", 2))
    extra = set(keys_of("gfx950", 2, draft=DRAFT)) - plain
    assert extra and {k.kind for k in extra} == {"k1", "k2"}
    assert all((k.experts, k.topk, k.ug_groups, k.swa_width, k.ratio, k.index) == (128, 3, 1, 192, 0, False) for k in extra)
    assert {k.fold for k in extra if k.kind == "k1"} == {False, True}  # first draft layer settles the residual
    extra942 = set(keys_of("gfx942", 4, draft=DRAFT)) - set(keys_of("gfx942", 4))
    assert {k.kind for k in extra942} == {"ffn"} and len(extra942) == 42
    assert all((k.experts, k.topk) == (128, 3) for k in extra942)


def test_max_rows_caps_and_is_capped():
    assert max(k.tokens for k in keys_of("gfx950", 4, max_rows=8)) == 8
    assert max(k.tokens for k in keys_of("gfx942", 4, max_rows=48)) == 42


@pytest.mark.parametrize("arch,tp", [("gfx942", 2), ("gfx950", 8), ("gfx90a", 4), ("gfx950", 1)])
def test_deployments_vllm_refuses_are_bad_input(arch, tp):
    with pytest.raises(coverage.CoverageInputError) as e:
        coverage.deployment(arch, tp, release="0.33.0")
    assert e.value.exit_code == 2
    r = cli("coverage", "--arch", arch, "--tp", tp, "--profile", "full")
    assert r.returncode == 2 and "error" in r.stderr


def test_bad_draft_is_bad_input():
    r = cli("coverage", "--arch", "gfx950", "--tp", 4, "--draft", "128,3", "--profile", "full")
    assert r.returncode == 2 and "experts,topk,swa_width" in r.stderr


def test_required_layer_kinds_come_from_vllms_rules_not_the_matrix(tmp_path):
    # a profile that keeps only folding layers (no first layer, no Engram
    # write) misses the K1 keys of every layer kind vLLM runs with fold false
    text = matrix.DEFAULT_MATRIX.read_text()
    old = "  gfx942-tp4: {where: {arch: gfx942, tp: 4}}\n"
    narrow = text.replace(old, "  gfx942-tp4: {where: {arch: gfx942, tp: 4, fold: true}}\n", 1)
    assert narrow != text
    path = tmp_path / "m.yaml"
    path.write_text(narrow)
    r = cli("coverage", "--arch", "gfx942", "--tp", 4, "--profile", "gfx942-tp4", "--matrix", path, "--json")
    rep = only(json.loads(r.stdout), "0.33.0")
    # ratio 0, and ratio 1 and 2 with index 0 or 1, at 42 widths; K2 reads no fold, so none of its keys
    assert r.returncode == 1 and len(rep["missing"]) == 5 * 42
    assert all(k.kind == "k1" and not k.fold for k in (BuildKey.parse(t, NEWEST) for t in rep["missing"]))


# ---------------------------------------------------------------- one rule, three commands

# A subprocess that changes one rule of vLLM's runner in the facts (argv:
# release, arch, its row cap; 0 keeps the real one), then runs dsv41-aot
# commands in-process (argv[4]: {name: argv}) and prints {name: [exit code,
# its --json document]}.
_RULE_FLIP = """
import contextlib, dataclasses, io, json, sys
from dsv41_aot.facts.releases import RELEASES
release, arch, rows = sys.argv[1], sys.argv[2], int(sys.argv[3])
if rows:
    rel = RELEASES[release]
    cap = dataclasses.replace(rel.arches[arch], max_rows=rows)
    RELEASES[release] = dataclasses.replace(rel, arches=dict(rel.arches, **{arch: cap}))
from dsv41_aot.cli import main
out = {}
for name, argv in json.loads(sys.argv[4]).items():
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(argv)
    out[name] = [code, json.loads(buf.getvalue())]
print(json.dumps(out))
"""


def _with_rows(arch: str, rows: int, prebuilt) -> dict:
    """``arch`` at TP 4 with the DSpark draft, its row cap ``rows`` (0: the
    real one): {command: the keys it names}, and coverage's missing keys."""
    profile = f"{arch}-tp4"
    commands = {
        "build": ["build", "--list", "--profile", profile, "--release", NEWEST, "--json"],
        "coverage": ["coverage", "--arch", arch, "--tp", "4", "--draft", "dspark", "--release", NEWEST,
                     "--profile", profile, "--json"],
        "doctor": ["doctor", "--tp", "4", "--draft", ",".join(map(str, DRAFT)), "--json"],
    }
    env = {k: v for k, v in os.environ.items() if k not in ("DSV41_AOT_DISABLE", "DSV41_AOT_MODE", "ARCH")}
    env.update(DSV41_AOT_ARCH=arch, DSV41_AOT_PREBUILT=str(prebuilt))  # an empty prebuilt dir: nothing held
    r = subprocess.run([sys.executable, "-c", _RULE_FLIP, NEWEST, arch, str(rows), json.dumps(commands)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.splitlines()[-1])
    (build_code, build), (cov_code, cov), (_, doc) = got["build"], got["coverage"], got["doctor"]
    assert build_code == 0 and cov_code == 0, got  # the profile covers every key the rules require
    assert doc["coverage"]["release"] == NEWEST and doc["coverage"]["arch"] == arch
    return {"build": {e["key"] for e in build["entries"]}, "coverage": set(only(cov, NEWEST)["required"]),
            "doctor": set(doc["coverage"]["required"]), "missing": only(cov, NEWEST)["missing"]}


@pytest.mark.parametrize("arch,real,flips", [("gfx950", 48, (47,)), ("gfx942", 42, (40, 44))])
def test_one_rule_changes_build_list_coverage_and_doctor_together(tmp_path, arch, real, flips):
    # an arch's row cap (facts/releases.py Deploy.max_rows, amd/mono_decode.py
    # MAX_ROWS and MAX_ROWS_GFX942) is the one place each command learns it
    # from: gfx950's 48 -> 47 and gfx942's 42 -> 40 move all three, and
    # gfx942's 42 -> 44 too (the matrix names no width)
    got = {rows: _with_rows(arch, 0 if rows == real else rows, tmp_path) for rows in (real, *flips)}
    for rows, seen in got.items():
        assert seen["build"] == seen["coverage"] == seen["doctor"] and seen["missing"] == []
        assert max(BuildKey.parse(k, NEWEST).tokens for k in seen["build"]) == rows
    for rows in flips:
        low, high = sorted((rows, real))
        assert got[low]["build"] == {k for k in got[high]["build"] if BuildKey.parse(k, NEWEST).tokens <= low}


# ---------------------------------------------------------------- the matrix profiles


@pytest.mark.parametrize("arch,tp", [("gfx950", 2), ("gfx950", 4), ("gfx942", 4)])
@pytest.mark.parametrize("draft", [None, "dspark"])
def test_full_profile_covers_every_supported_deployment(arch, tp, draft):
    args = ["coverage", "--arch", arch, "--tp", tp, "--profile", "full", "--json"] + (["--draft", draft] if draft else [])
    r = cli(*args)
    doc = json.loads(r.stdout)
    # every release that runs the deployment is reported; gfx942 is 0.33.0's only
    want = {"0.33.0"} if arch == "gfx942" else {"0.33.0", "0.32.0"}
    assert {rep["release"] for rep in doc["reports"]} == want
    assert [s["release"] for s in doc["skipped"]] == sorted({"0.33.0", "0.32.0"} - want)
    for rep in doc["reports"]:
        assert rep["missing"] == [] and rep["required"], r.stdout[-2000:] + r.stderr
    assert r.returncode == 0 and doc["failed"] == 0 and doc["keys"] == sum(len(rep["required"]) for rep in doc["reports"])


def test_full_profile_is_exactly_the_union_of_the_deployments(m):
    union = set()
    for arch, tp in (("gfx950", 2), ("gfx950", 4), ("gfx942", 4)):
        union |= set(keys_of(arch, tp, draft=DRAFT))
    for tp in (2, 4):
        union |= set(keys_of("gfx950", tp, draft=DRAFT, release="0.32.0"))
    assert set(m.select("full")) == union


def test_a_profile_for_another_deployment_misses_keys():
    r = cli("coverage", "--arch", "gfx950", "--tp", 2, "--profile", "gfx950-tp4", "--json")
    doc = json.loads(r.stdout)
    assert r.returncode == 1 and len(doc["reports"]) == 2
    for rep in doc["reports"]:
        assert len(rep["missing"]) == len(rep["required"]) > 0
    assert {(f["release"], f["key"]) for f in doc["failures"]} == {
        (rep["release"], k) for rep in doc["reports"] for k in rep["missing"]}


# ---------------------------------------------------------------- vLLM 0.32.0


def test_vllm_0_32_0_gfx950_tp4_counts():
    keys = keys_of("gfx950", 4, release="0.32.0")
    by_kind = {kind: [k for k in keys if k.kind == kind] for kind in ("k1", "k2", "ffn")}
    # whole layers (K1 + K2) for ratio 1 and 2 only, at 1..48 rows; the FFN launch
    # ffn_kernel(tokens) = MonoBuild(tokens, tp, 0) for every other mono layer
    assert (len(by_kind["k1"]), len(by_kind["k2"]), len(by_kind["ffn"])) == (48 * 2, 48 * 2, 48)
    assert len(keys) == 240
    assert {k.ratio for k in by_kind["k1"] + by_kind["k2"]} == {1, 2}
    assert all(k.release == "0.32.0" for k in keys)
    # MonoBuild(tokens, tp, ratio, timeline): fold, index and routing are pinned
    assert all(set(k.build_fields()) == {"tokens", "tp", "ratio", "timeline"} for k in keys)
    assert all((k.fold, k.index, k.experts, k.topk) == (True, False, 384, 6) for k in keys)
    assert BuildKey.parse("ffn@gfx950:s=48,tp=4,r=0", "0.32.0") in keys


def test_vllm_0_32_0_runs_no_draft_and_no_gfx942():
    # mono_decode.py: a "draft layer" leaves the mono path: a draft adds no key
    assert keys_of("gfx950", 2, draft=DRAFT, release="0.32.0") == keys_of("gfx950", 2, release="0.32.0")
    with pytest.raises(coverage.NotDeployed, match="does not run on gfx942"):
        coverage.deployment("gfx942", 4, release="0.32.0")
    r = cli("coverage", "--arch", "gfx942", "--tp", 4, "--release", "0.32.0", "--profile", "full")
    assert r.returncode == 2 and "0.32.0" in r.stderr and "gfx942" in r.stderr
    r = cli("coverage", "--arch", "gfx942", "--tp", 4, "--max-rows", 2, "--profile", "full")
    assert r.returncode == 0 and "skipped  vLLM 0.32.0" in r.stdout and "ok       0.33.0 k2@gfx942:s=2,tp=4,r=1" in r.stdout
    assert " 0.32.0 " not in r.stdout.replace("skipped  vLLM 0.32.0", "")


def test_release_flag_reports_only_that_release():
    r = cli("coverage", "--arch", "gfx950", "--tp", 4, "--release", "0.32.0", "--profile", "vllm-0.32.0", "--json")
    doc = json.loads(r.stdout)
    assert r.returncode == 0 and [rep["release"] for rep in doc["reports"]] == ["0.32.0"]
    assert doc["keys"] == doc["ok"] == 240
    r = cli("coverage", "--arch", "gfx950", "--tp", 4, "--release", "0.31.0", "--profile", "full")
    assert r.returncode == 2 and "0.31.0" in r.stderr


def test_a_newer_release_key_never_satisfies_an_older_ones_requirement(m):
    # vLLM 0.33.0's profile holds key strings that read exactly like 0.32.0's...
    need = [str(k) for k in keys_of("gfx950", 4, release="0.32.0")]
    newer = {str(k) for k in m.select("vllm-0.33.0")}
    assert set(need) & newer
    # ...but none of them is a 0.32.0 key
    r = cli("coverage", "--arch", "gfx950", "--tp", 4, "--release", "0.32.0", "--profile", "vllm-0.33.0", "--json")
    rep = only(json.loads(r.stdout), "0.32.0")
    assert r.returncode == 1 and rep["missing"] == rep["required"] == need


def _room(root, arch: str, release: str, keys: list, linked: list | None = None) -> None:
    """A room's manifest (and libs.json) naming ``keys``: what coverage reads
    (no objects: coverage checks presence, verify checks bytes)."""
    man = Manifest(root / arch, arch, release=release)
    for text in keys:
        man.put(stand_in_entry(text, release), [])
    man.write()
    if linked is not None:
        doc = {"schema": 2, "arch": arch, "release": release, "libraries": [
            {"chunk": "libdsv41_x", "file": "libdsv41_x.so.xz", "sha256": "0" * 64, "bytes": 1, "raw_sha256": "0" * 64,
             "raw_bytes": 1, "entries": {k: "0" * 64 for k in linked}}]}
        (room_dir(root / arch, release) / LIBS_JSON).write_text(json.dumps(doc))


def test_rooms_are_read_per_release(tmp_path):
    dep32 = coverage.deployment("gfx950", 4, 2, release="0.32.0")
    need32 = [str(k) for k in coverage.required(dep32)]
    need33 = [str(k) for k in coverage.required(coverage.deployment("gfx950", 4, 2, release="0.33.0"))]
    assert len(need32) == 2 * (2 + 2 + 1)
    # the 0.33.0 room holds every 0.32.0 string (and its own keys), linked; the
    # 0.32.0 room one key, not linked
    _room(tmp_path, "gfx950", "0.33.0", sorted(set(need33) | set(need32)), linked=sorted(set(need33) | set(need32)))
    _room(tmp_path, "gfx950", "0.32.0", [need32[0]], linked=[])
    r = cli("coverage", "--arch", "gfx950", "--tp", 4, "--max-rows", 2, "--dir", tmp_path, "--json")
    doc = json.loads(r.stdout)
    assert r.returncode == 1
    assert only(doc, "0.33.0")["missing"] == only(doc, "0.33.0")["unlinked"] == []
    assert only(doc, "0.32.0")["missing"] == need32[1:] and only(doc, "0.32.0")["unlinked"] == need32[:1]
    assert only(doc, "0.32.0")["against"].endswith("gfx950/vllm-0.32.0")
    text = cli("coverage", "--arch", "gfx950", "--tp", 4, "--max-rows", 2, "--dir", tmp_path)
    assert f"MISSING  0.32.0 {need32[1]}" in text.stdout and f"ok       0.33.0 {need32[1]}" in text.stdout
    (fix,) = [line for line in text.stdout.splitlines() if "fix:" in line]
    assert "fix: dsv41-aot build --release 0.32.0 --out " in fix and need32[1] in fix.split(" --key ")[1], fix
    # a release without a room misses all its keys; asked for by name, it is bad input
    (room_dir(tmp_path / "gfx950", "0.32.0") / "manifest.json").unlink()
    doc = json.loads(cli("coverage", "--arch", "gfx950", "--tp", 4, "--max-rows", 2, "--dir", tmp_path, "--json").stdout)
    assert only(doc, "0.32.0")["missing"] == need32 and only(doc, "0.32.0")["against"].endswith("(absent)")
    r = cli("coverage", "--arch", "gfx950", "--tp", 4, "--release", "0.32.0", "--dir", tmp_path)
    assert r.returncode == 2 and "no prebuilt kernels for gfx950 of vLLM 0.32.0" in r.stderr


# ---------------------------------------------------------------- prebuilt directories


@pytest.mark.slow
def test_a_key_removed_on_purpose_is_caught(smoke_dir, tmp_path):
    smoke = smoke_dir
    args = ["coverage", "--arch", "gfx950", "--tp", 4, "--max-rows", 4, "--json"]
    full = json.loads(cli(*args, "--dir", smoke).stdout)
    for release in ("0.33.0", "0.32.0"):
        rep = only(full, release)
        assert "k2@gfx950:s=4,tp=4,r=1" in rep["required"] and "k2@gfx950:s=4,tp=4,r=1" not in rep["missing"]
    d = copy_of(smoke, tmp_path / "pb")
    path = room_dir(d / "gfx950", "0.32.0") / "manifest.json"
    doc = json.loads(path.read_text())
    del doc["entries"]["k2@gfx950:s=4,tp=4,r=1"]
    path.write_text(json.dumps(doc))
    r = cli(*args, "--dir", d)
    rep = json.loads(r.stdout)
    assert r.returncode == 1
    # only the 0.32.0 room lost it: the 0.33.0 key of the same string does not stand in
    assert set(only(rep, "0.32.0")["missing"]) - set(only(full, "0.32.0")["missing"]) == {"k2@gfx950:s=4,tp=4,r=1"}
    assert only(rep, "0.33.0")["missing"] == only(full, "0.33.0")["missing"]
    text = cli(*args[:-1], "--dir", d)
    assert text.returncode == 1 and "MISSING  0.32.0 k2@gfx950:s=4,tp=4,r=1" in text.stdout
    assert "dsv41-aot build --release 0.32.0 --out " in text.stdout and " --key " in text.stdout


@pytest.mark.slow
def test_unlinked_keys_fail_and_a_complete_dir_passes(smoke_dir, tmp_path):
    smoke = smoke_dir
    d = copy_of(smoke, tmp_path / "pb")
    # of gfx942 TP4 at widths 1..4, the smoke set holds exactly its three s=4 keys
    r = cli("coverage", "--arch", "gfx942", "--tp", 4, "--max-rows", 4, "--dir", d, "--json")
    rep = only(json.loads(r.stdout), "0.33.0")
    held = [k for k in rep["required"] if k not in rep["missing"]]
    assert sorted(held) == ["ffn@gfx942:s=4,tp=4,r=0", "k1@gfx942:s=4,tp=4,r=1", "k2@gfx942:s=4,tp=4,r=1"]
    assert rep["unlinked"] == []
    # the 0.32.0 room of gfx950 holds its three smoke keys
    r = cli("coverage", "--arch", "gfx950", "--tp", 4, "--max-rows", 4, "--release", "0.32.0", "--dir", d, "--json")
    rep32 = only(json.loads(r.stdout), "0.32.0")
    assert sorted(k for k in rep32["required"] if k not in rep32["missing"]) == [
        "ffn@gfx950:s=4,tp=4,r=0", "k1@gfx950:s=4,tp=4,r=1", "k2@gfx950:s=4,tp=4,r=1"]
    assert rep32["unlinked"] == []
    (room_dir(d / "gfx942", "0.33.0") / LIBS_JSON).unlink()
    rep = only(json.loads(cli("coverage", "--arch", "gfx942", "--tp", 4, "--max-rows", 4, "--dir", d, "--json").stdout),
               "0.33.0")
    assert sorted(rep["unlinked"]) == sorted(held)


def test_no_prebuilt_dir_is_bad_input(tmp_path):
    r = cli("coverage", "--arch", "gfx950", "--tp", 4, "--dir", tmp_path)
    assert r.returncode == 2 and "no prebuilt kernels for gfx950" in r.stderr
