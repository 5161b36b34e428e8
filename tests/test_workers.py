"""The one worker pool (dsv41_aot.aot.workers) under ``build`` and ``verify
--against-jit``: every key of every arch is built whatever ``--jobs``, workers
die with their parent and leave nothing behind, a hung compile times out,
and verify runs on the same pool with the build's shard partition.

Real compiles throughout (K1 at s=1 is the cheap key); a hang is a real
worker stopped with SIGSTOP, a killed build a real SIGKILL.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _smoke import REPO, SMOKE_RELEASE_KEYS, copy_of

from dsv41_aot.aot import jit, matrix
from dsv41_aot.aot.workers import RUN_PREFIX
from dsv41_aot.facts.releases import NEWEST
from dsv41_aot.room import Room
from dsv41_aot.listing import built_rooms

# (release, key) of every smoke key: a key string names a launch within its release
SMOKE_ALL = sorted((r, k) for r, keys in SMOKE_RELEASE_KEYS.items() for k in keys)


def named(keys) -> list:
    """(release, key string) of BuildKeys, or of ``build --list --json`` entries."""
    return [(k["release"], k["key"]) if isinstance(k, dict) else (k.release, str(k)) for k in keys]

K1_950 = "k1@gfx950:s=1,tp=4,r=0"
K1_942 = "k1@gfx942:s=1,tp=4,r=0"
K1_SMOKE_950 = "k1@gfx950:s=4,tp=4,r=1"
K2_950 = "k2@gfx950:s=4,tp=4,r=1"  # several seconds of compile: time to act while it runs
WORKER_LINE = re.compile(r"dsv41-aot worker (\d+): (\S+)")


def _argv(args) -> list:
    """A build or verify here runs the worker pool for real: nothing is taken
    from the session's build cache (what the workers build is still stored)."""
    argv = [sys.executable, "-m", "dsv41_aot.cli", *map(str, args)]
    return argv + ["--no-cache"] if args[0] in ("build", "verify") else argv


def dsv(*args, tmp: Path, timeout: float = 1800, **kw) -> subprocess.CompletedProcess:
    """``dsv41-aot ARGS`` with its temporary files under ``tmp``."""
    return subprocess.run(_argv(args), cwd=REPO, capture_output=True,
                          text=True, env=dict(os.environ, TMPDIR=str(tmp)), timeout=timeout, **kw)


def start(*args, tmp: Path) -> subprocess.Popen:
    return subprocess.Popen(_argv(args), cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(os.environ, TMPDIR=str(tmp)))


def runs(tmp: Path) -> list[Path]:
    return sorted(tmp.glob(RUN_PREFIX + "*"))


