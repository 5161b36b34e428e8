"""Runtime fault suite: real faults injected into a real smoke prebuilt dir,
each refused at bind (or load) with the error that names it.

Byte flips in bands, libs.json and manifest.json; forged link records (a
band's sha256 rewritten to match the flip; a recompressed altered library);
traversal paths in libs.json ``file``, manifest ``object`` and the arch;
ABIs with a slot removed (id kept, or id recomputed so only the library's
export metadata can tell); a file swapped between verification and load; the
HIP runtime version; a vLLM whose digest cannot be computed; a thread race on
one Launcher against a C stub compiled here with gcc, through the same ctypes
call path (and the old shared-buffer path, which the race does break).

``bench/faults.py`` counts them (``-m faults``). No GPU here: only the stub
stands in for a device entry (MOCK-GPU, marked where it is made).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import lzma
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from _smoke import OLD, REPO, band_of, copy_of, forge_band, forge_library, libdir, libs_json, room
import dsv41_aot
from dsv41_aot.errors import (
    HipVersionError,
    IntegrityError,
    LaunchError,
    LoadError,
    ManifestError,
    SourceMismatchError,
)
from dsv41_aot.facts.releases import NEWEST
from dsv41_aot.manifest import abi_id
from dsv41_aot.room import Room
from dsv41_aot.linkrecord import Band
from dsv41_aot.runtime import loader, state

pytestmark = [pytest.mark.slow, pytest.mark.faults]
K1 = "k1@gfx950:s=4,tp=4,r=1"


@pytest.fixture(scope="module")
def smoke(smoke_dir):
    return smoke_dir



@pytest.fixture
def prebuilt(smoke, tmp_path):
    return copy_of(smoke, tmp_path / "p")


def _own(doc: dict, key: str = K1) -> dict:
    return band_of(doc, key)


def _memfds() -> set:
    return {line.split("/memfd:")[1].split(" ")[0] for line in open("/proc/self/maps") if "/memfd:" in line}


def _bind_refused(d: Path, error, match: str, key: str = K1):
    """Bind ``key`` from ``d``: refused with ``error`` matching ``match``, and
    no new library mapped. Returns the error."""
    before = _memfds()
    with pytest.raises(error, match=match) as e:
        dsv41_aot.load_key(key, prebuilt=d).bind()
    assert isinstance(e.value, LoadError)  # what the vLLM plugin's fallback catches
    assert _memfds() == before and not state.current().libraries
    return e.value


# ---------------------------------------------------------------- byte flips


@pytest.mark.parametrize("where", ["header", "middle", "last"])
def test_byte_flip_in_a_band(prebuilt, fresh, where):
    _, doc = libs_json(prebuilt)
    band = libdir(prebuilt, "gfx950") / _own(doc)["file"]
    data = bytearray(band.read_bytes())
    data[{"header": 3, "middle": len(data) // 2, "last": len(data) - 1}[where]] ^= 0x10
    band.write_bytes(bytes(data))
    _bind_refused(prebuilt, IntegrityError, "does not match the sha256 in libs.json")


def test_byte_flip_in_a_band_with_a_forged_sha256(prebuilt, fresh):
    path, doc = libs_json(prebuilt)
    lib = _own(doc)
    band = libdir(prebuilt, "gfx950") / lib["file"]
    data = bytearray(band.read_bytes())
    data[len(data) // 2] ^= 0x10
    forge_band(prebuilt, "gfx950", path, doc, lib, bytes(data))  # the record forged to match the flipped band
    _bind_refused(prebuilt, IntegrityError, "not an xz band|raw_sha256")


def test_the_same_library_in_another_lzma_container_is_not_an_xz_band(prebuilt, fresh):
    """The band's own library, packed as legacy .lzma (which Python's lzma also reads) with the record forged to
    match: every digest of the library holds, but a band is xz, and it is refused as not one."""
    path, doc = libs_json(prebuilt)
    lib = _own(doc)
    raw = lzma.decompress((libdir(prebuilt, "gfx950") / lib["file"]).read_bytes())
    forge_band(prebuilt, "gfx950", path, doc, lib, lzma.compress(raw, format=lzma.FORMAT_ALONE))
    _bind_refused(prebuilt, IntegrityError, "not an xz band")


def test_altered_library_recompressed_with_a_forged_band_sha256(prebuilt, fresh):
    path, doc = libs_json(prebuilt)
    lib = _own(doc)
    band = libdir(prebuilt, "gfx950") / lib["file"]
    raw = bytearray(lzma.decompress(band.read_bytes()))
    raw[len(raw) // 2] ^= 0x01  # one byte of code changed, then packed again as a valid band
    forge_band(prebuilt, "gfx950", path, doc, lib, lzma.compress(bytes(raw), format=lzma.FORMAT_XZ))
    _bind_refused(prebuilt, IntegrityError, "decompresses to a library whose sha256 is not the raw_sha256")


def _flip_text(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


@pytest.mark.parametrize("what", ["syntax", "band sha256", "raw sha256", "entry object sha256", "schema"])
def test_byte_flip_in_libs_json(prebuilt, fresh, what):
    path, doc = libs_json(prebuilt)
    lib = _own(doc)
    flip = lambda s: s[:10] + ("0" if s[10] != "0" else "1") + s[11:]  # noqa: E731 - one hex digit
    if what == "syntax":
        _flip_text(path, '"libraries":', '"libraries";')
        error, match = ManifestError, "malformed JSON"
    elif what == "band sha256":
        _flip_text(path, lib["sha256"], flip(lib["sha256"]))
        error, match = IntegrityError, "its name is not .* the one libs.json's chunk and sha256 for it make"
    elif what == "raw sha256":
        _flip_text(path, lib["raw_sha256"], flip(lib["raw_sha256"]))
        error, match = IntegrityError, "not the raw_sha256"
    elif what == "entry object sha256":
        _flip_text(path, lib["entries"][K1], flip(lib["entries"][K1]))
        error, match = ManifestError, "links it from object"
    else:
        _flip_text(path, '"schema": 2', '"schema": 1')
        error, match = ManifestError, "link record schema 1"
    _bind_refused(prebuilt, error, match)


# ---------------------------------------------------------------- traversal paths


# the second begins like a band file name: refused by the link record's
# parser, not left to the bind's path check (which refuses it otherwise)
@pytest.mark.parametrize("name", ["../../../../../../../../etc/hostname",
                                  "libdsv41_x.so.xz/../../../../../../../../../etc/hostname"])
def test_traversal_in_libs_json_file(prebuilt, fresh, name):
    path, doc = libs_json(prebuilt)
    target = Path("/etc/hostname")
    data = target.read_bytes()
    lib = _own(doc)
    lib["file"] = name  # with that file's real sha256: only the path is wrong
    lib["sha256"] = lib["raw_sha256"] = hashlib.sha256(data).hexdigest()
    lib["bytes"] = lib["raw_bytes"] = len(data)
    path.write_text(json.dumps(doc))
    err = _bind_refused(prebuilt, ManifestError, "not a band file of lib/")
    assert "etc/hostname" in str(err) and lib["chunk"] in str(err)


def test_band_symlinked_outside_its_lib_folder(prebuilt, fresh, tmp_path):
    _, doc = libs_json(prebuilt)
    band = libdir(prebuilt, "gfx950") / _own(doc)["file"]
    outside = tmp_path / "elsewhere.so.xz"
    shutil.move(band, outside)  # the same bytes, valid sha256: only where it lives is wrong
    band.symlink_to(outside)
    # the path check itself refuses it (O_NOFOLLOW at the open would too, but
    # with another message: this one names where the symlink leads)
    err = _bind_refused(prebuilt, ManifestError, r"resolves to \S+, outside ")
    assert f"resolves to {outside}, outside" in str(err)


def test_band_symlinked_to_another_band_inside_lib(prebuilt, fresh):
    """K1's band replaced by a symlink to another band of the same lib/:
    refused, and said as what it is (not "outside lib/")."""
    _, doc = libs_json(prebuilt)
    lib_dir = libdir(prebuilt, "gfx950")
    own = _own(doc)["file"]
    other = next(p.name for p in lib_dir.iterdir() if p.name != own)
    (lib_dir / own).unlink()
    (lib_dir / own).symlink_to(other)
    err = _bind_refused(prebuilt, ManifestError, rf"{own} is a symlink to {other}, another file in ")
    assert "outside" not in str(err)


def test_band_folder_symlinked_outside(prebuilt, fresh, tmp_path):
    lib_dir = libdir(prebuilt, "gfx950")
    shutil.move(lib_dir, tmp_path / "lib-elsewhere")
    lib_dir.symlink_to(tmp_path / "lib-elsewhere")
    _bind_refused(prebuilt, ManifestError, r"resolves to \S+, outside ")


def test_traversal_in_manifest_object(prebuilt, fresh):
    path = room(prebuilt, "gfx950") / "manifest.json"
    doc = json.loads(path.read_text())
    doc["entries"][K1]["object"] = "objects/../../../../etc/hostname"
    path.write_text(json.dumps(doc))
    with pytest.raises(ManifestError, match=r"entry k1@gfx950:s=4,tp=4,r=1 names object .*outside gfx950/objects/"):
        dsv41_aot.load_key(K1, prebuilt=prebuilt)


@pytest.mark.parametrize("arch", ["../gfx950", "gfx950/../gfx942", "/etc"])
def test_traversal_in_the_arch_from_the_environment(prebuilt, fresh, monkeypatch, arch):
    monkeypatch.setenv(loader.ENV_ARCH, arch)
    with pytest.raises(ManifestError, match="is not a GPU arch name") as e:
        dsv41_aot.load("k1", tokens=4, tp=4, ratio=1, prebuilt=prebuilt)
    assert repr(arch) in str(e.value) and loader.ENV_ARCH in str(e.value)
    with pytest.raises(ManifestError, match="is not a GPU arch name"):
        loader.keys(prebuilt=prebuilt)


def test_a_band_whose_metadata_names_another_arch_is_refused(prebuilt, fresh):
    """The band's library rewritten so that its entries' own export metadata
    says gfx942 (packed again, libs.json forged to its sha256s: every record
    agrees): the bind compares the metadata's arch with the key's and
    refuses it."""
    path, doc = libs_json(prebuilt)
    lib = _own(doc)
    band = libdir(prebuilt, "gfx950") / lib["file"]
    raw = lzma.decompress(band.read_bytes())
    assert raw.count(b'"arch":"gfx950"') >= len(lib["entries"])
    raw = raw.replace(b'"arch":"gfx950"', b'"arch":"gfx942"')
    forge_library(prebuilt, "gfx950", path, doc, lib, raw)
    launcher = dsv41_aot.load_key(K1, prebuilt=prebuilt)
    with pytest.raises(IntegrityError, match=rf"{K1}: .*__metadata describes \S+ for gfx942") as e:
        launcher.bind()
    assert launcher._lib is None  # never callable
    assert e.value.fix == Room(prebuilt, "gfx950", NEWEST).fix_reinstall  # the band came that way: again


@pytest.mark.parametrize("edit,said", [
    (lambda raw, entry: raw.replace(f"{entry}__metadata".encode(), f"{entry}__metadatX".encode()),
     "has no {entry}__metadata"),
    (lambda raw, entry: raw.replace(b'"symbol":"', b'"symbxl":"'), "{entry}__metadata in .* is unreadable"),
    (lambda raw, entry: raw.replace(b'"arg_name":"stream"', b'"arg_nxme":"stream"'),
     "{entry}__metadata in .* is unreadable"),
], ids=["no metadata symbol", "metadata without its symbol field", "a slot without its name"])
def test_a_band_whose_export_metadata_cannot_be_read_is_refused_with_its_fix(prebuilt, fresh, edit, said):
    """The band's library rewritten (packed again, libs.json forged to its sha256s) so that the entry's export
    metadata is not found by its name, or no longer names its symbol or its stream slot (the build reads each
    slot's name; none is guessed): the bind cannot check the manifest's ABI against it and refuses, naming the
    key and the library, with the fix a damaged band gets."""
    from dsv41_aot.manifest import entry_name

    path, doc = libs_json(prebuilt)
    lib = _own(doc)
    band = libdir(prebuilt, "gfx950") / lib["file"]
    raw = edit(lzma.decompress(band.read_bytes()), entry_name(K1))
    forge_library(prebuilt, "gfx950", path, doc, lib, raw)
    launcher = dsv41_aot.load_key(K1, prebuilt=prebuilt)
    with pytest.raises(IntegrityError, match=rf"{K1}: .*" + said.format(entry=entry_name(K1))) as e:
        launcher.bind()
    assert launcher._lib is None  # never callable
    assert e.value.fix == Room(prebuilt, "gfx950", NEWEST).fix_reinstall


# ---------------------------------------------------------------- releases


def test_a_record_forged_to_name_another_releases_band(prebuilt, fresh):
    """vLLM 0.32.0's link record rewritten to name 0.33.0's band for the same
    chunk, with that band's real sha256s (a whole, valid band, the same entry
    names): the object sha256s still say 0.32.0, and the library's SONAME
    (linkrecord.soname: a digest of the objects it was linked from) does not
    match them, so the bind refuses it before anything of it is called."""
    from dsv41_aot import source

    path, doc = libs_json(prebuilt, release=OLD)
    _, new = libs_json(prebuilt)
    mine, theirs = _own(doc), _own(new)
    assert mine["chunk"] == theirs["chunk"] and mine["file"] != theirs["file"]
    for f in ("file", "sha256", "bytes", "raw_sha256", "raw_bytes"):
        mine[f] = theirs[f]
    path.write_text(json.dumps(doc))
    old = source.MonoSource(root=source.trees_dir() / OLD)
    assert old.version == OLD, f"no vLLM {OLD} tree: dsv41-aot fetch-vllm {OLD}"
    fresh.running_vllm(old.mono_dir)  # a vLLM 0.32.0 runner: its room serves K1
    launcher = dsv41_aot.load_key(K1, prebuilt=prebuilt)  # the room's own records agree with each other
    assert launcher.library.endswith(theirs["file"])
    # the band is whole (its sha256s hold), but not linked from the objects
    # 0.32.0's libs.json names (nor would the ABI check pass: 41 slots, not 39)
    with pytest.raises(IntegrityError, match="was not linked from the objects libs.json names"):
        launcher.bind()
    assert launcher._lib is None  # never callable


# ---------------------------------------------------------------- ABI


def _forge_abi(prebuilt: Path, change, recompute_id: bool = True) -> tuple[list, list]:
    """K1's ABI in the gfx950 room's manifest.json replaced by ``change(slots)``: (old slots, new slots).

    With ``recompute_id`` (a careful forger) the new slots get the id that
    hashes to them and every entry of the old id points at it; without, they
    stay under the old id."""
    path = room(prebuilt, "gfx950") / "manifest.json"
    doc = json.loads(path.read_text())
    aid = doc["entries"][K1]["abi"]
    old = doc["abis"][aid]
    slots = change([dict(s) for s in old])
    if recompute_id:
        new = abi_id(slots)
        doc["abis"][new] = slots
        for e in doc["entries"].values():
            if e["abi"] == aid:
                e["abi"] = new
    else:
        doc["abis"][aid] = slots
    path.write_text(json.dumps(doc))
    return old, slots


def _remove_slot(prebuilt: Path, recompute_id: bool) -> None:
    old, slots = _forge_abi(prebuilt, lambda slots: [s for s in slots if s["name"] != "swa_block"], recompute_id)
    assert len(slots) == len(old) - 1


def test_abi_with_a_slot_removed_keeping_its_id(prebuilt, fresh):
    _remove_slot(prebuilt, recompute_id=False)
    # refused where the manifest is read (Manifest.parse, the one judge of an ABI's id)
    with pytest.raises(ManifestError, match="is not the slot list its id names"):
        dsv41_aot.load_key(K1, prebuilt=prebuilt)


def test_abi_with_a_slot_removed_and_its_id_recomputed(prebuilt, fresh):
    _remove_slot(prebuilt, recompute_id=True)
    launcher = dsv41_aot.load_key(K1, prebuilt=prebuilt)  # the manifest is self-consistent now
    assert len(launcher.abi) == 40
    with pytest.raises(ManifestError, match=r"\(40 slots\) is not the entry's own \(41 slots, from .*__metadata\)") as e:
        launcher.bind()
    assert "swa_block" in str(e.value) and e.value.fix == Room(prebuilt, "gfx950", NEWEST).fix_reinstall
    assert launcher._lib is None  # never callable


def test_abi_slot_retyped_with_its_id_recomputed_fails_verify_and_bind(prebuilt, fresh):
    """One int64 slot of the manifest's ABI made uint64, the id recomputed
    (the manifest is self-consistent; same slot count, same sizes): verify
    compares every slot with the object's export metadata and fails the
    key, as the bind does against the band's."""
    def retype(slots):
        slots[next(i for i, s in enumerate(slots) if s["ctype"] == "int64")]["ctype"] = "uint64"
        return slots

    old, slots = _forge_abi(prebuilt, retype)
    (i,) = [i for i, (a, b) in enumerate(zip(old, slots)) if a != b]
    r = subprocess.run([sys.executable, "-m", "dsv41_aot.cli", "verify", "--dir", str(prebuilt), "--json"],
                       capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 1, r.stdout + r.stderr
    (bad,) = [x for x in json.loads(r.stdout)["reports"] if x["key"] == K1 and x["release"] == "0.33.0"]
    assert "export metadata's ABI slots differ from the manifest's ABI" in bad["problems"], bad
    launcher = dsv41_aot.load_key(K1, prebuilt=prebuilt)
    with pytest.raises(ManifestError, match=rf"first difference at slot {i}: manifest .*uint64"):
        launcher.bind()
    assert launcher._lib is None


def test_an_abi_slot_the_library_lacks_is_named_at_bind(prebuilt, fresh):
    """The manifest's ABI one slot longer than the band's export metadata, the id recomputed (a second stream
    slot, as the ABI must end with the stream): the bind names the first slot the library does not have ("library
    none") and never makes the launcher callable."""
    _, slots = _forge_abi(prebuilt, lambda slots: [*slots, slots[-1]])
    launcher = dsv41_aot.load_key(K1, prebuilt=prebuilt)
    with pytest.raises(ManifestError) as e:
        launcher.bind()
    n = len(slots) - 1
    assert f"({len(slots)} slots) is not the entry's own ({n} slots" in str(e.value), e.value
    assert f"first difference at slot {n}: manifest ('stream', 'pointer', 8), library none" in str(e.value), e.value
    assert launcher._lib is None


# ---------------------------------------------------------------- swap between verify and load


_CTOR = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void planted(void) {
    FILE *f = fopen(getenv("DSV41_FAULT_MARKER"), "w");
    if (f) { fputs("constructor ran", f); fclose(f); }
}
int dsv41_planted(void) { return 7; }
"""


def test_a_band_swapped_after_it_was_verified_is_not_what_is_loaded(prebuilt, fresh, monkeypatch, tmp_path):
    c = tmp_path / "planted.c"
    c.write_text(_CTOR)
    so = tmp_path / "planted.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", so, c], check=True)
    planted = lzma.compress(so.read_bytes(), format=lzma.FORMAT_XZ)
    marker = tmp_path / "marker"
    monkeypatch.setenv("DSV41_FAULT_MARKER", str(marker))
    _, doc = libs_json(prebuilt)
    band = libdir(prebuilt, "gfx950") / _own(doc)["file"]
    real_unpack = Band.unpack
    swapped = []

    def unpack_then_swap(self, data, where, fix):
        raw = real_unpack(self, data, where, fix)  # verified...
        band.write_bytes(planted)  # ...then another library takes the band's place on disk
        swapped.append(where)
        return raw

    monkeypatch.setattr(Band, "unpack", unpack_then_swap)
    launcher = dsv41_aot.load_key(K1, prebuilt=prebuilt)
    launcher.bind()
    assert swapped and band.read_bytes() == planted
    assert not marker.exists()  # the planted library's constructor never ran
    with pytest.raises(AttributeError):
        launcher._lib.dsv41_planted  # noqa: B018 - what was loaded is the verified band
    assert launcher._call is not None and hasattr(launcher._lib, launcher.entry + "__module_load")


def test_a_band_swapped_for_a_symlink_after_its_path_check_is_not_followed(prebuilt, fresh, monkeypatch, tmp_path):
    """The band's path passes its check (a file inside lib/), then the band is
    replaced by a symlink to its very bytes elsewhere: the open itself refuses
    the symlink (O_NOFOLLOW), though every sha256 would hold."""
    import errno

    _, doc = libs_json(prebuilt)
    lib = _own(doc)
    band = libdir(prebuilt, "gfx950") / lib["file"]
    elsewhere = tmp_path / "planted" / lib["file"]
    real_check = Room.band_path
    checked = []

    def check_then_swap(room, rec):
        path = real_check(room, rec)  # passes: the band is still the plain file inside lib/
        elsewhere.parent.mkdir()
        shutil.move(band, elsewhere)
        band.symlink_to(elsewhere)  # the same bytes, so only the open can tell
        checked.append(path)
        return path

    monkeypatch.setattr(Room, "band_path", check_then_swap)
    err = _bind_refused(prebuilt, ManifestError, "cannot open it as a plain file inside its lib/ folder")
    assert checked == [band] and band.is_symlink() and str(band) in str(err)
    assert os.strerror(errno.ELOOP) in str(err)
    # followed, the symlink would have given a band that passes both sha256 checks
    assert hashlib.sha256(band.read_bytes()).hexdigest() == lib["sha256"]


def test_without_memfd_the_per_user_cache_is_verified_through_its_descriptor(prebuilt, fresh, monkeypatch, tmp_path):
    cache = tmp_path / "cache"
    monkeypatch.setenv(loader.ENV_CACHE, str(cache))

    def no_memfd(*a, **k):
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(os, "memfd_create", no_memfd)
    _, doc = libs_json(prebuilt)
    lib = _own(doc)
    cached = cache / f"{lib['raw_sha256']}.so"
    cache.mkdir()
    cached.write_bytes(b"\x7fELF not the library")  # a corrupt cache entry: replaced, never loaded
    before = _memfds()
    dsv41_aot.load_key(K1, prebuilt=prebuilt).bind()
    assert hashlib.sha256(cached.read_bytes()).hexdigest() == lib["raw_sha256"]
    assert str(cached) in open("/proc/self/maps").read() and _memfds() == before
    assert [p.name for p in cache.iterdir()] == [cached.name]  # written atomically: no temporaries left


# ---------------------------------------------------------------- host and source


def test_a_hip_runtime_outside_rocm_6_and_7_is_refused_at_bind(smoke):
    env = {k: v for k, v in os.environ.items() if k != "DSV41_AOT_ALLOW_HIP_VERSION"}
    code = (f"import dsv41_aot\nfrom dsv41_aot.errors import HipVersionError\n"
            f"l = dsv41_aot.load_key({K1!r}, prebuilt={str(smoke)!r})\n"
            f"try:\n    l.bind()\nexcept HipVersionError as e:\n    print('refused:', e)\n"
            f"print(sorted(x for x in open('/proc/self/maps').read().split() if 'libdsv41' in x))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env=dict(env, PYTHONPATH=str(REPO)))
    assert r.returncode == 0, r.stderr
    assert "refused:" in r.stdout and "is HIP 5.2" in r.stdout and "ROCm 6.0 up to (not including) 8.0" in r.stdout
    assert "DSV41_AOT_ALLOW_HIP_VERSION=5.2" in r.stdout
    assert r.stdout.strip().endswith("[]")  # no band bound
    assert issubclass(HipVersionError, LoadError)


def test_a_vllm_whose_digest_cannot_be_computed_is_not_no_vllm(smoke, tmp_path):
    mono = tmp_path / "site" / "vllm" / "models" / "deepseek_v41" / "amd" / "mono"
    mono.mkdir(parents=True)
    (tmp_path / "site" / "vllm" / "__init__.py").write_text("raise ImportError('vllm must not be imported')\n")
    (mono / "layer.py").symlink_to(tmp_path / "gone.py")  # unreadable source: the digest raises
    code = (f"import sys\nsys.path.insert(0, {str(tmp_path / 'site')!r})\nimport dsv41_aot\n"
            f"from dsv41_aot.errors import SourceMismatchError\n"
            f"for attempt in (1, 2):\n"
            f"    try:\n        dsv41_aot.load_key({K1!r}, prebuilt={str(smoke)!r}); print('loaded')\n"
            f"    except SourceMismatchError as e:\n        print('refused:', str(e).splitlines()[0])\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 2 and all("cannot compute the installed vLLM's mono source digest" in x for x in lines)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, PYTHONPATH=str(REPO), DSV41_AOT_ALLOW_SOURCE_MISMATCH="1"))
    assert r.stdout.splitlines() == ["loaded", "loaded"] and "running unchecked" in r.stderr
    assert issubclass(SourceMismatchError, LoadError)


# ---------------------------------------------------------------- thread race


_STUB = r"""
#include <stdint.h>
#include <pthread.h>
/* MOCK-GPU: stands in for a kernel entry. It answers 0 when its first
   argument is the calling thread's id, 77 when the arguments are another
   thread's. */
int stub_entry(void **args) {
    return *(int64_t *)args[0] == (int64_t)pthread_self() ? 0 : 77;
}
"""


def _stub(tmp_path: Path):
    c = tmp_path / "stub.c"
    c.write_text(_STUB)
    so = tmp_path / "stub.so"
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-pthread", "-o", so, c], check=True)
    return ctypes.CDLL(str(so)).stub_entry


def _race(call, threads: int = 4, calls: int = 20_000) -> int:
    """Calls whose C side saw another thread's arguments."""
    wrong = [0] * threads
    start = threading.Barrier(threads)

    def worker(i):
        start.wait()
        me = threading.get_ident()
        for _ in range(calls):
            wrong[i] += call(me)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter allows
    try:
        ts = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    finally:
        sys.setswitchinterval(old)
    return sum(wrong)


def test_thread_race_on_one_launcher_against_a_c_stub(smoke, fresh, tmp_path):
    stub = _stub(tmp_path)
    launcher = dsv41_aot.load_key(K1, prebuilt=smoke)
    launcher.bind()  # real band, real ABI
    abi = launcher._abi
    assert abi.slots[0]["ctype"] == "int64"
    launcher._call = abi.proto(ctypes.cast(stub, ctypes.c_void_p).value)  # MOCK-GPU: the stub is the entry
    launcher._ready = True  # MOCK-GPU: no module to load on a device
    rest = [0] * (len(abi.slots) - 2)

    # the old call path: one buffer per Launcher, packed then called
    shared = ctypes.create_string_buffer(abi.struct.size)
    argv = abi.argv_type(*[ctypes.addressof(shared) + off for off in abi.offsets])

    def old_path(me):
        abi.struct.pack_into(shared, 0, me, *rest, 0)
        return launcher._call(argv) != 0

    def new_path(me):
        try:
            launcher(me, *rest, stream=0)
        except LaunchError as e:
            assert e.status == 77
            return 1
        return 0

    assert new_path(threading.get_ident()) == 0 and old_path(threading.get_ident()) == 0  # one thread: both fine
    broken = _race(old_path)
    assert broken > 0, "the race never showed: this test could not catch a shared buffer"
    assert _race(new_path) == 0
