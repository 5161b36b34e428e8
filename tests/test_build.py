"""The builder for real: FlyDSL compiles on this CPU, for both arches and
both vLLM releases (each from its own tree), into per-(arch, release) rooms."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time

import pytest
from _smoke import OLD, REPO, SMOKE_KEYS, SMOKE_RELEASE_KEYS, copy_of, room, run_cli

from dsv41_aot import cli, elf, source
from dsv41_aot.aot import buildroom, matrix, toolchain
from dsv41_aot.errors import ToolchainError
from dsv41_aot.facts import flydsl
from dsv41_aot.facts.releases import NEWEST
from dsv41_aot.keys import BuildKey
from dsv41_aot.manifest import BAND_SUFFIX, LIB, LIBS_JSON, sha256_file
from dsv41_aot.room import Room
from dsv41_aot.listing import built_rooms

GOLDEN = REPO / "tests" / "data" / "golden_code_objects.txt"
CHEAP = ["k1@gfx950:s=1,tp=2,r=0", "k1@gfx942:s=1,tp=4,r=0"]  # ~3 s each
CHEAP_OLD = "k1@gfx950:s=1,tp=2,r=1"  # a vLLM 0.32.0 key (its K1 has ratio 1 or 2)
# four K1 widths of one arch and one library chunk, about 2 s of compile each
K1S = [f"k1@gfx950:s={s},tp=2,r=0" for s in (1, 2, 3, 4)]
# ABI slots of each launch kind, the stream last: counted in export_to_c's
# metadata of vLLM 0.33.0's launchers (K1 41, K2 55, FFN 31 parameters) and
# of vLLM 0.32.0's (K1 39, K2 48, FFN 30)
ABI_SLOTS = {NEWEST: {"k1": 41, "k2": 55, "ffn": 31}, OLD: {"k1": 39, "k2": 48, "ffn": 30}}
ALL_SMOKE = sum(map(len, SMOKE_RELEASE_KEYS.values()))  # every release's smoke keys
DIGESTS = matrix.load().releases


def golden() -> dict:
    out = {}
    for line in GOLDEN.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, sha, size = line.split()
            out[key] = (sha, int(size))
    return out


def build_json(*keys, out, check=True, **run) -> dict:
    """``dsv41-aot build --key KEYS --out OUT --json --jobs 1``: the summary.

    One worker: a second one's start (torch, FlyDSL and vLLM imported, about
    2.5 s of CPU) costs more than it saves on a few K1s."""
    code, stdout, stderr = run_cli("build", "--key", *keys, "--out", out, "--json", "--no-progress", "--jobs", "1",
                                   check=check, **run)
    return json.loads(stdout)


@pytest.mark.slow
def test_smoke_build_reproduces_the_golden_code_objects(smoke_dir):
    """Re-hash the GPU code object inside every stored object (not the
    digest the manifest recorded) and compare with the golden list."""
    want = golden()
    seen: dict = {}  # release -> key -> (code object sha256, bytes)
    for r in built_rooms(smoke_dir):
        arch_dir, release = r.arch_dir, r.release
        m = r.manifest()
        assert m.mono_sources == DIGESTS[release]
        for key, e in m.entries.items():
            data = (arch_dir / e.object).read_bytes()
            assert hashlib.sha256(data).hexdigest() == e.sha256, key
            meta, code = elf.exported_parts(data, e.entry)
            got = seen.setdefault(release, {})[key] = (hashlib.sha256(code).hexdigest(), len(code))
            assert (e.code_object_sha256, e.code_object_bytes) == got, f"{key}: the manifest misstates its code object"
            meta = json.loads(meta)
            bk = BuildKey.parse(key, release)
            assert meta["arch"] == arch_dir.name == bk.arch
            assert bk.kernel_symbol in {s.name for s in elf.Elf(code).symbols()}
            # each release from its own tree, with the digest the matrix records for it
            assert (e.source.vllm_version, e.source.mono_sources) == (release, DIGESTS[release])
            assert e.source.helpers["impl"] == "dsv41_aot.compat"  # the label manifests carry
            assert e.source.flydsl_version == flydsl.installed().version  # the installed FlyDSL
            assert e.bytes <= 160_000, "stripped objects stay small"
            abi = m.abi(key)
            assert abi[-1] == {"name": "stream", "ctype": "pointer", "size": 8}
            assert len(abi) == ABI_SLOTS[release][e.kind], key
            assert all((a["ctype"], a["size"]) in {("int64", 8), ("int32", 4)} for a in abi[:-1]), key
    assert DIGESTS[NEWEST] == source.find().digest  # the installed vLLM is the newest release
    assert sorted(seen[NEWEST]) == SMOKE_KEYS and sorted(seen[OLD]) == sorted(SMOKE_RELEASE_KEYS[OLD])
    # the project's own aiter helpers give upstream's code objects, byte for byte
    assert {k: seen[NEWEST].get(k) for k in want} == want
    # the kernels changed between releases: the same key string, other code
    for key, code in seen[OLD].items():
        assert code != seen[NEWEST][key], key


@pytest.mark.slow
def test_a_second_build_compiles_nothing(smoke_dir):
    before = {p: p.read_bytes() for p in smoke_dir.rglob("*") if p.is_file() and ".lock" not in p.name}
    _, stdout, _ = run_cli("build", "--profile", "smoke", "--out", smoke_dir, "--json", "--no-progress")
    s = json.loads(stdout)
    assert (s["compiled"], s["up_to_date"], s["failed"]) == (0, ALL_SMOKE, 0)
    after = {p: p.read_bytes() for p in smoke_dir.rglob("*") if p.is_file() and ".lock" not in p.name}
    assert before == after


def _tree(root) -> dict:
    """Every file of a prebuilt folder but its lock and timings: path -> bytes."""
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and ".lock" not in p.name and p.name != "timings.json"}


def test_a_build_from_the_build_cache_compiles_nothing_and_gives_the_same_bytes(smoke_dir, tmp_path):
    """The session's build cache (tests/conftest.py) holds the smoke keys
    once any folder built them: new folders get them copied, not compiled,
    byte for byte what a compile gave (objects, manifests, bands, libs.json)."""
    first = tmp_path / "first"
    s = json.loads(run_cli("build", "--profile", "smoke", "--out", first, "--json", "--no-progress")[1])
    assert (s["compiled"] + s["cached"], s["up_to_date"], s["failed"]) == (ALL_SMOKE, 0, 0)
    second = tmp_path / "second"
    _, stdout, stderr = run_cli("build", "--profile", "smoke", "--out", second, "--no-progress")
    assert f"0 compiled, {ALL_SMOKE} from the build cache" in stdout
    assert _tree(second) == _tree(first) == _tree(smoke_dir)
    assert Room(second, "gfx950", NEWEST).manifest().timings == Room(first, "gfx950", NEWEST).manifest().timings  # what compiles took


@pytest.mark.slow
def test_a_damaged_cache_entry_is_compiled_again_never_trusted(tmp_path):
    cache, key = tmp_path / "cache", CHEAP[0]
    s = build_json(key, out=tmp_path / "a", env=dict(os.environ, DSV41_AOT_BUILD_CACHE=str(cache)))
    assert (s["compiled"], s["cached"]) == (1, 0)
    (blob,) = (cache / "v1" / "blobs").iterdir()
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))
    code, stdout, stderr = run_cli("build", "--key", key, "--out", tmp_path / "b", "--cache", cache, "--json",
                                   "--no-progress")
    assert (json.loads(stdout)["compiled"], json.loads(stdout)["cached"]) == (1, 0)
    assert f"warning: {key}" in stderr and "does not match its blob" in stderr
    assert _tree(tmp_path / "b") == _tree(tmp_path / "a")
    s = build_json(key, out=tmp_path / "c", env=dict(os.environ, DSV41_AOT_BUILD_CACHE=str(cache)))
    assert (s["compiled"], s["cached"]) == (0, 1)  # the compile wrote a sound entry back
    # (--no-cache: tests/test_cache.py, where it never even opens the cache)


@pytest.mark.slow
def test_resume_rebuilds_only_missing_or_corrupt_and_is_deterministic(smoke_dir, tmp_path):
    out = tmp_path / "pb"
    shutil.copytree(smoke_dir, out)
    m950 = Room(out, "gfx950", NEWEST).manifest()
    dropped = m950.entries.pop("k1@gfx950:s=4,tp=4,r=1")
    m950.write()
    m942 = Room(out, "gfx942", NEWEST).manifest()
    obj = out / "gfx942" / m942.entries["k1@gfx942:s=4,tp=4,r=1"].object
    data = bytearray(obj.read_bytes())
    data[len(data) // 2] ^= 0xFF
    obj.write_bytes(bytes(data))
    # vLLM 0.32.0's room: its K1 dropped too (the same key string: another entry)
    old = Room(out, "gfx950", OLD).manifest()
    dropped_old = old.entries.pop("k1@gfx950:s=4,tp=4,r=1")
    old.write()
    # compiled for real (--no-cache): same inputs, same bytes is what this proves
    _, stdout, _ = run_cli("build", "--profile", "smoke", "--out", out, "--json", "--no-progress", "--no-cache")
    s = json.loads(stdout)
    assert (s["compiled"], s["up_to_date"]) == (3, ALL_SMOKE - 3)
    # same inputs, same bytes: the rebuilt directory equals the original
    for r in built_rooms(smoke_dir):
        arch_dir, release = r.arch_dir, r.release
        a, b = Room(arch_dir.parent, arch_dir.name, release).manifest(), Room(out, arch_dir.name, release).manifest()
        assert sorted(a.entries) == sorted(b.entries)
        for key in a.entries:
            assert a.entries[key].sha256 == b.entries[key].sha256, key
    assert Room(out, "gfx950", NEWEST).manifest().entries["k1@gfx950:s=4,tp=4,r=1"].sha256 == dropped.sha256
    assert Room(out, "gfx950", OLD).manifest().entries["k1@gfx950:s=4,tp=4,r=1"].sha256 == dropped_old.sha256


# The build in a process group of its own, SIGKILLed (workers and all) at one
# moment of its own: os.replace is where a flush or a library lands, so the
# hook kills right before the rename of the chosen one.
_KILLED_BUILD = """
import os, signal, sys
moment, argv = sys.argv[1], sys.argv[2:]
real, flushes = os.replace, []

