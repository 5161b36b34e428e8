"""The build cache only ever saves work (aot/cache.py): a cache that cannot
be created or written, and a record naming the wrong blob (another key's
intact object, or the other release's object of the same key string),
each become a ``warning:`` and a miss; the build goes on and ends with the
bytes a build without a cache gives. ``--no-cache`` never opens the cache,
and ``DSV41_AOT_BUILD_CACHE=`` (empty) turns it off.

Every build (the slow tests) is of two of the cheapest keys (about 3 s each, one worker);
the damage is done to a copy of the session's cache, never to it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from _smoke import run_cli

from dsv41_aot.aot.cache import ENV_BUILD_CACHE, LAYOUT
from dsv41_aot.facts.releases import NEWEST

K = "k1@gfx950:s=1,tp=2,r=0"
K_BOTH = "k1@gfx950:s=1,tp=2,r=1"  # a key string both releases build
KEYS = (K, K_BOTH)
OLD = "0.32.0"


def build(out: Path, *args, env_cache: str | None = None, keys=KEYS) -> tuple[dict, str]:
    """``dsv41-aot build --key KEYS --out OUT --json ARGS``: (summary, stderr);
    ``env_cache``: the DSV41_AOT_BUILD_CACHE it runs with (None: the session's)."""
    env = dict(os.environ) if env_cache is None else dict(os.environ, **{ENV_BUILD_CACHE: env_cache})
    # one worker: KEYS share a room, and a second worker's start (torch, FlyDSL
    # and vLLM imported: about 2.5 s of CPU) costs more than it saves here
    code, stdout, stderr = run_cli("build", "--key", *keys, "--out", out, "--json", "--no-progress", "--jobs", "1",
                                   *args, check=False, env=env)
    assert code == 0, stdout + stderr
    assert "Traceback" not in stderr, stderr
    return json.loads(stdout), stderr


def tree(root: Path) -> dict:
    """Every file of a prebuilt folder but its lock and timings: path -> bytes."""
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and ".lock" not in p.name and p.name != "timings.json"}


def records(cache: Path) -> dict:
    """(key, release) -> (record path, record) of a cache's compiled objects."""
    out = {}
    for path in (cache / LAYOUT / "compile").glob("*/*.json"):
        rec = json.loads(path.read_text())
        out[rec["key"], rec["release"]] = (path, rec)
    return out


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """KEYS built through the session's cache (compiled once per session, and
    stored there): the bytes every build below must give."""
    out = tmp_path_factory.mktemp("reference") / "p"
    s, _ = build(out)
    assert s["compiled"] + s["cached"] == 2 and s["failed"] == 0
    return out


@pytest.mark.slow
@pytest.mark.parametrize("how", ["parent is a file", "blobs is a file"])
def test_a_cache_that_cannot_be_written_is_a_warning_and_nothing_is_lost(reference, tmp_path, how):
    """A cache folder that cannot be made (its parent is a file), or whose
    blobs cannot be stored: the keys compile, a warning names the cache,
    nothing is stored, and the folder is what any other build gives."""
    if how == "parent is a file":
        (tmp_path / "file").write_text("not a folder\n")
        cache = tmp_path / "file" / "cache"
    else:
        cache = tmp_path / "cache"
        (cache / LAYOUT).mkdir(parents=True)
        (cache / LAYOUT / "blobs").write_text("not a folder\n")
    s, err = build(tmp_path / "out", "--cache", cache)
    assert (s["compiled"], s["cached"], s["failed"]) == (2, 0, 0)
    assert f"warning: build cache {cache} cannot be written" in err, err
    # and in --json's warnings, as printed (N9 of the fault report at 24a0152: build --json had none)
    assert [w for w in s["warnings"] if f"build cache {cache} cannot be written" in w] and \
        all(f"warning: {w}" in err for w in s["warnings"]), s["warnings"]
    assert tree(tmp_path / "out") == tree(reference)
    assert not records(cache) if how == "blobs is a file" else not cache.exists()


