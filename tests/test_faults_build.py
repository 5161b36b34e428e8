"""Faults injected for real into the build side: kill -9 at random moments
(during link too), byte flips in objects, libraries, libs.json and
manifests, corrupt manifests, two builders on one ``--out``.

Every fault is counted: tried, survived (the next ordinary command ends in a
good prebuilt dir: it builds, links and verifies, with the bytes of a clean
build) and refused with the right error (exit code, the file or key named,
and a fix that works when it is run). The counts are printed at the end of
the module (``-rA`` not needed: pytest's terminal summary).
"""

from __future__ import annotations

import json
import os
import random
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _smoke import OLD, REPO, cli, copy_of, libdir, room

from dsv41_aot.aot import verify as verify_mod
from dsv41_aot.room import Room
from dsv41_aot.aot.lock import LOCK_FILE, arch_lock
from dsv41_aot.errors import ManifestError
from dsv41_aot.facts.releases import NEWEST
from dsv41_aot.manifest import LIB, LIBS_JSON, MANIFEST, Manifest, folder_name
from dsv41_aot.listing import built_rooms

pytestmark = pytest.mark.faults

CHEAP = ["k1@gfx950:s=1,tp=2,r=0", "k1@gfx942:s=1,tp=4,r=0"]  # the cheapest compiles, one per arch
SEED = 20261129
TALLY = {"tried": 0, "survived": 0, "refused": 0}


def record(outcome: str) -> None:
    TALLY["tried"] += 1
    TALLY[outcome] += 1


@pytest.fixture(scope="module", autouse=True)
def fault_counts(summary_lines):
    yield
    line = (f"faults (tests/test_faults_build.py): {TALLY['tried']} tried, {TALLY['survived']} survived, "
            f"{TALLY['refused']} refused with the right error")
    summary_lines.append(line)


def popen_build(out: Path, keys, *, env=None, stderr=None) -> subprocess.Popen:
    """A build in its own process group (kill -9 takes its workers with it)."""
    return subprocess.Popen(
        [sys.executable, "-m", "dsv41_aot.cli", "build", "--key", *keys, "--any-key", "--out", str(out),
         "--no-progress", "--json", "--jobs", "2", "--no-cache"],  # compiles for real: kills land mid-compile
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=stderr or subprocess.DEVNULL, env=env, start_new_session=True,
    )


def kill9(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def artifacts(root: Path) -> dict:
    """What a build leaves that must be the same for the same inputs."""
    out = {}
    for r in built_rooms(root):  # each room's manifest and link record
        for name in (MANIFEST, LIBS_JSON):
            path = r.dir / name
            out[str(path.relative_to(root))] = path.read_bytes()
    for arch_dir in sorted({r.arch_dir for r in built_rooms(root)}):  # the arch's objects and bands
        for p in sorted((arch_dir / "objects").glob("*.o")) + sorted((arch_dir / LIB).glob("*.so.xz")):
            out[str(p.relative_to(root))] = p.read_bytes()
    return out


def flip(path: Path, rng: random.Random) -> int:
    data = bytearray(path.read_bytes())
    at = rng.randrange(len(data))
    data[at] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(data))
    return at


def fixes_of(stderr: str) -> list[list[str]]:
    """The commands of the ``fix:`` lines an error printed (argv after dsv41-aot)."""
    out = []
    for line in stderr.splitlines():
        if "fix:" not in line:
            continue
        text = line.split("fix:", 1)[1].strip()
        text = text.split(" (", 1)[0]  # a trailing explanation
        if text.startswith("rebuild it: ") or text.startswith("rebuild them: ") or text.startswith("rebuild: "):
            text = text.split(": ", 1)[1]
        argv = shlex.split(text)
        assert argv[0] == "dsv41-aot", line
        out.append(argv[1:])
    assert out, stderr
    return out


def fix_of(stderr: str) -> list[str]:
    (only,) = fixes_of(stderr)
    return only


def meaning(man: Manifest) -> tuple:
    """What a manifest says to the loader and the builder (not the
    informational export_bytes)."""
    strip = {k: e.replace(export_bytes=None) for k, e in man.entries.items()}
    return man.arch, man.release, strip, man.abis, man.refused


@pytest.fixture(scope="module")
def smoke(smoke_dir) -> Path:
    return smoke_dir


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """A clean build of the cheap keys: (dir, its --json summary)."""
    out = tmp_path_factory.mktemp("reference") / "prebuilt"
    r = cli("build", "--key", *CHEAP, "--any-key", "--out", out, "--json", "--no-progress", "--jobs", "2")
    assert r.returncode == 0, r.stderr
    return out, json.loads(r.stdout)