def replace(src, dst, *a, **kw):
    name = os.path.basename(os.fspath(dst))
    if moment == "mid-flush" and name == "manifest.json":
        flushes.append(dst)
        if len(flushes) == 2:  # the second flush: its temp file written, not yet renamed
            os.killpg(0, signal.SIGKILL)
    if moment == "during-link" and name.endswith(".so.xz"):  # a library band linked, libs.json not written
        os.killpg(0, signal.SIGKILL)
    return real(src, dst, *a, **kw)

os.replace = replace
from dsv41_aot import cli
sys.exit(cli.main(argv))
"""


def _killed_build(moment: str, keys: list, out) -> dict:
    """Run ``build --key KEYS --jobs 1`` and SIGKILL it at ``moment``; the
    manifest's entries it left (asserting the kill did happen)."""
    argv = ["build", "--key", *keys, "--out", str(out), "--jobs", "1", "--no-progress", "--no-cache"]
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_BUILD, moment, *argv],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    if moment == "mid-compile":
        # wait for a flush that holds some keys but not all, then kill while the
        # worker compiles the next one (one compile is about 2 s)
        manifest, deadline = room(out, "gfx950") / "manifest.json", time.time() + 600
        while time.time() < deadline and proc.poll() is None:
            if manifest.exists() and 1 <= len(Room(out, "gfx950", NEWEST).manifest().entries) < len(keys):
                time.sleep(0.3)
                os.killpg(proc.pid, signal.SIGKILL)
                break
            time.sleep(0.02)
    err = proc.communicate(timeout=600)[1]
    assert proc.returncode == -signal.SIGKILL, f"the build was not interrupted {moment} (exit {proc.returncode}): {err[-2000:]}"
    m = Room(out, "gfx950", NEWEST).manifest(missing_ok=True)  # parses: never torn
    for key in m.entries:
        m.check_object(key)
    return m.entries


