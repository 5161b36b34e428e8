"""The record parsers on what they must refuse: the link record's
(linkrecord.LinkRecord.parse) on names that are not a band file of lib/ and
on malformed fields, the manifest's on an entry filed under another key.
Each is refused where the record is read, naming it, so no later check has
to catch what the parser let through. And libs.json's bytes: the same bands
give the same file."""

from __future__ import annotations

import json
import shutil

import pytest
from _smoke import deployment

from dsv41_aot.errors import ManifestError
from dsv41_aot.facts.releases import NEWEST
from dsv41_aot.linkrecord import Band, LinkRecord
from dsv41_aot.manifest import entry_name, read_timings
from dsv41_aot.room import Room

K = "k1@gfx950:s=4,tp=4,r=1"


def _record(file: str) -> bytes:
    lib = {"chunk": "s01-08", "file": file, "sha256": "a" * 64, "bytes": 10, "raw_sha256": "b" * 64,
           "raw_bytes": 20, "entries": {K: "c" * 64}}
    return json.dumps({"schema": 2, "arch": "gfx950", "release": NEWEST, "libraries": [lib]}).encode()


def test_a_band_file_name_parses():
    rec = LinkRecord.parse(_record("libdsv41_s01-08.0123456789ab.so.xz"), "libs.json", "gfx950", NEWEST, "FIX")
    assert rec.band_of[K].file == "libdsv41_s01-08.0123456789ab.so.xz"


# each begins like a band file name: a parser matching only a prefix of the
# name would accept it
@pytest.mark.parametrize("name", [
    "libdsv41_x.so.xz/../../../../etc/hostname",
    "libdsv41_x.so.xz/../libdsv41_y.so.xz",
    "libdsv41_x.so.xz\n",
    "libdsv41_x.so.xz.so",
    "libdsv41_x.so.xz ",
    "../libdsv41_x.so.xz",
    "/etc/libdsv41_x.so.xz",
])
def test_a_name_that_only_begins_or_ends_like_a_band_is_refused(name):
    with pytest.raises(ManifestError, match="not a band file of lib/") as e:
        LinkRecord.parse(_record(name), "/d/gfx950/vllm-0.33.0/libs.json", "gfx950", NEWEST, "FIX")
    assert str(e.value).startswith("/d/gfx950/vllm-0.33.0/libs.json: ") and e.value.fix == "FIX"


@pytest.mark.parametrize("change", [
    lambda doc: [doc],
    lambda doc: {k: v for k, v in doc.items() if k != "libraries"},
    lambda doc: dict(doc, libraries=5),
    lambda doc: dict(doc, libraries=["libdsv41_s01-08.0123456789ab.so.xz"]),
    lambda doc: dict(doc, libraries=[{k: v for k, v in doc["libraries"][0].items() if k != "sha256"}]),
], ids=["a list", "no libraries", "libraries a number", "a library a string", "a library without its sha256"])
def test_a_document_that_is_no_link_record_is_refused_naming_it(change):
    doc = change(json.loads(_record("libdsv41_s01-08.0123456789ab.so.xz")))
    with pytest.raises(ManifestError) as e:
        LinkRecord.parse(json.dumps(doc).encode(), "/d/gfx950/vllm-0.33.0/libs.json", "gfx950", NEWEST, "FIX")
    assert (e.value.message, e.value.fix) == ("/d/gfx950/vllm-0.33.0/libs.json: not a dsv41-aot link record", "FIX")


@pytest.mark.parametrize("arch, release", [("gfx942", NEWEST), ("gfx950", "0.32.0")])
def test_a_link_record_of_another_room_is_refused_naming_both_rooms(arch, release):
    """libs.json of another arch or release, copied into this room: both rooms named, the record's as it says."""
    with pytest.raises(ManifestError) as e:
        LinkRecord.parse(_record("libdsv41_s01-08.0123456789ab.so.xz"), "/d/libs.json", arch, release, "FIX")
    assert (e.value.message, e.value.fix) == (f"/d/libs.json: link record for 'gfx950' vLLM '{NEWEST}' in the "
                                              f"{arch} vLLM {release} folder", "FIX")


# each field of a library, of the wrong type while every other field is sound:
# one bad field alone must be refused (a check that needs two bad fields at
# once would let each through)
@pytest.mark.parametrize("field, value", [("chunk", 5), ("entries", ["k"]), ("sha256", "a"), ("raw_sha256", 7),
                                          ("bytes", "10"), ("raw_bytes", 2.0)])
def test_a_library_with_one_malformed_field_is_refused(field, value):
    doc = json.loads(_record("libdsv41_s01-08.0123456789ab.so.xz"))
    doc["libraries"][0][field] = value
    with pytest.raises(ManifestError, match="chunk / sha256 / raw_sha256 / bytes / raw_bytes / entries malformed") as e:
        LinkRecord.parse(json.dumps(doc).encode(), "/d/gfx950/vllm-0.33.0/libs.json", "gfx950", NEWEST, "FIX")
    assert e.value.fix == "FIX"


