"""ci/: shard plans cover every key once, merged shards equal one whole build,
and merge refuses what cannot be merged."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ci import build_shard, merge  # noqa: E402
from dsv41_aot.build import matrix  # noqa: E402
from dsv41_aot.errors import IntegrityError, ManifestError  # noqa: E402

from _smoke import copy_of, smoke_dir  # noqa: E402

PY = sys.executable
ARCHES = ("gfx950", "gfx942")


def run(*cmd, **kw):
    return subprocess.run([str(c) for c in cmd], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, **kw)


# ------------------------------------------------------------------ plans (fast)


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("count", [1, 3, 8])
def test_plans_cover_every_full_key_exactly_once(arch, count):
    plans = [build_shard.plan(arch, i, count, "full") for i in range(count)]
    everything = plans[0]["all_keys"]
    got = [k for p in plans for k in p["keys"]]
    assert sorted(got) == everything and len(set(got)) == len(got)
    assert all(p["all_keys"] == everything for p in plans)
    costs = [p["estimated_seconds"] for p in plans]
    assert max(costs) - min(costs) <= max(matrix.estimate_seconds(matrix.BuildKey.parse(k)) for k in everything)


def test_plans_follow_recorded_seconds_identically_in_every_cell():
    keys = build_shard.plan("gfx950", 0, 1, "full")["all_keys"]
    seconds = {k: (i * 7919) % 97 + 1.0 for i, k in enumerate(keys)}  # a recorded run, far from the estimate
    plans = [build_shard.plan("gfx950", i, 4, "full", seconds=seconds) for i in range(4)]
    again = [build_shard.plan("gfx950", i, 4, "full", seconds=dict(reversed(seconds.items()))) for i in range(4)]
    assert plans == again
    loads = [sum(seconds[k] for k in p["keys"]) for p in plans]
    assert max(loads) - min(loads) <= max(seconds.values())
    assert plans != [build_shard.plan("gfx950", i, 4, "full") for i in range(4)]


def test_recorded_seconds_read_from_timings_manifests_and_arch_folders(tmp_path):
    """timings.json (what a build writes beside its manifest), a manifest.json
    (its sibling timings.json), an arch folder, and an older manifest that
    still held compile_seconds all give the same mapping."""
    k1, k2 = "k1@gfx950:s=1,tp=2,r=0", "k2@gfx950:s=4,tp=4,r=1"
    arch = tmp_path / "gfx950"
    arch.mkdir()
    (arch / "timings.json").write_text(json.dumps({k1: 3.5, k2: 9.25}))
    (arch / "manifest.json").write_text(json.dumps({"schema": 1, "arch": "gfx950", "abis": {}, "entries": {}}))
    want = {k1: 3.5, k2: 9.25}
    assert matrix.recorded_seconds([arch / "timings.json"]) == want
    assert matrix.recorded_seconds([arch / "manifest.json"]) == want
    assert matrix.recorded_seconds([arch]) == want
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"schema": 1, "arch": "gfx950", "abis": {}, "entries": {k1: {"compile_seconds": 3.5}}}))
    assert matrix.recorded_seconds([old]) == {k1: 3.5}
    (tmp_path / "bad.json").write_text(json.dumps({k1: "slow"}))
    with pytest.raises(matrix.MatrixError, match="not a number"):
        matrix.recorded_seconds([tmp_path / "bad.json"])


def test_bad_shard_is_refused():
    r = run(PY, "ci/build_shard.py", "--arch", "gfx950", "--shard", "2/2", "--out", "/nonexistent", "--plan-only")
    assert r.returncode == 2 and "0 <= i < N" in r.stderr


# ------------------------------------------------------------------ builds (slow)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The smoke profile built whole (and linked), and built as 2 shards per arch."""
    tmp = tmp_path_factory.mktemp("ci")
    whole = copy_of(smoke_dir(tmp_path_factory), tmp / "whole")  # the session's smoke build, linked
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
        # objects and linked libraries byte for byte
        assert _tree(a / "objects") == _tree(b / "objects")
        assert _tree(a / "lib") == _tree(b / "lib")
        # the manifest byte for byte (nothing measured is in it); the shards'
        # compile seconds joined in the side file
        assert (a / "manifest.json").read_bytes() == (b / "manifest.json").read_bytes()
        assert sorted(json.loads((a / "timings.json").read_text())) == sorted(json.loads((a / "manifest.json").read_text())["entries"])
    assert sorted(p.name for p in out.iterdir()) == list(sorted(ARCHES))


@pytest.mark.slow
def test_merge_is_byte_exact_for_the_same_entries(built, tmp_path):
    """Shards cut from the whole build merge back into its exact manifest.json bytes."""
    _, whole, _ = built
    parts = []
    for i in range(2):
        d = tmp_path / f"part{i}"
        for arch in ARCHES:
            man = json.loads((whole / arch / "manifest.json").read_bytes())
            keep = sorted(man["entries"])[i::2]
            man["entries"] = {k: man["entries"][k] for k in keep}
            (d / arch / "objects").mkdir(parents=True)
            (d / arch / "manifest.json").write_text(json.dumps(man))
            for k in keep:
                obj = man["entries"][k]["object"]
                shutil.copyfile(whole / arch / obj, d / arch / obj)
        parts.append(d)
    merge.merge(parts, tmp_path / "out", log=None)
    for arch in ARCHES:
        assert (tmp_path / "out" / arch / "manifest.json").read_bytes() == (whole / arch / "manifest.json").read_bytes()
        assert _tree(tmp_path / "out" / arch / "lib") == _tree(whole / arch / "lib")