@pytest.mark.slow
@pytest.mark.parametrize("moment", ["mid-compile", "mid-flush"])
def test_a_build_killed_mid_flight_resumes_with_what_is_missing(moment, tmp_path):
    """A kill while compiles land keeps the keys already flushed (the manifest
    is written at least once a second, atomically); the rerun compiles exactly
    the keys the killed run had not recorded."""
    out = tmp_path / "pb"
    recorded = _killed_build(moment, K1S, out)
    assert 1 <= len(recorded) < len(K1S), f"killed {moment} with {len(recorded)} of {len(K1S)} keys recorded"
    if moment == "mid-flush":
        # the flush the kill cut short: a temp file holding more than manifest.json
        (torn,) = room(out, "gfx950").glob(".manifest.json.*.tmp")
        assert len(json.loads(torn.read_bytes())["entries"]) > len(recorded)
    s = build_json(*K1S, out=out)
    missing = len(K1S) - len(recorded)
    assert (s["compiled"] + s["cached"], s["up_to_date"], s["failed"]) == (missing, len(recorded), 0)
    m = Room(out, "gfx950", NEWEST).manifest()
    assert sorted(m.entries) == sorted(K1S)
    for key, e in recorded.items():
        assert m.entries[key].sha256 == e.sha256, f"{key} was compiled again"
    for key in m.entries:
        m.check_object(key)
    assert not list((out / "gfx950" / "objects").glob(".*.tmp")), "a finished build leaves no temp files"


