"""``dsv41-aot facts`` and the table fields that replaced code: the command
prints the facts modules' own values (a release or arch added to the tables
appears with nothing written by hand), CI reads its releases and arches from
it, whether a launch kind is a whole layer drives the plot series, the
runner's arch flag is the attribute the release names, and a CTA's threads
and the grid's size are the key's release's."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import types

import pytest
from _smoke import REPO, run_cli

from dsv41_aot.aot import inspection
from dsv41_aot.cli import facts as facts_cli
from dsv41_aot.errors import AotError
from dsv41_aot.facts import arches, kinds
from dsv41_aot.facts.releases import NEWEST, RELEASES, version_order
from dsv41_aot.keys import BuildKey
from dsv41_aot.manifest import folder_name
from dsv41_aot.runtime import runner_patch, state


def deployed() -> list[str]:
    return [a for a in arches.ARCHES if any(a in r.arches for r in RELEASES.values())]


@pytest.fixture(scope="module")
def doc():
    return json.loads(run_cli("facts", "--json")[1])


# ---------------------------------------------------------------- the command


def test_json_is_the_tables_values(doc):
    assert doc["newest"] == NEWEST
    assert [r["version"] for r in doc["releases"]] == sorted(RELEASES, key=version_order)
    assert doc["releases"][-1]["version"] == NEWEST  # newest last
    for r in doc["releases"]:
        rel = RELEASES[r["version"]]
        assert r["folder"] == folder_name(rel.version) and r["mono_fields"] == list(rel.mono_fields)
        assert r["defaults"] == rel.defaults and r["whole_ratios"] == list(rel.whole_ratios)
        assert r["max_tokens"] == rel.max_tokens
        assert (r["cta_threads"], r["grid_ctas"], r["arch_flag"]) == (rel.cta_threads, rel.grid_ctas, rel.arch_flag)
        assert set(r["arches"]) == set(rel.arches)
        for arch, dep in rel.arches.items():
            assert r["arches"][arch] == {"tp_sizes": list(dep.tp_sizes), "max_rows": dep.max_rows,
                                         "k2_reads_index": dep.k2_reads_index, "draft_layers": dep.draft_layers,
                                         "runner_flag": dep.runner_flag}
    assert [a["name"] for a in doc["arches"]] == deployed()
    for a in doc["arches"]:
        facts = arches.ARCHES[a["name"]]
        assert (a["products"], a["gfx_target_version"], a["cus"]) == (facts.products, facts.gfx_target_version, facts.cus)
        assert a["releases"] == [v for v in sorted(RELEASES, key=version_order) if a["name"] in RELEASES[v].arches]
    assert [(k["name"], k["builder"], k["whole_layer"]) for k in doc["kinds"]] == [
        (k.name, k.builder, k.whole_layer) for k in kinds.KINDS.values()]
    assert doc["failed"] == 0 and doc["failures"] == []


def test_json_names_the_flydsl_releases_and_the_one_the_build_pins(doc):
    """The releases facts/flydsl.py supports (today 0.4.2 and 0.5.0), and the
    pin of pyproject.toml's build extra, read from the installed metadata."""
    from dsv41_aot.facts.flydsl import FLYDSL

    assert [r["version"] for r in doc["flydsl"]["supported"]] == list(FLYDSL)
    assert {"0.4.2", "0.5.0"} <= set(FLYDSL)
    (pin,) = re.findall(r'"flydsl==([^"]+)"', (REPO / "pyproject.toml").read_text())
    assert doc["flydsl"]["pinned"] == pin


def test_a_release_and_an_arch_added_to_the_tables_appear_with_nothing_else_written(monkeypatch):
    old = RELEASES[min(RELEASES, key=version_order)]
    new_arch = dataclasses.replace(arches.ARCHES["gfx950"], name="gfx9ff", products="a test part")
    older = dataclasses.replace(old, version="0.0.1", arches={**old.arches, "gfx9ff": old.arches["gfx950"]})
    monkeypatch.setitem(arches.ARCHES, "gfx9ff", new_arch)
    monkeypatch.setitem(RELEASES, "0.0.1", older)
    doc = facts_cli.document()
    assert [r["version"] for r in doc["releases"]][0] == "0.0.1" and doc["releases"][0]["folder"] == "vllm-0.0.1"
    assert "gfx9ff" in [a["name"] for a in doc["arches"]]
    assert next(a for a in doc["arches"] if a["name"] == "gfx9ff")["releases"] == ["0.0.1"]
    text = "\n".join(facts_cli.lines())
    assert "0.0.1" in text and "gfx9ff" in text and "a test part" in text


def test_an_arch_no_release_runs_on_is_not_one_to_build(monkeypatch):
    monkeypatch.setitem(arches.ARCHES, "gfx9fe", dataclasses.replace(arches.ARCHES["gfx950"], name="gfx9fe"))
    assert "gfx9fe" not in [a["name"] for a in facts_cli.document()["arches"]]


def test_text_names_every_release_arch_and_kind():
    _, out, _ = run_cli("facts")
    for v in RELEASES:
        assert re.search(rf"^  {re.escape(v)} ", out, re.M), out
    assert [line.split()[0] for line in out.splitlines() if line.endswith("(newest)")] == [NEWEST]
    for a in deployed():
        assert re.search(rf"^  {a} ", out, re.M), out
    for k in kinds.KINDS:
        assert re.search(rf"^  {k} ", out, re.M), out
    assert out.index("vLLM releases") < out.index("arches:") < out.index("launch kinds:")


