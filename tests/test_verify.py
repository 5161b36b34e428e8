"""``dsv41-aot verify``: integrity of a prebuilt directory, and AOT = JIT.

The slow tests build the ``smoke`` profile with the real builder (both vLLM
releases' keys, one room a release), then rebuild its keys through each
release's own vLLM runner and FlyDSL's JIT (compile only, no GPU) and compare
the GPU code objects byte for byte.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import replace
from importlib.metadata import version
from pathlib import Path

import pytest
from _smoke import REPO, SMOKE_RELEASE_KEYS, cli, deployment, forge_library, stand_in_entry

from dsv41_aot import commands, linkrecord, source, verdict
from dsv41_aot.aot import jit, matrix, verify
from dsv41_aot.aot.integrity import kernarg_problems
from dsv41_aot.elf import SHT_DYNAMIC, Elf, exported_parts
from dsv41_aot.errors import ToolchainError
from dsv41_aot.facts.releases import NEWEST
from dsv41_aot.keys import BuildKey
from dsv41_aot.manifest import LIB, LIBS_JSON, Manifest, abi_id, sha256_file
from dsv41_aot.room import Room, room_dir

ALL = sum(map(len, SMOKE_RELEASE_KEYS.values()))  # smoke keys of every release

SMOKE = matrix.load().select("smoke")  # BuildKeys: each with its release


@pytest.fixture(scope="module")
def smoke(smoke_jit) -> Path:
    return smoke_jit


@pytest.fixture
def copy(smoke, tmp_path) -> Path:
    """A private copy of the smoke build, free to damage."""
    return Path(shutil.copytree(smoke, tmp_path / "prebuilt"))


@pytest.mark.slow
def test_against_jit_passes_on_smoke(copy):
    proc = cli("verify", "--dir", copy, "--against-jit", "--record", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert (report["failed"], report["failures"], report["ok"]) == (0, [], ALL)
    assert report["jit_checked"] == ALL
    assert {(r["release"], r["key"]) for r in report["reports"]} == {(k.release, str(k)) for k in SMOKE}
    assert all("jit" in r["checks"] and r["ok"] for r in report["reports"])
    assert all("launch" in r["checks"] for r in report["reports"])  # both releases' launches compared
    # each room's proof is in the room, and its keys were JIT-built by that
    # release's own mono package (the matrix's digest of the release)
    m = matrix.load()
    modules = []
    for arch, release in {(k.arch, k.release) for k in SMOKE}:
        recs = Room(copy, arch, release).proof().keys
        assert set(recs) == {str(k) for k in SMOKE if (k.arch, k.release) == (arch, release)}
        assert {r.jit["mono_sources"] for r in recs.values()} == {m.releases[release]}
        assert {r.jit["release"] for r in recs.values()} == {release}
        assert all(r.evidence is not None for r in recs.values())  # what only the JIT run produced
        assert all("mono_dir" not in r.jit for r in recs.values())
        assert all(r.evidence.launch_sha256 for r in recs.values())  # the launch both made
        path = room_dir(copy / arch, release) / jit.VERIFIED
        assert str(REPO).encode() not in path.read_bytes() and b"site-packages" not in path.read_bytes()
        modules += [r.evidence.module_sha256 for r in recs.values()]
    # each compile's own evidence: no two keys (two K2 of one arch and kind included) share a module digest
    assert len(set(modules)) == len(modules) == ALL and None not in modules
    assert not (copy / "gfx950" / jit.VERIFIED).exists()


@pytest.mark.slow
@pytest.mark.faults
def test_the_fix_for_a_proof_that_differs_works_the_first_time(copy):
    """Q8 of the fault report at 3f0364f: a key's recorded proof carries
    forged artifact and module digests. verify --against-jit fails it naming
    both, each with the recorded and the run's value, and prints a fix; that
    fix, run once word for word, records this run's proof in its place,
    names the one it replaced in a warning, and exits 0."""
    key = "k1@gfx950:s=4,tp=4,r=1"  # its JIT answer is in the session's build cache (smoke_jit)
    cli("verify", "--dir", copy, "--against-jit", "--record", "--key", key, check=True)
    path = Room(copy, "gfx950", NEWEST).verified_path
    doc = json.loads(path.read_text())
    doc["keys"][key]["evidence"].update(artifact_sha256="12" * 32, module_sha256="34" * 32)
    path.write_text(json.dumps(doc))
    r = cli("verify", "--dir", copy, "--against-jit", "--key", key)
    differs = (r"differs from this JIT run's \(recorded under FlyDSL [0-9.]+, now\): "
               r"evidence\.artifact_sha256 \((12){8}, [0-9a-f]{16}\), "
               r"evidence\.module_sha256 \((34){8}, [0-9a-f]{16}\)$")
    assert r.returncode == 1 and re.search(differs, r.stdout, re.M), r.stdout + r.stderr
    (fix,) = [line[len("fix: "):] for line in r.stderr.splitlines() if line.startswith("fix: ")]
    argv = shlex.split(fix)
    assert argv[:2] == ["dsv41-aot", "verify"] and "--record" in argv
    assert argv[argv.index("--key") + 1] == key  # this key alone: not a JIT build of each key of the room
    r = cli(*argv[1:])
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{key} (vLLM {NEWEST}): its proof in verified.json differs" in r.stderr
    assert "replaced by this run's proof" in r.stderr
    assert Room(copy, "gfx950", NEWEST).proof().keys[key].evidence.artifact_sha256 != "12" * 32


@pytest.mark.slow
def test_flipped_byte_fails_with_its_key(copy):
    man = Room(copy, "gfx942", "0.33.0").manifest()
    key = "k2@gfx942:s=4,tp=4,r=1"
    path = man.object_path(key)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    proc = cli("verify", "--dir", copy)
    assert proc.returncode == 1
    assert f"FAILED 0.33.0  {key}" in proc.stdout and "does not match its manifest sha256" in proc.stdout
    assert proc.stdout.count("FAILED") == 1
    assert f"fix: dsv41-aot build --release 0.33.0 --out {copy} --key {key}" in proc.stderr


@pytest.mark.slow
def test_swapped_object_with_updated_sha_is_caught(copy):
    """An object replaced by another key's, manifest sha256 updated to match:
    the checksum passes, the export and code object checks do not."""
    from dsv41_aot.manifest import sha256_file

    man = Room(copy, "gfx950", "0.32.0").manifest()
    victim, donor = "k1@gfx950:s=4,tp=4,r=1", "k2@gfx950:s=4,tp=4,r=1"
    shutil.copyfile(man.object_path(donor), man.object_path(victim))
    man.entries[victim] = man.entries[victim].replace(sha256=sha256_file(man.object_path(victim)),
                                                      bytes=man.object_path(victim).stat().st_size)
    man.write()
    proc = cli("verify", "--dir", copy, "--json")
    assert proc.returncode == 1
    report = json.loads(proc.stdout)
    (own,) = [f for f in report["failures"] if f["file"] is None]  # the entry's own check
    assert (own["key"], own["release"]) == (victim, "0.32.0")
    assert own["fix"] == f"dsv41-aot build --release 0.32.0 --out {copy} --key {victim}"
    # and the room's libs.json still links the key from the object it was linked from
    (linked,) = [f for f in report["failures"] if f["file"] is not None]
    assert (linked["key"], linked["release"]) == (victim, "0.32.0")
    assert linked["fix"] == f"dsv41-aot link --dir {copy} --arch gfx950 --release 0.32.0"
    (bad,) = [r for r in report["reports"] if r["key"] == victim and r["release"] == "0.32.0"]
    assert any("is not an export of entry" in p for p in bad["problems"]), bad


@pytest.mark.slow
def test_compare_jit_names_every_difference(smoke, tmp_path):
    """The comparison itself, on real code objects: a JIT answer holding
    another key's code object differs in bytes, kernel name and kernargs."""
    man = Room(smoke, "gfx950", NEWEST).manifest()
    k1, k2 = "k1@gfx950:s=4,tp=4,r=1", "k2@gfx950:s=4,tp=4,r=1"
    code = {k: exported_parts(man.object_path(k).read_bytes(), man.entries[k].entry)[1] for k in (k1, k2)}
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


