import pytest

from dsv41_aot.errors import KeyFormatError
from dsv41_aot.facts.releases import NEWEST
from dsv41_aot.keys import BuildKey, neighbours


def test_canonical_string_round_trips():
    for text in [
        "k2@gfx950:s=4,tp=4,r=1",
        "k1@gfx950:s=6,tp=4,r=0,f=0,e=128,k=3,g=1,w=192",
        "ffn@gfx942:s=42,tp=4,r=0,e=128,k=3",
        "k1@gfx950:s=48,tp=2,r=2,i=1,tl=1",
    ]:
        assert str(BuildKey.parse(text, NEWEST)) == text


def test_defaults_written_out_parse_to_the_canonical_key():
    key = BuildKey.parse("k1@gfx950:s=4,tp=4,r=1,f=1,i=0,e=384,k=6,g=2,w=128,tl=0", NEWEST)
    assert str(key) == "k1@gfx950:s=4,tp=4,r=1"


def test_kernel_symbol_matches_vllm_naming():
    # measured here: K1 s=4 tp=4 r=1's kernel name in FlyDSL's cache
    assert BuildKey.parse("k1@gfx950:s=4,tp=4,r=1", NEWEST).kernel_symbol == "_ZN5aiter33dsv41_mono_k1_s4_tp4_r1_tl0_f1_i0E"
    assert BuildKey.parse("k2@gfx950:s=4,tp=4,r=1", NEWEST).kernel_symbol == "_ZN5aiter30dsv41_mono_k2_s4_tp4_r1_tl0_i0E"
    # the FFN symbol names e but not k (layer._ffn_symbol_params)
    assert BuildKey.parse("ffn@gfx942:s=1,tp=4,r=0,e=128,k=3", NEWEST).kernel_symbol == "_ZN5aiter30dsv41_mono_ffn_s1_tp4_tl0_e128E"


def test_fields_a_launch_does_not_read_are_pinned():
    # K2 does not read fold: one K2 symbol, one key
    assert BuildKey("k2", "gfx950", 4, 4, 1, fold=False, release=NEWEST) == BuildKey("k2", "gfx950", 4, 4, 1, release=NEWEST)
    # ffn_kernel builds MonoBuild(tokens, tp, 0, timeline, experts=, topk=)
    assert str(BuildKey("ffn", "gfx950", 4, 4, 2, index=True, ug_groups=1, release=NEWEST)) == "ffn@gfx950:s=4,tp=4,r=0"


def test_entry_names_are_distinct_c_identifiers():
    a = BuildKey.parse("k1@gfx950:s=4,tp=4,r=1", NEWEST).entry
    b = BuildKey.parse("k1@gfx950:s=4,tp=4,r=1,f=0", NEWEST).entry
    assert a != b and a.isidentifier() and b.isidentifier()


@pytest.mark.parametrize(
    "text, words",
    [
        ("k2gfx950:s=4", "malformed"),
        ("k3@gfx950:s=4,tp=4,r=1", "unknown launch kind"),
        ("k1@gfx1100:s=4,tp=4,r=1", "unknown arch"),
        ("k1@gfx950:s=49,tp=4,r=1", "outside 1..48"),
        ("k1@gfx950:s=0,tp=4,r=1", "outside 1..48"),
        ("k1@gfx950:s=4,tp=4,r=3", "compress ratio"),
        ("k1@gfx950:s=4,tp=4", "missing r"),
        ("k1@gfx950:s=4,tp=4,r=1,x=2", "bad field"),
        ("k1@gfx950:s=4,tp=4,r=1,f=2", "must be 0 or 1"),
        ("k1@gfx950:s=four,tp=4,r=1", "not an integer"),
        ("k1@gfx950:s=4,s=5,tp=4,r=1", "given twice"),
        ("ffn@gfx950:s=4,tp=4,r=1", "does not take r=1"),
        ("k2@gfx950:s=4,tp=4,r=1,f=0", "does not take f=0"),
    ],
)
def test_malformed_keys_are_refused_with_the_fix(text, words):
    with pytest.raises(KeyFormatError) as e:
        BuildKey.parse(text, NEWEST)
    assert words in str(e.value)
    assert "fix:" in str(e.value)
    assert e.value.exit_code == 2


# ---------------------------------------------------------------- neighbours