@pytest.fixture(scope="module")
def built_k1s(tmp_path_factory):
    """K1S built and linked into a folder of this module's own (copy it to change it)."""
    out = tmp_path_factory.mktemp("k1s") / "pb"
    s = build_json(*K1S, out=out)
    assert (s["compiled"] + s["cached"], s["failed"]) == (len(K1S), 0)
    return out


@pytest.mark.slow
def test_a_build_killed_during_link_relinks_and_compiles_nothing(built_k1s, tmp_path):
    out = copy_of(built_k1s, tmp_path / "pb")
    shutil.rmtree(out / "gfx950" / LIB)
    (room(out, "gfx950") / LIBS_JSON).unlink()
    recorded = _killed_build("during-link", K1S, out)
    assert sorted(recorded) == sorted(K1S)
    libdir = out / "gfx950" / LIB
    record = room(out, "gfx950") / LIBS_JSON
    assert not record.exists(), "killed before libs.json"
    s = build_json(*K1S, out=out)
    assert (s["compiled"], s["up_to_date"], s["failed"], s["libraries"]) == (0, len(K1S), 0, 1)
    libs = json.loads(record.read_bytes())["libraries"]
    assert [sorted(lib["entries"]) for lib in libs] == [sorted(K1S)]
    assert libs[0]["entries"] == {k: e.sha256 for k, e in recorded.items()}
    assert sha256_file(libdir / libs[0]["file"]) == libs[0]["sha256"]
    assert sorted(p.name for p in libdir.glob(f"*{BAND_SUFFIX}")) == [libs[0]["file"]]


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
    built = Room(out, "gfx950", NEWEST).manifest().entries[CHEAP[0]]
    # a checkout without a version is told by its digest: it is 0.33.0's
    assert (built.source.vllm_version, built.source.mono_sources) == ("unknown", src.digest)
    # a second key of the room, built from the same tree
    assert json.loads(run_cli(*args[:2], K1S[1], *args[3:])[1])["failed"] == 0
    layer = root / source.MONO_REL / "layer.py"
    layer.write_text(layer.read_text() + "\n# an edit\n")
    edited = source.mono_digest(root / source.MONO_REL)
    # the edited tree is no release the matrix builds: refused, naming both
    # digests (never passed over for the installed vLLM), nothing rebuilt
    code, _, err = run_cli(*args, check=False)
    assert code == 2 and edited in err and src.digest in err and "mono_sources" in err
    assert Room(out, "gfx950", NEWEST).manifest().entries[CHEAP[0]] == built
    # a matrix recording the edited digest for 0.33.0 rebuilds what it covers
    mx = tmp_path / "build_matrix.yaml"
    mx.write_text((REPO / "build_matrix.yaml").read_text().replace(f"mono_sources: {src.digest}", f"mono_sources: {edited}"))
    # ... but not into a room holding another key of the old digest: refused,
    # naming both digests (one room, one source), nothing rebuilt
    code, _, err = run_cli(*args, "--matrix", mx, check=False)
    assert code == 2 and edited in err and src.digest in err and "two sources" in err
    assert Room(out, "gfx950", NEWEST).manifest().entries[CHEAP[0]] == built
    # ... and so it stays when the old keys carry proofs under this FlyDSL (P1
    # of the fault report at 24a0152): a proof lets a toolchain move through,
    # never another vLLM source
    _prove_by_hand(Room(out, "gfx950", NEWEST))
    code, _, err = run_cli(*args, "--matrix", mx, check=False)
    assert code == 2 and "two sources" in err, err
    assert Room(out, "gfx950", NEWEST).manifest().entries[CHEAP[0]] == built
    # its printed fix carries this build's --matrix and --vllm-src (N9d): run
    # word for word, it rebuilds the room from the edited tree, not the installed vLLM
    (fix,) = [line.split("fix:", 1)[1].split(": ", 1)[1] for line in err.splitlines() if "fix:" in line]
    argv = shlex.split(fix)
    assert argv[:2] == ["dsv41-aot", "build"] and "--json" not in argv, fix
    assert argv[argv.index("--matrix") + 1] == str(mx.resolve()), fix
    assert argv[argv.index("--vllm-src") + 1] == str(root.resolve()), fix
    s = json.loads(run_cli(*argv[1:], "--json", "--no-progress")[1])
    assert s["compiled"] == 2
    e = Room(out, "gfx950", NEWEST).manifest().entries[CHEAP[0]]
    assert e.source.mono_sources == edited
    assert e.source.vllm_version == "unknown"
    assert json.loads(run_cli(*args, "--matrix", mx)[1])["compiled"] == 0


