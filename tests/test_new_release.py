"""Adding a vLLM release is data: a copy of this project gains a release
0.33.1 (0.33.0's kernel tree with one comment added, so a mono sources digest
of its own) by one facts entry and one matrix entry (its mono sources digest), and
with no code edit: ``build --list`` lists its keys, ``coverage`` checks its
deployments, the wheel gate ships a room of it, and the loader serves that
room to a running 0.33.1 (picked by its digest)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from _smoke import REPO, copy_of, run_cli
from dsv41_aot import source
from dsv41_aot.manifest import folder_name

NEW, LIKE = "0.33.1", "0.33.0"


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """(the project copy, the 0.33.1 tree's mono folder, its digest)."""
    tmp = tmp_path_factory.mktemp("new-release")
    root = tmp / "project"
    shutil.copytree(REPO / "dsv41_aot", root / "dsv41_aot", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "ci", root / "ci", ignore=shutil.ignore_patterns("__pycache__"))
    mono = tmp / "vllm-0.33.1" / source.MONO_REL
    shutil.copytree(source.find().mono_dir, mono, ignore=shutil.ignore_patterns("__pycache__"))
    (mono / "layer.py").write_text((mono / "layer.py").read_text() + "\n# vLLM 0.33.1\n")
    digest = source.mono_digest(mono)
    # the facts entry: 0.33.0's facts under the new version
    facts = root / "dsv41_aot" / "facts" / "releases.py"
    text = facts.read_text()
    anchor = "\ndef version_order("
    assert anchor in text
    facts.write_text(text.replace(anchor, f'\nRELEASES["{NEW}"] = replace(RELEASES["{LIKE}"], version="{NEW}")\n'
                                          + anchor, 1).replace("from dataclasses import dataclass, field",
                                                               "from dataclasses import dataclass, field, replace"))
    # the matrix entry: its digest
    matrix = (REPO / "build_matrix.yaml").read_text()
    assert "\nreleases:\n" in matrix
    (root / "build_matrix.yaml").write_text(matrix.replace(
        "\nreleases:\n", f'\nreleases:\n  "{NEW}": {{mono_sources: {digest}}}\n', 1))
    return root, mono, digest


def test_build_lists_the_new_release_as_its_model(project):
    root, _, _ = project
    new = json.loads(run_cli("build", "--list", "--profile", "full", "--release", NEW, "--json", cwd=root)[1])
    old = json.loads(run_cli("build", "--list", "--profile", "full", "--release", LIKE, "--json", cwd=root)[1])
    assert new["keys"] == old["keys"] > 1000
    assert sorted(e["key"] for e in new["entries"]) == sorted(e["key"] for e in old["entries"])
    assert {e["release"] for e in new["entries"]} == {NEW}


def test_coverage_checks_the_new_releases_deployments(project):
    root, _, _ = project
    code, out, err = run_cli("coverage", "--arch", "gfx950", "--tp", 4, "--release", NEW, "--profile", "full",
                             "--json", cwd=root, check=False)
    assert code == 0, out + err
    (rep,) = json.loads(out)["reports"]
    assert rep["release"] == NEW and len(rep["required"]) > 500 and rep["missing"] == []


def _relabel(d, digest):
    """gfx950's 0.33.0 room of ``d`` as a 0.33.1 build would write it: the same
    objects and bands (the kernels did not change), its own release and digest."""
    old, new = d / "gfx950" / folder_name(LIKE), d / "gfx950" / folder_name(NEW)
    shutil.copytree(old, new)
    man = json.loads((new / "manifest.json").read_text())
    man["release"], man["mono_sources"] = NEW, digest
    for e in man["entries"].values():
        e["source"].update(mono_sources=digest, vllm_version=NEW)
    (new / "manifest.json").write_text(json.dumps(man))
    libs = json.loads((new / "libs.json").read_text())
    libs["release"] = NEW
    (new / "libs.json").write_text(json.dumps(libs))
    (new / "verified.json").unlink(missing_ok=True)


def test_the_wheel_gate_and_the_loader_take_the_new_room(project, smoke_dir, tmp_path):
    root, mono, digest = project
    d = copy_of(smoke_dir, tmp_path / "p")
    _relabel(d, digest)
    gate = subprocess.run([sys.executable, str(root / "ci" / "prebuilt.py"), str(d)], capture_output=True, text=True,
                          cwd=root)
    assert gate.returncode == 0, gate.stdout + gate.stderr
    assert f"gfx950/{folder_name(NEW)}" in gate.stdout
    code, out, err = run_cli("verify", "--dir", d, cwd=root, check=False)
    assert code == 0, out + err
    # a process running the 0.33.1 tree is served the 0.33.1 room, by its digest
    probe = (
        "import sys; from dsv41_aot.runtime import loader, rooms\n"
        f"loader.running_vllm({str(mono)!r})\n"
        f"print(rooms.release_of(__import__('pathlib').Path({str(d)!r}), 'gfx950'))\n"
        f"launcher = loader.load_key('k1@gfx950:s=4,tp=4,r=1', prebuilt={str(d)!r})\n"
        "launcher.bind(); print(launcher._idx.room.release)\n"
    )
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=root)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [NEW, NEW]


@pytest.mark.slow
def test_a_release_with_the_same_gpu_code_ships_no_second_band(project, tmp_path):
    """The new release built and proven (one of the cheapest smoke keys)
    beside 0.33.0 in one folder: its exported object is byte-identical to
    0.33.0's (its metadata names the arch, FlyDSL version, symbols and ABI,
    never the vLLM release or source digest), so both rooms name the same
    object and the same band; what the release adds is its room's records."""
    root, mono, digest = project
    key, out = "k1@gfx950:s=4,tp=4,r=1", tmp_path / "p"
    run_cli("build", "--release", LIKE, "--key", key, "--out", out, "--no-progress", cwd=root)
    run_cli("build", "--release", NEW, "--key", key, "--out", out, "--vllm-src", mono.parents[len(source.MONO_REL.parts) - 1],
            "--no-progress", cwd=root)
    _, text, _ = run_cli("verify", "--dir", out, "--release", NEW, "--against-jit", "--record", "--vllm-src",
                         mono.parents[len(source.MONO_REL.parts) - 1], "--no-progress", cwd=root)
    assert "1 of 1 keys carry a proof" in text, text
    arch = out / "gfx950"
    rooms = {r: json.loads((arch / folder_name(r) / "manifest.json").read_text()) for r in (LIKE, NEW)}
    old, new = (rooms[r]["entries"][key] for r in (LIKE, NEW))
    assert new["source"]["mono_sources"] == digest != old["source"]["mono_sources"]
    assert (new["object"], new["sha256"], new["code_object_sha256"]) == \
        (old["object"], old["sha256"], old["code_object_sha256"])
    bands = {r: sorted(p for p in json.dumps(json.loads((arch / folder_name(r) / "libs.json").read_text())).split('"')
                       if p.endswith(".so.xz")) for r in (LIKE, NEW)}
    assert bands[NEW] == bands[LIKE] and bands[NEW], bands
    assert len(list((arch / "objects").glob("*.o"))) == 1 and sorted(p.name for p in (arch / "lib").iterdir()) == bands[NEW]