BUILT = [
    "k2@gfx950:s=12,tp=4,r=1", "k2@gfx950:s=17,tp=4,r=1", "k2@gfx950:s=3,tp=4,r=1",
    "k2@gfx950:s=13,tp=2,r=1", "k2@gfx950:s=13,tp=4,r=2,i=1", "k2@gfx950:s=13,tp=4,r=0",
    "k1@gfx950:s=13,tp=4,r=1", "k2@gfx942:s=13,tp=4,r=1",
]


def test_neighbours_are_the_same_launch_at_the_nearest_widths_then_the_same_width():
    want = BuildKey.parse("k2@gfx950:s=13,tp=4,r=1", NEWEST)
    near = neighbours(want, BUILT)
    # the same launch just below and just above (not s=3, which a string match would pick),
    # then the same width with one field changed before two
    assert near[:2] == ["k2@gfx950:s=12,tp=4,r=1", "k2@gfx950:s=17,tp=4,r=1"]
    assert set(near[2:4]) == {"k2@gfx950:s=13,tp=2,r=1", "k2@gfx950:s=13,tp=4,r=0"}
    assert near[4] == "k2@gfx950:s=13,tp=4,r=2,i=1" and len(near) == 5
    # never another kind or arch
    assert not any(k.startswith("k1@") or "gfx942" in k for k in near)
    assert neighbours(want, [BuildKey.parse(k, NEWEST) for k in BUILT], n=2) == near[:2]


def test_neighbours_fall_back_to_the_fewest_changes():
    assert neighbours(BuildKey.parse("k2@gfx950:s=40,tp=2,r=2,i=1", NEWEST), BUILT, n=1) == ["k2@gfx950:s=13,tp=4,r=2,i=1"]
    assert neighbours(BuildKey.parse("ffn@gfx950:s=4,tp=4,r=0", NEWEST), BUILT) == []


# ---------------------------------------------------------------- releases

OLD = "0.32.0"  # MonoBuild(tokens, tp, ratio, timeline): no fold, index or routing fields


@pytest.mark.parametrize(
    "text, field",
    [
        ("k1@gfx950:s=4,tp=4,r=1,f=0", "fold"),
        ("k1@gfx950:s=4,tp=4,r=1,i=1", "index"),
        ("k2@gfx950:s=4,tp=4,r=1,i=1", "index"),
        ("k2@gfx950:s=4,tp=4,r=1,e=128", "experts"),
        ("ffn@gfx950:s=4,tp=4,r=0,e=128", "experts"),
        ("k1@gfx950:s=4,tp=4,r=1,w=192", "swa_width"),
    ],
)
def test_an_old_release_key_refuses_fields_its_monobuild_lacks(text, field):
    # the same string is a vLLM 0.33.0 key ...
    assert str(BuildKey.parse(text, NEWEST)) == text
    # ... but vLLM 0.32.0's MonoBuild has no such field: refused, naming it
    with pytest.raises(KeyFormatError) as e:
        BuildKey.parse(text, OLD)
    msg = str(e.value)
    assert f"vLLM {OLD}'s MonoBuild has no {field} field" in msg and f"vLLM {OLD} {text[:text.index('@')]} launch" in msg
    assert e.value.exit_code == 2 and "fix:" in msg
    # written at the value it behaves as, the field is accepted (and dropped)
    default = {"fold": "f=1", "index": "i=0", "experts": "e=384", "swa_width": "w=128"}[field]
    plain = text.rsplit(",", 1)[0]
    assert BuildKey.parse(f"{plain},{default}", OLD) == BuildKey.parse(plain, OLD)


def test_an_old_release_key_names_its_own_symbol_and_fields():
    k1, k2, ffn = (BuildKey.parse(t, OLD) for t in
                   ("k1@gfx950:s=4,tp=4,r=1", "k2@gfx950:s=4,tp=4,r=1", "ffn@gfx950:s=4,tp=4,r=0"))
    # measured here: vLLM 0.32.0's layer.py kernel_symbol(stem, s=, tp=, r=, tl=)
    # (no f / i), and the FFN's (s=, tp=) -- the symbols its compiles export
    assert k1.kernel_symbol == "_ZN5aiter27dsv41_mono_k1_s4_tp4_r1_tl0E"
    assert k2.kernel_symbol == "_ZN5aiter27dsv41_mono_k2_s4_tp4_r1_tl0E"
    assert ffn.kernel_symbol == "_ZN5aiter21dsv41_mono_ffn_s4_tp4E"
    # 0.33.0's K1 of the same string reads fold and index, and names them
    assert "_f1_i0" in BuildKey.parse("k1@gfx950:s=4,tp=4,r=1", NEWEST).kernel_symbol
    # the MonoBuild 0.32.0's builders take: its four fields, nothing else
    assert k1.build_fields() == {"tokens": 4, "tp": 4, "ratio": 1, "timeline": False}
    assert ffn.build_fields() == {"tokens": 4, "tp": 4, "ratio": 0, "timeline": False}
    assert set(BuildKey.parse("k1@gfx950:s=4,tp=4,r=1", NEWEST).build_fields()) > set(k1.build_fields())