def _prove_by_hand(room) -> None:
    """Give every key of ``room`` a PROVEN proof under its own FlyDSL, written without a JIT run.

    For tests of what a build does with proven keys; the proofs' digests are made up."""
    from dsv41_aot.proof import Evidence, KeyProof, Proof

    man = room.manifest()
    proofs = [KeyProof(k, e.code_object_sha256, {f: getattr(e.source, f) for f in ("vllm_version", "mono_sources",
                                                                       "flydsl_version")} | {"release": room.release},
                       Evidence("a1" * 32, "b2" * 32, "2026-12-02T00:00:00Z"))
              for k, e in man.entries.items()]
    room.verified_path.write_bytes(Proof.of(room.arch, room.release, proofs, man.entries).to_bytes())
    assert Room(room.root, room.arch, room.release).proof().counts(man.entries)["proven"] == len(man.entries)


def _project_copy(tmp_path, edit=None):
    """A copy of this project (the dsv41_aot package and build_matrix.yaml),
    ``edit(root)`` applied: run the CLI from it (``cwd=``) and it, and the
    workers it starts, import the copy."""
    root = tmp_path / "project"
    shutil.copytree(REPO / "dsv41_aot", root / "dsv41_aot", ignore=shutil.ignore_patterns("__pycache__", "kernels_prebuilt"))
    shutil.copy2(REPO / "build_matrix.yaml", root / "build_matrix.yaml")
    if edit:
        edit(root)
    return root


def _append(path, text):
    path.write_text(path.read_text() + text)


def _cut_to_two_keys(out) -> tuple:
    """Cut ``out``'s gfx950 room of K1S to its first two keys A and B: (A, B, the entries left)."""
    m = Room(out, "gfx950", NEWEST).manifest()
    for k in K1S[2:]:
        del m.entries[k]
    m.write()
    return K1S[0], K1S[1], Room(out, "gfx950", NEWEST).manifest().entries


def _only_the_changed_key_rebuilds(out, field, **run) -> str:
    """``out`` holds K1S built by this project as it is, cut to a room of two
    keys A and B. Under a helper change (``run``: the env / cwd
    the CLI runs with), building A alone is refused (the room would hold two
    source identities; the message names the field that differs) and
    changes nothing; A and B together rebuild both, their entries' source
    differing from before in ``field`` only; again, nothing. Returns the new
    ``field``."""
    a, b, before = _cut_to_two_keys(out)
    code, _, err = run_cli("build", "--key", a, "--out", out, "--json", "--no-progress", check=False, **run)
    assert code == 2 and "two sources" in err and field in err and f"--key {a} {b}" in err, err
    assert Room(out, "gfx950", NEWEST).manifest().entries == before
    s = build_json(a, b, out=out, **run)
    assert (s["compiled"], s["up_to_date"], s["failed"]) == (2, 0, 0), f"a changed {field} did not rebuild the room"
    after = Room(out, "gfx950", NEWEST).manifest().entries
    new, old = after[a].source, before[a].source
    assert old.differences(new) == [field] and after[b].source == new
    # the same kernel source and compile: the same GPU code (the object's own
    # bytes may differ: export_to_c records FlyDSL's version in its metadata)
    assert after[a].code_object_sha256 == before[a].code_object_sha256
    s = build_json(a, b, out=out, **run)
    assert (s["compiled"], s["up_to_date"], s["failed"]) == (0, 2, 0)
    return getattr(new, field)


