"""``dsv41-aot verify``: integrity of a prebuilt directory, and AOT = JIT.

The slow tests build the ``smoke`` profile with the real builder, then
rebuild its keys through vLLM's own runner and FlyDSL's JIT (compile only,
no GPU) and compare the GPU code objects byte for byte.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dsv41_aot.build import verify
from dsv41_aot.build.elf import exported_parts
from dsv41_aot.manifest import Manifest

from _smoke import SMOKE_KEYS, smoke_count, smoke_dir



@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> Path:
    return smoke_dir(tmp_path_factory)


def cli(*argv) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dsv41_aot.cli", *map(str, argv)], capture_output=True, text=True)


@pytest.fixture
def copy(smoke, tmp_path) -> Path:
    """A private copy of the smoke build, free to damage."""
    return Path(shutil.copytree(smoke, tmp_path / "prebuilt"))


@pytest.mark.slow
def test_against_jit_passes_on_smoke(smoke):
    proc = cli("verify", "--dir", smoke, "--against-jit", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert (report["failed"], report["failures"], report["ok"]) == (0, [], smoke_count())
    assert report["jit_checked"] == smoke_count()
    assert {r["key"] for r in report["reports"]} == set(SMOKE_KEYS)
    assert all("jit" in r["checks"] and r["ok"] for r in report["reports"])


@pytest.mark.slow
def test_flipped_byte_fails_with_its_key(copy):
    man = Manifest.read(copy / "gfx942")
    key = "k2@gfx942:s=4,tp=4,r=1"
    path = man.object_path(key)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    proc = cli("verify", "--dir", copy)
    assert proc.returncode == 1
    assert f"FAILED {key}" in proc.stdout and "does not match its manifest sha256" in proc.stdout
    assert proc.stdout.count("FAILED") == 1
    assert "dsv41-aot build --key" in proc.stderr and key in proc.stderr


@pytest.mark.slow
def test_swapped_object_with_updated_sha_is_caught(copy):
    """An object replaced by another key's, manifest sha256 updated to match:
    the checksum passes, the export and code object checks do not."""
    from dsv41_aot.manifest import sha256_file

    man = Manifest.read(copy / "gfx950")
    victim, donor = "k1@gfx950:s=4,tp=4,r=1", "k2@gfx950:s=4,tp=4,r=1"
    e = man.entries[victim]
    shutil.copyfile(man.object_path(donor), man.object_path(victim))
    e["sha256"], e["bytes"] = sha256_file(man.object_path(victim)), man.object_path(victim).stat().st_size
    man.write()
    proc = cli("verify", "--dir", copy, "--json")
    assert proc.returncode == 1
    report = json.loads(proc.stdout)
    (own,) = [f for f in report["failures"] if f["file"] is None]  # the entry's own check
    assert own["key"] == victim and own["fix"] == f"rebuild it: dsv41-aot build --key '{victim}' --out {copy}"
    # and libs.json still links the key from the object it was linked from
    (linked,) = [f for f in report["failures"] if f["file"] is not None]
    assert linked["key"] == victim and linked["fix"] == f"dsv41-aot link --dir {copy} --arch gfx950"
    (bad,) = [r for r in report["reports"] if r["key"] == victim]
    assert any("is not an export of entry" in p for p in bad["problems"]), bad


@pytest.mark.slow
def test_compare_jit_names_every_difference(smoke, tmp_path):
    """The comparison itself, on real code objects: a JIT answer holding
    another key's code object differs in bytes, kernel name and kernargs."""
    man = Manifest.read(smoke / "gfx950")
    k1, k2 = "k1@gfx950:s=4,tp=4,r=1", "k2@gfx950:s=4,tp=4,r=1"
    code = {k: exported_parts(man.object_path(k).read_bytes(), man.entries[k]["entry"])[1] for k in (k1, k2)}
    (tmp_path / "k2.co").write_bytes(code[k2])
    # the launcher's parameters as the JIT worker reports them: FlyDSL annotation names
    params = [[s["name"], {"int64": "Int64", "int32": "Int32"}.get(s["ctype"], "Stream")] for s in man.abi(k1)]
    same = verify.compare_jit(man, k1, code[k1], {"code": str(tmp_path / "k2.co"), "params": params})
    assert any(p.startswith("GPU code object differs") for p in same)
    assert any(p.startswith("kernel name differs") and "dsv41_mono_k2" in p for p in same)
    assert any(p.startswith("kernarg layout differs") for p in same)
    (tmp_path / "k1.co").write_bytes(code[k1])
    assert verify.compare_jit(man, k1, code[k1], {"code": str(tmp_path / "k1.co"), "params": params}) == []
    wrong = [list(p) for p in params]
    wrong[0][1] = "Int32"
    assert any("launcher parameters" in p for p in verify.compare_jit(man, k1, code[k1], {"code": str(tmp_path / "k1.co"), "params": wrong}))
    assert verify.compare_jit(man, k1, code[k1], {"error": "boom"}) == ["JIT build failed: boom"]