def wait_for_worker_on(key: str, tmp: Path, proc: subprocess.Popen, timeout: float = 600) -> int:
    """The pid of the worker that announced ``key`` in its log (the key is then in flight)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        assert proc.poll() is None, proc.communicate()
        for log in tmp.glob(f"{RUN_PREFIX}*/*/worker.log"):
            for pid, k in WORKER_LINE.findall(log.read_text(errors="replace")):
                if k == key:
                    return int(pid)
        time.sleep(0.05)
    raise AssertionError(f"no worker took {key} in {timeout} s")


def alive(pid: int) -> bool:
    """A live process (a zombie, killed and not yet reaped, is not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


@pytest.fixture(scope="module")
def smoke(smoke_dir) -> Path:
    return smoke_dir


# ---------------------------------------------------------------- jobs and arches


@pytest.mark.parametrize("command", ["build", "verify"])
@pytest.mark.parametrize("jobs", ["0", "-1"])
def test_jobs_below_one_is_bad_input(command, jobs, tmp_path):
    extra = ["--key", K1_950, "--out", tmp_path / "out"] if command == "build" else ["--dir", tmp_path, "--against-jit"]
    r = dsv(command, *extra, "--jobs", jobs, tmp=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"--jobs {jobs}: must be at least 1" in r.stderr
    assert not (tmp_path / "out").exists()


def test_one_job_builds_every_arch(tmp_path):
    """--jobs 1 over two arches: the single slot serves one arch, then the other."""
    out = tmp_path / "out"
    r = dsv("build", "--key", K1_950, K1_942, "--jobs", 1, "--out", out, "--json", "--no-progress", "--no-link", tmp=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    s = json.loads(r.stdout)
    assert (s["keys"], s["compiled"], s["up_to_date"], s["failed"]) == (2, 2, 0, 0), s
    assert set(Room(out, "gfx950", NEWEST).manifest().entries) == {K1_950}
    assert set(Room(out, "gfx942", NEWEST).manifest().entries) == {K1_942}
    assert runs(tmp_path) == []  # the run's folder goes with the run


# ---------------------------------------------------------------- lifecycle


def test_killed_build_leaves_no_live_worker_and_next_run_cleans(tmp_path):
    out = tmp_path / "out"
    build = start("build", "--key", K2_950, "--jobs", 1, "--out", out, "--no-progress", "--no-link", tmp=tmp_path)
    worker = wait_for_worker_on(K2_950, tmp_path, build)
    assert alive(worker)
    (run,) = runs(tmp_path)  # this run's logs, kept while it runs
    os.kill(build.pid, signal.SIGKILL)  # the build alone, mid-compile: not its process group
    build.communicate()
    end = time.monotonic() + 3
    while alive(worker) and time.monotonic() < end:
        time.sleep(0.05)
    assert not alive(worker), "the compile worker outlived its killed parent"
    # gone, it writes nothing more; what it wrote between its parent's death and its own is here
    assert not list((out / "gfx950" / "objects").glob("*.o")), "an object was written after the build was killed"
    assert run.is_dir() and (run / "owner.lock").is_file()  # left behind by the kill

    r = dsv("build", "--key", K1_950, "--out", tmp_path / "next", "--no-progress", "--no-link", tmp=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not run.exists(), "the next run did not remove the killed run's folder"
    assert runs(tmp_path) == []


@pytest.mark.parametrize("command", ["build", "link"])
def test_the_next_lock_holder_removes_a_killed_runs_worker_folder(smoke, tmp_path, command):
    """A killed build's run folder ($TMPDIR/dsv41-aot-workers-*, its
    owner.lock held by nobody) is removed by the next command that takes an
    arch lock, whatever it does: a build that compiles nothing (no worker
    pool), a link. A live run's folder (its owner.lock held) stays."""
    import fcntl

    from dsv41_aot.aot.workers import OWNER_LOCK

    d = copy_of(smoke, tmp_path / "p")
    tmp = tmp_path / "tmp"
    dead = tmp / f"{RUN_PREFIX}killed"
    (dead / "gfx950-vllm-0.33.0-0" / "tmp").mkdir(parents=True)
    (dead / "gfx950-vllm-0.33.0-0" / "worker.log").write_text("dsv41-aot worker 1: k1@gfx950:s=4,tp=4,r=1\n")
    (dead / OWNER_LOCK).write_text("")  # the flock died with its run
    live = tmp / f"{RUN_PREFIX}live"
    live.mkdir()
    with open(live / OWNER_LOCK, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if command == "build":
            r = dsv("build", "--profile", "smoke", "--out", d, "--no-progress", "--json", tmp=tmp)
            assert r.returncode == 0, r.stderr
            assert json.loads(r.stdout)["compiled"] == 0
        else:
            r = dsv("link", "--dir", d, tmp=tmp)
            assert r.returncode == 0, r.stderr
        assert not dead.exists(), f"{command} left the killed run's folder"
        assert live.is_dir() and (live / OWNER_LOCK).is_file()


def test_a_hung_compile_times_out_and_the_build_goes_on(tmp_path):
    """A worker stopped mid-compile (SIGSTOP) never answers: after
    --key-timeout its key fails with its log, the worker is killed, a new
    one builds the next key. 15 s: the new worker's start and its K1 each
    take about 3 s of CPU, well inside it on 2 busy cores, and the run waits
    it out once."""
    out = tmp_path / "out"
    hung, fine = "k1@gfx950:s=4,tp=4,r=1", K1_950  # the wider key goes first (longest first)
    build = start("build", "--key", hung, fine, "--any-key", "--jobs", 1, "--key-timeout", 15, "--out", out,
                  "--json", "--no-progress", "--no-link", tmp=tmp_path)
    worker = wait_for_worker_on(hung, tmp_path, build)
    os.kill(worker, signal.SIGSTOP)
    try:
        stdout, stderr = build.communicate(timeout=900)
    finally:
        if build.poll() is None:
            build.kill()
        if alive(worker):
            os.kill(worker, signal.SIGKILL)
    assert build.returncode == 1, stdout + stderr
    s = json.loads(stdout)
    assert (s["compiled"], s["failed"]) == (1, 1), s
    (f,) = s["failures"]
    assert f["key"] == hung and "did not finish in 15 s" in f["error"] and f"worker {worker} killed, log:" in f["error"]
    assert set(Room(out, "gfx950", NEWEST).manifest().entries) == {fine}
    assert not alive(worker)
    m = Room(out, "gfx950", NEWEST).manifest()
    assert hung not in m.refused  # a timeout is not the source's refusal: a rerun tries again


# ---------------------------------------------------------------- verify on the pool


@pytest.mark.slow
def test_verify_on_two_jobs_proves_a_key_of_each_arch(smoke_jit, tmp_path):
    """Two JIT builds, one per worker: the K1 of each arch (the cheapest JIT
    builds), under --no-cache though the session's build cache holds both
    answers (smoke_jit). Every smoke key's proof, each release's against its
    own vLLM, is tests/test_verify.py's."""
    d = Path(shutil.copytree(smoke_jit, tmp_path / "prebuilt"))
    keys = [K1_SMOKE_950, "k1@gfx942:s=4,tp=4,r=1"]
    r = dsv("verify", "--dir", d, "--against-jit", "--jobs", 2, "--record", "--json", "--key", *keys, tmp=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(r.stdout)
    asked = sorted((NEWEST, k) for k in keys)  # a --key names a launch of the newest release
    assert report["jobs"] == 2 and report["jit_checked"] == len(asked) and report["failed"] == 0
    assert report["jit_cached"] == 0  # the workers built every one
    assert "verify --against-jit" in r.stderr  # the progress bar, on stderr
    proven = set()
    for r in built_rooms(d):
        release = r.release
        man = r.manifest()
        recs = r.proof().keys
        for k, rec in recs.items():
            assert rec.code_object_sha256 == man.entries[k].code_object_sha256
            # each release proven against its own vLLM's JIT
            assert rec.jit["vllm_version"] == man.entries[k].source.vllm_version == release
        proven |= {(release, k) for k in recs}
    assert sorted(proven) == asked
    assert runs(tmp_path) == []


@pytest.mark.parametrize("count", [2, 3])
def test_verify_shard_is_the_build_shard(smoke, tmp_path, count):
    """verify --shard i/N names the keys build --shard i/N builds: together
    every smoke key once; integrity-checks exactly those."""
    seen = []
    for i in range(count):
        r = dsv("build", "--list", "--json", "--profile", "smoke", "--shard", f"{i}/{count}", tmp=tmp_path)
        assert r.returncode == 0, r.stderr
        built = named(json.loads(r.stdout)["entries"])
        assert named(matrix.load().choose("smoke", shard=f"{i}/{count}")) == built
        r = dsv("verify", "--dir", smoke, "--json", "--shard", f"{i}/{count}", "--profile", "smoke", tmp=tmp_path)
        assert r.returncode == 0, r.stdout + r.stderr
        assert sorted(named(json.loads(r.stdout)["reports"])) == sorted(built)
        seen += built
    assert sorted(seen) == SMOKE_ALL


def test_verify_shard_with_recorded_seconds_and_arch(smoke, tmp_path):
    """The --seconds files and --arch cut verify's shards as they cut the build's."""
    seconds = tmp_path / "seconds.json"
    # invert the estimate: the cheapest key now weighs most, so the partition changes
    seconds.write_text(json.dumps({k: (100.0 if k.startswith("k1") else 1.0) for _, k in SMOKE_ALL}))
    for i in range(2):
        args = ["--profile", "smoke", "--arch", "gfx950", "--shard", f"{i}/2", "--seconds", seconds]
        r = dsv("build", "--list", "--json", *args, tmp=tmp_path)
        assert r.returncode == 0, r.stderr
        assert named(matrix.load().choose("smoke", arches=["gfx950"], shard=f"{i}/2", seconds=[seconds])) == \
            named(json.loads(r.stdout)["entries"])


def test_verify_shard_refuses_a_dir_missing_its_keys(smoke, tmp_path):
    d = Path(shutil.copytree(smoke, tmp_path / "prebuilt"))
    shutil.rmtree(d / "gfx942")
    r = dsv("verify", "--dir", d, "--shard", "0/1", "--profile", "smoke", tmp=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "does not hold" in r.stderr and "@gfx942" in r.stderr


# ---------------------------------------------------------------- the proof through merge and wheel


def test_merge_carries_the_proofs_and_can_require_them(smoke, tmp_path):
    """ci/merge.py keeps each shard's verified.json records of the merged
    objects; --require-verified refuses a key without one; the wheel's file
    list (ci/prebuilt.py) carries the file."""
    sys.path.insert(0, str(REPO))
    from ci import merge
    from ci.prebuilt import check_arch
    from dsv41_aot.proof import Evidence, KeyProof

    d = Path(shutil.copytree(smoke, tmp_path / "shard"))
    recs = {}
    for r in built_rooms(d):
        arch_dir, release = r.arch_dir, r.release
        man = r.manifest()
        recs[arch_dir.name, release] = {  # well formed, with (made-up) evidence of a JIT run
            k: KeyProof(k, e.code_object_sha256,
                        {"release": release, "vllm_version": release, "mono_sources": e.source.mono_sources,
                         "flydsl_version": e.source.flydsl_version},
                        Evidence(hashlib.sha256(k.encode()).hexdigest(), hashlib.sha256(k.encode() * 2).hexdigest(),
                                 "2026-01-02T03:04:05Z"))
            for k, e in man.entries.items()}
        jit.write_verified(man, recs[arch_dir.name, release])
    unproven = sorted(recs["gfx942", "0.33.0"])[0]
    del recs["gfx942", "0.33.0"][unproven]
    jit.write_verified(Room(d, "gfx942", NEWEST).manifest(), recs["gfx942", "0.33.0"])

    with pytest.raises(merge.MergeError, match="carry no proof") as e:
        merge.merge([d], tmp_path / "refused", link=False, log=None, require_verified=True)
    assert unproven in str(e.value) and not (tmp_path / "refused").exists()

    out = tmp_path / "merged"
    s = merge.merge([d], out, log=None)
    assert s["arches"]["gfx942"]["rooms"]["0.33.0"]["verified"] == len(recs["gfx942", "0.33.0"])
    for (arch, release), want in recs.items():
        assert Room(out, arch, release).proof().keys == want
    # the wheel carries each room's proofs
    assert f"vllm-0.33.0/{jit.VERIFIED}" in [str(f) for f in check_arch(out, "gfx950").files]
