"""A room's verified.json (proof.Proof): the proof that each key's prebuilt
code object is what vLLM's JIT builds, read by one strict parser everywhere
(verify, verify --against-jit --record, list, build, ci/merge.py).

- A malformed record, or one of another arch or release, is refused naming
  the file (exit 1), with a fix that works; ``--record`` sets an unreadable
  one aside and records anew.
- Each proof carries what only its JIT run produced (the sha256 of FlyDSL's
  cache artifact and cache key, and when), the build cache's JIT records
  too: a proof copied from the manifest carries none and is told apart
  (``merge --require-verified`` refuses it, ``verify`` counts it apart).
- Proofs of the old format (version 1, no evidence: the shared deployment's)
  stay readable and are reported as such, never a failure.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from dataclasses import replace
from datetime import datetime, timezone
from importlib.metadata import version as dist_version
from pathlib import Path

import pytest
from _smoke import REPO, cli, copy_of, room

from dsv41_aot.errors import ManifestError
from dsv41_aot.facts.releases import NEWEST
from dsv41_aot.manifest import Entry, Manifest, SourceIdentity
from dsv41_aot.proof import NO_EVIDENCE, PROOF_VERSION, PROVEN, STALE, Evidence, KeyProof, Proof
from dsv41_aot.room import Room
from dsv41_aot.listing import built_rooms

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
from ci import merge  # noqa: E402

SHARED = Path("/work/shared/prebuilt-gfx950-tp4")
K = "k1@gfx950:s=4,tp=4,r=1"  # the cheapest smoke key to JIT-build


def forged(man: Manifest, key: str, *, version: int = 2, evidence: dict | None | str = "jit") -> dict:
    """A proof record of ``key`` as verified.json holds it: version 1 (no
    evidence), or 2 with made-up JIT evidence (``"jit"``), ``None``, or
    the given dict."""
    e = man.entries[key]
    jit = {"release": man.release, "vllm_version": e.source.vllm_version,
           "mono_sources": e.source.mono_sources, "flydsl_version": e.source.flydsl_version,
           "mono_dir": "/somewhere/mono"}
    rec = {"code_object_sha256": e.code_object_sha256, "jit": jit}
    if version == 2:
        if evidence == "jit":
            evidence = {"artifact_sha256": hashlib.sha256(f"artifact {key}".encode()).hexdigest(),
                        "cache_key_sha256": hashlib.sha256(f"cache key {key}".encode()).hexdigest(),
                        "at": "2026-01-02T03:04:05Z"}
        rec["evidence"] = evidence
    return rec


def write_proofs(man: Manifest, recs: dict, version: int = 2, **doc) -> Path:
    path = man.room / "verified.json"
    path.write_text(json.dumps(dict({"version": version, "arch": man.arch, "release": man.release, "keys": recs},
                                    **doc)))
    return path


# ---------------------------------------------------------------- the parser


def _good(version=2) -> dict:
    rec = {"code_object_sha256": "a" * 64, "jit": {"release": NEWEST, "vllm_version": NEWEST,
                                                   "mono_sources": "0123456789abcdef", "flydsl_version": "0.4.2"}}
    if version >= 2:
        rec["evidence"] = {"artifact_sha256": "b" * 64, "cache_key_sha256": "c" * 64, "at": "2026-01-02T03:04:05Z"}
    return {"version": version, "arch": "gfx950", "release": NEWEST, "keys": {K: rec}}


def _with(change) -> bytes:
    doc = _good()
    change(doc)
    return json.dumps(doc).encode()


def _set(path, value):
    def change(doc):
        *head, last = path
        d = doc
        for p in head:
            d = d[p]
        if value is KeyError:
            del d[last]
        else:
            d[last] = value
    return change


BAD = {
    "not json": b'{"keys": ',
    "a list": b"[]",
    "keys a list": json.dumps({"version": 2, "arch": "gfx950", "release": NEWEST, "keys": [K]}).encode(),
    "no version": _with(_set(["version"], KeyError)),
    "a newer version": _with(_set(["version"], PROOF_VERSION + 1)),
    "other arch": _with(_set(["arch"], "gfx942")),
    "other release": _with(_set(["release"], "0.32.0")),
    "key of another arch": _with(lambda d: d["keys"].update({"k1@gfx942:s=4,tp=4,r=1": d["keys"].pop(K)})),
    "no code_object_sha256": _with(_set(["keys", K, "code_object_sha256"], KeyError)),
    "short code_object_sha256": _with(_set(["keys", K, "code_object_sha256"], "abc")),
    "jit of another release": _with(_set(["keys", K, "jit", "release"], "0.32.0")),
    "no evidence field": _with(_set(["keys", K, "evidence"], KeyError)),
    "evidence not a digest": _with(_set(["keys", K, "evidence", "artifact_sha256"], "xyz")),
    "evidence without a time": _with(_set(["keys", K, "evidence", "at"], "yesterday")),
    "evidence repeating the code object": _with(_set(["keys", K, "evidence", "artifact_sha256"], "a" * 64)),
    "version 1 with evidence": json.dumps(dict(_good(), version=1)).encode(),
    "jit without its FlyDSL": _with(_set(["keys", K, "jit", "flydsl_version"], KeyError)),
    "jit without its release": _with(_set(["keys", K, "jit", "release"], KeyError)),
}


def _under(flydsl: str, own: bool = True) -> dict:
    """A version-3 record whose ``flydsl`` section proves K under ``flydsl``;
    ``own``: K has its own proof in ``keys`` too (under FlyDSL 0.4.2)."""
    doc = _good(3)
    under = json.loads(json.dumps(doc["keys"][K]))
    under["jit"]["flydsl_version"] = flydsl
    doc["flydsl"] = {flydsl: {K: under}}
    if not own:
        doc["keys"] = {}
    return doc


# a proof under another FlyDSL is a second proof of a key that has its own
BAD["a proof under another FlyDSL of a key with no proof of its own"] = json.dumps(_under("0.5.0", own=False)).encode()
BAD["a proof under another FlyDSL that is the key's own FlyDSL"] = json.dumps(_under("0.4.2")).encode()
BAD["a flydsl section that is a list"] = json.dumps(dict(_good(3), flydsl=[])).encode()
BAD["a FlyDSL release mapped to a list"] = json.dumps(dict(_good(3), flydsl={"0.5.0": []})).encode()


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_malformed_proof_record_is_refused_naming_its_file(case):
    with pytest.raises(ManifestError) as e:
        Proof.parse(BAD[case], "/d/gfx950/vllm-0.33.0/verified.json", "gfx950", NEWEST, fix="FIX")
    assert str(e.value).startswith("/d/gfx950/vllm-0.33.0/verified.json: ") and e.value.fix == "FIX"
    assert e.value.exit_code == 1


def _identity(flydsl: str) -> SourceIdentity:
    """A made-up entry's source identity, built with FlyDSL ``flydsl``."""
    helpers = {"impl": "dsv41_aot.compat", "digest": "0" * 16}
    return SourceIdentity(NEWEST, "0123456789abcdef", helpers, flydsl, "LLD 19")