def _a_toolchain_change_keeps_the_same_code(out, **run) -> str:
    """``out`` holds K1S built by this project as it is, cut to a room of two
    keys A and B. Under another FlyDSL or linker (``run``: the env / cwd the
    CLI runs with) that compiles the same GPU code objects
    (aot/toolmove.py): building A alone is refused, as B would stay unproven
    under it, and changes nothing; A and B together compile once each and
    keep their objects and entries. Returns the refusal's message."""
    a, b, before = _cut_to_two_keys(out)
    code, _, err = run_cli("build", "--key", a, "--out", out, "--json", "--no-progress", check=False, **run)
    assert code == 2 and "no proof under this FlyDSL" in err and "build the whole room" in err, err
    assert Room(out, "gfx950", NEWEST).manifest().entries == before
    s = build_json(a, b, out=out, **run)
    # each compiled (or taken from the cache) to tell, and counted so (P13e of the fault report at 24a0152)
    assert (s["compiled"] + s["cached"], s["up_to_date"], s["failed"]) == (2, 0, 0), s
    assert sorted(k["key"] for k in s["toolchain_kept"]) == sorted([a, b]), s
    assert {k["release"] for k in s["toolchain_kept"]} == {NEWEST}, s
    assert s["toolchain_changed"] == [] and Room(out, "gfx950", NEWEST).manifest().entries == before
    return err


@pytest.mark.slow
def test_a_helper_change_rebuilds_only_keys_built_with_other_helpers(built_k1s, tmp_path):
    out = copy_of(built_k1s, tmp_path / "pb")
    compat = "dsv41_aot/aot/compat"
    plumbing = _project_copy(tmp_path / "plumbing", lambda root: _append(root / compat / "__init__.py", "\n# shim plumbing\n"))
    s = build_json(*K1S[:2], out=out, cwd=plumbing)
    assert (s["compiled"], s["up_to_date"]) == (0, 2), "the shim's plumbing is not the helpers: nothing rebuilds"
    helper = _project_copy(tmp_path / "helper", lambda root: _append(root / compat / "dpp_utils.py", "\n# one line more\n"))
    digest = _only_the_changed_key_rebuilds(out, "helpers", cwd=helper)
    assert digest["impl"] == "dsv41_aot.compat"


@pytest.mark.slow
def test_a_linker_change_keeps_keys_whose_code_object_is_the_same(built_k1s, tmp_path):
    """The linker FlyDSL runs is $ROCM_PATH/llvm/bin/ld.lld: the same ld.lld
    found in another folder is the same identity; one that reports another
    version is not, and its keys are judged by their GPU code object."""
    out = copy_of(built_k1s, tmp_path / "pb")
    real = toolchain.llvm_tool("ld.lld")
    bindir = tmp_path / "rocm" / "llvm" / "bin"
    bindir.mkdir(parents=True)
    env = dict(os.environ, ROCM_PATH=str(tmp_path / "rocm"))
    (bindir / "ld.lld").symlink_to(real)
    s = build_json(*K1S[:2], out=out, env=env)
    assert (s["compiled"], s["up_to_date"]) == (0, 2), "the same linker elsewhere rebuilt keys"
    (bindir / "ld.lld").unlink()
    version = "LLD 19.1.8 (compatible with GNU linkers)"
    # another build of lld: its own version line, lld-19's linking
    (bindir / "ld.lld").write_text(f'#!/bin/sh\n[ "$1" = --version ] && {{ echo "{version}"; exit 0; }}\nexec {real} "$@"\n')
    (bindir / "ld.lld").chmod(0o755)
    assert version in _a_toolchain_change_keeps_the_same_code(out, env=env)


def _flydsl_release(root, version):
    """FlyDSL as a ``version`` release would install (the installed FlyDSL's
    modules, its distribution and ``flydsl.__version__`` saying ``version``): a
    release facts/flydsl.py does not list until a test's project copy adds it."""
    import flydsl

    real = os.path.realpath(flydsl.__file__)
    (root / "flydsl").mkdir(parents=True)
    (root / "flydsl" / "__init__.py").write_text(
        f"__path__ = [{os.path.dirname(real)!r}]\n__file__ = {real!r}\n"
        f"exec(compile(open(__file__).read(), __file__, 'exec'))\n__version__ = {version!r}\n"
    )
    (root / f"flydsl-{version}.dist-info").mkdir()
    (root / f"flydsl-{version}.dist-info" / "METADATA").write_text(f"Metadata-Version: 2.1\nName: flydsl\nVersion: {version}\n")
    return root