# ------------------------------------------------------------------ determinism


@pytest.mark.slow
def test_two_clean_builds_are_byte_identical(reference, tmp_path):
    """Nothing measured goes into the artifact: manifests, libs.json, objects
    and libraries of two clean builds are the same bytes; the compile seconds
    are in the side file the shard balancer reads."""
    ref, _ = reference
    r = cli("build", "--key", *CHEAP, "--any-key", "--out", tmp_path / "again", "--json", "--no-progress")
    assert r.returncode == 0, r.stderr
    a, b = artifacts(ref), artifacts(tmp_path / "again")
    assert a.keys() == b.keys() and len(a) >= 8
    assert [k for k in a if a[k] != b[k]] == []
    for arch in ("gfx950", "gfx942"):
        assert "compile_seconds" not in (room(ref, arch) / MANIFEST).read_text()
        timings = json.loads((room(ref, arch) / "timings.json").read_text())  # the room's side file
        assert list(timings) == [k for k in CHEAP if f"@{arch}:" in k] and all(s > 0 for s in timings.values())
    from dsv41_aot.aot.shards import recorded_seconds

    # keyed by (release, key): the rooms' release
    assert set(recorded_seconds([room(ref, "gfx950") / MANIFEST, room(ref, "gfx942")])) == {(NEWEST, k) for k in CHEAP}


# ------------------------------------------------------------------ kill -9


@pytest.mark.slow
def test_kill_9_at_random_moments_then_a_rerun_gives_the_clean_bytes(reference, tmp_path):
    ref, summary = reference
    rng = random.Random(SEED)
    out = tmp_path / "killed"
    span = max(summary["wall_seconds"], 3.0)
    moments = [round(rng.uniform(0.1, span), 2) for _ in range(3)]
    for at in moments:
        proc = popen_build(out, CHEAP)
        time.sleep(at)
        kill9(proc)
        # whatever the moment, the folder is never torn: verify runs and
        # either passes or names what is missing (exit 1), never crashes
        if built_rooms(out):
            v = cli("verify", "--dir", out, "--json")
            assert v.returncode in (0, 1), v.stderr
            json.loads(v.stdout)
        record("survived")
    r = cli("build", "--key", *CHEAP, "--any-key", "--out", out, "--json", "--no-progress")
    assert r.returncode == 0, r.stderr
    assert cli("verify", "--dir", out).returncode == 0
    a, b = artifacts(ref), artifacts(out)
    assert [k for k in a if a[k] != b.get(k)] == [], f"kill moments {moments}"


@pytest.mark.slow
def test_kill_9_during_link(reference, tmp_path):
    """A build killed while its linker runs (a wrapper that sleeps before
    exec'ing ld.lld, so the kill lands inside the link) leaves the previous
    link intact or none; verify names libs.json and `dsv41-aot link` fixes it."""
    from dsv41_aot.aot.link import find_linker

    ref, _ = reference
    slow_ld = tmp_path / "slow-ld.lld"
    slow_ld.write_text(f"#!/bin/sh\nsleep 5\nexec {shlex.quote(str(find_linker()))} \"$@\"\n")
    slow_ld.chmod(0o755)
    out = copy_of(ref, tmp_path / "p")  # everything compiled: the build goes straight to link
    for arch in ("gfx950", "gfx942"):
        for p in libdir(out, arch).iterdir():
            p.unlink()
        (room(out, arch) / LIBS_JSON).unlink()
    env = dict(os.environ, DSV41_AOT_LD=str(slow_ld))
    proc = popen_build(out, CHEAP, env=env)
    deadline = time.monotonic() + 300
    while not list((out / "gfx942" / LIB).glob(".link-*")) and time.monotonic() < deadline:
        assert proc.poll() is None, "the build ended before it linked"
        time.sleep(0.05)
    time.sleep(0.5)
    kill9(proc)
    assert list((out / "gfx942" / LIB).glob(".link-*")), "the kill landed outside the link"
    v = cli("verify", "--dir", out)
    assert v.returncode == 1 and f"{room(out, 'gfx942') / LIBS_JSON} is missing" in v.stdout
    for fix in fixes_of(v.stderr):
        assert fix[0] == "link"
        assert cli(*fix).returncode == 0
    assert cli("verify", "--dir", out).returncode == 0
    assert list((out / "gfx942" / LIB).glob(".link-*")) == []  # the dead link's temporaries are gone
    a, b = artifacts(ref), artifacts(out)
    assert [k for k in a if a[k] != b.get(k)] == []
    record("refused")