def test_a_manifest_entry_filed_under_another_key_is_refused_naming_both(tmp_path):
    """An entry whose own ``key`` is not the key it is filed under (a
    copied entry): the manifest is refused, naming the key it is filed
    under and the one it names."""
    room = Room(tmp_path / "p", "gfx942", NEWEST)  # the deployment's one room
    shutil.copytree(Room(deployment("gfx942-tp4"), "gfx942", NEWEST).dir, room.dir)
    path = room.manifest_path
    doc = json.loads(path.read_text())
    a, b = sorted(doc["entries"])[:2]
    doc["entries"][a]["key"] = b
    path.write_text(json.dumps(doc))
    with pytest.raises(ManifestError) as e:
        room.manifest()
    assert f"{path}: entry {a} names key {b!r} / arch 'gfx942'" in str(e.value) and e.value.fix


def _first(doc: dict) -> dict:
    return doc["entries"][sorted(doc["entries"])[0]]


def _file_under(doc: dict, key: str) -> None:
    """Refile the first entry under ``key``, its own key and C entry point made to match."""
    e = doc["entries"].pop(sorted(doc["entries"])[0])
    doc["entries"][key] = dict(e, key=key, entry=entry_name(key))


MALFORMED_MANIFESTS = {  # what is changed -> (the change, what the refusal says after the manifest's path)
    "schema": (lambda d: d.update(schema=1), "not a schema-2 dsv41-aot manifest"),
    "arch": (lambda d: d.update(arch="gfx950"), "manifest for 'gfx950' in the gfx942 folder"),
    "release": (lambda d: d.update(release="0.32.0"), f"manifest for vLLM '0.32.0' in the vLLM {NEWEST} folder"),
    "entries": (lambda d: d.pop("entries"), "entries / abis missing"),
    "key": (lambda d: _file_under(d, "k1@gfx942:s=99,tp=4,r=0"),
            f"entry k1@gfx942:s=99,tp=4,r=0 is no key of vLLM {NEWEST}: step width s=99 outside 1..48"),
    "abi": (lambda d: d["abis"].update({_first(d)["abi"]: []}), "is not the slot list its id names"),
    "entry field": (lambda d: _first(d).pop("object"), "lacks object"),
    "entry a number": (lambda d: d["entries"].update({next(iter(d["entries"])): 7}), "lacks key, "),
    "entry abi": (lambda d: _first(d).update(abi="0" * 16), "names unknown ABI 0000000000000000"),
    "entry key": (lambda d: _first(d).update(key="k1@gfx942:s=1,tp=4,r=0"),
                  "names key 'k1@gfx942:s=1,tp=4,r=0' / arch 'gfx942'"),
    "entry arch": (lambda d: _first(d).update(arch="gfx950"), "/ arch 'gfx950'"),
    "entry point": (lambda d: _first(d).update(entry="dsv41_other"), "names C entry point 'dsv41_other'"),
    "key spelling": (lambda d: _file_under(d, "k1@gfx942:tp=4,s=3,r=1"),
                     "entry k1@gfx942:tp=4,s=3,r=1 is not written as its key is (k1@gfx942:s=3,tp=4,r=1)"),
    "object": (lambda d: _first(d).update(object="../objects/x.co"), "names object '../objects/x.co' outside"),
    "object folder": (lambda d: _first(d).update(object="lib/x.co"), "names object 'lib/x.co' outside"),
    "object step": (lambda d: _first(d).update(object="objects/.."), "names object 'objects/..' outside"),
    "object no name": (lambda d: _first(d).update(object="objects/"), "names object 'objects/' outside"),
    "object backslash": (lambda d: _first(d).update(object="objects/..\\x.co"), "names object 'objects/..\\\\x.co'"),
    "object a number": (lambda d: _first(d).update(object=7), "names object 7 outside"),
    "refused": (lambda d: d.update(refused=[]), "refused must be a mapping"),
    "mono_sources": (lambda d: d.update(mono_sources="0" * 16), "mono_sources '0000000000000000' is not its"),
}


@pytest.mark.parametrize("field", sorted(MALFORMED_MANIFESTS))
def test_a_malformed_manifest_is_refused_naming_it_with_the_rebuild(tmp_path, field):
    """Each way manifest.json can be malformed is refused when it is read, naming the file and what is wrong,
    with the room's rebuild as the fix (a build sets the bad manifest aside and recovers its entries)."""
    room = Room(tmp_path / "p", "gfx942", NEWEST)
    shutil.copytree(Room(deployment("gfx942-tp4"), "gfx942", NEWEST).dir, room.dir)
    change, said = MALFORMED_MANIFESTS[field]
    doc = json.loads(room.manifest_path.read_text())
    change(doc)
    room.manifest_path.write_text(json.dumps(doc))
    with pytest.raises(ManifestError) as e:
        room.manifest()
    assert e.value.message.startswith(f"{room.manifest_path}: ") and said in e.value.message, e.value.message
    assert e.value.fix == room.build_cmd, e.value.fix