@pytest.mark.slow
def test_a_flydsl_change_keeps_keys_whose_code_object_is_the_same(built_k1s, tmp_path):
    out = copy_of(built_k1s, tmp_path / "pb")
    env = dict(os.environ, PYTHONPATH=str(_flydsl_release(tmp_path / "flydsl-next", "0.4.3")))
    # the project as it is refuses a FlyDSL its facts table does not list, naming the ones it does ...
    code, _, err = run_cli("build", "--key", K1S[0], "--out", out, "--no-progress", env=env, check=False)
    assert code == 2 and "FlyDSL 0.4.3 is installed" in err and f"FlyDSL {flydsl.supported()}" in err, err
    assert "Traceback" not in err
    # ... and a project whose table lists it (as the installed release does) keeps what compiles the same
    def pin(root):
        _append(root / "dsv41_aot" / "facts" / "flydsl.py",
                f'\nFLYDSL["0.4.3"] = FlyDSLRelease(**dict(vars(FLYDSL[{flydsl.installed().version!r}]), version="0.4.3"))\n')

    pinned = _project_copy(tmp_path, pin)
    assert "0.4.3" in _a_toolchain_change_keeps_the_same_code(out, env=env, cwd=pinned)


@pytest.mark.faults
def test_flydsl_metadata_and_module_that_disagree_are_bad_input_before_any_compile(tmp_path):
    """Q12 of the fault report at 3f0364f: a dist-info of one FlyDSL release in
    front of another's module failed every key (exit 1 each, no fix). Both are
    supported releases: only their disagreement is refused, by the toolchain
    check every command that compiles makes first."""
    other = next(v for v in flydsl.FLYDSL if v != flydsl.installed().version)
    info = tmp_path / "shadow" / f"flydsl-{other}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: flydsl\nVersion: {other}\n")
    out = tmp_path / "out"
    code, _, err = run_cli("build", "--key", CHEAP[0], "--out", out, "--no-cache", "--no-progress", check=False,
                           env=dict(os.environ, PYTHONPATH=str(info.parent)))
    assert code == 2 and f"FlyDSL's installed metadata says {other}" in err, err
    assert f"is {flydsl.installed().version}" in err and "fix: reinstall FlyDSL" in err and "Traceback" not in err
    assert not out.exists()