def test_the_facts_command_needs_nothing_installed():
    """The workflow's first job runs it with a bare interpreter and the
    checkout on the path: no site-packages (-S)."""
    proc = subprocess.run([sys.executable, "-S", "-m", "dsv41_aot.cli", "facts", "--json"], capture_output=True,
                          text=True, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["newest"] == NEWEST


# ---------------------------------------------------------------- CI reads it


@pytest.mark.parametrize("path", ["ci/bootstrap.sh", ".github/workflows/wheels.yml", "ci/release.py"])
def test_ci_repeats_no_release_and_no_arch(path):
    text = (REPO / path).read_text()
    for v in RELEASES:
        assert v not in text, f"{path} names vLLM {v}: read it from dsv41-aot facts --json"
    assert not re.search(r"\bgfx[0-9a-f]{3,4}\b", text), f"{path} names an arch: read it from dsv41-aot facts --json"
    assert "facts" in text


def test_release_py_facts_writes_the_arches_the_matrices_run(tmp_path):
    out = tmp_path / "github-output"
    proc = subprocess.run([sys.executable, "ci/release.py", "facts"], capture_output=True, text=True, cwd=REPO,
                          env=dict(os.environ, GITHUB_OUTPUT=str(out)), timeout=120)
    assert proc.returncode == 0, proc.stderr
    got = dict(line.split("=", 1) for line in out.read_text().splitlines())
    assert json.loads(got["arches"]) == deployed()
    assert json.loads(got["releases"]) == sorted(RELEASES, key=version_order) and got["newest"] == NEWEST


def test_the_workflow_matrices_take_the_facts_jobs_arches():
    yaml = pytest.importorskip("yaml")
    jobs = yaml.safe_load((REPO / ".github/workflows/wheels.yml").read_text())["jobs"]
    assert jobs["version"]["outputs"]["arches"] == "${{ steps.facts.outputs.arches }}"
    assert any(s.get("id") == "facts" and s.get("run") == "python ci/release.py facts" for s in jobs["version"]["steps"])
    assert jobs["shard"]["strategy"]["matrix"]["arch"] == "${{ fromJSON(needs.version.outputs.arches) }}"
    assert jobs["shard"]["outputs"]["arches"] == "${{ needs.version.outputs.arches }}"
    assert jobs["merge"]["strategy"]["matrix"]["arch"] == "${{ fromJSON(needs.shard.outputs.arches) }}"


# ---------------------------------------------------------------- table fields, not code


def test_whole_layer_decides_the_plot_series(monkeypatch):
    ffn = BuildKey.parse("ffn@gfx950:s=4,tp=4,r=0", NEWEST)
    assert inspection.series(ffn) == "ffn"
    monkeypatch.setitem(kinds.KINDS, "ffn", dataclasses.replace(kinds.KINDS["ffn"], whole_layer=True))
    assert inspection.series(ffn) == "ffn r0"


def _runner(**flags) -> types.ModuleType:
    mod = types.ModuleType("fake.mono.runner")
    for name, value in flags.items():
        setattr(mod, name, value)
    return mod


def test_the_runner_flag_is_the_attribute_the_release_names(monkeypatch):
    rel = RELEASES[NEWEST]
    (flagged,) = [a for a, d in rel.arches.items() if d.runner_flag]
    (plain,) = [a for a, d in rel.arches.items() if not d.runner_flag][:1]
    monkeypatch.setitem(RELEASES, NEWEST, dataclasses.replace(rel, arch_flag="IS_MI300"))
    # judged by IS_MI300 alone: a GFX942 attribute means nothing to this release
    runner_patch.check_arch_flag(_runner(IS_MI300=True, GFX942=False), NEWEST, flagged)
    runner_patch.check_arch_flag(_runner(GFX942=True), NEWEST, plain)
    with pytest.raises(AotError, match=f"has IS_MI300=False but compiles for {flagged}"):
        runner_patch.check_arch_flag(_runner(IS_MI300=False, GFX942=True), NEWEST, flagged)
    with pytest.raises(AotError, match=f"has IS_MI300=True but compiles for {plain}"):
        runner_patch.check_arch_flag(_runner(IS_MI300=True), NEWEST, plain)
    # a release whose runner has no flag: nothing to check
    monkeypatch.setitem(RELEASES, NEWEST, dataclasses.replace(rel, arch_flag=None))
    runner_patch.check_arch_flag(_runner(GFX942=True, IS_MI300=True), NEWEST, plain)


def test_the_plugin_finds_the_running_release_then_checks_that_releases_flag(monkeypatch, tmp_path):
    """_running (the first build of a patched runner) judges the runner module
    by the flag its release names."""
    from dsv41_aot.runtime import loader

    rel = RELEASES[NEWEST]
    (flagged,) = [a for a, d in rel.arches.items() if d.runner_flag]
    monkeypatch.setitem(RELEASES, NEWEST, dataclasses.replace(rel, arch_flag="IS_MI300"))
    monkeypatch.setattr(loader, "release_of", lambda root, arch: NEWEST)
    monkeypatch.setattr(loader, "running_vllm", lambda folder: None)
    monkeypatch.setattr(runner_patch._state, "arch", flagged)
    monkeypatch.setattr(runner_patch._state, "prebuilt", str(tmp_path))
    mod = _runner(IS_MI300=False, GFX942=True)
    mod.__file__ = str(tmp_path / "runner.py")
    monkeypatch.setattr(state.current(), "runner_room", None)
    with pytest.raises(AotError, match="IS_MI300=False"):
        runner_patch._running(mod)
    mod.IS_MI300 = True
    assert runner_patch._running(mod) == (flagged, NEWEST)