def test_a_key_string_names_a_launch_within_its_release():
    new, old = BuildKey.parse("k2@gfx950:s=4,tp=4,r=1", NEWEST), BuildKey.parse("k2@gfx950:s=4,tp=4,r=1", OLD)
    # one string, two launches: the release is beside the string, never in it
    assert str(new) == str(old) and new != old
    assert (new.release, old.release) == ("0.33.0", OLD)
    assert old.describe() == "k2@gfx950:s=4,tp=4,r=1 (vLLM 0.32.0)" and old.room == "gfx950/vllm-0.32.0"
    assert new.room == "gfx950/vllm-0.33.0"
    with pytest.raises(KeyFormatError, match="unknown vLLM release '0.31.0'"):
        BuildKey.parse("k2@gfx950:s=4,tp=4,r=1", "0.31.0")
    # neighbours never cross releases: a 0.33.0 key is no neighbour of a 0.32.0 one
    assert neighbours(BuildKey.parse("k2@gfx950:s=5,tp=4,r=1", OLD), [new]) == []
    assert neighbours(BuildKey.parse("k2@gfx950:s=5,tp=4,r=1", OLD), [old]) == [str(old)]


# ---------------------------------------------------------------- MonoBuild's defaults: one table


def test_every_release_states_monobuilds_defaults_and_routing():
    from dsv41_aot.facts.releases import DEFAULTED, RELEASES, ROUTING

    for rel in RELEASES.values():
        assert set(rel.defaults) == set(DEFAULTED), rel.version
        assert set(rel.target) <= {f for f in ROUTING if rel.reads(f)}, rel.version
        whole_drafts = any(d.draft_layers == "whole" for d in rel.arches.values())
        assert (rel.draft_ug_groups is not None) == whole_drafts, rel.version


def test_a_key_reads_its_releases_defaults_from_the_facts(monkeypatch):
    import dataclasses

    from dsv41_aot.facts import releases

    rel = releases.RELEASES["0.33.0"]
    # a release whose MonoBuild defaults to 256 experts: keys.py repeats no default
    monkeypatch.setitem(releases.RELEASES, "0.33.0", dataclasses.replace(rel, defaults=dict(rel.defaults, experts=256)))
    plain = BuildKey("k1", "gfx950", 4, 4, 1, release=NEWEST)
    assert plain.experts == 256 and str(plain) == "k1@gfx950:s=4,tp=4,r=1"
    assert "_e" not in plain.kernel_symbol  # "?e": named only off the default
    wide = BuildKey.parse("k1@gfx950:s=4,tp=4,r=1,e=384", NEWEST)
    assert wide.experts == 384 and str(wide) == "k1@gfx950:s=4,tp=4,r=1,e=384" and "_e384" in wide.kernel_symbol
    # a launch that does not read a field is pinned to the release's default
    assert BuildKey("ffn", "gfx950", 4, 4, 0, swa_width=64, release=NEWEST).swa_width == 128
    monkeypatch.setitem(releases.RELEASES, "0.33.0", dataclasses.replace(rel, defaults=dict(rel.defaults, swa_width=96)))
    assert BuildKey("ffn", "gfx950", 4, 4, 0, swa_width=64, release=NEWEST).swa_width == 96


def test_a_field_left_out_takes_the_default_and_compares_equal():
    assert BuildKey("k2", "gfx950", 4, 4, 1, release=NEWEST) == BuildKey("k2", "gfx950", 4, 4, 1, fold=True, index=False, experts=384,
                                                         topk=6, ug_groups=2, swa_width=128, timeline=False, release=NEWEST)
    assert BuildKey("k2", "gfx950", 4, 4, 1, experts=None, release=NEWEST).experts == 384
    old = BuildKey("k1", "gfx950", 4, 4, 1, release=OLD)
    assert (old.fold, old.index, old.experts, old.topk, old.ug_groups, old.swa_width) == (True, False, 384, 6, 2, 128)
