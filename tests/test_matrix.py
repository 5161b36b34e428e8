"""build_matrix.yaml: the releases and drafts a build covers, expanded by
each vLLM release's own rules (0.33.0, 0.32.0; dsv41_aot/facts/), profiles
across releases, shards, and errors that point at the offending line."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from _smoke import OLD, REPO, run_cli

from dsv41_aot.aot import matrix
from dsv41_aot.manifest import folder_name
from dsv41_aot.aot.shards import shard
from dsv41_aot.errors import MatrixError
from dsv41_aot.facts.releases import NEWEST
from dsv41_aot.keys import BuildKey

MATRIX = REPO / "build_matrix.yaml"


@pytest.fixture(scope="module")
def m():
    return matrix.load(MATRIX)


def test_full_profile_follows_vllms_rules(m):
    full = m.select("full")
    assert len(full) == len(set(full))
    gfx942 = [k for k in full if k.arch == "gfx942"]
    # gfx942: TP 4 only, at most 42 rows, K2 without the key-table build,
    # draft layers FFN-only
    assert gfx942 and all(k.tp == 4 and k.tokens <= 42 for k in gfx942)
    assert not any(k.kind == "k2" and k.index for k in gfx942)
    assert not any(k.kind in ("k1", "k2") and k.experts != 384 for k in gfx942)
    assert any(k.kind == "ffn" and (k.experts, k.topk) == (128, 3) for k in gfx942)
    gfx950 = [k for k in full if k.arch == "gfx950"]
    # gfx950: every width 1..48 at TP 2 and 4, the draft as whole layers
    assert {k.tokens for k in gfx950} == set(range(1, 49)) and {k.tp for k in gfx950} == {2, 4}
    assert not any(k.kind == "ffn" and k.experts != 384 for k in gfx950)
    draft = BuildKey.parse("k1@gfx950:s=6,tp=4,r=0,f=0,e=128,k=3,g=1,w=192", NEWEST)
    assert draft in full
    # an index source's K2 keeps index on gfx950; layer 0's K1 folds nothing
    assert BuildKey.parse("k2@gfx950:s=1,tp=2,r=2,i=1", NEWEST) in full
    assert BuildKey.parse("k1@gfx950:s=1,tp=2,r=0,f=0", NEWEST) in full
    # the kernel source refuses these (measured here): never in the matrix
    assert BuildKey.parse("ffn@gfx942:s=33,tp=2,r=0", NEWEST) not in full
    assert BuildKey.parse("k2@gfx942:s=17,tp=2,r=2", NEWEST) not in full


def test_full_holds_every_layer_kind_the_runner_accepts(m):
    # vLLM 0.33.0's runner (0.32.0's has no fold or index: its own tests below)
    full = {k for k in m.select("full") if k.release == NEWEST}
    # runner.forward: ratio 0/1/2, fold true/false, index only with a ratio --
    # K1 with (ratio 1 or 2, fold false, index false) included, which
    # V4.1-Flash's own schedule never uses
    for arch, tp, widths in (("gfx950", 2, 48), ("gfx950", 4, 48), ("gfx942", 4, 42)):
        for s in range(1, widths + 1):
            for r in (0, 1, 2):
                for f in (False, True):
                    for i in (False, True) if r else (False,):
                        assert BuildKey(kind="k1", arch=arch, tokens=s, tp=tp, ratio=r, fold=f, index=i, release=NEWEST) in full
    superset = [k for k in full if k.kind == "k1" and k.ratio and not k.fold and not k.index]
    # 2 ratios x 48 widths at each gfx950 TP, 2 x 42 on gfx942 TP4: the 96 / 96 / 84
    assert len(superset) == 96 + 96 + 84
    # K2 reads no fold: no K2 key is added by them
    k2s = [k for k in full if k.kind == "k2"]
    assert {str(k) for k in k2s} == {str(dataclasses.replace(k, index=k.index)) for k in k2s}
    assert len([k for k in full if k.kind == "k2" and k.arch == "gfx950" and k.experts == 384]) == 2 * 48 * 5


def test_deployment_profiles_partition_full(m):
    parts = [set(m.select(p)) for p in ("gfx950-tp2", "gfx950-tp4", "gfx942-tp4")]
    assert set.union(*parts) == set(m.select("full"))
    assert sum(map(len, parts)) == len(m.select("full"))


def test_smoke_covers_every_kind_on_both_arches(m):
    smoke = m.select("smoke")
    newest = [k for k in smoke if k.release == NEWEST]
    assert {(k.kind, k.arch) for k in newest} == {(k, a) for k in ("k1", "k2", "ffn") for a in ("gfx950", "gfx942")}
    assert len(newest) <= 8
    # vLLM 0.32.0 (gfx950 only) has every kind too, and nothing else is in it
    old = [k for k in smoke if k.release == OLD]
    assert {(k.kind, k.arch) for k in old} == {(k, "gfx950") for k in ("k1", "k2", "ffn")}
    assert len(newest) + len(old) == len(smoke) and len(old) <= 3


@pytest.mark.parametrize("count", [1, 2, 3, 7])
def test_every_key_in_exactly_one_shard(m, count):
    keys = m.select("gfx942-tp4")
    shards = [shard(keys, i, count) for i in range(count)]
    flat = [k for s in shards for k in s]
    assert sorted(flat) == sorted(keys) and len(flat) == len(set(flat))


def test_shards_balance_recorded_seconds(m):
    # one release's keys: a recorded time is keyed by the key string, which
    # names a launch within its release
    keys = [k for k in m.select("gfx950-tp4") if k.release == NEWEST][:40]
    seconds = {str(k): (100.0 if i == 0 else 1.0) for i, k in enumerate(keys)}
    a, b = (shard(keys, i, 2, seconds) for i in range(2))
    heavy = keys[0]
    # the 100-second key is alone against the 39 one-second ones
    assert (heavy in a and len(a) == 1) or (heavy in b and len(b) == 1)


def _write(tmp_path: Path, old: str, new: str, count: int = 1) -> Path:
    text = MATRIX.read_text()
    assert old in text, old
    p = tmp_path / "build_matrix.yaml"
    p.write_text(text.replace(old, new, count))
    return p


def _line_of(path: Path, needle: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if needle in line)


@pytest.mark.parametrize(
    "old, new, needle, words",
    [
        # a release gives its digest only: vLLM's rules give the widths, TP sizes and layer kinds
        ('"0.33.0": {mono_sources: 6d37d13d1b3c9e47}', '"0.33.0": {mono_sources: 6d37d13d1b3c9e47, tokens: 1..48}',
         '"0.33.0": {mono', "unknown entry 'tokens' (a release gives its mono_sources only"),
        ("version: 4", "version: 3", "version: 3", "matrix version 3: this dsv41-aot reads version 4"),
        ('  "0.33.0": {mono', '  "0.31.0": {mono', '"0.31.0": {mono', "release '0.31.0': dsv41-aot knows vLLM"),
        ("        - k2@gfx950:s=4,tp=4,r=1\n", "        - k2@gfx950:s=4,tp=4,r=1\n        - k2@gfx950:s=4,tp=4,r=1\n", None, "duplicate key k2@gfx950:s=4,tp=4,r=1 (vLLM 0.33.0)"),
        ("  gfx942-tp4: {where: {arch: gfx942, tp: 4}}", "  gfx942-tp4: {where: {arch: gfx942, tp: 2}}", "gfx942-tp4:", "selects no keys"),
        # gfx942 steps take at most 42 rows (facts/releases.py): the profile key names that rule
        ("      - k1@gfx942:s=4,tp=4,r=1", "      - k1@gfx942:s=44,tp=4,r=1", "k1@gfx942:s=44",
         "vLLM's runner never asks for it on vLLM 0.33.0 gfx942 TP4, steps of 1..42 rows"),
        ("dspark: {experts: 128, topk: 3, swa_width: 192}", "dspark: {experts: 128, topk: 3, ug_groups: 1, swa_width: 192}",
         "dspark:", "drafts.dspark: needs exactly experts, topk, swa_width"),
        ("  gfx942-tp4: {where: {arch: gfx942, tp: 4}}", "  gfx942-tp4: {where: {arch: gfx942, tpp: 4}}", "gfx942-tp4:",
         "unknown field 'tpp'"),
    ],
)
def test_bad_matrix_errors_name_the_line(tmp_path, old, new, needle, words):
    p = _write(tmp_path, old, new)
    with pytest.raises(MatrixError) as e:
        m = matrix.load(p)
        for name in m.profiles:
            m.select(name)
    msg = str(e.value)
    assert words in msg
    assert str(p) in msg and "dsv41-aot build" in msg
    if needle is None:  # the second copy of a duplicated line
        line = [i for i, t in enumerate(p.read_text().splitlines(), 1) if "k2@gfx950:s=4,tp=4,r=1" in t][1]
    else:
        line = _line_of(p, needle)
    assert re.search(rf":{line}:", msg), (line, msg)


def test_not_yaml_names_the_line(tmp_path):
    p = _write(tmp_path, "swa_width: 192}", "swa_width: 192")
    with pytest.raises(MatrixError, match=r"build_matrix.yaml:\d+: not valid YAML"):
        matrix.load(p)


def test_cli_bad_input_exits_2_and_writes_nothing(tmp_path):
    p = _write(tmp_path, "6d37d13d1b3c9e47}", "6d37d13d1b3c9e47, tokens: 1..49}")
    out = tmp_path / "out"
    code, _, err = run_cli("build", "--matrix", p, "--out", out, check=False)
    assert code == 2 and "unknown entry 'tokens'" in err
    assert not out.exists()
    code, _, err = run_cli("build", "--key", "k9@gfx950:s=1,tp=2,r=0", "--out", out, check=False)
    assert code == 2 and "unknown launch kind" in err and not out.exists()
    code, _, err = run_cli("build", "--profile", "nope", "--out", out, check=False)
    assert code == 2 and "no profile 'nope'" in err and not out.exists()
    code, _, err = run_cli("build", "--shard", "2/2", "--out", out, check=False)
    assert code == 2 and "bad shard" in err and not out.exists()


def _listed(out: str) -> list:
    """``build --list`` lines: (release, key string) each."""
    return [tuple(line.split()) for line in out.splitlines()]


def test_cli_lists_a_profile(m):
    _, out, _ = run_cli("build", "--list", "--profile", "smoke")
    assert _listed(out) == [(k.release, str(k)) for k in m.select("smoke")]
    # --release keeps that release's keys only
    _, out, _ = run_cli("build", "--list", "--profile", "smoke", "--release", OLD)
    assert _listed(out) == [(OLD, str(k)) for k in m.select("smoke") if k.release == OLD]


def test_cli_key_flags_extend_and_suggest_real_neighbours():
    a, b, c = "k1@gfx950:s=4,tp=4,r=1", "k2@gfx950:s=4,tp=4,r=1", "ffn@gfx942:s=4,tp=4,r=0"
    # --key A --key B builds both (the last one used to win); --key A B still works
    _, out, _ = run_cli("build", "--list", "--key", a, "--key", b, c)
    assert _listed(out) == [(NEWEST, a), (NEWEST, b), (NEWEST, c)]
    # a key the matrix does not build names its nearest keys, not string look-alikes
    code, _, err = run_cli("build", "--list", "--key", "k2@gfx942:s=43,tp=4,r=1", check=False)
    assert code == 2 and "nearest it builds: k2@gfx942:s=42,tp=4,r=1\n" in err  # gfx942 stops at 42 rows
    code, _, err = run_cli("build", "--list", "--key", "k2@gfx950:s=13,tp=8,r=1", check=False)
    near = err.split("nearest it builds: ")[1].splitlines()[0].split(", ")
    assert code == 2 and near[:2] == ["k2@gfx950:s=13,tp=2,r=1", "k2@gfx950:s=13,tp=4,r=1"] and len(near) == 5


# ---------------------------------------------------------------- releases


def test_full_is_each_releases_keys(m):
    full = m.select("full")
    by_release = {r: [k for k in full if k.release == r] for r in m.releases}
    # 2,454 launches of vLLM 0.33.0 beside 480 of vLLM 0.32.0
    assert (len(by_release[NEWEST]), len(by_release[OLD])) == (2454, 480) and len(full) == 2454 + 480
    # 0.32.0: gfx950 only, TP 2 and 4, widths 1..48, whole layers at ratio 1
    # and 2 (K1 + K2), the FFN launch for any other layer; no draft routing
    old = by_release[OLD]
    assert {k.arch for k in old} == {"gfx950"} and {k.tp for k in old} == {2, 4}
    assert {k.tokens for k in old} == set(range(1, 49))
    assert {(k.kind, k.ratio) for k in old} == {("k1", 1), ("k1", 2), ("k2", 1), ("k2", 2), ("ffn", 0)}
    # its MonoBuild has no fold, index or routing: those are pinned, the string omits them
    assert all((k.fold, k.index, k.experts, k.topk) == (True, False, 384, 6) for k in old)
    assert all(str(k).count(",") == 2 for k in old)
    # its entry gives its digest alone: its runner's rules keep its keys
    assert m.releases[OLD] == "0aa9262967c37d51" and m.drafts == {"dspark": (128, 3, 192)}
    # the per-release profiles split full
    assert set(m.select(folder_name(NEWEST))) == set(by_release[NEWEST])
    assert set(m.select(folder_name(OLD))) == set(old)


_OLD_DIGEST = '  "0.32.0": {mono_sources: 0aa9262967c37d51}'


@pytest.mark.parametrize(
    "old, new, needle, words",
    [
        # a field vLLM 0.32.0's MonoBuild lacks
        ('      "0.32.0":\n        - k1@gfx950:s=4,tp=4,r=1\n', '      "0.32.0":\n        - k1@gfx950:s=4,tp=4,r=1,f=0\n',
         "r=1,f=0", "vLLM 0.32.0's MonoBuild has no fold field"),
        # a draft only vLLM 0.32.0 would run: its draft layers leave the mono path
        ('  "0.33.0": {mono_sources: 6d37d13d1b3c9e47}\n', "", "  dspark: {", "drafts.dspark adds no key"),
        # its mono sources digest: 16 hex digits, given
        (_OLD_DIGEST, '  "0.32.0": {mono_sources: 0aa9262967c37d5}', '  "0.32.0":', "mono_sources must be"),
        (_OLD_DIGEST, '  "0.32.0": {}', '  "0.32.0":', "mono_sources must be"),
        # keys: a mapping of release -> keys; each read in its release
        ('      "0.32.0":\n        - k1', '      "0.31.0":\n        - k1', '"0.31.0":', "vLLM '0.31.0' is not a release"),
        ('      "0.32.0":\n        - k1@gfx950:s=4,tp=4,r=1\n', '      "0.32.0":\n        - k1@gfx950:s=4,tp=4,r=0\n',
         "- k1@gfx950:s=4,tp=4,r=0", "k1@gfx950:s=4,tp=4,r=0 (vLLM 0.32.0) is not a key the matrix builds"),
    ],
)
def test_a_release_entry_is_checked_against_its_release(tmp_path, old, new, needle, words):
    p = _write(tmp_path, old, new)
    with pytest.raises(MatrixError) as e:
        matrix.load(p)
    msg = str(e.value)
    assert words in msg and str(p) in msg and "dsv41-aot build" in msg
    # the offending line of the 0.32.0 entry (or its profile keys), not 0.33.0's;
    # a needle with its indentation is a line's start (the release's own line)
    lines = p.read_text().splitlines()
    line = max(i for i, t in enumerate(lines, 1) if (t.startswith(needle) if needle[0] == " " else needle in t))
    assert re.search(rf":{line}:", msg), (line, msg)


def test_keys_mapping_reads_each_list_in_its_release(tmp_path, m):
    smoke = m.select("smoke")
    # the smoke profile's 0.32.0 list gives 0.32.0 keys, its 0.33.0 list 0.33.0's
    assert sorted(str(k) for k in smoke if k.release == OLD) == [
        "ffn@gfx950:s=4,tp=4,r=0", "k1@gfx950:s=4,tp=4,r=1", "k2@gfx950:s=4,tp=4,r=1"]
    assert sum(k.release == NEWEST for k in smoke) == 7
    extra = ("  mine:\n    keys:\n      \"0.32.0\":\n        - k2@gfx950:s=9,tp=2,r=2\n"
             "  plain:\n    keys:\n      - k2@gfx950:s=9,tp=2,r=2\n")
    p = tmp_path / "build_matrix.yaml"
    p.write_text(MATRIX.read_text() + extra)
    mm = matrix.load(p)
    (mine,), (plain,) = mm.select("mine"), mm.select("plain")
    # the same string names a launch of each release: a list is the newest's
    assert str(mine) == str(plain) == "k2@gfx950:s=9,tp=2,r=2"
    assert (mine.release, plain.release) == (OLD, NEWEST) and mine != plain