def test_both_versions_parse_and_say_what_they_prove():
    v2 = Proof.parse(json.dumps(_good()).encode(), "f", "gfx950", NEWEST, "FIX")
    v1 = Proof.parse(json.dumps(_good(1)).encode(), "f", "gfx950", NEWEST, "FIX")
    assert v2.keys[K].evidence == Evidence("b" * 64, None, "2026-01-02T03:04:05Z", cache_key_sha256="c" * 64)
    assert v1.keys[K].evidence is None
    entry = Entry(key=K, kind="k1", arch="gfx950", fields={}, symbol="s", entry="e", object="objects/x.o",
                  sha256="d" * 64, bytes=1, code_object_sha256="a" * 64, code_object_bytes=1, abi="0" * 12,
                  source=_identity("0.4.2"))
    assert v2.verdict(K, entry) == PROVEN and v1.verdict(K, entry) == NO_EVIDENCE
    assert v2.verdict(K, entry.replace(code_object_sha256="e" * 64)) == STALE
    assert v2.verdict(K, entry.replace(source=replace(entry.source, mono_sources="f" * 16))) == STALE
    # evidence that is the manifest's own object sha256 is no evidence
    assert v2.verdict(K, entry.replace(sha256="b" * 64)) == NO_EVIDENCE
    assert v2.verdict("k2@gfx950:s=4,tp=4,r=1", entry) is None
    assert v2.counts({K: entry, "k2@gfx950:s=4,tp=4,r=1": entry}) == \
        {"keys": 2, PROVEN: 1, NO_EVIDENCE: 0, STALE: 0, "unproven": 1}
    # written back: always the newest version, a version-1 proof kept without evidence
    again = Proof.parse(Proof("gfx950", NEWEST, {K: v1.keys[K]}).to_bytes(), "f", "gfx950", NEWEST, "FIX")
    assert again.version == PROOF_VERSION and again.keys[K] == KeyProof(K, "a" * 64, v1.keys[K].jit, None)
    # and a version-2 proof kept in a version-4 record, its evidence as it was
    kept = Proof.parse(Proof("gfx950", NEWEST, {K: v2.keys[K]}).to_bytes(), "f", "gfx950", NEWEST, "FIX")
    assert kept.version == PROOF_VERSION and kept.keys[K] == v2.keys[K] and kept.verdict(K, entry) == PROVEN