def test_a_vllm_checkout_is_read_by_the_version_py_setuptools_scm_writes(tmp_path):
    """Q10 of the fault report at 3f0364f: ``__version__ = version = '0.33.0'``
    read as "version = '0.33.0", so the checkout was passed over for the
    installed vLLM, or, patched, refused as no release instead of naming its
    digest. The installed vLLM's own _version.py (version_tuple lines too),
    no dist-info beside it."""
    installed = source.find()
    tree = tmp_path / "checkout"
    shutil.copytree(installed.mono_dir, tree / source.MONO_REL, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(installed.root / "vllm" / "_version.py", tree / "vllm" / "_version.py")
    assert "version_tuple = (" in (tree / "vllm" / "_version.py").read_text()
    src = source.release_trees({NEWEST}, DIGESTS, [tree])[NEWEST]
    assert (src.root, src.version) == (tree.resolve(), NEWEST)
    layer = tree / source.MONO_REL / "layer.py"
    layer.write_text(layer.read_text() + "\n# patched\n")
    with pytest.raises(ToolchainError) as e:
        source.release_trees({NEWEST}, DIGESTS, [tree])
    assert f"is vLLM {NEWEST}, but its mono sources digest is {source.mono_digest(layer.parent)}" in e.value.message
    assert str(tree) in e.value.message


def test_identity_change_makes_a_key_stale(smoke_dir):
    """A key is up to date only when its entry is what a clean build of this
    source identity writes and verify's check of the entry passes."""
    from dsv41_aot.keys import BuildKey

    m = Room(smoke_dir, "gfx950", NEWEST).manifest()
    key = BuildKey.parse("k1@gfx950:s=4,tp=4,r=1", NEWEST)  # a smoke key
    built = m.entries[str(key)]
    ident = built.source
    assert buildroom.up_to_date(m, key, ident)
    m.entries[str(key)] = built.replace(export_bytes=None)  # as a recovery from objects/ leaves it
    assert not buildroom.up_to_date(m, key, ident)
    m.entries[str(key)] = built
    assert not buildroom.up_to_date(m, key, dataclasses.replace(ident, flydsl_version="0.5.0"))
    assert not buildroom.up_to_date(m, key, dataclasses.replace(ident, mono_sources="b"))
    assert not buildroom.up_to_date(m, key, dataclasses.replace(ident, linker="m"))
    assert not buildroom.up_to_date(m, key, dataclasses.replace(ident, helpers={"impl": "aiter", "version": "1"}))
    # an entry verify refuses (its object intact) is not up to date: verify's fix, build --key, rebuilds it
    for edit in (dict(symbol="_ZN5aiter5otherE"), dict(entry="dsv41_other"), dict(code_object_sha256="0" * 64),
                 dict(resources=dict(built.resources, vgpr_count=1))):
        m.entries[str(key)] = built.replace(**edit)
        assert not buildroom.up_to_date(m, key, ident), edit
    m.entries[str(key)] = built
    assert buildroom.up_to_date(m, key, ident)


def test_seconds_without_shard_and_an_unknown_release_exit_2(tmp_path, capsys):
    """--seconds only balances --shard's shards (verify refuses the same);
    --release names a release dsv41-aot knows, else "unknown vLLM release"
    naming the known ones (not "profile selects no key"). Nothing written."""
    out = tmp_path / "out"
    seconds = tmp_path / "timings.json"
    seconds.write_text(json.dumps({CHEAP[0]: 1.0}))
    for argv in (["build", "--list", "--profile", "smoke", "--seconds", str(seconds)],
                 ["build", "--key", CHEAP[0], "--seconds", str(seconds), "--out", str(out), "--no-progress"]):
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "--seconds" in err and "--shard i/N" in err, err
    for argv in (["build", "--release", "0.99.0", "--out", str(out)],
                 ["build", "--release", "0.99.0", "--profile", "smoke", "--list"],
                 ["build", "--release", "0.99.0", "--key", CHEAP[0], "--out", str(out)]):
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "unknown vLLM release '0.99.0'" in err and NEWEST in err and OLD in err, err
    assert not out.exists()


def test_bad_input_exits_2_and_writes_nothing(tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    cases = [
        (["build", "--key", CHEAP[0], "--out", str(blocker / "sub")], "not writable"),
        (["build", "--key", CHEAP[0], "--out", str(out), "--vllm-src", str(tmp_path / "nowhere")], "no vLLM mono package"),
        (["build", "--profile", "smoke", "--arch", "gfx1100", "--out", str(out)], "gfx1100"),
        (["build", "--key", "k1@gfx950:s=4,tp=4,r=1,", "--out", str(out)], "malformed key"),
        (["build", "--key", "ffn@gfx942:s=33,tp=2,r=0", "--out", str(out)], "does not run gfx942 at TP 2"),
    ]
    for argv, words in cases:
        assert cli.main(argv) == 2, argv
        assert words in capsys.readouterr().err, argv
    # a tree that says vLLM 0.32.0 but holds 0.33.0's kernels
    old = tmp_path / "old-vllm"
    (old / "vllm-0.32.0.dist-info").mkdir(parents=True)
    (old / "vllm-0.32.0.dist-info" / "METADATA").write_text("Name: vllm\nVersion: 0.32.0\n")
    shutil.copytree(source.find().mono_dir, old / source.MONO_REL, ignore=shutil.ignore_patterns("__pycache__"))
    assert cli.main(["build", "--release", OLD, "--key", CHEAP_OLD, "--out", str(out), "--vllm-src", str(old)]) == 2
    err = capsys.readouterr().err
    assert f"is vLLM {OLD}, but its mono sources digest is {DIGESTS[NEWEST]}, not the {DIGESTS[OLD]}" in err
    # vLLM 0.32.0's own tree (the tree cache's), one .py edited: refused, naming both digests
    tree = source.trees_dir() / OLD
    assert source.MonoSource(tree).version == OLD, f"no vLLM {OLD} tree: dsv41-aot fetch-vllm {OLD}"
    edited = tmp_path / "edited-0.32.0"
    shutil.copytree(tree, edited, ignore=shutil.ignore_patterns("__pycache__"))
    layer = edited / source.MONO_REL / "layer.py"
    layer.write_text(layer.read_text() + "\n# patched\n")
    digest = source.mono_digest(edited / source.MONO_REL)
    assert cli.main(["build", "--release", OLD, "--key", CHEAP_OLD, "--out", str(out), "--vllm-src", str(edited)]) == 2
    err = capsys.readouterr().err
    assert f"vLLM {OLD}, but its mono sources digest is {digest}, not the {DIGESTS[OLD]}" in err
    assert "build_matrix.yaml" in err and str(edited) in err
    monkeypatch.setattr(toolchain, "_llvm_dirs", lambda: iter(()))
    assert cli.main(["build", "--key", CHEAP[0], "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "no ld.lld found" in err and "lld-19" in err
    assert not out.exists()