def test_sample_is_seeded_per_room(tmp_path):
    man = Manifest(tmp_path / "gfx950", "gfx950", entries={f"k1@gfx950:s={s},tp=4,r=1": {} for s in range(1, 21)}, release=NEWEST)
    a = verify.choose_keys(man, None, 3, seed=0)
    assert len(a) == 3 and a == verify.choose_keys(man, None, 3, seed=0)
    assert verify.choose_keys(man, None, 3, seed=1) != a or verify.choose_keys(man, None, 3, seed=2) != a
    assert verify.choose_keys(man, None, 50, seed=0) == sorted(man.entries)
    assert verify.choose_keys(man, ["k1@gfx950:s=2,tp=4,r=1", "k2@gfx942:s=4,tp=4,r=1"], None, 0) == ["k1@gfx950:s=2,tp=4,r=1"]
    old = Manifest(tmp_path / "gfx950", "gfx950", entries=dict(man.entries), release="0.32.0")
    draws = {tuple(verify.choose_keys(m, None, 3, seed=s)) for m in (man, old) for s in range(4)}
    assert len(draws) > 4  # the rooms of one arch draw apart


def test_bad_input_exits_2(tmp_path):
    proc = cli("verify", "--dir", tmp_path)
    assert proc.returncode == 2 and "holds no prebuilt architecture" in proc.stderr
    # an arch folder of the old layout (manifest.json beside objects/) holds no room
    (tmp_path / "gfx950").mkdir()
    (tmp_path / "gfx950" / "manifest.json").write_text("{}")
    proc = cli("verify", "--dir", tmp_path)
    assert proc.returncode == 2 and "vllm-<release>/manifest.json" in proc.stderr
    # a --sample without --against-jit would be ignored: refused, naming the fix
    proc = cli("verify", "--dir", tmp_path, "--sample", "2")
    assert proc.returncode == 2 and "without --against-jit" in proc.stderr and "--against-jit --sample 2" in proc.stderr


@pytest.mark.slow
def test_unknown_key_and_bad_sample_exit_2(smoke):
    proc = cli("verify", "--dir", smoke, "--key", "k1@gfx950:s=7,tp=4,r=1")
    assert proc.returncode == 2 and "does not hold" in proc.stderr and "k1@gfx950:s=7,tp=4,r=1 (vLLM 0.33.0)" in proc.stderr
    # a smoke key string of 0.33.0 that 0.32.0's room does not hold
    proc = cli("verify", "--dir", smoke, "--release", "0.32.0", "--key", "k2@gfx950:s=44,tp=4,r=1")
    assert proc.returncode == 2 and "k2@gfx950:s=44,tp=4,r=1 (vLLM 0.32.0)" in proc.stderr
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
    rooms = sorted({(k.arch, k.release) for k in SMOKE})
    assert report["jit_checked"] == len(rooms) == 3 and sorted((r["arch"], r["release"]) for r in jit) == rooms
    assert report["keys"] == ALL  # integrity still covers every key


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
    path = room_dir(copy / "gfx950", "0.32.0") / "libs.json"
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
    assert f"FAILED {named} (vLLM 0.32.0)" in proc.stdout, proc.stdout
    fix = f"fix: dsv41-aot link --dir {copy} --arch gfx950 --release 0.32.0"
    assert fix in proc.stderr
    # every key's own object is fine (no key line fails): the link is what is wrong, and the keys it
    # serves are counted failed with it
    assert not [ln for ln in proc.stdout.splitlines() if ln.startswith("FAILED") and str(copy) not in ln]
    assert re.search(r"\): [1-9]\d* failed; [1-9]\d* library problems", proc.stdout), proc.stdout
    assert cli("link", "--dir", copy, "--arch", "gfx950").returncode == 0
    assert cli("verify", "--dir", copy).returncode == 0


def test_mixed_source_identities_fail(copy):
    man = Room(copy, "gfx942", "0.33.0").manifest()
    key = sorted(man.entries)[0]
    man.entries[key] = man.entries[key].replace(source=replace(man.entries[key].source, mono_sources="0" * 16))
    man.write()
    proc = cli("verify", "--dir", copy, "--json")
    assert proc.returncode == 1
    (f,) = json.loads(proc.stdout)["failures"]
    assert f["file"] == str(copy / "gfx942" / "vllm-0.33.0" / "manifest.json") and key in f["error"]
    assert "2 source identities" in f["error"] and f["release"] == "0.33.0"
    # P11a of the fault report at 24a0152: the fix says which source it keeps, never silently
    assert "the fix rebuilds them from the installed vLLM" in f["error"] and "--vllm-src" in f["error"]
    # the fix rebuilds the keys that differ, from this release's tree
    assert f["fix"] == f"dsv41-aot build --release 0.33.0 --out {copy} --key {key}"


@pytest.mark.faults
def test_record_under_an_unsupported_flydsl_writes_nothing(copy, tmp_path):
    """P13a of the fault report at 24a0152: refused (exit 2) before a corrupt
    verified.json is set aside or an empty record written."""
    fake = tmp_path / "site" / "flydsl-9.9.9.dist-info"
    fake.mkdir(parents=True)
    (fake / "METADATA").write_text("Metadata-Version: 2.1\nName: flydsl\nVersion: 9.9.9\n")
    verified = Room(copy, "gfx942", "0.33.0").verified_path
    verified.write_text("{ not json")
    before = sorted(p.name for p in verified.parent.iterdir())
    proc = subprocess.run([sys.executable, "-m", "dsv41_aot.cli", "verify", "--dir", str(copy), "--against-jit",
                           "--record", "--key", sorted(Room(copy, "gfx942", "0.33.0").manifest().entries)[0],
                           "--release", "0.33.0", "--no-progress"], capture_output=True, text=True, cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=str(tmp_path / "site")))
    assert proc.returncode == 2 and "FlyDSL 9.9.9 is installed" in proc.stderr, proc.stderr
    assert verified.read_text() == "{ not json" and sorted(p.name for p in verified.parent.iterdir()) == before


def _rebuilt_under_another_flydsl(copy: Path, key: str) -> str:
    """Make ``key``'s object what a build under the other supported FlyDSL writes, and relink.

    Under FlyDSL 0.4.2 and 0.5.0 the export differs only in the version its
    metadata names (the GPU code object is the same); returns that version."""
    from dsv41_aot.manifest import sha256_file

    man = Room(copy, "gfx942", "0.33.0").manifest()
    e = man.entries[key]
    have = e.source.flydsl_version
    other = "0.5.0" if have != "0.5.0" else "0.4.2"
    data = man.object_path(key).read_bytes()
    at = data.index(have.encode(), data.index(b"flydsl_version"))
    data = data[:at] + other.encode() + data[at + len(have):]
    new = copy / "gfx942" / "objects" / f"{hashlib.sha256(data).hexdigest()}.o"
    new.write_bytes(data)
    man.entries[key] = e.replace(object=f"objects/{new.name}", sha256=sha256_file(new), bytes=len(data),
                                 source=replace(e.source, flydsl_version=other))
    man.write()
    assert cli("link", "--dir", copy, "--arch", "gfx942").returncode == 0
    return other