def test_a_version_3_record_keeps_its_proofs_under_other_flydsl_releases():
    """Version 3 added the ``flydsl`` section (a key's proofs under FlyDSL
    releases other than its own proof's): a version-3 record's section is
    read, checked like the keys' proofs, and kept when written back; a
    version-2 record has none, and one it carries is not read."""
    doc = _under("0.5.0")
    under = doc["flydsl"]["0.5.0"][K]
    v3 = Proof.parse(json.dumps(doc).encode(), "f", "gfx950", NEWEST, "FIX")
    assert [(p.key, p.flydsl) for p in v3.others] == [(K, "0.5.0")]
    again = Proof.parse(v3.to_bytes(), "f", "gfx950", NEWEST, "FIX")
    assert again.version == PROOF_VERSION and again.others == v3.others
    under["jit"]["flydsl_version"] = "0.4.2"  # filed under 0.5.0, its JIT names another: refused
    with pytest.raises(ManifestError, match="under FlyDSL 0.5.0: its jit names FlyDSL '0.4.2'"):
        Proof.parse(json.dumps(doc).encode(), "f", "gfx950", NEWEST, "FIX")
    assert Proof.parse(json.dumps(dict(doc, version=2)).encode(), "f", "gfx950", NEWEST, "FIX").others == ()


def test_a_key_keeps_its_proof_under_each_flydsl_and_a_stale_one_says_what_changed():
    """A proof under another FlyDSL of the same code object is a proof (the
    FlyDSL alone changes nothing that is served); a room's record keeps one a
    key and FlyDSL, each key's own under the FlyDSL its entry was built with,
    and counts the keys proven under each. A stale proof names what changed."""
    ev = Evidence("b" * 64, "c" * 64, "2026-01-02T03:04:05Z")
    jit = {"release": NEWEST, "vllm_version": NEWEST, "mono_sources": "0123456789abcdef"}
    built, other = "0.4.2", "0.5.0"  # the build's FlyDSL and another supported one
    entry = Entry(key=K, kind="k1", arch="gfx950", fields={}, symbol="s", entry="e", object="objects/x.o",
                  sha256="d" * 64, bytes=1, code_object_sha256="a" * 64, code_object_bytes=1, abi="0" * 12,
                  source=_identity(built))
    k2 = "k2@gfx950:s=4,tp=4,r=1"
    under_built = KeyProof(K, "a" * 64, dict(jit, flydsl_version=built), ev)
    under_other = KeyProof(K, "a" * 64, dict(jit, flydsl_version=other), Evidence("e" * 64, "f" * 64, "2026-02-01T00:00:00Z"))
    k2_other = KeyProof(k2, "a" * 64, dict(jit, flydsl_version=other), ev)
    assert under_other.verdict(entry) == PROVEN and under_other.change(entry) is None
    entries = {K: entry, k2: entry}
    proof = Proof.of("gfx950", NEWEST, [under_other, under_built, k2_other], entries)
    assert proof.keys == {K: under_built, k2: k2_other} and proof.others == (under_other,)
    assert proof.flydsl_counts(entries) == {built: 1, other: 2}
    assert proof.counts(entries)[PROVEN] == 2
    again = Proof.parse(proof.to_bytes(), "f", "gfx950", NEWEST, "FIX")
    assert again == proof and json.loads(proof.to_bytes())["flydsl"] == {other: {K: under_other.as_dict()}}
    # proofs under other FlyDSL releases are kept in key, then FlyDSL, order, whatever order they came in
    later = KeyProof(K, "a" * 64, dict(jit, flydsl_version="0.5.1"), ev)
    k2_built = KeyProof(k2, "a" * 64, dict(jit, flydsl_version=built), ev)
    mixed = Proof.of("gfx950", NEWEST, [later, k2_other, under_other, under_built, k2_built], entries)
    assert [(p.key, p.flydsl) for p in mixed.others] == [(K, other), (K, "0.5.1"), (k2, other)]
    # and written with every object's keys sorted, so the same proofs give the same bytes (a wheel is reproducible)
    for record in (proof.to_bytes(), mixed.to_bytes()):
        assert record == (json.dumps(json.loads(record), indent=1, sort_keys=True) + "\n").encode()
    # a proof of a code object the entry no longer holds is dropped from the record
    assert Proof.of("gfx950", NEWEST, [under_built], {K: entry.replace(code_object_sha256="9" * 64)}).keys == {}
    # stale: what changed, named
    rebuilt = entry.replace(code_object_sha256="9" * 64, source=replace(entry.source, flydsl_version=other))
    assert under_built.change(rebuilt) == ("the code object", f"rebuilt since by FlyDSL {other}, proven under {built}")
    same_flydsl = entry.replace(code_object_sha256="9" * 64)
    assert under_built.change(same_flydsl) == ("the code object", "rebuilt since")
    resourced = entry.replace(source=replace(entry.source, mono_sources="f" * 16))
    what, how = under_built.change(resourced)
    assert what == "the vLLM source" and how.startswith("mono sources ffff"), how
    assert proof.changes({K: rebuilt, k2: resourced}) == {"the code object": 1, "the vLLM source": 1}
    # the record's other-FlyDSL section must say the FlyDSL its proofs name
    doc = json.loads(proof.to_bytes())
    doc["flydsl"] = {"0.4.9": doc["flydsl"][other]}
    with pytest.raises(ManifestError, match="under FlyDSL 0.4.9"):
        Proof.parse(json.dumps(doc).encode(), "f", "gfx950", NEWEST, "FIX")


