"""The builder for real: FlyDSL compiles on this CPU, for both arches."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from dsv41_aot import cli, source
from dsv41_aot.build import builder, toolchain
from dsv41_aot.manifest import Manifest, sha256_file

from _smoke import REPO, run_cli, smoke_count

GOLDEN = REPO / "tests" / "data" / "golden_code_objects.txt"
CHEAP = ["k1@gfx950:s=1,tp=2,r=0", "k1@gfx942:s=1,tp=4,r=0"]  # ~3 s each


def golden() -> dict:
    out = {}
    for line in GOLDEN.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, sha, size = line.split()
            out[key] = (sha, int(size))
    return out


@pytest.mark.slow
def test_smoke_build_reproduces_the_golden_code_objects(smoke_build):
    out, summary = smoke_build
    assert summary["compiled"] == summary["keys"] == smoke_count() and summary["failed"] == 0
    want = golden()
    seen = {}
    for arch in ("gfx950", "gfx942"):
        m = Manifest.read(out / arch)
        for key, e in m.entries.items():
            seen[key] = (e["code_object_sha256"], e["code_object_bytes"])
            m.check_object(key)
            assert sha256_file(out / arch / e["object"]) == e["sha256"]
            assert e["source"]["mono_sources"] == source.find().digest
            assert e["source"]["helpers"]["impl"] == "dsv41_aot.compat"  # the label manifests carry
            assert e["source"]["flydsl_version"] == toolchain.FLYDSL_VERSION
            assert e["bytes"] <= 160_000, "stripped objects stay small"
            abi = m.abi(key)
            assert abi[-1] == {"name": "stream", "ctype": "pointer", "size": 8}
            assert len(abi) == {"k1": 41}.get(e["kind"], len(abi))
    # the project's own aiter helpers give upstream's code objects, byte for byte
    assert {k: seen.get(k) for k in want} == want


@pytest.mark.slow
def test_a_second_build_compiles_nothing(smoke_build):
    out, _ = smoke_build
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and ".lock" not in p.name}
    _, stdout, _ = run_cli("build", "--profile", "smoke", "--out", out, "--json", "--no-progress")
    s = json.loads(stdout)
    assert (s["compiled"], s["up_to_date"], s["failed"]) == (0, smoke_count(), 0)
    after = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and ".lock" not in p.name}
    assert before == after


@pytest.mark.slow
def test_resume_rebuilds_only_missing_or_corrupt_and_is_deterministic(smoke_dir, tmp_path):
    out = tmp_path / "pb"
    shutil.copytree(smoke_dir, out)
    m950 = Manifest.read(out / "gfx950")
    dropped = m950.entries.pop("k1@gfx950:s=4,tp=4,r=1")
    m950.write()
    m942 = Manifest.read(out / "gfx942")
    obj = out / "gfx942" / m942.entries["k1@gfx942:s=4,tp=4,r=1"]["object"]
    data = bytearray(obj.read_bytes())
    data[len(data) // 2] ^= 0xFF
    obj.write_bytes(bytes(data))
    _, stdout, _ = run_cli("build", "--profile", "smoke", "--out", out, "--json", "--no-progress")
    s = json.loads(stdout)
    assert (s["compiled"], s["up_to_date"]) == (2, smoke_count() - 2)
    # same inputs, same bytes: the rebuilt directory equals the original
    for arch in ("gfx950", "gfx942"):
        a, b = Manifest.read(smoke_dir / arch), Manifest.read(out / arch)
        for key in a.entries:
            assert a.entries[key]["sha256"] == b.entries[key]["sha256"], key
    assert Manifest.read(out / "gfx950").entries["k1@gfx950:s=4,tp=4,r=1"]["sha256"] == dropped["sha256"]


@pytest.mark.slow
def test_kill_at_any_moment_leaves_a_consistent_directory(tmp_path):
    out = tmp_path / "pb"
    keys = ["k1@gfx950:s=1,tp=2,r=0", "k1@gfx950:s=2,tp=2,r=0", "k1@gfx950:s=3,tp=2,r=0", "k1@gfx950:s=4,tp=2,r=0"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "dsv41_aot.cli", "build", "--key", *keys, "--out", str(out), "--jobs", "2", "--no-progress"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    manifest = out / "gfx950" / "manifest.json"
    deadline = time.time() + 300
    while time.time() < deadline and not manifest.exists():
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the build and its workers, mid-flight
    proc.wait()
    m = Manifest.read(out / "gfx950")  # parses: never torn
    for key in m.entries:
        m.check_object(key)
    done = len(m.entries)  # a temp file a kill left behind is never read: names start with "."
    assert 1 <= done <= len(keys)
    _, stdout, _ = run_cli("build", "--key", *keys, "--out", out, "--json", "--no-progress")
    s = json.loads(stdout)
    assert s["up_to_date"] == done and s["compiled"] == len(keys) - done and s["failed"] == 0
    assert not list((out / "gfx950" / "objects").glob(".*.tmp")), "a finished build leaves no temp files"


@pytest.mark.slow
def test_a_changed_source_digest_rebuilds_what_it_covers(tmp_path):
    src = source.find()
    root = tmp_path / "vllm-src"
    shutil.copytree(src.mono_dir, root / source.MONO_REL, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path / "pb"
    args = ("build", "--key", CHEAP[0], "--vllm-src", root, "--out", out, "--json", "--no-progress")
    s = json.loads(run_cli(*args)[1])
    assert s["compiled"] == 1
    assert json.loads(run_cli(*args)[1])["compiled"] == 0
    layer = root / source.MONO_REL / "layer.py"
    layer.write_text(layer.read_text() + "\n# an edit\n")
    s = json.loads(run_cli(*args)[1])
    assert s["compiled"] == 1
    e = Manifest.read(out / "gfx950").entries[CHEAP[0]]
    assert e["source"]["mono_sources"] == source.mono_digest(root / source.MONO_REL)
    assert e["source"]["vllm_version"] == "unknown"


def test_identity_change_makes_a_key_stale(tmp_path):
    m = Manifest(tmp_path / "gfx950", "gfx950")
    from dsv41_aot.keys import BuildKey

    key = BuildKey.parse(CHEAP[0])
    obj = m.dir / "objects" / "x.o"
    obj.parent.mkdir(parents=True)
    obj.write_bytes(b"object")
    ident = {"vllm_version": "0.33.0", "mono_sources": "a", "helpers": {}, "flydsl_version": "0.4.2", "linker": "l"}
    m.put({"key": str(key), "object": "objects/x.o", "bytes": 6, "sha256": sha256_file(obj), "source": ident}, [])
    assert builder.up_to_date(m, key, ident)
    assert not builder.up_to_date(m, key, dict(ident, flydsl_version="0.5.0"))
    assert not builder.up_to_date(m, key, dict(ident, mono_sources="b"))
    obj.write_bytes(b"objecT")
    assert not builder.up_to_date(m, key, ident)


@pytest.mark.slow
def test_keys_that_cannot_run_fail_alone(tmp_path):
    out = tmp_path / "pb"
    # measured here: gfx942 FFN s=33 tp=2 trips stages/moe.py's shared_units assert;
    # gfx942 K2 s=17 tp=2 r=2 compiles but needs 77,056 B of LDS (64 KiB) and
    # 325 VGPRs: a persistent CTA that could never be resident
    refused, unresident = "ffn@gfx942:s=33,tp=2,r=0", "k2@gfx942:s=17,tp=2,r=2"
    code, stdout, stderr = run_cli(
        "build", "--key", refused, unresident, CHEAP[1], "--any-key", "--out", out, "--json", "--no-progress",
        check=False,
    )
    assert code == 1
    s = json.loads(stdout)
    assert (s["compiled"], s["failed"]) == (1, 2)
    errors = {f["key"]: f["error"] for f in s["failures"]}
    assert "moe.py" in errors[refused]
    assert unresident in errors[unresident] and "LDS" in errors[unresident] and "65536" in errors[unresident].replace(",", "")
    m = Manifest.read(out / "gfx942")
    assert list(m.entries) == [CHEAP[1]]
    assert m.entries[CHEAP[1]]["resources"]["scratch_bytes"] == 0
    assert set(m.refused) == {refused, unresident}
    # the same source refuses them again: reported, not recompiled
    code, stdout, _ = run_cli(
        "build", "--key", refused, unresident, CHEAP[1], "--any-key", "--out", out, "--json", "--no-progress",
        check=False,
    )
    s = json.loads(stdout)
    assert code == 1 and (s["compiled"], s["up_to_date"], s["failed"], s["compile_seconds"]) == (0, 1, 2, 0)
    assert {f["key"]: f["error"] for f in s["failures"]} == errors and all(f["known"] for f in s["failures"])


def test_bad_input_exits_2_and_writes_nothing(tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    cases = [
        (["build", "--key", CHEAP[0], "--out", str(blocker / "sub")], "not writable"),
        (["build", "--key", CHEAP[0], "--out", str(out), "--vllm-src", str(tmp_path / "nowhere")], "no vllm/ package"),
        (["build", "--profile", "smoke", "--arch", "gfx1100", "--out", str(out)], "gfx1100"),
        (["build", "--key", "k1@gfx950:s=4,tp=4,r=1,", "--out", str(out)], "malformed key"),
        (["build", "--key", "ffn@gfx942:s=33,tp=2,r=0", "--out", str(out)], "dropped by the rule"),
    ]
    for argv, words in cases:
        assert cli.main(argv) == 2, argv
        assert words in capsys.readouterr().err, argv
    old = tmp_path / "old-vllm"
    (old / "vllm-0.32.0.dist-info").mkdir(parents=True)
    (old / "vllm-0.32.0.dist-info" / "METADATA").write_text("Name: vllm\nVersion: 0.32.0\n")
    shutil.copytree(source.find().mono_dir, old / source.MONO_REL, ignore=shutil.ignore_patterns("__pycache__"))
    assert cli.main(["build", "--key", CHEAP[0], "--out", str(out), "--vllm-src", str(old)]) == 2
    assert "vLLM 0.32.0" in capsys.readouterr().err
    monkeypatch.setattr(toolchain, "_llvm_dirs", lambda: iter(()))
    assert cli.main(["build", "--key", CHEAP[0], "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "no ld.lld found" in err and "lld-19" in err
    assert not out.exists()