@pytest.mark.faults
def test_entries_that_differ_only_in_toolchain_are_one_source(copy):
    """P3 of the fault report at 24a0152: a room holding keys built under two
    FlyDSL releases (each kept its object, its GPU code object unchanged) is
    what docs/building.md allows and the loader serves; verify agrees."""
    key = sorted(Room(copy, "gfx942", "0.33.0").manifest().entries)[0]
    _rebuilt_under_another_flydsl(copy, key)
    proc = cli("verify", "--dir", copy, "--json")
    assert not [f for f in json.loads(proc.stdout)["failures"] if "source identities" in f["error"]]
    assert proc.returncode == 0, proc.stdout


@pytest.mark.faults
def test_an_entry_naming_another_flydsl_than_its_export_fails(copy):
    """P11d of the fault report at 24a0152: an entry (or a build cache's
    record) may not pass one FlyDSL's object off as another's."""
    man = Room(copy, "gfx942", "0.33.0").manifest()
    key = sorted(man.entries)[0]
    have = man.entries[key].source.flydsl_version
    man.entries[key] = man.entries[key].replace(source=replace(man.entries[key].source, flydsl_version="0.0.1"))
    man.write()
    proc = cli("verify", "--dir", copy, "--json")
    (f,) = [f for f in json.loads(proc.stdout)["failures"] if f["key"] == key]
    assert proc.returncode == 1 and f"built by FlyDSL {have}, its identity says 0.0.1" in f["error"]


# ---------------------------------------------------------------- rooms (no build)


def test_a_mixed_room_left_by_a_stopped_build_carries_its_options(copy):
    """The mixed-source fix carries the options (--matrix, --vllm-src) the
    arch's unfinished build recorded (N9d), and builds every key with them."""
    from dsv41_aot import pending

    man = Room(copy, "gfx942", "0.33.0").manifest()
    key = sorted(man.entries)[0]
    man.entries[key] = man.entries[key].replace(source=replace(man.entries[key].source, mono_sources="0" * 16))
    man.write()
    matrix_file, tree = copy.parent / "m" / "build_matrix.yaml", copy.parent / "t" / "vllm-0.33.0"
    (tree / source.MONO_REL).mkdir(parents=True)  # a vLLM tree: a record naming any other folder is not echoed
    matrix_file.parent.mkdir()
    matrix_file.write_text((REPO / "build_matrix.yaml").read_text())
    opts = ["--matrix", str(matrix_file), "--vllm-src", str(tree)]
    pending.write(copy / "gfx942", {"0.33.0": sorted(man.entries)}, opts)
    (f,) = json.loads(cli("verify", "--dir", copy, "--json").stdout)["failures"]
    # every key from the stopped build's tree: those already of it are up to date and kept (Q5)
    assert f["fix"] == commands.build(copy, release="0.33.0", keys=sorted(man.entries), options=opts)


@pytest.mark.faults
@pytest.mark.parametrize("how", ["truncated", "version 2", "a bad key", "an unknown release", "no keys",
                                 "an option a build never records", "a matrix that is not there", "a shell word"])
