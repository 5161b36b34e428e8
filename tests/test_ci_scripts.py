"""ci/: shard plans cover every (release, key) once, cutting across releases;
merged shards equal one whole build, room by room; and merge refuses what
cannot be merged."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ci import build_shard, merge  # noqa: E402
from dsv41_aot.aot import matrix  # noqa: E402
from dsv41_aot.aot.shards import estimate_seconds, recorded_seconds  # noqa: E402
from dsv41_aot.errors import IntegrityError, ManifestError  # noqa: E402
from dsv41_aot.manifest import folder_name  # noqa: E402

from _smoke import copy_of  # noqa: E402

PY = sys.executable
ARCHES = ("gfx950", "gfx942")
# the smoke profile's rooms: (arch, release) with keys, e.g. ("gfx950", "0.32.0")
ROOMS = sorted({(k.arch, k.release) for k in matrix.load().select("smoke")})


def room(root: Path, arch: str, release: str) -> Path:
    return root / arch / folder_name(release)


def run(*cmd, **kw):
    return subprocess.run([str(c) for c in cmd], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, **kw)


# ------------------------------------------------------------------ plans (fast)


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("count", [1, 3, 8])
def test_plans_cover_every_full_key_exactly_once(arch, count):
    plans = [build_shard.plan(arch, i, count, "full") for i in range(count)]
    everything = build_shard.pairs(plans[0]["all_keys"])
    got = [k for p in plans for k in build_shard.pairs(p["keys"])]
    assert sorted(got) == everything and len(set(got)) == len(got)
    assert all(p["all_keys"] == plans[0]["all_keys"] for p in plans)
    want = sorted((k.release, str(k)) for k in matrix.load().select("full") if k.arch == arch)
    assert everything == want  # every release's keys of the arch, a key being (release, key)
    costs = [p["estimated_seconds"] for p in plans]
    assert max(costs) - min(costs) <= max(estimate_seconds(matrix.BuildKey.parse(k, r)) for r, k in everything)


def test_a_plans_estimate_counts_the_recorded_seconds():
    """A shard plan's estimated_seconds is what the recorded seconds say of
    its keys (as ``recorded_seconds`` keys them, by release), the estimate
    only for a key nothing recorded."""
    alone = build_shard.plan("gfx942", 0, 1, "smoke")
    keys = [matrix.BuildKey.parse(k, r) for r, k in build_shard.pairs(alone["keys"])]
    recorded = {(keys[0].release, str(keys[0])): 1000.0}
    timed = build_shard.plan("gfx942", 0, 1, "smoke", seconds=recorded)
    want = 1000.0 + sum(estimate_seconds(k) for k in keys[1:])
    assert timed["estimated_seconds"] == pytest.approx(want, abs=0.01) != alone["estimated_seconds"]


def test_shards_cut_across_releases():
    """gfx950's full keys of both releases are one partition: a key string
    both releases build is two keys, and with 8 shards every shard holds keys
    of both releases (no cell serves only the small release)."""
    m = matrix.load()
    full = [k for k in m.select("full") if k.arch == "gfx950"]
    assert {k.release for k in full} == {"0.32.0", "0.33.0"}
    both = {str(k) for k in full if k.release == "0.32.0"} & {str(k) for k in full if k.release == "0.33.0"}
    assert both  # the same launch string in two releases
    plans = [build_shard.plan("gfx950", i, 8, "full") for i in range(8)]
    assert all(set(p["keys"]) == {"0.32.0", "0.33.0"} for p in plans)
    text = sorted(both)[0]
    holders = [(p["index"], r) for p in plans for r, ks in p["keys"].items() if text in ks]
    assert sorted(r for _, r in holders) == ["0.32.0", "0.33.0"]  # once per release, never twice
    assert sum(len(build_shard.pairs(p["keys"])) for p in plans) == len(full)


def test_plans_follow_recorded_seconds_identically_in_every_cell():
    keys = sorted({k for _, k in build_shard.pairs(build_shard.plan("gfx950", 0, 1, "full")["all_keys"])})
    seconds = {k: (i * 7919) % 97 + 1.0 for i, k in enumerate(keys)}  # a recorded run, far from the estimate
    plans = [build_shard.plan("gfx950", i, 4, "full", seconds=seconds) for i in range(4)]
    again = [build_shard.plan("gfx950", i, 4, "full", seconds=dict(reversed(seconds.items()))) for i in range(4)]
    assert plans == again
    loads = [sum(seconds[k] for _, k in build_shard.pairs(p["keys"])) for p in plans]
    assert max(loads) - min(loads) <= max(seconds.values())
    assert plans != [build_shard.plan("gfx950", i, 4, "full") for i in range(4)]


def test_recorded_seconds_read_from_timings_manifests_and_room_folders(tmp_path):
    """timings.json (what a build writes beside its room's manifest), a
    manifest.json (its sibling timings.json), a room folder, and an older
    manifest that still held compile_seconds all give the same mapping."""
    k1, k2 = "k1@gfx950:s=1,tp=2,r=0", "k2@gfx950:s=4,tp=4,r=1"
    arch = room(tmp_path, "gfx950", "0.33.0")
    arch.mkdir(parents=True)
    (arch / "timings.json").write_text(json.dumps({k1: 3.5, k2: 9.25}))
    (arch / "manifest.json").write_text(json.dumps({"schema": 2, "arch": "gfx950", "release": "0.33.0",
                                                    "abis": {}, "entries": {}}))
    want = {("0.33.0", k1): 3.5, ("0.33.0", k2): 9.25}  # (release, key): the room's release
    assert recorded_seconds([arch / "timings.json"]) == want
    assert recorded_seconds([arch / "manifest.json"]) == want
    assert recorded_seconds([arch]) == want
    old32 = room(tmp_path, "gfx950", "0.32.0")
    old32.mkdir(parents=True)
    (old32 / "timings.json").write_text(json.dumps({k2: 2.0}))
    # an arch folder: every room's, the same key string kept apart by release
    assert recorded_seconds([arch.parent]) == {**want, ("0.32.0", k2): 2.0}
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"schema": 1, "arch": "gfx950", "abis": {}, "entries": {k1: {"compile_seconds": 3.5}}}))
    assert recorded_seconds([old]) == {(None, k1): 3.5}
    (tmp_path / "bad.json").write_text(json.dumps({k1: "slow"}))
    with pytest.raises(matrix.MatrixError, match="not a number"):
        recorded_seconds([tmp_path / "bad.json"])


def test_bad_shard_is_refused():
    r = run(PY, "ci/build_shard.py", "--arch", "gfx950", "--shard", "2/2", "--out", "/nonexistent", "--plan-only")
    assert r.returncode == 2 and "0 <= i < N" in r.stderr


# ------------------------------------------------------------------ builds (slow)


@pytest.fixture(scope="module")
def built(tmp_path_factory, smoke_jit):
    """The smoke profile built whole (and linked), and built as 2 shards per
    arch (every release's keys of each shard, each verified against its
    release's JIT: verified.json in each room)."""
    tmp = tmp_path_factory.mktemp("ci")
    whole = copy_of(smoke_jit, tmp / "whole")  # the session's smoke build, linked
    shards = []
    for arch in ARCHES:
        for i in range(2):
            d = tmp / f"shard-{arch}-{i}"
            r = run(PY, "ci/build_shard.py", "--arch", arch, "--shard", f"{i}/2", "--profile", "smoke", "--out", d)
            assert r.returncode == 0, r.stderr
            shards.append(d)
    return tmp, whole, shards


def _tree(path: Path) -> dict:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file() and not p.name.startswith(".")}


@pytest.mark.slow
def test_merged_shards_equal_the_whole_build(built):
    tmp, whole, shards = built
    out = tmp / "merged"
    r = run(PY, "ci/merge.py", "--out", out, *shards)
    assert r.returncode == 0, r.stderr
    for arch in ARCHES:
        a, b = out / arch, whole / arch
        # objects (once an arch, whatever rooms name them) and the shared bands byte for byte
        assert _tree(a / "objects") == _tree(b / "objects")
        assert _tree(a / "lib") == _tree(b / "lib")
    for arch, release in ROOMS:
        a, b = room(out, arch, release), room(whole, arch, release)
        # each room's manifest and link record byte for byte (nothing measured is in them); the
        # shards' compile seconds joined in the side file
        assert (a / "manifest.json").read_bytes() == (b / "manifest.json").read_bytes()
        assert (a / "libs.json").read_bytes() == (b / "libs.json").read_bytes()
        assert sorted(json.loads((a / "timings.json").read_text())) == \
            sorted(json.loads((a / "manifest.json").read_text())["entries"])
    assert sorted(p.name for p in out.iterdir()) == list(sorted(ARCHES))
    assert sorted(p.name for p in (out / "gfx950").iterdir()) == ["lib", "objects", "vllm-0.32.0", "vllm-0.33.0"]


def _cut(whole: Path, dest: Path, part: int, count: int, plan: bool = False) -> Path:
    """Part ``part`` of ``count`` of every room of a built dir: each room's
    keys i::count, with their objects; with ``plan``, the plans
    ci/build_shard.py would write for it (by release)."""
    for arch in ARCHES:
        keys, every = {}, {}
        for a, release in ROOMS:
            if a != arch:
                continue
            man = json.loads((room(whole, arch, release) / "manifest.json").read_bytes())
            every[release] = sorted(man["entries"])
            keys[release] = every[release][part::count]
            man["entries"] = {k: man["entries"][k] for k in keys[release]}
            (room(dest, arch, release)).mkdir(parents=True)
            (dest / arch / "objects").mkdir(exist_ok=True)
            (room(dest, arch, release) / "manifest.json").write_text(json.dumps(man))
            for k in keys[release]:
                obj = man["entries"][k]["object"]
                shutil.copyfile(whole / arch / obj, dest / arch / obj)
        if plan:
            p = {"arch": arch, "index": part, "count": count, "profile": "smoke", "all_keys": every, "keys": keys}
            (dest / build_shard.plan_name(arch, part, count)).write_text(json.dumps(p))
    return dest


@pytest.mark.slow
def test_merge_is_byte_exact_for_the_same_entries(built, tmp_path):
    """Shards cut from the whole build merge back into its exact manifest.json bytes, room by room."""
    _, whole, _ = built
    parts = [_cut(whole, tmp_path / f"part{i}", i, 2) for i in range(2)]
    merge.merge(parts, tmp_path / "out", log=None)
    for arch, release in ROOMS:
        assert (room(tmp_path / "out", arch, release) / "manifest.json").read_bytes() == \
            (room(whole, arch, release) / "manifest.json").read_bytes()
    for arch in ARCHES:
        assert _tree(tmp_path / "out" / arch / "lib") == _tree(whole / arch / "lib")


def _copy_shards(shards, dest: Path) -> list[Path]:
    out = []
    for s in shards:
        shutil.copytree(s, dest / s.name)
        out.append(dest / s.name)
    return out


@pytest.mark.slow
def test_merge_refuses_conflicting_entries(built, tmp_path):
    _, whole, _ = built
    copies = [_cut(whole, tmp_path / f"part{i}", i, 2) for i in range(2)]
    # a second copy of part 1 whose 0.33.0 gfx950 room holds part 0's first key with another object: the same
    # export with a byte appended, which its entry describes (so only the two shards' disagreement is wrong)
    b_root = tmp_path / "conflict"
    shutil.copytree(copies[1], b_root)
    man_a = json.loads((room(copies[0], "gfx950", "0.33.0") / "manifest.json").read_bytes())
    path_b = room(b_root, "gfx950", "0.33.0") / "manifest.json"
    man_b = json.loads(path_b.read_bytes())
    key = sorted(man_a["entries"])[0]
    data = (copies[0] / "gfx950" / man_a["entries"][key]["object"]).read_bytes() + b"\0"
    sha = hashlib.sha256(data).hexdigest()
    (b_root / "gfx950" / "objects" / f"{sha}.o").write_bytes(data)
    man_b["entries"][key] = dict(man_a["entries"][key], object=f"objects/{sha}.o", sha256=sha, bytes=len(data))
    man_b["abis"].update(man_a["abis"])
    path_b.write_text(json.dumps(man_b))
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep").write_text("old")
    with pytest.raises(IntegrityError, match="different objects") as e:
        merge.merge(copies + [b_root], out, log=None)
    assert key in str(e.value) and "vLLM 0.33.0" in str(e.value) and "fix:" in str(e.value)
    assert [p.name for p in out.iterdir()] == ["keep"]  # the old output is untouched
    assert not [p for p in tmp_path.iterdir() if ".merge-" in p.name]  # no temporary left


@pytest.mark.slow
def test_merge_keeps_one_key_string_of_two_releases_apart(built, tmp_path):
    """The same key string in the 0.32.0 and the 0.33.0 room is two keys:
    both rooms keep their own entry (their own object where the kernels
    differ), and dropping the 0.32.0 one from every shard loses it."""
    _, whole, _ = built
    parts = [_cut(whole, tmp_path / f"part{i}", i, 2, plan=True) for i in range(2)]
    merge.merge(parts, tmp_path / "out", log=None)
    old = json.loads((room(tmp_path / "out", "gfx950", "0.32.0") / "manifest.json").read_bytes())["entries"]
    new = json.loads((room(tmp_path / "out", "gfx950", "0.33.0") / "manifest.json").read_bytes())["entries"]
    shared = sorted(set(old) & set(new))
    assert shared and any(old[k]["sha256"] != new[k]["sha256"] for k in shared)
    k = shared[0]
    for p in parts:  # take the 0.32.0 entry of k out of whichever shard holds it (plans unchanged)
        path = room(p, "gfx950", "0.32.0") / "manifest.json"
        man = json.loads(path.read_bytes())
        man["entries"].pop(k, None)
        path.write_text(json.dumps(man))
    with pytest.raises(IntegrityError, match="planned") as e:
        merge.merge(parts, tmp_path / "out2", log=None)
    assert k in str(e.value) and "vLLM 0.32.0" in str(e.value)


@pytest.mark.slow
def test_merge_refuses_missing_objects_missing_shards_and_mixed_sources(built, tmp_path):
    _, _, shards = built
    copies = _copy_shards(shards, tmp_path)
    r = run(PY, "ci/merge.py", "--out", tmp_path / "o1", *copies[:1], *copies[2:])
    assert r.returncode == 1 and "shards [1] of 2 are missing" in r.stderr and "--shard 1/2" in r.stderr

    obj = next((copies[1] / "gfx950" / "objects").glob("*.o"))
    data = obj.read_bytes()
    obj.unlink()
    r = run(PY, "ci/merge.py", "--out", tmp_path / "o2", *copies)
    assert r.returncode == 1 and "is missing" in r.stderr and "@gfx950" in r.stderr
    obj.write_bytes(data)

    path = room(copies[3], "gfx942", "0.33.0") / "manifest.json"
    man = json.loads(path.read_bytes())
    for e in man["entries"].values():  # built with other aiter helpers: a source the loader serves apart
        e["source"] = dict(e["source"], helpers=dict(e["source"]["helpers"], digest="0" * 16))
    path.write_text(json.dumps(man))
    with pytest.raises(IntegrityError, match="2 source identities") as e:
        merge.merge(copies, tmp_path / "o3", log=None)
    assert "gfx942/vllm-0.33.0" in str(e.value)
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists() and not (tmp_path / "o3").exists()


@pytest.mark.slow
def test_require_verified_reads_each_rooms_proofs(built, tmp_path):
    """The shards ci/build_shard.py built carry each room's verified.json (every
    key proven against its release's JIT); a room whose proofs are gone is
    refused by --require-verified, naming the room."""
    _, _, shards = built
    copies = _copy_shards(shards, tmp_path)
    merge.merge(copies, tmp_path / "ok", log=None, require_verified=True)
    for arch, release in ROOMS:
        proven = json.loads((room(tmp_path / "ok", arch, release) / "verified.json").read_text())["keys"]
        assert sorted(proven) == sorted(json.loads((room(tmp_path / "ok", arch, release) / "manifest.json")
                                                   .read_text())["entries"])
    for c in copies:
        v = room(c, "gfx950", "0.32.0") / "verified.json"
        if v.exists():
            v.unlink()
    with pytest.raises(IntegrityError, match="no proof") as e:
        merge.merge(copies, tmp_path / "out", log=None, require_verified=True)
    assert "gfx950/vllm-0.32.0" in str(e.value)
    assert not (tmp_path / "out").exists()
    merge.merge(copies, tmp_path / "out", log=None)  # without --require-verified it merges


def test_merge_refuses_a_key_the_shard_plan_did_not_give(smoke_dir, tmp_path):
    """A shard holding a key of another shard (same object: a plain merge
    would keep it once) or a shard with no plan is refused, naming the shard."""
    whole = smoke_dir
    shards = [_cut(whole, tmp_path / "ok" / f"s{i}", i, 2, plan=True) for i in range(2)]
    merge.merge(shards, tmp_path / "fine", log=None)  # as planned: merges
    a, b = room(shards[0], "gfx950", "0.32.0"), room(shards[1], "gfx950", "0.32.0")
    man_a, man_b = json.loads((a / "manifest.json").read_bytes()), json.loads((b / "manifest.json").read_bytes())
    key = sorted(man_b["entries"])[0]
    e = man_b["entries"][key]
    man_a["entries"][key] = e
    man_a["abis"].update(man_b["abis"])
    (a / "manifest.json").write_text(json.dumps(man_a))
    shutil.copyfile(shards[1] / "gfx950" / e["object"], shards[0] / "gfx950" / e["object"])
    with pytest.raises(IntegrityError, match="did not give it") as err:
        merge.merge(shards, tmp_path / "out", log=None)
    assert key in str(err.value) and "vLLM 0.32.0" in str(err.value)
    assert str(shards[0] / "gfx950") in str(err.value) and "--shard 0/2" in str(err.value)
    assert not (tmp_path / "out").exists()
    fresh = [_cut(whole, tmp_path / "fresh" / f"s{i}", i, 2, plan=True) for i in range(2)]
    extra = tmp_path / "unplanned"
    shutil.copytree(fresh[1], extra)
    for plan in extra.glob("shard-*.json"):
        plan.unlink()
    with pytest.raises(IntegrityError, match="no shard plan") as err:
        merge.merge(fresh + [extra], tmp_path / "out", log=None)
    assert str(extra) in str(err.value)


def test_merge_refuses_no_shards(tmp_path):
    (tmp_path / "gfx950" / "objects").mkdir(parents=True)  # an arch folder with no room is nothing to merge
    with pytest.raises(ManifestError, match="no shard holds"):
        merge.merge([tmp_path], tmp_path / "out", log=None)


def test_merge_refuses_a_plan_build_shard_never_writes(smoke_dir, tmp_path):
    """A plan file that is no JSON, lacks a field, or names shard 1 of 1 is bad input naming the file."""
    shard = _cut(smoke_dir, tmp_path / "s0", 0, 1, plan=True)
    plan = shard / build_shard.plan_name("gfx950", 0, 1)
    for text in ("{", json.dumps({"arch": "gfx950", "index": 0}), json.dumps({"arch": "gfx950", "index": 1, "count": 1})):
        plan.write_text(text)
        with pytest.raises(IntegrityError, match="not a shard plan") as err:
            merge.merge([shard], tmp_path / "out", log=None)
        assert str(plan) in str(err.value) and err.value.fix.startswith(f"rm {plan}")
    assert not (tmp_path / "out").exists()


def test_merge_json_is_one_document_when_it_fails(tmp_path, capsys):
    (tmp_path / "gfx950" / "objects").mkdir(parents=True)
    assert merge.main([str(tmp_path), "--out", str(tmp_path / "out"), "--json"]) == 1
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert doc["exit_code"] == 1 and "no shard holds" in doc["error"] and doc["failures"][0]["error"] == doc["error"]
    assert "no shard holds" in captured.err


def test_cibuildwheel_config_selects_one_linux_x86_64_build():
    exe = Path(PY).with_name("cibuildwheel")
    if not exe.exists():
        pytest.skip("cibuildwheel is not installed (pip install .[build])")
    r = run(exe, "--platform", "linux", "--print-build-identifiers", ".")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["cp311-manylinux_x86_64"]


def test_an_empty_prebuilt_dir_is_refused_with_a_fix_that_builds_every_deployed_arch(tmp_path, monkeypatch):
    from ci import prebuilt
    from dsv41_aot.facts import releases

    with pytest.raises(ManifestError, match="no prebuilt kernels in") as e:
        prebuilt.check_dir(tmp_path)
    deployed = releases.deployed_arches()
    build, link = e.value.fix.split(" && ")  # each names every arch (S24: the link named only the first)
    every = " ".join(f"--arch {a}" for a in deployed)
    assert len(deployed) > 1 and every in build and link == f"dsv41-aot link --dir {tmp_path} {every}", e.value.fix
    # an arch no release runs on any more is not one to build
    gone = deployed[-1]
    for v, rel in releases.RELEASES.items():
        monkeypatch.setitem(releases.RELEASES, v, dataclasses.replace(
            rel, arches={a: d for a, d in rel.arches.items() if a != gone}))
    with pytest.raises(ManifestError) as e:
        prebuilt.check_dir(tmp_path)
    assert f"--arch {gone}" not in e.value.fix and e.value.fix.endswith(f" && dsv41-aot link --dir {tmp_path} "
                                                                       + " ".join(f"--arch {a}" for a in deployed[:-1]))


def test_the_vllm_extra_is_read_from_pyproject_and_matched_by_pep_440():
    """ci/prebuilt.py reads the vllm extra with tomllib and matches releases
    with packaging: the range admits both releases the matrix builds, not the
    next minor or its pre-releases; a malformed extra is refused by name."""
    from ci import prebuilt
    from dsv41_aot.aot.wheel import admits

    spec = prebuilt.vllm_extra((ROOT / "pyproject.toml").read_text())
    assert [admits(spec, v) for v in ("0.31.9", "0.32.0", "0.33.1", "0.34", "0.34.0rc1")] == \
        [False, True, True, False, False]
    with pytest.raises(ManifestError, match="no vllm extra"):
        prebuilt.vllm_extra('[project.optional-dependencies]\nvllm = ["vllm"]\n')
    with pytest.raises(ManifestError, match="cannot be read"):
        prebuilt.vllm_extra('[project.optional-dependencies]\nvllm = ["vllm>=>1"]\n')
    with pytest.raises(ManifestError, match="not a PEP 440 version specifier"):
        admits(">=0.32,<x", "0.33.0")


def test_check_wheel_reads_requires_dist_as_pep_508():
    """The wheel's judge parses each Requires-Dist with packaging: the
    runtime needs nothing, FlyDSL and torch sit only in the build extra, and
    the vllm extra's range is the one the wheel must serve under."""
    from dsv41_aot.aot.wheel import requirement_problems

    ok = ['flydsl==0.4.2; extra == "build"', 'vllm==0.33.0 ; extra == "build"',
          'vllm[audio]<0.34,>=0.32.0; extra == "vllm"']
    assert requirement_problems(ok, ["build", "vllm"]) == ([], "<0.34,>=0.32.0")
    # pip evaluates a marker with extra "" when no extra is asked for: torch below installs at run time too;
    # a line that does not parse is named, and the lines after it are still judged
    bad = ['vllm>=>1; extra == "vllm"', "numpy", 'msgpack; python_version >= "3.8"',
           'torch; extra == "" or extra == "build"', 'Torch (>=2) ; extra == "vllm"', 'flydsl; extra == "plot"']
    problems, spec = requirement_problems(bad, ["build", "vllm", "plot"])
    assert spec is None
    assert problems[0].startswith("Requires-Dist 'vllm>=>1; extra == \"vllm\"' is not a PEP 508 requirement")
    assert [p.split(":")[0] for p in problems[1:4]] == [f"runtime requirement {line!r}" for line in bad[1:4]]
    assert [p.endswith("outside the build extra") for p in problems[4:]] == [True, True]


def test_the_wheel_gate_runs_when_a_wheel_is_built_not_when_setup_py_is_imported(tmp_path):
    """With DSV41_AOT_PREBUILT naming an empty dir, the backend's metadata
    step (what pip install -e runs first) and an sdist succeed; only the wheel
    build runs the gate and refuses the dir."""
    from ci.check_wheel import source_tree

    src = source_tree(tmp_path / "src")
    (tmp_path / "empty").mkdir()
    hooks = ("import sys; from setuptools import build_meta as b; "
             "print(getattr(b, sys.argv[1])(sys.argv[2]))")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSV41_AOT_")}
    env["DSV41_AOT_PREBUILT"] = str(tmp_path / "empty")
    for hook in ("prepare_metadata_for_build_wheel", "build_sdist", "build_wheel"):
        out = tmp_path / hook
        out.mkdir()
        r = subprocess.run([PY, "-c", hooks, hook, str(out)], cwd=src, env=env, capture_output=True, text=True,
                           timeout=300)
        if hook == "build_wheel":
            assert r.returncode == ManifestError.exit_code and "dsv41-aot wheel: error: no prebuilt kernels in" in r.stderr, \
                r.stderr
            assert not list(out.glob("*.whl"))
        else:
            assert r.returncode == 0, r.stderr[-3000:]
            assert "no prebuilt kernels" not in r.stderr