def test_two_proofs_of_a_key_are_compared_field_by_field():
    """``KeyProof.differences``, what verify prints when a room's proof is not
    this run's: each field both carry and that differs, with both values; a
    field one of them lacks (an older proof's) is not compared, nor the time."""
    jit = {"release": NEWEST, "vllm_version": NEWEST, "mono_sources": "0123456789abcdef"}
    mine = KeyProof(K, "a" * 64, jit, Evidence("b" * 64, "c" * 64, "2026-01-02T03:04:05Z"))
    assert mine.differences(mine) == []
    theirs = KeyProof(K, "a" * 64, dict(jit, mono_sources="fedcba9876543210"),
                      Evidence("b" * 64, "d" * 64, "2026-02-01T00:00:00Z"))
    assert mine.differences(theirs) == ["jit.mono_sources (0123456789abcdef, fedcba9876543210)",
                                        f"evidence.module_sha256 ({'c' * 16}, {'d' * 16})"]
    older = KeyProof(K, "a" * 64, {"release": NEWEST}, None)
    assert mine.differences(older) == older.differences(mine) == []
    other = KeyProof(K, "0123456789abcdef" * 4, jit, mine.evidence)  # another code object: each named by 16 digits
    assert mine.differences(other) == [f"code_object_sha256 ({'a' * 16}, 0123456789abcdef)"]
    assert other.differences(mine) == [f"code_object_sha256 (0123456789abcdef, {'a' * 16})"]


def test_version_4_evidence_names_the_compiled_module_and_no_host_path():
    """A version-4 proof's evidence is the artifact's and the compiled
    module's sha256 (FlyDSL's cache key, the same for every key of one arch
    and kind, is no longer written); a JIT identity's mono_dir (a path of the
    machine that made it) is never written into a record, an old one's
    included; a version-2 or 3 record cannot carry the new field."""
    doc = _good()
    doc["version"] = 4
    doc["keys"][K]["evidence"] = {"artifact_sha256": "b" * 64, "module_sha256": "c" * 64, "at": "2026-01-02T03:04:05Z"}
    doc["keys"][K]["jit"]["mono_dir"] = "/home/builder/vllm/models/deepseek_v41/amd/mono"
    p = Proof.parse(json.dumps(doc).encode(), "f", "gfx950", NEWEST, "FIX")
    assert p.keys[K].evidence == Evidence("b" * 64, "c" * 64, "2026-01-02T03:04:05Z")
    written = p.to_bytes()
    assert b"mono_dir" not in written and b"/home/builder" not in written and b"cache_key_sha256" not in written
    assert Proof.parse(written, "f", "gfx950", NEWEST, "FIX").keys[K].evidence == p.keys[K].evidence
    doc["version"] = 2
    with pytest.raises(ManifestError, match="evidence must be artifact_sha256, cache_key_sha256"):
        Proof.parse(json.dumps(doc).encode(), "f", "gfx950", NEWEST, "FIX")


