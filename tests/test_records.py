"""The link record's parser (linkrecord.LinkRecord.parse) on names that are not
a band file of lib/: each refused where the record is read, naming it, so no
later path check has to catch a name the parser let through."""

from __future__ import annotations

import json

import pytest

from dsv41_aot.errors import ManifestError
from dsv41_aot.facts.releases import NEWEST
from dsv41_aot.linkrecord import LinkRecord

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
