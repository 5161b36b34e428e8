"""dsv41-aot coverage: the keys vLLM 0.33.0 can ask for, from vLLM's rules,
checked against prebuilt directories and matrix profiles."""

from __future__ import annotations

import json
import shutil

import pytest

from _smoke import cli, copy_of, smoke_dir
from dsv41_aot.build import coverage
from dsv41_aot.keys import BuildKey

DRAFT = (128, 3, 192)  # V4.1-Flash's DSpark draft (build_matrix.yaml routing.dspark)


@pytest.fixture(scope="module")
def sched():
    return coverage.schedule()


def keys_of(arch, tp, sched, max_rows=None, draft=None) -> list[BuildKey]:
    return coverage.required(coverage.deployment(arch, tp, max_rows, draft), sched)


# ---------------------------------------------------------------- vLLM's rules


def test_gfx950_tp4_counts_and_widths(sched):
    keys = keys_of("gfx950", 4, sched)
    assert {k.tokens for k in keys} == set(range(1, 49))  # mono_decode.py MAX_ROWS
    by_kind = {kind: [k for k in keys if k.kind == kind] for kind in ("k1", "k2", "ffn")}
    # every layer kind runner.forward accepts: ratio 0 with fold 0/1, ratio 1 and 2
    # with fold 0/1 x index 0/1 = 10 a width; K2 ignores fold: 5 distinct (ratio, index)
    assert len(by_kind["k1"]) == 48 * 10 and len(by_kind["k2"]) == 48 * 5 and len(by_kind["ffn"]) == 48
    assert BuildKey.parse("k1@gfx950:s=13,tp=4,r=2,f=0") in keys and BuildKey.parse("k1@gfx950:s=13,tp=4,r=1,f=0") in keys
    assert any(k.index for k in by_kind["k2"])
    assert all((k.experts, k.topk, k.ug_groups, k.swa_width) == (384, 6, 2, 128) for k in keys)
    assert not any(k.timeline for k in keys)


def test_gfx942_rules(sched):
    keys = keys_of("gfx942", 4, sched)
    assert max(k.tokens for k in keys) == 42  # MAX_ROWS_GFX942
    assert not any(k.index for k in keys if k.kind == "k2")  # runner.py: K2 built with index=False
    assert any(k.index for k in keys if k.kind == "k1")
    assert BuildKey.parse("k2@gfx942:s=4,tp=4,r=1") in keys


def test_draft_on_gfx950_is_its_own_runner_on_gfx942_the_ffn_launch(sched):
    plain = set(keys_of("gfx950", 2, sched))
    extra = set(keys_of("gfx950", 2, sched, draft=DRAFT)) - plain
    assert extra and {k.kind for k in extra} == {"k1", "k2"}
    assert all((k.experts, k.topk, k.ug_groups, k.swa_width, k.ratio, k.index) == (128, 3, 1, 192, 0, False) for k in extra)
    assert {k.fold for k in extra if k.kind == "k1"} == {False, True}  # first draft layer settles the residual
    extra942 = set(keys_of("gfx942", 4, sched, draft=DRAFT)) - set(keys_of("gfx942", 4, sched))
    assert {k.kind for k in extra942} == {"ffn"} and len(extra942) == 42
    assert all((k.experts, k.topk) == (128, 3) for k in extra942)


def test_max_rows_caps_and_is_capped(sched):
    assert max(k.tokens for k in keys_of("gfx950", 4, sched, max_rows=8)) == 8
    assert max(k.tokens for k in keys_of("gfx942", 4, sched, max_rows=48)) == 42


@pytest.mark.parametrize("arch,tp", [("gfx942", 2), ("gfx950", 8), ("gfx90a", 4), ("gfx950", 1)])
def test_deployments_vllm_refuses_are_bad_input(arch, tp):
    with pytest.raises(coverage.CoverageInputError) as e:
        coverage.deployment(arch, tp)
    assert e.value.exit_code == 2
    r = cli("coverage", "--arch", arch, "--tp", tp, "--profile", "full")
    assert r.returncode == 2 and "error" in r.stderr


def test_bad_draft_is_bad_input():
    r = cli("coverage", "--arch", "gfx950", "--tp", 4, "--draft", "128,3", "--profile", "full")
    assert r.returncode == 2 and "experts,topk,swa_width" in r.stderr


def test_schedule_that_breaks_vllm_invariants_is_refused(tmp_path):
    from dsv41_aot.build.matrix import DEFAULT_MATRIX

    # a compressed draft layer: the matrix accepts it, vLLM never runs one
    text = DEFAULT_MATRIX.read_text().replace("\n  draft:\n", "\n  draft:\n    - {ratio: 1, fold: true, index: false}\n", 1)
    assert text != DEFAULT_MATRIX.read_text()
    bad = tmp_path / "m.yaml"
    bad.write_text(text)
    with pytest.raises(coverage.CoverageInputError, match="compressed keys"):
        coverage.schedule(bad)