# ---------------------------------------------------------------- every reader


@pytest.fixture
def copy(smoke_dir, tmp_path) -> Path:
    return copy_of(smoke_dir, tmp_path / "p")


@pytest.mark.parametrize("case", ["a list", "keys a list", "no code_object_sha256", "other arch", "other release"])
def test_merge_refuses_a_malformed_proof_naming_it(copy, tmp_path, case, capsys):
    """ci/merge.py reads each shard room's verified.json through the parser:
    exit 1 naming the file (a traceback before), nothing written."""
    man = Room(copy, "gfx950", NEWEST).manifest()
    doc = json.loads(BAD[case]) if case != "no code_object_sha256" else None
    if doc is None:
        recs = {k: forged(man, k) for k in man.entries}
        del recs[K]["code_object_sha256"]
        doc = {"version": 2, "arch": man.arch, "release": man.release, "keys": recs}
    elif isinstance(doc, dict) and isinstance(doc.get("keys"), dict):
        doc["keys"] = {k: forged(man, k) for k in man.entries}
    path = man.room / "verified.json"
    path.write_text(json.dumps(doc))
    code = merge.main([str(copy), "--out", str(tmp_path / "out"), "--no-link"])
    err = capsys.readouterr().err
    assert code == 1 and f"{path}: " in err and "Traceback" not in err, err
    assert f"dsv41-aot verify --against-jit --record --dir {copy} --release {NEWEST}" in err
    assert not (tmp_path / "out").exists()


def test_the_wheel_gate_refuses_a_truncated_proof(copy):
    """ci/prebuilt.py (what every wheel build runs) never ships a room whose
    verified.json cannot be read: the room's verdict includes its proof
    record, and the refusal names the file and the command that proves the
    room again."""
    from ci import prebuilt

    assert [r.name for c in prebuilt.check_dir(copy, ["gfx950"]) for r in c.rooms]  # sound as built
    man = Room(copy, "gfx950", NEWEST).manifest()
    path = write_proofs(man, {k: forged(man, k) for k in man.entries})
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
    with pytest.raises(ManifestError, match="malformed JSON") as e:
        prebuilt.check_dir(copy, ["gfx950"])
    assert str(path) in str(e.value)
    assert e.value.fix == f"dsv41-aot verify --against-jit --record --dir {copy.resolve()} --release {NEWEST}"


def test_verify_reads_every_rooms_proof(copy):
    """verify without --against-jit refuses an unreadable verified.json
    (exit 1, the file and its fix), and reports the other rooms' counts."""
    path = room(copy, "gfx942") / "verified.json"
    path.write_text('{"keys": ["k1@gfx942:s=4,tp=4,r=1"]}')
    proc = cli("verify", "--dir", copy, "--json")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    (bad,) = [f for f in report["failures"] if f["file"] == str(path)]
    assert bad["fix"] == f"dsv41-aot verify --against-jit --record --dir {copy} --release {NEWEST}"
    by_room = {(p["arch"], p["release"]): p for p in report["proofs"]}
    assert set(by_room) == {(r.arch, r.release) for r in built_rooms(copy)}
    assert "error" in by_room["gfx942", NEWEST]
    assert by_room["gfx950", NEWEST]["unproven"] == by_room["gfx950", NEWEST]["keys"] > 0