def test_sample_is_seeded_per_arch(tmp_path):
    man = Manifest(tmp_path / "gfx950", "gfx950", entries={f"k1@gfx950:s={s},tp=4,r=1": {} for s in range(1, 21)})
    a = verify.choose_keys(man, None, 3, seed=0)
    assert len(a) == 3 and a == verify.choose_keys(man, None, 3, seed=0)
    assert verify.choose_keys(man, None, 3, seed=1) != a or verify.choose_keys(man, None, 3, seed=2) != a
    assert verify.choose_keys(man, None, 50, seed=0) == sorted(man.entries)
    assert verify.choose_keys(man, ["k1@gfx950:s=2,tp=4,r=1", "k2@gfx942:s=4,tp=4,r=1"], None, 0) == ["k1@gfx950:s=2,tp=4,r=1"]


def test_bad_input_exits_2(tmp_path):
    proc = cli("verify", "--dir", tmp_path)
    assert proc.returncode == 2 and "holds no prebuilt architecture" in proc.stderr


@pytest.mark.slow
def test_unknown_key_and_bad_sample_exit_2(smoke):
    proc = cli("verify", "--dir", smoke, "--key", "k1@gfx950:s=7,tp=4,r=1")
    assert proc.returncode == 2 and "does not hold" in proc.stderr and "k1@gfx950:s=7,tp=4,r=1" in proc.stderr
    proc = cli("verify", "--dir", smoke, "--key", "k1@gfx950:bogus")
    assert proc.returncode == 2 and "malformed key" in proc.stderr
    proc = cli("verify", "--dir", smoke, "--against-jit", "--sample", "0")
    assert proc.returncode == 2 and "--sample 0" in proc.stderr


@pytest.mark.slow
def test_sample_checks_n_keys_per_arch_against_jit(smoke):
    proc = cli("verify", "--dir", smoke, "--against-jit", "--sample", "1", "--seed", "3", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    jit = [r for r in report["reports"] if "jit" in r["checks"]]
    assert report["jit_checked"] == 2 and sorted(r["arch"] for r in jit) == ["gfx942", "gfx950"]
    assert report["keys"] == smoke_count()  # integrity still covers every key


# ---------------------------------------------------------------- libraries and libs.json


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["flip-library", "delete-library", "delete-libs.json", "malformed-libs.json",
                                    "object-sha256"])
def test_libraries_and_libs_json_are_checked(copy, damage):
    """What the loader refuses, verify refuses: exit 1, the file named, and
    the fix (relink) printed; running it makes verify pass again."""
    libdir = copy / "gfx950" / "lib"
    path = libdir / "libs.json"
    doc = json.loads(path.read_text())
    lib = libdir / doc["libraries"][0]["file"]
    named = {"flip-library": lib, "delete-library": lib}.get(damage, path)
    if damage == "flip-library":
        _flip(lib)
    elif damage == "delete-library":
        lib.unlink()
    elif damage == "delete-libs.json":
        path.unlink()
    elif damage == "malformed-libs.json":
        path.write_text("{")
    else:
        key = sorted(doc["libraries"][0]["entries"])[0]
        doc["libraries"][0]["entries"][key] = "f" * 64
        path.write_text(json.dumps(doc))
    proc = cli("verify", "--dir", copy)
    assert proc.returncode == 1, proc.stdout
    assert f"FAILED {named}" in proc.stdout, proc.stdout
    fix = f"fix: dsv41-aot link --dir {copy} --arch gfx950"
    assert fix in proc.stderr
    assert "0 failed" in proc.stdout  # every key's own object is fine: the link is what is wrong
    assert cli("link", "--dir", copy, "--arch", "gfx950").returncode == 0
    assert cli("verify", "--dir", copy).returncode == 0


def test_mixed_source_identities_fail(copy):
    man = Manifest.read(copy / "gfx942")
    key = sorted(man.entries)[0]
    man.entries[key]["source"] = dict(man.entries[key]["source"], mono_sources="0" * 16)
    man.write()
    proc = cli("verify", "--dir", copy, "--json")
    assert proc.returncode == 1
    (f,) = json.loads(proc.stdout)["failures"]
    assert f["file"] == str(copy / "gfx942" / "manifest.json") and key in f["error"] and "2 source identities" in f["error"]
    assert f["fix"] == f"rebuild: dsv41-aot build --arch gfx942 --out {copy}"