def test_required_layer_kinds_come_from_vllms_rules_not_the_matrix(tmp_path):
    from dsv41_aot.build.matrix import DEFAULT_MATRIX

    # a matrix that builds only one checkpoint's schedule (no Engram write
    # before a compressed layer without an indexer) misses K1 keys vLLM can ask for
    text = DEFAULT_MATRIX.read_text()
    narrow = text.replace("    - {ratio: 1, fold: false, index: false}", "", 1)
    assert narrow != text
    path = tmp_path / "m.yaml"
    path.write_text(narrow)
    r = cli("coverage", "--arch", "gfx942", "--tp", 4, "--profile", "full", "--matrix", path, "--json")
    rep = json.loads(r.stdout)
    assert r.returncode == 1 and len(rep["missing"]) == 42
    assert all(BuildKey.parse(k).with_(tokens=1) == BuildKey.parse("k1@gfx942:s=1,tp=4,r=1,f=0") for k in rep["missing"])


# ---------------------------------------------------------------- the matrix profiles


@pytest.mark.parametrize("arch,tp", [("gfx950", 2), ("gfx950", 4), ("gfx942", 4)])
@pytest.mark.parametrize("draft", [None, "dspark"])
def test_full_profile_covers_every_supported_deployment(arch, tp, draft):
    args = ["coverage", "--arch", arch, "--tp", tp, "--profile", "full", "--json"] + (["--draft", draft] if draft else [])
    r = cli(*args)
    rep = json.loads(r.stdout)
    assert r.returncode == 0 and rep["missing"] == [] and rep["required"], r.stdout[-2000:] + r.stderr


def test_full_profile_is_exactly_the_union_of_the_deployments(sched):
    union = set()
    for arch, tp in (("gfx950", 2), ("gfx950", 4), ("gfx942", 4)):
        union |= set(keys_of(arch, tp, sched, draft=DRAFT))
    assert set(sched["matrix"].select("full")) == union


def test_a_profile_for_another_deployment_misses_keys():
    r = cli("coverage", "--arch", "gfx950", "--tp", 2, "--profile", "gfx950-tp4", "--json")
    rep = json.loads(r.stdout)
    assert r.returncode == 1 and len(rep["missing"]) == len(rep["required"])


# ---------------------------------------------------------------- prebuilt directories


@pytest.mark.slow
def test_a_key_removed_on_purpose_is_caught(tmp_path_factory, tmp_path):
    smoke = smoke_dir(tmp_path_factory)
    args = ["coverage", "--arch", "gfx950", "--tp", 4, "--max-rows", 4, "--json"]
    full = json.loads(cli(*args, "--dir", smoke).stdout)
    assert "k2@gfx950:s=4,tp=4,r=1" in full["required"] and "k2@gfx950:s=4,tp=4,r=1" not in full["missing"]
    d = copy_of(smoke, tmp_path / "pb")
    path = d / "gfx950" / "manifest.json"
    doc = json.loads(path.read_text())
    del doc["entries"]["k2@gfx950:s=4,tp=4,r=1"]
    path.write_text(json.dumps(doc))
    r = cli(*args, "--dir", d)
    rep = json.loads(r.stdout)
    assert r.returncode == 1
    assert set(rep["missing"]) - set(full["missing"]) == {"k2@gfx950:s=4,tp=4,r=1"}
    text = cli(*args[:-1], "--dir", d)
    assert text.returncode == 1 and "MISSING  k2@gfx950:s=4,tp=4,r=1" in text.stdout and "dsv41-aot build --key" in text.stdout


@pytest.mark.slow
def test_unlinked_keys_fail_and_a_complete_dir_passes(tmp_path_factory, tmp_path):
    smoke = smoke_dir(tmp_path_factory)
    d = copy_of(smoke, tmp_path / "pb")
    # of gfx942 TP4 at widths 1..4, the smoke set holds exactly its three s=4 keys
    r = cli("coverage", "--arch", "gfx942", "--tp", 4, "--max-rows", 4, "--dir", d, "--json")
    rep = json.loads(r.stdout)
    held = [k for k in rep["required"] if k not in rep["missing"]]
    assert sorted(held) == ["ffn@gfx942:s=4,tp=4,r=0", "k1@gfx942:s=4,tp=4,r=1", "k2@gfx942:s=4,tp=4,r=1"]
    assert rep["unlinked"] == []
    shutil.rmtree(d / "gfx942" / "lib")
    rep = json.loads(cli("coverage", "--arch", "gfx942", "--tp", 4, "--max-rows", 4, "--dir", d, "--json").stdout)
    assert sorted(rep["unlinked"]) == sorted(held)


def test_no_prebuilt_dir_is_bad_input(tmp_path):
    r = cli("coverage", "--arch", "gfx950", "--tp", 4, "--dir", tmp_path)
    assert r.returncode == 2 and "no prebuilt kernels for gfx950" in r.stderr