def test_record_replaces_an_unreadable_proof_and_verify_counts_per_room(copy):
    """verify --against-jit --record on a room whose verified.json is `[]`
    (a traceback before): set aside, the key proven now recorded with its
    JIT run's evidence, the room's count says 1 proven; the printed fix of
    the unreadable file is this very command."""
    path = room(copy, "gfx950") / "verified.json"
    path.write_text("[]")
    proc = cli("verify", "--dir", copy, "--against-jit", "--record", "--key", K, "--json", "--jobs", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert path.with_name("verified.json.corrupt").read_text() == "[]" and "set aside" in proc.stderr
    report = json.loads(proc.stdout)
    # --json's warnings say it too (N9 of the fault report at 24a0152: they were empty)
    assert [w for w in report["warnings"] if "set aside as" in w and "verified.json.corrupt" in w], report["warnings"]
    counts = {(p["arch"], p["release"]): p for p in report["proofs"]}[("gfx950", NEWEST)]
    man = Room(copy, "gfx950", NEWEST).manifest()
    assert counts == {"arch": "gfx950", "release": NEWEST, "keys": len(man.entries), PROVEN: 1, NO_EVIDENCE: 0,
                      STALE: 0, "unproven": len(man.entries) - 1, "by_flydsl": {dist_version("flydsl"): 1}}
    proof = Room(copy, "gfx950", NEWEST).proof()
    (p,) = proof.keys.values()
    e = man.entries[K]
    assert p.key == K and p.code_object_sha256 == e.code_object_sha256 and proof.verdict(K, e) == PROVEN
    assert p.evidence.module_sha256 and not p.evidence.digests & {e.sha256, e.code_object_sha256}
    assert "mono_dir" not in p.jit and b"mono_dir" not in path.read_bytes()
    when = datetime.fromisoformat(p.evidence.at.replace("Z", "+00:00"))
    assert abs((datetime.now(timezone.utc) - when).total_seconds()) < 24 * 3600  # the session's build cache's run
    # the text report says it per room too
    text = cli("verify", "--dir", copy)
    assert text.returncode == 0, text.stdout + text.stderr
    assert f"proofs gfx950 vLLM {NEWEST}: 1 of {len(man.entries)} keys carry a proof" in text.stdout


def test_proofs_copied_from_the_manifest_are_told_apart(copy, tmp_path):
    """Proofs made from the manifest's own digests (version 1, or version 2
    whose "evidence" is the object's sha256) pass no --require-verified and
    verify counts them apart; proofs carrying JIT evidence pass."""
    mans = [r.manifest() for r in built_rooms(copy)]
    for man in mans:
        write_proofs(man, {k: forged(man, k, version=1) for k in man.entries}, version=1)
    with pytest.raises(merge.MergeError, match="without evidence only a JIT run produced"):
        merge.merge([copy], tmp_path / "refused", link=False, log=None, require_verified=True)
    report = json.loads(cli("verify", "--dir", copy, "--json").stdout)
    assert report["failed"] == 0
    assert all(p[NO_EVIDENCE] == p["keys"] and p[PROVEN] == 0 for p in report["proofs"]), report["proofs"]
    assert any("carry no evidence only a JIT run produced" in w for w in report["warnings"])

    for man in mans:  # "evidence" that is the manifest's object sha256
        write_proofs(man, {k: forged(man, k, evidence={"artifact_sha256": e.sha256, "cache_key_sha256": e.sha256,
                                                       "at": "2026-01-02T03:04:05Z"})
                           for k, e in man.entries.items()})
    with pytest.raises(merge.MergeError, match="without evidence"):
        merge.merge([copy], tmp_path / "refused", link=False, log=None, require_verified=True)

    for man in mans:
        write_proofs(man, {k: forged(man, k) for k in man.entries})
    s = merge.merge([copy], tmp_path / "ok", link=False, log=None, require_verified=True)
    for man in mans:
        assert s["arches"][man.arch]["rooms"][man.release]["verified"] == len(man.entries)
        got = Room(tmp_path / "ok", man.arch, man.release).proof()
        assert got.keys == Room(copy, man.arch, man.release).proof().keys


def test_list_and_build_read_the_proofs(copy):
    """list says each key's proof; build says each room's count and warns
    of a proof its rebuild made stale (here: a proof of another object)."""
    man = Room(copy, "gfx950", NEWEST).manifest()
    recs = {k: forged(man, k) for k in man.entries}
    other = sorted(recs)[0]
    recs[other]["code_object_sha256"] = "0" * 64
    old = sorted(recs)[1]
    recs[old] = forged(man, old, evidence=None)
    write_proofs(man, recs)
    doc = json.loads(cli("list", "--dir", copy, "--json").stdout)
    states = {(e["release"], e["key"]): e["proof"] for e in doc["entries"]}
    assert states[NEWEST, other] == STALE and states[NEWEST, old] == NO_EVIDENCE
    assert {states[NEWEST, k] for k in man.entries if k not in (other, old)} == {PROVEN}
    assert all(v is None for (r, k), v in states.items() if (r, k[k.index("@"):k.index(":")]) != (NEWEST, "@gfx950"))
    n = len(man.entries)
    r = cli("build", "--arch", "gfx950", "--release", NEWEST, "--profile", "smoke", "--out", copy, "--json",
            "--no-progress")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["compiled"] == 0
    (counted,) = s["proofs"]  # the count verify and list report too
    assert counted == {"arch": "gfx950", "release": NEWEST, "keys": n, PROVEN: n - 2, NO_EVIDENCE: 1, STALE: 1,
                       "unproven": 0, "by_flydsl": counted["by_flydsl"]} and sum(counted["by_flydsl"].values()) == n - 2
    assert f"warning: {man.room / 'verified.json'}: 1 proof(s) carry no evidence" in r.stderr
    assert "1 proof(s) are stale: the code object changed (1)" in r.stderr


def test_a_cached_jit_result_keeps_its_runs_evidence(copy, tmp_path):
    """The build cache's JIT record holds the evidence of the run that made
    it; a proof recorded from the cache carries that run's evidence."""
    from dsv41_aot.aot.hiprec import launch_digest

    cache = tmp_path / "cache"
    second = copy_of(copy, tmp_path / "second")
    got = []
    for d in (copy, second):
        proc = cli("verify", "--dir", d, "--against-jit", "--record", "--key", K, "--json", "--cache", cache,
                   "--jobs", "1")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        got.append((json.loads(proc.stdout)["jit_cached"], Room(d, "gfx950", NEWEST).proof().keys[K]))
    (first_cached, a), (second_cached, b) = got
    assert (first_cached, second_cached) == (0, 1)
    assert a == b and a.evidence is not None
    (rec,) = [json.loads(p.read_text()) for p in (cache / "v1" / "jit").rglob("*.json")]
    launch = rec["evidence"].pop("launch")  # the JIT's launch as HIP saw it; the proof keeps its digest
    assert dict(rec["evidence"], launch_sha256=launch_digest(launch)) == a.evidence.as_dict()


@pytest.mark.skipif(not SHARED.is_dir(), reason=f"{SHARED} (the shared full deployment) is not on this machine")
def test_the_shared_deployments_old_proofs_are_read_and_reported(tmp_path):
    """The full gfx950-tp4 deployment's verified.json files are version 1
    (no evidence): verify passes, counting every key's proof as one without
    JIT-only evidence and saying so; list says it per key. Nothing migrates
    them (evidence cannot be made after the fact): proving again does."""
    d = Path(shutil.copytree(SHARED, tmp_path / "dep"))
    before = {p: p.read_bytes() for p in d.rglob("verified.json")}
    proc = cli("verify", "--dir", d, "--json")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    for p in report["proofs"]:
        assert p[NO_EVIDENCE] == p["keys"] > 0 and (p[PROVEN], p[STALE], p["unproven"]) == (0, 0, 0), p
    assert sorted(p["release"] for p in report["proofs"]) == ["0.32.0", "0.33.0"]
    assert sum("carry no evidence only a JIT run produced" in w for w in report["warnings"]) == 2
    doc = json.loads(cli("list", "--dir", d, "--json").stdout)
    assert {e["proof"] for e in doc["entries"]} == {NO_EVIDENCE}
    assert {p: p.read_bytes() for p in d.rglob("verified.json")} == before


@pytest.mark.parametrize("counted, said", [
    ({PROVEN: 2, NO_EVIDENCE: 2, STALE: 1, "by_flydsl": {"0.4.2": 1, None: 1}},
     ": 2 of 5 keys carry a proof against vLLM's JIT matching their entry, 2 without JIT-only evidence (old format), "
     "1 stale; proven under FlyDSL 0.4.2: 1, (unnamed): 1"),
    ({PROVEN: 5, NO_EVIDENCE: 0, STALE: 0}, ": 5 of 5 keys carry a proof against vLLM's JIT matching their entry"),
    ({"error": "malformed JSON"}, ": verified.json unreadable (malformed JSON)"),
], ids=["every state", "all proven", "unreadable"])
def test_the_proofs_line_counts_each_state(counted, said):
    """The one line build, list and verify print of a room's proofs: each state it has keys in, counted."""
    from dsv41_aot.verdict import proofs_line

    line = proofs_line({"arch": "gfx950", "release": NEWEST, "keys": 5, **counted})
    assert line == f"proofs gfx950 vLLM {NEWEST}{said}", line