@pytest.mark.slow
def test_no_cache_never_opens_it_and_an_empty_variable_turns_it_off(reference, tmp_path):
    """--no-cache with a --cache that cannot even be made and a
    DSV41_AOT_BUILD_CACHE naming a folder: no warning, nothing created, the
    keys compiled; DSV41_AOT_BUILD_CACHE= (empty) is no cache at all."""
    (tmp_path / "file").write_text("not a folder\n")
    env_cache = tmp_path / "env-cache"
    s, err = build(tmp_path / "out", "--no-cache", "--cache", tmp_path / "file" / "cache", env_cache=str(env_cache))
    assert (s["compiled"], s["cached"]) == (2, 0) and "warning" not in err, err
    assert not env_cache.exists() and tree(tmp_path / "out") == tree(reference)
    code, out, _ = run_cli("cache", "--json", env=dict(os.environ, **{ENV_BUILD_CACHE: ""}))
    assert code == 0 and json.loads(out)["cache"] is None
    from dsv41_aot.aot.cache import cache_dir

    assert cache_dir(None, no_cache=True) is None and cache_dir(str(env_cache), no_cache=True) is None


@pytest.mark.slow
def test_a_record_naming_the_wrong_intact_blob_is_a_miss(reference, tmp_path):
    """In a cache of its own (the session's may hold a key under several
    build identities, e.g. another FlyDSL's, and one record a key is what
    this test tampers with), K's record names K_BOTH's blob (another key's
    intact object), and K_BOTH's names its vLLM 0.32.0 blob (the other
    release's object of the same key string): each is a warning and a
    compile, the folder is the reference's, and the records are written
    sound again."""
    cache = tmp_path / "cache"
    s, _ = build(tmp_path / "seed", "--cache", cache)
    assert s["compiled"] == 2
    s, _ = build(tmp_path / "old", "--cache", cache, "--release", OLD, keys=(K_BOTH,))
    assert s["compiled"] + s["cached"] == 1
    recs = records(cache)
    for key, at in (((K, NEWEST), (K_BOTH, NEWEST)), ((K_BOTH, NEWEST), (K_BOTH, OLD))):
        path, rec = recs[key]
        path.write_text(json.dumps(dict(rec, sha256=recs[at][1]["sha256"])))
    s, err = build(tmp_path / "out", "--cache", cache)
    assert (s["compiled"], s["cached"], s["failed"]) == (2, 0, 0), err
    for key in KEYS:
        assert f"warning: {key} (vLLM {NEWEST}): cache record" in err, err
    assert "names a blob that is not its object" in err
    assert tree(tmp_path / "out") == tree(reference)
    assert {k: r[1]["sha256"] for k, r in records(cache).items() if k[1] == NEWEST and k[0] in KEYS} == \
        {k: r[1]["sha256"] for k, r in recs.items() if k[1] == NEWEST and k[0] in KEYS}


def test_a_cache_that_is_a_file_is_bad_input(tmp_path):
    (tmp_path / "file").write_text("not a folder\n")
    code, out, err = run_cli("cache", "--cache", tmp_path / "file", check=False)
    assert code == 2 and f"build cache {tmp_path / 'file'}: not a folder" in err and "Traceback" not in err


@pytest.mark.faults
def test_a_cache_that_does_not_exist_is_bad_input_but_has_an_identity(tmp_path):
    """A folder no build made is not "0 compiled objects" (N9 of the fault
    report at 24a0152, a typo read as an empty cache); --identity, what a CI
    cache key names before the first build, still answers."""
    code, out, err = run_cli("cache", "--cache", tmp_path / "nothing", check=False)
    assert code == 2 and "no such folder" in err and "compiled objects" not in out, (out, err)
    code, out, _ = run_cli("cache", "--cache", tmp_path / "nothing", "--identity")
    assert code == 0 and len(out.strip()) == 16 and not (tmp_path / "nothing").exists()