@pytest.mark.parametrize("sha", ["c" * 63, "C" * 64, 7, None])
def test_a_key_linked_from_an_object_digest_that_is_no_sha256_is_refused(sha):
    """Each key of a band names the sha256 of the object it was linked from: anything else is refused, naming the
    key and the band."""
    doc = json.loads(_record("libdsv41_s01-08.0123456789ab.so.xz"))
    doc["libraries"][0]["entries"][K] = sha
    with pytest.raises(ManifestError) as e:
        LinkRecord.parse(json.dumps(doc).encode(), "/d/gfx950/vllm-0.33.0/libs.json", "gfx950", NEWEST, "FIX")
    assert f"libdsv41_s01-08.0123456789ab.so.xz links {K} from object {sha!r}, not a sha256" in e.value.message
    assert e.value.fix == "FIX"


def test_compile_seconds_in_an_older_manifest_move_to_timings_json(tmp_path):
    """A manifest written before timings.json held each entry's compile seconds in the entry: read, they are the
    room's timings and no longer the entry's, and the next write moves them to timings.json."""
    room = Room(tmp_path / "p", "gfx942", NEWEST)
    shutil.copytree(Room(deployment("gfx942-tp4"), "gfx942", NEWEST).dir, room.dir)
    (room.dir / "timings.json").unlink(missing_ok=True)
    doc = json.loads(room.manifest_path.read_text())
    key = sorted(doc["entries"])[0]
    doc["entries"][key]["compile_seconds"] = 3.5
    assert not room.manifest().migrated  # today's manifest: nothing for a build to move
    room.manifest_path.write_text(json.dumps(doc))
    man = Room(room.root, "gfx942", NEWEST).manifest()
    assert man.migrated and man.timings == {key: 3.5} and "compile_seconds" not in man.entries[key].extra
    man.write()
    assert json.loads((room.dir / "timings.json").read_text()) == {key: 3.5}
    assert "compile_seconds" not in room.manifest_path.read_text()
    # a rebuild's seconds replace them: given (as the builder puts a compile), or carried by a worker's entry
    other = sorted(man.entries)[1]
    man.put(man.entries[key], man.abi(key), seconds=2.25)
    man.put(dict(man.entries[other].to_dict(), compile_seconds=1.5), man.abi(other))
    assert man.timings == {key: 2.25, other: 1.5}


def test_the_same_bands_give_the_same_libs_json_bytes():
    """libs.json is written the same whatever order a band's keys were linked in: a relink of the same objects
    changes no byte (a record written in link order would differ from build to build)."""
    keys = [f"k1@gfx950:s={s},tp=4,r=1" for s in (1, 2, 3, 4)]
    lib = json.loads(_record("libdsv41_s01-08.0123456789ab.so.xz"))["libraries"][0]

    def record(order):
        band = Band(**{**lib, "entries": {k: f"{i:x}" * 64 for i, k in order}})
        return LinkRecord.of("gfx950", NEWEST, [band]).to_bytes()

    linked = list(enumerate(keys, 1))
    data = record(linked)
    assert data == record(linked[::-1])
    assert LinkRecord.parse(data, "libs.json", "gfx950", NEWEST, "FIX").to_bytes() == data


def test_a_key_two_bands_link_is_refused_naming_both():
    """A key is served from one band: a record whose two bands both link it (which the loader could only pick
    between) is refused, naming the key and both band files."""
    doc = json.loads(_record("libdsv41_s01-08.0123456789ab.so.xz"))
    second = dict(doc["libraries"][0], file="libdsv41_s01-08.ba9876543210.so.xz")
    doc["libraries"].append(second)
    with pytest.raises(ManifestError) as e:
        LinkRecord.parse(json.dumps(doc).encode(), "/d/gfx950/vllm-0.33.0/libs.json", "gfx950", NEWEST, "FIX")
    assert e.value.message == (f"/d/gfx950/vllm-0.33.0/libs.json: {K} is linked by "
                               "libdsv41_s01-08.0123456789ab.so.xz and libdsv41_s01-08.ba9876543210.so.xz")
    assert e.value.fix == "FIX"


@pytest.mark.parametrize("text", [b"[1, 2]", b"{not json", b'{"k1@gfx950:s=4,tp=4,r=1": "fast", "other": 2}'],
                         ids=["a list", "not json", "a value not a number"])
def test_timings_that_do_not_read_are_no_timings(tmp_path, text):
    """timings.json only balances shards, never decides a build: whatever it holds, reading it never fails,
    and only the numbers it holds are kept."""
    (tmp_path / "timings.json").write_bytes(text)
    assert read_timings(tmp_path) == ({"other": 2.0} if b"other" in text else {})
    assert read_timings(tmp_path / "absent") == {}