def test_a_record_of_a_stopped_build_that_cannot_be_used_is_named_never_echoed(copy, how):
    """P10 of the fault report at 24a0152: the record is checked when read; a
    bad one is a warning whose fix removes it, and no printed fix carries it."""
    import json as _json

    from dsv41_aot import pending

    arch_dir = copy / "gfx942"
    built = sorted(Room(copy, "gfx942", "0.33.0").manifest().entries)
    doc = {"version": 1, "options": [], "keys": {"0.33.0": built + ["k1@gfx942:s=9,tp=4,r=0"]}}
    if how == "version 2":
        doc["version"] = 2
    elif how == "a bad key":
        doc["keys"]["0.33.0"].append("k9@gfx942:nonsense")
    elif how == "an unknown release":
        doc["keys"] = {"0.99.0": built}
    elif how == "no keys":
        doc["keys"] = {"0.33.0": []}
    elif how == "an option a build never records":
        doc["options"] = ["--out", str(copy.parent / "elsewhere")]
    elif how == "a matrix that is not there":
        doc["options"] = ["--matrix", str(copy.parent / "missing.yaml")]
    elif how == "a shell word":
        doc["options"] = ["--no-cache; touch /tmp/dsv41-pwned"]
    text = _json.dumps(doc)
    (arch_dir / pending.PENDING).write_text(text[: len(text) // 2] if how == "truncated" else text)
    proc = cli("verify", "--dir", copy, "--json")
    report = json.loads(proc.stdout)
    (w,) = [w for w in report["warnings"] if pending.PENDING in w]
    assert w.endswith(f"remove it: rm {shlex.quote(str(arch_dir / pending.PENDING))}"), w
    assert not any("9,tp=4" in f for f in report["fixes"]) and "stopped (or is running)" not in " ".join(
        report["warnings"])
    assert pending.asked(arch_dir) == {} and pending.options(arch_dir) == []


def test_keys_a_stopped_build_did_not_build_are_a_warning_naming_it(copy):
    """A build's record of the keys it was asked for, some not in its room:
    verify warns, naming the build that finishes it with its options (N9f)."""
    from dsv41_aot import pending

    built = sorted(Room(copy, "gfx942", "0.33.0").manifest().entries)
    extra = "k1@gfx942:s=9,tp=4,r=0"
    pending.write(copy / "gfx942", {"0.33.0": built + [extra]}, ["--no-cache"])
    proc = cli("verify", "--dir", copy, "--json")
    assert proc.returncode == 0, proc.stdout
    (w,) = [w for w in json.loads(proc.stdout)["warnings"] if pending.PENDING in w or "stopped" in w]
    assert "1 of the" in w and w.endswith(commands.build(copy.resolve(), release="0.33.0", keys=built + [extra], options=["--no-cache"]))
    pending.write(copy / "gfx942", {"0.33.0": built}, ["--no-cache"])  # every key it asked for is built: silent
    assert not [w for w in json.loads(cli("verify", "--dir", copy, "--json").stdout)["warnings"] if "stopped" in w]


@pytest.fixture
def shipped_copy(tmp_path) -> Path:
    """A copy of the shared gfx942 TP4 deployment (one room, no objects) whose path needs quoting in a shell."""
    return Path(shutil.copytree(deployment("gfx942-tp4"), tmp_path / "it's a copy"))


@pytest.mark.faults
def test_strays_and_a_record_naming_no_vllm_tree_get_fixes_that_run_word_for_word(shipped_copy, tmp_path):
    """Q15 of the fault report at 3f0364f: a folder in lib/ is called a
    folder (its fix rm -r); a stopped build's --vllm-src naming a folder that
    holds no vLLM tree is never echoed into a "finish it" command; and each rm
    fix is quoted for the shell (the path holds a space and a quote)."""
    from dsv41_aot import pending

    arch_dir = shipped_copy / "gfx942"
    (arch_dir / LIB / "sub dir").mkdir()
    (arch_dir / LIB / "sub dir" / "x").write_text("x\n")
    (arch_dir / ".left.tmp").write_text("")  # what a killed atomic write leaves
    # a key the room lacks (TP 8), and a folder that holds no vLLM tree
    pending.write(arch_dir, {NEWEST: ["k1@gfx942:s=1,tp=8,r=0"]}, ["--any-key", "--vllm-src", str(tmp_path)])
    proc = cli("verify", "--dir", shipped_copy, "--json")
    report = json.loads(proc.stdout)
    (f,) = [f for f in report["failures"] if "sub dir" in (f["file"] or "")]
    assert proc.returncode == 1 and f"{arch_dir}/{LIB}/sub dir/ is a folder no room names" in f["error"], f
    (w,) = [w for w in report["warnings"] if pending.PENDING in w]
    assert f"--vllm-src {str(tmp_path)!r} names no vLLM tree" in w and "finish it" not in str(report["warnings"])
    fixes = [f["fix"]] + [w.split("remove it: ")[1] for w in report["warnings"] if "remove it: " in w]
    assert len(fixes) == 3 and fixes[0].startswith("rm -r "), fixes
    for fix in fixes:
        subprocess.run(fix, shell=True, check=True)
    proc = cli("verify", "--dir", shipped_copy, "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["warnings"] == [], proc.stdout


@pytest.mark.faults
def test_a_cache_that_is_a_file_is_no_folder_and_json_carries_every_warning(shipped_copy, tmp_path):
    """Q15 of the fault report at 3f0364f: --cache <file> said each key's
    record "does not match its blob", and --json's warnings lacked the
    recording HIP's, which stderr showed. The JIT worker is stopped as it
    starts (--key-timeout): only the warnings are looked at, no JIT build."""
    afile = tmp_path / "afile"
    afile.write_text("x\n")
    proc = cli("verify", "--dir", shipped_copy, "--against-jit", "--key", "k1@gfx942:s=3,tp=4,r=0", "--cache", afile,
               "--key-timeout", "0.01", "--jobs", "1", "--no-progress", "--json")
    warnings = json.loads(proc.stdout)["warnings"]
    assert proc.returncode == 1 and f"build cache {afile} is not a folder: nothing is stored there" in warnings[0]
    assert f"build cache {afile} cannot hold the recording HIP" in warnings[1] and len(warnings) == 2, warnings
    assert [line for line in proc.stderr.splitlines() if line.startswith("warning: ")] == \
        [f"warning: {w}" for w in warnings], proc.stderr


@pytest.mark.parametrize("room_folder", [False, True])
def test_a_build_stopped_before_its_manifest_is_finished_by_the_fix(tmp_path, room_folder):
    """No manifest yet (no room folder, or one a killed manifest write left):
    verify's fix is the stopped build's own keys and options, not a default
    profile (N9f)."""
    from dsv41_aot import pending

    key = "k1@gfx950:s=1,tp=2,r=0"
    pending.write(tmp_path / "gfx950", {"0.33.0": [key]}, ["--any-key", "--no-cache"])
    if room_folder:  # killed in its manifest's atomic write: the objects it compiled are stored
        (tmp_path / "gfx950" / "vllm-0.33.0").mkdir()
        (tmp_path / "gfx950" / "objects").mkdir()
    proc = cli("verify", "--dir", tmp_path)
    assert proc.returncode in (1, 2) and "Traceback" not in proc.stderr, proc.stderr
    want = commands.build(tmp_path.resolve() if not room_folder else tmp_path, release="0.33.0", keys=[key],
                          options=["--any-key", "--no-cache"])
    assert f"fix: {want}" in proc.stderr, proc.stderr


def code_object(kernel: str) -> bytes:
    """A stand-in GPU code object: an AMDGPU ELF whose only dynamic symbol is kernel ``kernel``'s descriptor."""
    import struct

    dynstr, shstr = f"\0{kernel}.kd\0".encode(), b"\0.dynsym\0.dynstr\0.shstrtab\0"
    dynsym = bytes(24) + struct.pack("<IBBHQQ", 1, 0x11, 0, 1, 0, 64)
    body = dynsym + dynstr + shstr
    at = [64, 64 + len(dynsym), 64 + len(dynsym) + len(dynstr)]
    head = b"\x7fELF\x02\x01\x01" + bytes(9) + struct.pack("<HHIQQQIHHHHHH", 3, 224, 1, 0, 0, 64 + len(body), 0,
                                                                  64, 0, 0, 64, 4, 3)
    sections = [bytes(64)] + [struct.pack("<IIQQQQIIQQ", name, kind, 0, 0, off, size, link, 0, 1, ent)
                              for name, kind, off, size, link, ent in ((1, 11, at[0], len(dynsym), 2, 24),
                                                                       (9, 3, at[1], len(dynstr), 0, 0),
                                                                       (17, 3, at[2], len(shstr), 0, 0))]
    return head + body + b"".join(sections)


def _room(root: Path, arch: str, release: str, keys: list, band: bytes | None = b"band", kernels=None) -> Manifest:
    """A room whose manifest names ``keys`` (objects/ there, its objects
    absent) and, with ``band``, a libs.json linking them all from one xz band
    in the arch's lib/: a stand-in shared library built by the C compiler
    with the SONAME link gives a library of those objects, an empty
    function of each key's entry name and a stand-in GPU code object of its
    kernel, or of ``kernels[key]`` (what the room reads from a band), holding
    ``band`` as a string so that two bands differ."""
    import lzma

    man = Manifest(root / arch, arch, release=release)
    (root / arch / "objects").mkdir(parents=True, exist_ok=True)
    codes = {}
    for text in keys:
        entry = stand_in_entry(text, release, sha256=f"{len(text):064x}")
        codes[text] = code_object((kernels or {}).get(text, entry["symbol"]))
        man.put(dict(entry, code_object_sha256=hashlib.sha256(codes[text]).hexdigest()), [])
    man.write()
    if band is not None:
        (root / arch / LIB).mkdir(parents=True, exist_ok=True)
        chunk = f"libdsv41_{arch}_{release.replace('.', '_')}"
        members = {k: man.entries[k].sha256 for k in keys}
        so_name = linkrecord.soname(chunk, members)
        src = root / f".{chunk}.c"
        src.write_text(f"const char dsv41_band_note[] = {json.dumps(band.decode())};\n"
                       + "".join(f"void {man.entries[k].entry}(void) {{}}\nint {man.entries[k].entry}__module_load(int d) "
                                 f"{{ return d; }}\nconst unsigned char {man.entries[k].entry}__kernels_binary[] = "
                                 f"{{{', '.join(map(str, codes[k]))}}};\n" for k in keys))
        lib = src.with_suffix(".so")
        subprocess.run(["cc", "-shared", "-fPIC", "-nostdlib", f"-Wl,-soname,{so_name}", "-o", str(lib), str(src)],
                       check=True, capture_output=True)
        raw = lib.read_bytes()
        src.unlink()
        lib.unlink()
        data = lzma.compress(raw, format=lzma.FORMAT_XZ)
        name = linkrecord.band_file(chunk, hashlib.sha256(data).hexdigest())
        (root / arch / LIB / name).write_bytes(data)
        doc = {"schema": 2, "arch": arch, "release": release, "libraries": [
            {"chunk": chunk, "file": name, "sha256": sha256_file(root / arch / LIB / name),
             "bytes": len(data), "raw_sha256": hashlib.sha256(raw).hexdigest(),
             "raw_bytes": len(raw), "entries": members}]}
        (man.room / LIBS_JSON).write_text(json.dumps(doc))
    return man


KEYS = ["k1@gfx950:s=4,tp=4,r=1", "k2@gfx950:s=4,tp=4,r=1"]


def test_libs_json_is_checked_per_room(tmp_path):
    new = _room(tmp_path, "gfx950", "0.33.0", KEYS + ["k1@gfx950:s=4,tp=4,r=1,f=0"])
    old = _room(tmp_path, "gfx950", "0.32.0", KEYS, band=b"another band")

    def problems(release: str) -> list:
        return verdict.problems(Room(tmp_path, "gfx950", release), objects=False)

    assert problems("0.33.0") == problems("0.32.0") == []
    path = old.room / LIBS_JSON
    good = json.loads(path.read_text())

    def failures(doc) -> list:
        path.write_text(json.dumps(doc))
        return problems("0.32.0")

    # a 0.32.0 key linked from another object than its room's manifest names
    doc = json.loads(json.dumps(good))
    doc["libraries"][0]["entries"][KEYS[1]] = "f" * 64
    link, band = failures(doc)  # and the band was not linked from that object either
    assert link.key == KEYS[1] and "links it from object ffffffffffffffff" in link.message and link.serving
    assert band.what == "band" and "was not linked from the objects libs.json names" in band.message
    # the 0.33.0 room's libs.json copied into the 0.32.0 room
    (f,) = failures(json.loads((new.room / LIBS_JSON).read_text()))
    assert "vLLM '0.33.0' in the gfx950 vLLM 0.32.0 folder" in f.message and f.file == str(path)
    # a band named outside the arch's lib/
    doc = json.loads(json.dumps(good))
    doc["libraries"][0]["file"] = "../objects/libdsv41_x.so.xz"
    assert any("not a band file of lib/" in f.message for f in failures(doc))
    # a band altered after linking; a key linked that the room does not hold
    doc = json.loads(json.dumps(good))
    (tmp_path / "gfx950" / LIB / doc["libraries"][0]["file"]).write_bytes(b"altered")
    doc["libraries"][0]["entries"]["ffn@gfx950:s=4,tp=4,r=0"] = "0" * 64
    errors = [f.message for f in failures(doc)]
    assert any("does not match the sha256 in libs.json" in e for e in errors)
    assert any("ffn@gfx950:s=4,tp=4,r=0 is linked" in e for e in errors)
    # the other room is untouched by all of it
    assert problems("0.33.0") == []
    path.unlink()
    (f,) = problems("0.32.0")
    assert "missing" in f.message and f.what == "libs"


def test_a_shipped_rooms_key_linked_from_another_object_is_restored_not_relinked(tmp_path):
    """Without objects/ nothing relinks a room: a key whose band links another object than its manifest names is
    a disagreement of the records shipped together, and the fix copies the room again."""
    _room(tmp_path, "gfx950", "0.33.0", KEYS)
    shutil.rmtree(tmp_path / "gfx950" / "objects")
    room = Room(tmp_path, "gfx950", "0.33.0")
    doc = json.loads(room.libs_path.read_text())
    doc["libraries"][0]["entries"][KEYS[1]] = "f" * 64
    room.libs_path.write_text(json.dumps(doc))
    (link,) = [p for p in verdict.problems(room, objects=False) if p.what == "link"]
    assert link.key == KEYS[1] and link.message.endswith("the installed manifest and libraries disagree")
    assert link.fix == room.fix_restore and link.fix.startswith(f"copy {tmp_path} again")


def test_an_unreadable_proof_record_is_a_proof_failure_the_room_still_serves(tmp_path):
    """verified.json cut short: verify names it as the room's proof problem, which the loader never reads (it
    serves the room), and whose fix proves the room again."""
    _room(tmp_path, "gfx950", "0.33.0", KEYS)
    room = Room(tmp_path, "gfx950", "0.33.0")
    room.verified_path.write_text('{"version": 4, "keys": {')
    r = cli("verify", "--dir", tmp_path, "--json")
    (proof,) = [f for f in json.loads(r.stdout)["failures"] if f["file"] == str(room.verified_path)]
    assert r.returncode == 1 and (proof["what"], proof["serving"], proof["release"]) == ("proof", False, "0.33.0")
    assert "--against-jit --record" in proof["fix"], proof


def test_each_room_whose_manifest_cannot_be_read_is_a_failure_of_its_own(tmp_path):
    """Two rooms of one folder, each manifest unreadable: verify names both
    manifests, each with its release and fix (its keys cannot be checked)."""
    rooms = [_room(tmp_path, "gfx950", release, KEYS, band=None) for release in ("0.33.0", "0.32.0")]
    for man in rooms:
        man.path.write_text("{")
    r = cli("verify", "--dir", tmp_path, "--json")
    assert r.returncode == 1, r.stdout + r.stderr
    failures = json.loads(r.stdout)["failures"]
    assert sorted((f["file"], f["release"]) for f in failures) == sorted((str(m.path), m.release) for m in rooms)
    assert all("malformed JSON" in f["error"] and f["fix"] for f in failures), failures


@pytest.mark.faults
def test_a_band_whose_code_object_lacks_its_kernel_fails_the_rooms_verdict(tmp_path):
    """Q1 of the fault report at 3f0364f, in a room built here: the band holds
    the code object the manifest names for a key, but that code object
    defines another kernel. The room's verdict (verify, the wheel gate, link,
    doctor) names the key, the band and both kernels; the fix relinks."""
    other = "_ZN5aiter34dsv41_mono_k1_s4_tp4_r2_tl0_f1_i0E"
    _room(tmp_path, "gfx950", "0.33.0", KEYS, kernels={KEYS[0]: other})
    (p,) = verdict.problems(Room(tmp_path, "gfx950", "0.33.0"), objects=False)
    assert (p.what, p.key, p.serving) == ("band", KEYS[0], True) and p.file.endswith(p.band)
    assert f"defines kernel {other}, not {BuildKey.parse(KEYS[0], NEWEST).kernel_symbol}" in p.message
    assert p.fix.startswith("dsv41-aot link")


def test_a_code_object_whose_kernels_cannot_be_read_is_named_unreadable(tmp_path):
    """A band holding a key's code object whole (its section headers at its end) whose symbol table lies past its
    end (the tamper matrix's garbled code object): the key's kernel problem says so, naming the key, no crash."""
    from _tamper import garbled

    entry = _room(tmp_path, "gfx950", NEWEST, KEYS[:1], band=None).entries[KEYS[0]]
    code = code_object(entry.symbol)
    assert linkrecord.kernel_problem({entry.code_object_sha256: code}, entry, NEWEST) is None
    why = linkrecord.kernel_problem({entry.code_object_sha256: garbled(code)}, entry, NEWEST)
    assert why.startswith(f"holds {KEYS[0]}'s GPU code object "), why
    assert "defines kernel unreadable (not a whole GPU code object (" in why and why.endswith("would fail"), why


def test_reports_and_failures_carry_the_release(tmp_path):
    _room(tmp_path, "gfx950", "0.33.0", KEYS)
    _room(tmp_path, "gfx950", "0.32.0", KEYS[:1])
    proc = cli("verify", "--dir", tmp_path, "--json")
    doc = json.loads(proc.stdout)
    assert proc.returncode == 1 and doc["keys"] == 3
    assert sorted((r["release"], r["key"]) for r in doc["reports"]) == sorted(
        [("0.33.0", k) for k in KEYS] + [("0.32.0", KEYS[0])])
    own = [f for f in doc["failures"] if f["file"] is None]  # objects absent: every key fails its own check
    assert {(f["release"], f["key"]) for f in own} == {(r["release"], r["key"]) for r in doc["reports"]}
    assert f"dsv41-aot build --release 0.32.0 --out {tmp_path} --key {KEYS[0]}" in [f["fix"] for f in own]
    # --release keeps one release's rooms and names the release of --key
    doc = json.loads(cli("verify", "--dir", tmp_path, "--release", "0.32.0", "--json").stdout)
    assert {r["release"] for r in doc["reports"]} == {"0.32.0"} and doc["keys"] == 1
    proc = cli("verify", "--dir", tmp_path, "--release", "0.32.0", "--key", KEYS[1])
    assert proc.returncode == 2 and f"{KEYS[1]} (vLLM 0.32.0)" in proc.stderr and "--release 0.32.0" in proc.stderr
    proc = cli("verify", "--dir", tmp_path, "--key", KEYS[1], "--json")
    assert [r["release"] for r in json.loads(proc.stdout)["reports"]] == ["0.33.0"]


def test_shards_are_cut_across_releases():
    m = matrix.load()
    keys = [k for i in range(3) for k in m.choose("smoke", shard=f"{i}/3")]
    assert sorted(keys) == sorted(m.select("smoke")) and {k.release for k in keys} == {"0.33.0", "0.32.0"}
    only = m.choose("smoke", release="0.32.0", shard="0/1")
    assert only and {k.release for k in only} == {"0.32.0"}


def test_an_empty_shard_against_jit_fails_saying_so(tmp_path):
    """More shards than keys: a shard that holds none proves nothing, and says so rather than pass."""
    _room(tmp_path, "gfx950", "0.33.0", KEYS)
    m, n = matrix.load(), len(SMOKE) + 1
    empty = next(i for i in range(n) if not m.choose("smoke", shard=f"{i}/{n}"))
    proc = cli("verify", "--dir", tmp_path, "--against-jit", "--profile", "smoke", "--shard", f"{empty}/{n}", "--json")
    doc = json.loads(proc.stdout)
    assert proc.returncode == 1 and doc["jit_checked"] == 0 and not doc["reports"], proc.stdout + proc.stderr
    (f,) = doc["failures"]
    assert f["error"].endswith("no key was checked: the shard asked for holds no key") and "fewer shards" in f["fix"]
    assert {k: v for k, v in f.items() if k not in ("error", "fix")} == {  # a proof not made: the room still serves
        "key": None, "release": None, "file": str(tmp_path), "what": "jit", "serving": False}


def test_a_room_that_holds_no_key_against_jit_fails_with_its_build(tmp_path):
    """A room a build left with no key (each one refused by the kernel source) proves nothing: the failure says
    so, and its fix is the room's build, whose output names each refusal."""
    _room(tmp_path, "gfx950", "0.33.0", [], band=None)
    proc = cli("verify", "--dir", tmp_path, "--against-jit", "--json")
    doc = json.loads(proc.stdout)
    assert proc.returncode == 1 and doc["jit_checked"] == 0 and not doc["reports"], proc.stdout + proc.stderr
    (f,) = doc["failures"]
    assert f["error"].endswith("no key was checked: the rooms checked hold no key"), f
    assert f["fix"] == f"dsv41-aot build --release 0.33.0 --arch gfx950 --out {tmp_path}", f


def test_a_release_tree_with_other_kernels_is_refused(tmp_path):
    """--against-jit takes each release's tree by its matrix digest: a tree
    that says 0.32.0 but holds other mono sources is bad input, naming both."""
    m = matrix.load()
    good = source.release_trees({"0.32.0"}, m.releases, ())["0.32.0"]
    assert good.digest == m.releases["0.32.0"] and good.version == "0.32.0"
    tree = Path(shutil.copytree(good.root, tmp_path / "tree"))
    layer = tree / "vllm/models/deepseek_v41/amd/mono/layer.py"
    layer.write_text(layer.read_text() + "\n# patched\n")
    with pytest.raises(ToolchainError) as e:
        source.release_trees({"0.32.0"}, m.releases, (tree,))
    assert e.value.exit_code == 2 and m.releases["0.32.0"] in str(e.value)


@pytest.mark.slow
def test_against_jit_checks_exactly_the_keys_asked_for_across_arches(smoke):
    """--key naming one key of each arch on a folder of two arches and two
    releases: exactly those two are JIT-checked (a room none of whose keys
    was named checks none, never all)."""
    asked = ["k1@gfx950:s=4,tp=4,r=1", "k1@gfx942:s=4,tp=4,r=1"]
    proc = cli("verify", "--dir", smoke, "--against-jit", "--key", *asked, "--jobs", "2", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["jit_checked"] == 2
    assert sorted(r["key"] for r in report["reports"]) == sorted(asked)
    assert all(r["release"] == "0.33.0" and "jit" in r["checks"] for r in report["reports"])


# Imported at the start of every Python the verify run starts (sitecustomize on its PYTHONPATH), its JIT
# workers included: each JIT answer loses the evidence of its run, as an answer from a broken worker would.
_ANSWERS_WITHOUT_EVIDENCE = """
from dsv41_aot.aot import worker

_serve = worker.serve


def serve(arch, start, answer, **kw):
    return _serve(arch, start, lambda state, key: dict(answer(state, key), evidence=None), **kw)


worker.serve = serve
"""


@pytest.mark.slow
def test_a_jit_answer_without_the_evidence_of_its_run_fails_its_key_and_proves_nothing(copy, tmp_path):
    """A JIT answer that carries no evidence of its run (the artifact's and module's sha256, when, the launch)
    shows nothing the JIT did: the key fails naming what is missing, and no proof of it is recorded."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_ANSWERS_WITHOUT_EVIDENCE)
    key = "k1@gfx950:s=4,tp=4,r=1"  # the cheapest JIT build
    proc = cli("verify", "--dir", copy, "--against-jit", "--record", "--key", key, "--no-cache", "--json",
               env=dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{hook}"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (rep,) = json.loads(proc.stdout)["reports"]
    assert rep["key"] == key and not rep["ok"] and "launch" not in rep["checks"], rep
    assert "the JIT answer carries no evidence of its run (artifact / module sha256, time)" in rep["problems"], rep
    path = Room(copy, "gfx950", NEWEST).verified_path
    assert not path.exists() or key not in json.loads(path.read_text())["keys"]


@pytest.mark.slow
def test_jit_proofs_come_from_the_build_cache_and_say_so(smoke, tmp_path):
    """A key JIT-built once under a build identity is compared with the
    cached JIT code object next time (jit_cached counts it); a cached code
    object that does not match its record is dropped, said, and the JIT run
    again, never trusted. (--no-cache runs the JIT though the cache holds
    the answer: tests/test_workers.py's two-job verify.)"""
    key = "k1@gfx942:s=4,tp=4,r=1"
    cache = tmp_path / "cache"

    def run(*extra) -> tuple[dict, str]:
        proc = cli("verify", "--dir", smoke, "--against-jit", "--key", key, "--json", *extra)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return json.loads(proc.stdout), proc.stderr

    first, _ = run("--cache", cache)
    assert (first["jit_checked"], first["jit_cached"]) == (1, 0)
    again, err = run("--cache", cache)
    assert (again["jit_checked"], again["jit_cached"]) == (1, 1)
    seconds = [r["reports"][0]["jit_seconds"] for r in (first, again)]  # the JIT build's, kept with its answer
    assert seconds[0] > 0 and seconds[1] == pytest.approx(seconds[0], abs=0.001), seconds
    # its progress on stderr (stdout is the JSON): one key, cached answers counted too
    assert re.search(r"verify --against-jit: 100%.* 1/1 \[.*key/s\]", err), err
    assert again["reports"][0]["jit_cached"] and again["reports"][0]["ok"]
    (blob,) = (cache / "v1" / "blobs").iterdir()
    blob.write_bytes(blob.read_bytes()[:-1] + bytes([blob.read_bytes()[-1] ^ 1]))
    healed, err = run("--cache", cache)
    assert (healed["jit_checked"], healed["jit_cached"]) == (1, 0) and healed["reports"][0]["ok"]
    assert "does not match its blob" in err
    assert run("--cache", cache)[0]["jit_cached"] == 1  # the JIT run wrote a sound entry back
    # a proof recorded from the cached answer names the JIT run that made it: its release's tree, this FlyDSL
    d = Path(shutil.copytree(smoke, tmp_path / "prebuilt"))
    proc = cli("verify", "--dir", d, "--against-jit", "--key", key, "--json", "--record", "--cache", cache)
    assert proc.returncode == 0 and json.loads(proc.stdout)["jit_cached"] == 1, proc.stdout + proc.stderr
    ran = Room(d, "gfx942", "0.33.0").proof().keys[key].jit
    assert (ran["release"], ran["mono_sources"]) == ("0.33.0", matrix.load().releases["0.33.0"]), ran
    assert ran["vllm_version"].startswith("0.33.0") and ran["flydsl_version"] == version("flydsl"), ran


@pytest.mark.slow
def test_what_the_wheel_gate_refuses_fails_verify_and_counts_per_key(copy):
    """A band file no room names (the wheel gate refuses it) fails verify
    with link as its fix, which removes it; a corrupt band fails the keys it
    links in the ok count; a key's own failure says what it is; a killed
    write's temporary file is named."""
    lib = copy / "gfx950" / LIB
    band = sorted(lib.glob("*.so.xz"))[0]
    stray = lib / "libdsv41_stray.0123456789ab.so.xz"
    shutil.copyfile(band, stray)
    left = room_dir(copy / "gfx950", NEWEST) / ".manifest.json.abc123.tmp"
    left.write_text("{")
    proc = cli("verify", "--dir", copy, "--json")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    (f,) = [f for f in doc["failures"] if f["file"] == str(stray)]
    assert f["what"] == "band" and f["fix"] == f"dsv41-aot link --dir {copy} --arch gfx950"
    assert any(str(left) in w for w in doc["warnings"])
    assert cli("link", "--dir", copy, "--arch", "gfx950").returncode == 0 and not stray.exists()
    left.unlink(missing_ok=True)
    assert cli("verify", "--dir", copy).returncode == 0

    data = bytearray(band.read_bytes())
    data[len(data) // 2] ^= 1
    band.write_bytes(bytes(data))
    doc = json.loads(cli("verify", "--dir", copy, "--json").stdout)
    (bad,) = [f for f in doc["failures"] if f["file"] == str(band)]
    assert bad["what"] == "band" and bad["serving"] and bad["keys"]
    assert doc["ok"] == doc["keys"] - len(bad["keys"]) and doc["failed"] >= 1
    man = Room(copy, "gfx942", NEWEST).manifest()
    man.object_path(sorted(man.entries)[0]).unlink()
    doc = json.loads(cli("verify", "--dir", copy, "--json").stdout)
    (own,) = [f for f in doc["failures"] if f["key"] == sorted(man.entries)[0] and f["file"] is None]
    assert (own["what"], own["serving"]) == ("object", False)


@pytest.mark.faults
def test_an_orphan_object_warning_carries_the_fix_that_removes_it(copy):
    """A stored object no room names is a warning whose fix, run word for
    word, removes it (P13g of the fault report at 24a0152: it had none)."""
    orphan = copy / "gfx950" / "objects" / ("0" * 64 + ".o")
    orphan.write_bytes(b"left by an interrupted build")
    proc = cli("verify", "--dir", copy, "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (warning,) = [w for w in json.loads(proc.stdout)["warnings"] if orphan.name in w]
    fix = warning.rsplit(": ", 1)[1]
    assert fix == f"rm {orphan}", warning
    subprocess.run(fix.split(), check=True)
    proc = cli("verify", "--dir", copy, "--json")
    assert proc.returncode == 0 and not [w for w in json.loads(proc.stdout)["warnings"] if orphan.name in w]


# ---------------------------------------------------------------- a shipped room, changed where only one check looks


def _shipped_room(tmp_path: Path) -> Room:
    """A writable copy of one room of the shared gfx950 TP4 deployment (vLLM
    0.32.0: bands and records, no objects/), with the bands it links."""
    src = Room(deployment("gfx950-tp4"), "gfx950", "0.32.0")
    room = Room(tmp_path / "prebuilt", "gfx950", "0.32.0")
    room.dir.mkdir(parents=True)
    room.lib.mkdir()
    for f in src.dir.iterdir():
        shutil.copyfile(f, room.dir / f.name)
    for band in src.links().bands:
        shutil.copyfile(src.lib / band.file, room.lib / band.file)
    return room


def _verify_json(root: Path) -> tuple[int, dict, str]:
    proc = cli("verify", "--dir", root, "--json", "--no-progress")
    return proc.returncode, json.loads(proc.stdout), proc.stderr


@pytest.mark.faults
@pytest.mark.parametrize("change", ["an int32 slot made int64", "a scalar slot dropped"])
def test_a_shipped_manifest_abi_its_band_s_kernel_does_not_take_fails(tmp_path, change):
    """A shipped room's manifest gives a key an ABI (its id recomputed, so the
    manifest parses) whose int32 slot is int64, or which lacks a scalar
    slot: only the kernargs of the code object in the key's band can tell
    (S03), and verify fails naming the key and the slot or the count."""
    room = _shipped_room(tmp_path)
    key = "ffn@gfx950:s=1,tp=4,r=0"
    path = room.dir / "manifest.json"
    doc = json.loads(path.read_text())
    abi = [dict(s) for s in doc["abis"][doc["entries"][key]["abi"]]]
    i = next(i for i, s in enumerate(abi) if s["ctype"] == "int32")
    scalars = sum(s["name"] != "stream" for s in abi)
    if change == "a scalar slot dropped":
        del abi[i]
        said = f"ABI has {scalars - 1} scalar slots, the kernel {scalars} kernargs"
    else:
        abi[i].update(ctype="int64", size=8)
        said = f"slot {i} {abi[i]['name']}: ABI int64 (8 bytes), kernarg by_value 4 bytes"
    doc["abis"][abi_id(abi)] = abi
    doc["entries"][key]["abi"] = abi_id(abi)
    path.write_text(json.dumps(doc))
    code, doc, _ = _verify_json(room.root)
    assert code == 1, doc["failures"]
    (f,) = doc["failures"]
    assert f["key"] == key and said in f["error"], f["error"]
    assert doc["ok"] == doc["keys"] - 1


def test_each_key_s_report_names_the_checks_it_passed(smoke_dir, tmp_path):
    """verify --json lists, per key, the checks its entry passed, in order: a
    built room's stored object (its sha256, its export, its resources), a
    shipped room's band (the code object in it, its resources)."""
    code, doc, _ = _verify_json(smoke_dir)
    assert code == 0 and {tuple(r["checks"]) for r in doc["reports"]} == {("sha256", "export", "resources")}, doc
    code, doc, _ = _verify_json(_shipped_room(tmp_path).root)
    assert code == 0 and {tuple(r["checks"]) for r in doc["reports"]} == {("band", "resources")}, doc


def test_kernargs_past_the_kernarg_segment_are_named():
    """The kernel's own metadata, judged beside the ABI: kernargs that end past
    the segment the launch allocates (a code object no compiler should make;
    only a forged one can) are named, and one that ends exactly at it is sound."""
    abi = [{"name": "n", "ctype": "int64", "size": 8}, {"name": "stream", "ctype": "hipStream_t", "size": 8}]
    res = {"args": [{"offset": 0, "size": 8, "value_kind": "by_value"}], "kernarg_bytes": 8}
    assert kernarg_problems(abi, res) == []
    assert kernarg_problems(abi, dict(res, kernarg_bytes=4)) == ["kernargs end at 8 bytes, kernarg segment is 4"]


@pytest.mark.faults
def test_a_band_whose_dynamic_table_runs_past_its_end_fails_naming_it(tmp_path):
    """A band (its digests in libs.json made to match) whose library's
    dynamic table runs past the end of the file: verify fails naming the
    band and its keys, exit 1, never an internal error (S20)."""
    import lzma
    import struct

    room = _shipped_room(tmp_path)
    path = room.dir / LIBS_JSON
    doc = json.loads(path.read_text())
    lib = doc["libraries"][0]
    raw = bytearray(lzma.decompress((room.lib / lib["file"]).read_bytes()))
    i = next(i for i, s in enumerate(Elf(bytes(raw)).sections) if s.type == SHT_DYNAMIC)
    shoff, shentsize = struct.unpack_from("<Q", raw, 40)[0], struct.unpack_from("<H", raw, 58)[0]
    struct.pack_into("<Q", raw, shoff + i * shentsize + 24, len(raw) - 8)  # its sh_offset: 8 bytes before the end
    forge_library(room.root, room.arch, path, doc, lib, raw)
    code, report, err = _verify_json(room.root)
    assert code == 1 and "Traceback" not in err, err
    (f,) = [f for f in report["failures"] if f["file"] == str(room.lib / lib["file"])]
    assert f["what"] == "band" and f["serving"] and sorted(f["keys"]) == sorted(lib["entries"]), f
    assert report["ok"] == report["keys"] - len(lib["entries"])


@pytest.mark.faults
def test_a_manifest_entry_under_a_key_spelled_another_way_fails_and_its_fix_works(smoke_dir, tmp_path):
    """A manifest entry filed under a key written out of its canonical order,
    its key and C entry rewritten to match: no reader ever asks for that
    spelling, so the manifest is refused (exit 1) naming the entry and its
    key as written; the printed fix, run word for word, recovers the room's
    entries from its objects and verify then passes."""
    d = Path(shutil.copytree(smoke_dir, tmp_path / "prebuilt"))
    key, spelled = "k1@gfx950:s=4,tp=4,r=1", "k1@gfx950:tp=4,s=4,r=1"
    path = Room(d, "gfx950", NEWEST).manifest_path
    doc = json.loads(path.read_text())
    doc["entries"][spelled] = dict(doc["entries"].pop(key), key=spelled, entry="dsv41_k1_gfx950_tp4_s4_r1")
    path.write_text(json.dumps(doc))
    code, report, _ = _verify_json(d)
    (f,) = report["failures"]
    assert code == 1 and f["file"] == str(path) and f["release"] == NEWEST, report["failures"]
    assert f"entry {spelled} is not written as its key is ({key})" in f["error"], f
    r = cli(*shlex.split(f["fix"])[1:])
    assert r.returncode == 0 and f"entry {spelled} is not written" in r.stderr, r.stdout + r.stderr
    assert _verify_json(d)[0] == 0 and key in Room(d, "gfx950", NEWEST).manifest().entries


@pytest.mark.faults
def test_a_shipped_key_no_band_links_fails_naming_it_and_the_record(tmp_path):
    """A shipped room whose libs.json lists a key in no band (its entry kept in the manifest): with no
    objects/ its code object can come only from a band, so verify fails the key naming libs.json, with the
    room's restore as the fix (nothing relinks a shipped room)."""
    room = _shipped_room(tmp_path)
    key = "ffn@gfx950:s=1,tp=4,r=0"
    doc = json.loads(room.libs_path.read_text())
    (band,) = [b for b in doc["libraries"] if key in b["entries"]]
    del band["entries"][key]
    room.libs_path.write_text(json.dumps(doc))
    code, report, _ = _verify_json(room.root)
    assert code == 1
    errors = {f["error"]: f["fix"] for f in report["failures"] if f["key"] == key}
    said = f"{key} is in no band of {room.libs_path}"
    assert said in errors and errors[said] == room.fix_relink == room.fix_restore, errors


@pytest.mark.faults
@pytest.mark.parametrize("how", ["no band links it", "its band links another object"])
def test_a_key_its_band_does_not_link_from_its_object_fails_with_the_relink(smoke_dir, tmp_path, how):
    """libs.json, edited as a link that ran before the key's last build leaves it: the key missing from its
    band, or linked from another object. verify fails the key naming libs.json, with the relink as the fix
    (the object is the manifest's)."""
    d = Path(shutil.copytree(smoke_dir, tmp_path / "prebuilt"))
    room = Room(d, "gfx950", NEWEST)
    key = "k1@gfx950:s=4,tp=4,r=1"
    doc = json.loads(room.libs_path.read_text())
    (band,) = [b for b in doc["libraries"] if key in b["entries"]]
    if how == "no band links it":
        del band["entries"][key]
        said = f"{key} (vLLM {NEWEST}) is in {room.manifest_path} but no library of {room.libs_path} links it"
    else:
        band["entries"][key] = "ab" * 32
        # both digests cut to the same 16 characters
        said = (f"{key} (vLLM {NEWEST}): not linked from its object: {room.libs_path} links it from object "
                f"{'ab' * 8}, {room.manifest_path} records object sha256 {room.manifest().entries[key].sha256[:16]}")
    room.libs_path.write_text(json.dumps(doc))
    code, report, _ = _verify_json(d)
    assert code == 1
    (f,) = [f for f in report["failures"] if f["key"] == key]
    assert f["error"].startswith(said) and f["error"].endswith("the object was rebuilt after the last link"), f
    assert f["fix"] == room.link_cmd, f


@pytest.mark.faults
def test_proofs_without_jit_evidence_are_warned_of_with_the_command_that_proves_them(tmp_path):
    """A shipped room whose verified.json is version 1 (no evidence only a JIT run produces), as the shared
    deployment's vLLM 0.32.0 room is: verify passes, warning of the proofs and naming the command that proves
    the room from its bands."""
    room = _shipped_room(tmp_path)
    doc = json.loads(room.verified_path.read_text())
    assert doc["version"] == 1
    code, report, _ = _verify_json(room.root)
    assert code == 0, report["failures"]
    (said,) = [w for w in report["warnings"] if w.startswith(f"{room.verified_path}: ")]
    assert f"{len(doc['keys'])} proof(s) carry no evidence only a JIT run produced" in said, said
    assert said.endswith(f"; the room ships without objects/: prove them from its bands, {room.prove_cmd}"), said
