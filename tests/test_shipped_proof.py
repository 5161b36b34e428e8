"""What an operator who does not trust the publisher can check of shipped kernels.

A shipped room (a wheel's, or a deployment folder without ``objects/``) is
proven against vLLM's JIT from its bands: each key's GPU code object is taken
from its band by the manifest's sha256, built again by vLLM's runner and
FlyDSL's JIT, and both launches go through the recording HIP (the suite's
stand-in for the AMD GPU, MOCK-GPU). Run on a copy of the shared gfx942 TP4
deployment and on the wheel built from it. ``--seed 9`` makes ``--sample 2``
pick two K1 keys, the cheapest JIT builds; the wheel's run takes vLLM's
answers from the session's build cache, where the folder's run stored them.

Also: the shared gfx950 TP2 deployment (built, never proven) covers every
launch vLLM's runners can ask for at TP 2.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import zipfile
from pathlib import Path

import pytest
from _smoke import build_wheel, cli, deployment, replace_code_object

from dsv41_aot.room import Room, room_name

pytestmark = pytest.mark.slow

ARCH, RELEASE = "gfx942", "0.33.0"
SAMPLE = ("--sample", "2", "--seed", "9")
PICKED = ["k1@gfx942:s=3,tp=4,r=0", "k1@gfx942:s=42,tp=4,r=0"]  # what SAMPLE picks from the 630 keys


@pytest.fixture(scope="module")
def shipped(tmp_path_factory) -> Path:
    """A copy of the shared gfx942 TP4 deployment: bands and records, no objects/."""
    d = Path(shutil.copytree(deployment("gfx942-tp4"), tmp_path_factory.mktemp("shipped") / "prebuilt"))
    assert not (d / ARCH / "objects").exists()
    return d


@pytest.fixture(scope="module")
def wheel(shipped, tmp_path_factory) -> Path:
    return build_wheel(shipped, tmp_path_factory.mktemp("wheelhouse"))


def _verify(*args) -> tuple[int, dict]:
    r = cli("verify", *args, "--json", "--no-progress", "--jobs", "2")
    return r.returncode, json.loads(r.stdout)


def _flipped(code: bytes) -> bytes:
    """``code`` with one bit of its middle byte flipped: one byte of a code object's machine code."""
    return code[:len(code) // 2] + bytes([code[len(code) // 2] ^ 1]) + code[len(code) // 2 + 1:]


def _proved(doc: dict) -> list[str]:
    """The keys a report JIT-checked, each with its code object from its band and its launch compared."""
    return sorted(r["key"] for r in doc["reports"] if {"band", "jit", "launch"} <= set(r["checks"]) and r["ok"])


@pytest.mark.faults
def test_a_sample_of_a_shipped_folder_is_proven_from_its_bands(shipped):
    code, doc = _verify("--dir", shipped, "--against-jit", *SAMPLE)
    assert code == 0, doc["failures"]
    assert doc["jit_checked"] == 2 and _proved(doc) == PICKED
    # each fresh proof agreed with the one the folder carries (verified.json, made on another machine)
    assert all("proof" in r["checks"] for r in doc["reports"] if r["key"] in PICKED)


def test_a_sample_of_its_wheel_is_proven_and_recorded_without_touching_it(shipped, wheel):
    before = hashlib.sha256(wheel.read_bytes()).hexdigest()
    code, doc = _verify("--wheel", wheel, "--against-jit", "--record", *SAMPLE)
    assert code == 0, doc["failures"]
    assert doc["jit_checked"] == 2 and _proved(doc) == PICKED
    recorded = doc["recorded"][room_name(ARCH, RELEASE)]
    assert recorded["version"] == 4 and set(PICKED) <= set(recorded["keys"])
    for key in PICKED:  # this run's proofs: evidence of the JIT run and of both launches
        assert set(recorded["keys"][key]["evidence"]) >= {"artifact_sha256", "module_sha256", "launch_sha256"}
    assert hashlib.sha256(wheel.read_bytes()).hexdigest() == before
    assert str(wheel.resolve()) + "!" in doc["dir"]  # the report names the wheel, not its scratch copy


@pytest.mark.faults
def test_an_edited_band_fails_naming_the_key_and_nothing_is_checked(shipped, tmp_path):
    d = Path(shutil.copytree(shipped, tmp_path / "edited"))
    room = Room(d, ARCH, RELEASE)
    key = PICKED[0]
    band = room.lib / room.links().band_of[key].file
    data = bytearray(band.read_bytes())
    data[len(data) // 2] ^= 0x01
    band.write_bytes(bytes(data))
    code, doc = _verify("--dir", d, "--against-jit", "--key", key)
    assert code == 1 and doc["jit_checked"] == 0
    (own,) = [f for f in doc["failures"] if f["key"] == key]
    assert "band" in own["error"] and own["fix"].startswith(f"copy {d} again")
    assert any("asked to check against vLLM's JIT, but no key was checked" in f["error"] for f in doc["failures"])


@pytest.mark.faults
def test_a_shipped_proof_that_is_not_this_runs_is_named_field_by_field(shipped, tmp_path):
    d = Path(shutil.copytree(shipped, tmp_path / "forged"))
    path = Room(d, ARCH, RELEASE).verified_path
    doc = json.loads(path.read_text())
    key = PICKED[1]
    doc["keys"][key]["evidence"]["artifact_sha256"] = "12" * 32
    path.write_text(json.dumps(doc))
    code, report = _verify("--dir", d, "--against-jit", "--key", key)
    assert code == 1
    (own,) = [f for f in report["failures"] if f["key"] == key]
    assert own["what"] == "proof" and "evidence.artifact_sha256 (1212121212121212, " in own["error"]


@pytest.mark.faults
def test_a_proof_under_another_flydsl_is_compared_and_a_sample_compares_a_proof(shipped, tmp_path):
    """Q2 of the fault report at 3f0364f: the room carries one proof, of
    PICKED[1], labelled FlyDSL 0.5.0 and with a forged artifact digest. A
    sample of one key (by its seed, PICKED[0], which has no proof) holds a
    key the room carries a proof of instead, and that proof is compared
    though this run's FlyDSL is another (the digests do not depend on it)."""
    d = Path(shutil.copytree(shipped, tmp_path / "relabelled"))
    path = Room(d, ARCH, RELEASE).verified_path
    doc = json.loads(path.read_text())
    proof = doc["keys"][PICKED[1]]
    proof["jit"]["flydsl_version"] = "0.5.0"
    proof["evidence"]["artifact_sha256"] = "12" * 32
    doc["keys"], doc["flydsl"] = {PICKED[1]: proof}, {}
    path.write_text(json.dumps(doc))
    code, report = _verify("--dir", d, "--against-jit", "--sample", "1", "--seed", "9")
    assert code == 1 and report["jit_checked"] == 1, report["failures"]
    (own,) = [f for f in report["failures"] if f["key"] == PICKED[1]]
    assert own["what"] == "proof" and "under FlyDSL 0.5.0" in own["error"]
    assert "evidence.artifact_sha256 (1212121212121212, " in own["error"]


def test_record_never_rewrites_another_pythons_pip_installation(shipped, wheel, tmp_path):
    """Q3 of the fault report at 3f0364f: the wheel installed with ``pip install
    --target T`` (unpacked with its RECORD beside the package), proven and
    recorded by this checkout's dsv41-aot: the run prints the record and
    writes nothing into T."""
    target = tmp_path / "T"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(target)
    before = {f: f.read_bytes() for f in target.rglob("*") if f.is_file()}
    code, doc = _verify("--dir", target / "dsv41_aot" / "kernels_prebuilt", "--against-jit", "--record",
                        "--key", PICKED[0])
    assert code == 0, doc["failures"]
    assert PICKED[0] in doc["recorded"][room_name(ARCH, RELEASE)]["keys"]
    assert {f: f.read_bytes() for f in target.rglob("*") if f.is_file()} == before


@pytest.mark.faults
def test_a_code_object_the_cached_jit_answer_disagrees_with_is_blamed_not_the_cache(shipped, tmp_path):
    """Q11 of the fault report at 3f0364f: PICKED[0]'s GPU code object altered
    in its band (one byte of its code, every digest updated: the offline checks
    pass). Its JIT answer is in the build cache; the JIT runs again to decide
    (a cache only saves work), agrees with the cache, and the prebuilt code
    object is what fails: the cache record is kept and not blamed."""
    code, _ = _verify("--dir", shipped, "--against-jit", "--key", PICKED[0])  # the JIT answer, now in the cache
    assert code == 0
    cache = Path(os.environ["DSV41_AOT_BUILD_CACHE"]) / "v1" / "jit"
    records = {p: p.read_bytes() for p in cache.rglob("*.json") if json.loads(p.read_bytes())["key"] == PICKED[0]}
    d = Path(shutil.copytree(shipped, tmp_path / "altered"))

    replace_code_object(d, ARCH, RELEASE, PICKED[0], lambda code, codes: _flipped(code))
    code, report = _verify("--dir", d, "--against-jit", "--key", PICKED[0])
    assert code == 1
    (own,) = [f for f in report["failures"] if f["key"] == PICKED[0]]
    assert own["error"].startswith("GPU code object differs: prebuilt") and own["what"] == "entry"
    assert not [w for w in report["warnings"] if "cache record" in w], report["warnings"]
    assert all(p.is_file() and json.loads(p.read_bytes())["sha256"] == json.loads(b)["sha256"]
               for p, b in records.items()) and records


def test_a_cached_jit_answer_the_jit_run_disagrees_with_is_dropped_from_the_cache(shipped, tmp_path):
    """The other half of Q11: the build cache's JIT answer for PICKED[0] is the wrong one (one byte of its machine
    code flipped, its record naming the altered blob by its sha256: an intact record of another answer). The
    prebuilt code object disagrees with it, so the JIT runs again to decide; its answer agrees with the prebuilt
    one, so the key passes, and the cache record is what is blamed: named in a warning and rewritten with the
    JIT's answer. A private cache seeded from the session's, which other tests read."""
    code, _ = _verify("--dir", shipped, "--against-jit", "--key", PICKED[0])  # the JIT answer, now in the cache
    assert code == 0
    session, cache = Path(os.environ["DSV41_AOT_BUILD_CACHE"]) / "v1", tmp_path / "cache" / "v1"
    good = {}  # each of its records (one per build identity the session ran it under) -> its right answer's sha256
    for record in (session / "jit").rglob("*.json"):
        rec = json.loads(record.read_bytes())
        if rec["key"] != PICKED[0]:
            continue
        bad = _flipped((session / "blobs" / rec["sha256"]).read_bytes())
        mine = cache / record.relative_to(session)
        for path, data in ((cache / "blobs" / hashlib.sha256(bad).hexdigest(), bad),
                           (mine, json.dumps(dict(rec, sha256=hashlib.sha256(bad).hexdigest())).encode())):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        good[mine] = rec["sha256"]

    code, report = _verify("--dir", shipped, "--against-jit", "--key", PICKED[0], "--cache", cache.parent)
    assert code == 0, report["failures"]
    (said,) = [w for w in report["warnings"] if "cache record" in w]
    (mine,) = [p for p in good if f" {p} " in said]
    assert said == f"{PICKED[0]} (vLLM {RELEASE}): cache record {mine} disagrees with this JIT run's answer; " \
                   "built again", said
    assert json.loads(mine.read_bytes())["sha256"] == good[mine]  # the JIT's answer is stored in its place


def test_gfx950_tp2_covers_every_launch_vllm_can_ask_for():
    root = deployment("gfx950-tp2")
    for release, want in (("0.33.0", 768), ("0.32.0", 240)):
        r = cli("coverage", "--arch", "gfx950", "--tp", "2", "--dir", root, "--release", release, "--json")
        doc = json.loads(r.stdout)
        assert r.returncode == 0 and doc["failed"] == 0 and doc["keys"] == doc["ok"] == want, doc["failures"][:3]