@pytest.mark.slow
def test_kill_9_before_the_first_manifest_write_then_verify_fix_builds_its_keys(tmp_path):
    """A build killed before it wrote any manifest leaves the keys it was
    asked for (and its options) beside its arch lock: verify's fix names
    those keys, not the default profile, and run word for word makes verify
    pass (N9f)."""
    from dsv41_aot.pending import PENDING

    out = tmp_path / "killed"
    key = CHEAP[0]
    proc = popen_build(out, [key])
    deadline = time.monotonic() + 300
    while not (out / "gfx950" / PENDING).is_file() and time.monotonic() < deadline:
        assert proc.poll() is None, "the build ended before it recorded its keys"
        time.sleep(0.02)
    kill9(proc)
    assert built_rooms(out) == [], "the kill landed after the first manifest write"
    v = cli("verify", "--dir", out)
    assert v.returncode == 2, v.stderr
    fix = fix_of(v.stderr)
    assert fix[0] == "build" and fix[fix.index("--key") + 1] == key and "--no-cache" in fix, v.stderr
    assert "--profile" not in fix and cli(*fix).returncode == 0
    assert cli("verify", "--dir", out).returncode == 0
    assert not (out / "gfx950" / PENDING).exists()  # the finished build removed its record
    record("refused")


def test_the_lock_holder_removes_what_killed_writers_left(tmp_path):
    """Temporaries of a killed writer (an atomic_write temp file in the arch
    folder, objects/ or lib/, a lib/.link-* folder) are removed by the next
    holder of the arch lock; the folder's real files are not."""
    arch_dir = tmp_path / "gfx950"
    for rel in (".manifest.json.k3j2.tmp", "objects/.ab12.o.x9.tmp", "lib/.libs.json.q1.tmp",
                f"{folder_name(NEWEST)}/.manifest.json.a1.tmp", f"{folder_name(OLD)}/.libs.json.b2.tmp",
                f"{folder_name(OLD)}/.timings.json.c3.tmp"):
        (arch_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (arch_dir / rel).write_bytes(b"half")
    (arch_dir / "lib" / ".link-zz" ).mkdir()
    (arch_dir / "lib" / ".link-zz" / "libdsv41_gfx950_tp4_s01-08.so").write_bytes(b"\x7fELF")
    keep = [f"{folder_name(NEWEST)}/manifest.json", f"{folder_name(NEWEST)}/libs.json", f"{folder_name(OLD)}/manifest.json",
            f"{folder_name(OLD)}/timings.json", "objects/ab12.o", "lib/libdsv41_gfx950_tp4_s01-08.0123.so.xz"]
    for rel in keep:
        (arch_dir / rel).write_bytes(b"real")
    with arch_lock(arch_dir, "build"):
        left = sorted(str(p.relative_to(arch_dir)) for p in arch_dir.rglob("*") if p.is_file())
    assert left == sorted(keep + [LOCK_FILE])
    assert not (arch_dir / "lib" / ".link-zz").exists()
    record("survived")


# ------------------------------------------------------------------ two writers


@pytest.mark.slow
def test_two_builders_on_one_out_both_end_built_and_linked(tmp_path):
    out = tmp_path / "shared"
    first, second = "k1@gfx950:s=1,tp=2,r=0", "k1@gfx950:s=2,tp=2,r=0"
    log_a, log_b = open(tmp_path / "a.err", "w+"), open(tmp_path / "b.err", "w+")
    a = popen_build(out, [first], stderr=log_a)
    lock = out / "gfx950" / LOCK_FILE
    deadline = time.monotonic() + 120
    while not (lock.is_file() and lock.read_text().strip() == str(a.pid)) and time.monotonic() < deadline:
        assert a.poll() is None
        time.sleep(0.05)
    b = popen_build(out, [second], stderr=log_b)
    assert a.wait(600) == 0 and b.wait(600) == 0, (tmp_path / "a.err").read_text() + (tmp_path / "b.err").read_text()
    assert f"waiting for another build or link of {out / 'gfx950'} (pid {a.pid})" in (tmp_path / "b.err").read_text()
    man = Room(out, "gfx950", NEWEST).manifest()
    assert sorted(man.entries) == sorted([first, second])
    linked = {k for lib in json.loads((room(out, "gfx950") / LIBS_JSON).read_text())["libraries"] for k in lib["entries"]}
    assert linked == {first, second}
    assert cli("verify", "--dir", out).returncode == 0
    record("survived")


def test_link_waits_for_a_build_holding_the_lock(smoke, tmp_path):
    d = copy_of(smoke, tmp_path / "p")
    err = open(tmp_path / "link.err", "w+")
    with arch_lock(d / "gfx950", "test"):
        proc = subprocess.Popen([sys.executable, "-m", "dsv41_aot.cli", "link", "--dir", str(d), "--arch", "gfx950"],
                                cwd=REPO, stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.monotonic() + 60
        while "waiting for another" not in (tmp_path / "link.err").read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "link.err").read_text()
            time.sleep(0.05)
        time.sleep(0.5)
        assert proc.poll() is None  # still waiting while the lock is held
        assert f"(pid {os.getpid()})" in (tmp_path / "link.err").read_text()
    assert proc.wait(120) == 0, (tmp_path / "link.err").read_text()


def test_build_holds_the_lock_through_link(smoke, tmp_path, monkeypatch):
    """In process: the build's link runs while its arch lock is still held
    (another flock on the lock file would block)."""
    import fcntl

    from dsv41_aot.aot import builder, link
    from dsv41_aot.keys import BuildKey

    d = copy_of(smoke, tmp_path / "p")
    seen = []
    real = link.link_room

    def probing_link(arch_dir, release, **kw):
        fd = os.open(Path(arch_dir) / LOCK_FILE, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            seen.append((release, "free"))
        except BlockingIOError:
            seen.append((release, "held"))
        finally:
            os.close(fd)
        return real(arch_dir, release, **kw)

    monkeypatch.setattr(link, "link_room", probing_link)
    # both gfx950 rooms: one arch lock (their objects and bands are shared) held through both links
    keys = [BuildKey.parse(k, r) for r in (OLD, NEWEST) for k in Room(d, "gfx950", r).manifest().entries]
    s = builder.build(keys, d, jobs=1, progress=False)
    assert (s.compiled, s.up_to_date, s.failed) == (0, len(keys), 0)
    assert sorted(seen) == [(OLD, "held"), (NEWEST, "held")]


# ------------------------------------------------------------------ byte flips


@pytest.mark.slow
def test_flipped_object_is_refused_by_verify_and_link_and_rebuilt_by_build(smoke, tmp_path):
    d = copy_of(smoke, tmp_path / "p")
    man = Room(d, "gfx950", NEWEST).manifest()
    key = "k1@gfx950:s=4,tp=4,r=1"  # the cheapest smoke key to compile again
    before = man.object_path(key).read_bytes()
    flip(man.object_path(key), random.Random(SEED))
    v = cli("verify", "--dir", d)
    # the one failing line names the key and its release (0.32.0's K1 of the same string is fine)
    (failed,) = [line.split() for line in v.stdout.splitlines() if line.startswith("FAILED")]
    assert v.returncode == 1 and failed[1:3] == [NEWEST, key] and "does not match its manifest sha256" in v.stdout
    link = cli("link", "--dir", d)
    assert link.returncode == 1 and key in link.stderr and "does not match its manifest sha256" in link.stderr
    fix = fix_of(v.stderr)
    assert fix[:6] == ["build", "--release", NEWEST, "--out", str(d), "--key"] and fix[6] == key
    r = cli(*fix)
    assert r.returncode == 0, r.stderr
    assert man.object_path(key).read_bytes() == before
    assert cli("verify", "--dir", d).returncode == 0
    record("refused")


def test_flipped_libraries_are_refused_and_the_fix_relinks(smoke, tmp_path):
    d = copy_of(smoke, tmp_path / "p")
    rng = random.Random(SEED)
    libs = sorted(d.glob(f"*/{LIB}/*.so.xz"))  # the xz bands link writes
    assert len(libs) >= 3
    for lib in libs:
        good = lib.read_bytes()
        flip(lib, rng)
        v = cli("verify", "--dir", d)
        assert v.returncode == 1 and f"FAILED {lib}" in v.stdout and "does not match the sha256 in libs.json" in v.stdout, v.stdout
        fix = fix_of(v.stderr)
        assert fix[0] == "link" and cli(*fix).returncode == 0
        assert cli("verify", "--dir", d).returncode == 0
        assert lib.read_bytes() == good  # relinked to the same bytes
        record("refused")


@pytest.mark.parametrize("damage", ["delete-library", "delete-libs.json", "malformed-libs.json", "empty-libs.json",
                                    "libs.json-object-sha256", "libs.json-outside-path"])
def test_damaged_link_records_are_refused_and_the_fix_relinks(smoke, tmp_path, damage):
    d = copy_of(smoke, tmp_path / "p")
    libdir = d / "gfx942" / LIB
    path = room(d, "gfx942") / LIBS_JSON
    doc = json.loads(path.read_text())
    lib = doc["libraries"][0]
    named = str(path)
    if damage == "delete-library":
        (libdir / lib["file"]).unlink()
        named = str(libdir / lib["file"])
    elif damage == "delete-libs.json":
        path.unlink()
    elif damage == "malformed-libs.json":
        path.write_text(path.read_text()[:100])
    elif damage == "empty-libs.json":
        path.write_text("{}")
    elif damage == "libs.json-object-sha256":
        key = sorted(lib["entries"])[0]
        lib["entries"][key] = "0" * 64
        path.write_text(json.dumps(doc))
    elif damage == "libs.json-outside-path":
        lib["file"] = "../../../../etc/hostname"
        path.write_text(json.dumps(doc))
    v = cli("verify", "--dir", d, "--json")
    assert v.returncode == 1
    report = json.loads(v.stdout)
    assert report["failed"] >= 1 and any(f["file"] == named for f in report["failures"]), report["failures"]
    assert all(f["fix"] == f"dsv41-aot link --dir {d} --arch gfx942 --release {NEWEST}" for f in report["failures"])
    assert cli("link", "--dir", d, "--arch", "gfx942").returncode == 0
    assert cli("verify", "--dir", d).returncode == 0
    record("refused")


def test_random_manifest_flips_are_refused(smoke, tmp_path):
    """Single-bit flips anywhere in a manifest: verify refuses each (a
    malformed manifest, or the entry / file the flip changed), except a flip
    in ``export_bytes``, which only reports FlyDSL's unstripped size and
    which nothing loads."""
    d = copy_of(smoke, tmp_path / "p")
    path = room(d, "gfx950") / MANIFEST
    good = path.read_bytes()
    reference_dir = copy_of(d / "gfx950", tmp_path / "untouched" / "gfx950")
    rng = random.Random(SEED)
    informational = 0
    for _ in range(60):
        path.write_bytes(good)
        at = flip(path, rng)
        try:
            report = verify_mod.verify(d, against_jit=False)
        except ManifestError as e:
            assert str(path) in str(e) and "--arch gfx950 --out" in str(e) and "dsv41-aot build --release " in str(e)
            record("refused")
            continue
        if report["failed"]:
            record("refused")
            continue
        # verify passed: the manifest must still mean the same (what the
        # loader and the builder read), only an informational figure moved
        assert meaning(Room(d, "gfx950", NEWEST).manifest()) == meaning(Room(reference_dir.parent, "gfx950", NEWEST).manifest()), \
            f"flip at byte {at} passed verify and changed the manifest"
        informational += 1
        record("survived")
    path.write_bytes(good)
    assert informational < 10


# ------------------------------------------------------------------ corrupt manifests


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["truncated", "empty-object", "other-schema", "other-arch", "other-release",
                                    "other-mono-sources"])
def test_corrupt_manifest_link_refuses_and_its_fix_recovers(smoke, tmp_path, damage):
    d = copy_of(smoke, tmp_path / "p")
    path = room(d, "gfx950") / MANIFEST
    before = Room(d, "gfx950", NEWEST).manifest()
    good = path.read_bytes()
    bad = {
        "truncated": good[: len(good) // 2],
        "empty-object": b"{}",
        "other-schema": json.dumps(dict(json.loads(good), schema=99)).encode(),
        "other-arch": json.dumps(dict(json.loads(good), arch="gfx942")).encode(),
        "other-release": json.dumps(dict(json.loads(good), release=OLD)).encode(),
        "other-mono-sources": json.dumps(dict(json.loads(good), mono_sources="0" * 16)).encode(),
    }[damage]
    path.write_bytes(bad)
    link = cli("link", "--dir", d)
    assert link.returncode == 1 and str(path) in link.stderr
    fix = fix_of(link.stderr)
    assert fix[:5] == ["build", "--release", NEWEST, "--arch", "gfx950"]
    r = cli(*fix, "--json", "--no-progress")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    aside = path.with_name(f"{MANIFEST}.corrupt")
    assert aside.read_bytes() == bad and str(aside) in r.stderr
    assert s["failed"] == 0 and s["recovered"][0]["recovered"] == len(before.entries)
    # the clean build's bytes, export_bytes included: no object holds it, so the recovered keys came from the
    # build cache (the session's smoke build filled it) or were compiled again
    assert s["compiled"] + s["cached"] == len(before.entries)
    assert path.read_bytes() == good
    assert cli("verify", "--dir", d).returncode == 0
    record("refused")


def test_entries_a_recovery_left_without_export_bytes_are_rebuilt(smoke, tmp_path):
    """A manifest recovered by an older dsv41-aot (entries without
    export_bytes, FlyDSL's unstripped size, which no stored object holds) is
    not up to date: the next build takes those keys from the build cache or
    compiles them, and writes the clean build's bytes."""
    d = copy_of(smoke, tmp_path / "p")
    path = room(d, "gfx950") / MANIFEST
    good = path.read_bytes()
    doc = json.loads(good)
    lacking = "k1@gfx950:s=4,tp=4,r=1"  # the cheapest smoke key to compile, should the cache not hold it
    del doc["entries"][lacking]["export_bytes"]
    path.write_text(json.dumps(doc))
    r = cli("build", "--key", lacking, "--out", d, "--json", "--no-progress")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert (s["up_to_date"], s["compiled"] + s["cached"]) == (0, 1)
    assert path.read_bytes() == good


def test_an_abi_with_a_slot_removed_is_refused_at_read(smoke, tmp_path):
    """An ABI is shared by id (a hash of its slots): one with a slot removed
    no longer matches its id, and every reader (verify, link, the loader's
    Room.manifest) refuses the manifest instead of calling with fewer slots."""
    d = copy_of(smoke, tmp_path / "p")
    path = room(d, "gfx950") / MANIFEST
    doc = json.loads(path.read_text())
    aid = sorted(doc["abis"])[0]
    doc["abis"][aid] = doc["abis"][aid][:-2] + doc["abis"][aid][-1:]  # drop the slot before the stream
    path.write_text(json.dumps(doc))
    with pytest.raises(ManifestError, match=f"ABI {aid} is not the slot list its id names"):
        Room(d, "gfx950", NEWEST).manifest()
    v = cli("verify", "--dir", d)
    assert v.returncode == 1 and f"ABI {aid}" in v.stdout and "--arch gfx950 --out" in v.stderr and "dsv41-aot build --release " in v.stderr
    record("refused")


@pytest.mark.slow
def test_a_corrupt_old_release_manifest_recovers_only_that_releases_objects(smoke, tmp_path):
    """vLLM 0.32.0's and 0.33.0's objects share gfx950's objects/ (and the
    same key strings): recovering 0.32.0's room takes only objects that hold
    0.32.0's kernels, even one of 0.33.0's that no manifest names, and leaves
    0.33.0's room as it was."""
    d = copy_of(smoke, tmp_path / "p")
    key = "k1@gfx950:s=4,tp=4,r=1"  # in both rooms: two objects, one entry point name
    new = Room(d, "gfx950", NEWEST).manifest()
    stray = new.entries.pop(key)  # 0.33.0's K1 object, now named by no manifest
    new.write()
    new_bytes = (room(d, "gfx950") / MANIFEST).read_bytes()
    path = room(d, "gfx950", OLD) / MANIFEST
    before = Room(d, "gfx950", OLD).manifest()
    good = path.read_bytes()
    assert before.entries[key].object != stray.object
    path.write_bytes(path.read_bytes()[:200])
    link = cli("link", "--dir", d, "--arch", "gfx950", "--release", OLD)
    assert link.returncode == 1 and str(path) in link.stderr
    fix = fix_of(link.stderr)
    assert fix[:5] == ["build", "--release", OLD, "--arch", "gfx950"]
    r = cli(*fix, "--json", "--no-progress")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    (report,) = s["recovered"]
    assert (report["release"], report["recovered"], s["failed"]) == (OLD, len(before.entries), 0)
    # the stray 0.33.0 object was looked at and refused: its kernel is not 0.32.0's
    assert any(why.startswith(Path(stray.object).name) for why in report["skipped"]), report["skipped"]
    assert path.read_bytes() == good  # the clean build's bytes, export_bytes included
    assert (room(d, "gfx950") / MANIFEST).read_bytes() == new_bytes  # 0.33.0's room untouched
    record("refused")