def _copy_shards(shards, dest: Path) -> list[Path]:
    out = []
    for s in shards:
        shutil.copytree(s, dest / s.name)
        out.append(dest / s.name)
    return out


@pytest.mark.slow
def test_merge_refuses_conflicting_entries(built, tmp_path):
    _, _, shards = built
    copies = _copy_shards(shards, tmp_path)
    # a second copy of shard 0 of gfx950 whose key points at another real object
    a = copies[0] / "gfx950"
    b_root = tmp_path / "conflict"
    shutil.copytree(copies[1], b_root)
    man_a = json.loads((a / "manifest.json").read_bytes())
    man_b = json.loads((b_root / "gfx950" / "manifest.json").read_bytes())
    key = sorted(man_a["entries"])[0]
    other = next(iter(man_b["entries"].values()))
    forged = dict(man_a["entries"][key], **{f: other[f] for f in ("object", "sha256", "bytes")})
    man_b["entries"][key] = forged
    man_b["abis"].update(man_a["abis"])
    (b_root / "gfx950" / "manifest.json").write_text(json.dumps(man_b))
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep").write_text("old")
    with pytest.raises(IntegrityError, match="different objects") as e:
        merge.merge(copies + [b_root], out, log=None)
    assert key in str(e.value) and "fix:" in str(e.value)
    assert [p.name for p in out.iterdir()] == ["keep"]  # the old output is untouched
    assert not [p for p in tmp_path.iterdir() if ".merge-" in p.name]  # no temporary left


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

    path = copies[3] / "gfx942" / "manifest.json"
    man = json.loads(path.read_bytes())
    for e in man["entries"].values():
        e["source"] = dict(e["source"], flydsl_version="0.4.1")
    path.write_text(json.dumps(man))
    with pytest.raises(IntegrityError, match="2 source identities"):
        merge.merge(copies, tmp_path / "o3", log=None)
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists() and not (tmp_path / "o3").exists()


def _planned_shards(whole: Path, dest: Path, arch: str, count: int = 2) -> list[Path]:
    """Shards cut from a built arch folder, each with the plan ci/build_shard.py
    would write for it (its keys, every key of the arch)."""
    man = json.loads((whole / arch / "manifest.json").read_bytes())
    everything = sorted(man["entries"])
    out = []
    for i in range(count):
        d = dest / f"shard-{arch}-{i}"
        keep = everything[i::count]
        part = dict(man, entries={k: man["entries"][k] for k in keep})
        (d / arch / "objects").mkdir(parents=True)
        (d / arch / "manifest.json").write_text(json.dumps(part))
        for k in keep:
            obj = man["entries"][k]["object"]
            shutil.copyfile(whole / arch / obj, d / arch / obj)
        plan = {"arch": arch, "index": i, "count": count, "profile": "smoke", "all_keys": everything, "keys": keep}
        (d / build_shard.plan_name(arch, i, count)).write_text(json.dumps(plan))
        out.append(d)
    return out


def test_merge_refuses_a_key_the_shard_plan_did_not_give(tmp_path_factory, tmp_path):
    """A shard holding a key of another shard (same object: a plain merge
    would keep it once) or a shard with no plan is refused, naming the shard."""
    whole = smoke_dir(tmp_path_factory)
    shards = _planned_shards(whole, tmp_path / "ok", "gfx950")
    merge.merge(shards, tmp_path / "fine", log=None)  # as planned: merges
    a, b = shards[0] / "gfx950", shards[1] / "gfx950"
    man_a, man_b = json.loads((a / "manifest.json").read_bytes()), json.loads((b / "manifest.json").read_bytes())
    key = sorted(man_b["entries"])[0]
    e = man_b["entries"][key]
    man_a["entries"][key] = e
    (a / "manifest.json").write_text(json.dumps(man_a))
    shutil.copyfile(b / e["object"], a / e["object"])
    with pytest.raises(IntegrityError, match="did not give it") as err:
        merge.merge(shards, tmp_path / "out", log=None)
    assert key in str(err.value) and str(a) in str(err.value) and "--shard 0/2" in str(err.value)
    assert not (tmp_path / "out").exists()
    fresh = _planned_shards(whole, tmp_path / "fresh", "gfx950")
    extra = tmp_path / "unplanned"
    shutil.copytree(fresh[1], extra)
    for plan in extra.glob("shard-*.json"):
        plan.unlink()
    with pytest.raises(IntegrityError, match="no shard plan") as err:
        merge.merge(fresh + [extra], tmp_path / "out", log=None)
    assert str(extra) in str(err.value)


def test_merge_refuses_no_shards(tmp_path):
    with pytest.raises(ManifestError, match="no shard holds"):
        merge.merge([tmp_path], tmp_path / "out", log=None)


def test_cibuildwheel_config_selects_one_linux_x86_64_build():
    exe = Path(PY).with_name("cibuildwheel")
    if not exe.exists():
        pytest.skip("cibuildwheel is not installed (pip install .[build])")
    r = run(exe, "--platform", "linux", "--print-build-identifiers", ".")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["cp311-manylinux_x86_64"]
