"""One verdict, one fix that works: a table of faults in a room.

Each row injects one fault into a copy of the smoke build and checks, in
order: what ``dsv41-aot verify --json`` says (exit 1, and the problem's
kind), what the loader says when it binds a key of the room (in a fresh
process, the way a serving process meets it), then runs the fix verify
printed, word for word, and checks that both accept the room afterwards.
Problems only a builder has (a stored object missing) do not stop the
loader: verify reports them as such (``serving`` false) and their fix
rebuilds the key.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from _smoke import OLD, REPO, band_of, copy_of, forge_band, forge_library, libdir, libs_json, room, run_cli


K1, K2W = "k1@gfx950:s=4,tp=4,r=1", "k2@gfx950:s=44,tp=4,r=1,i=1"  # two bands of gfx950's 0.33.0 room
NEWEST = "0.33.0"




# ---------------------------------------------------------------- faults


def flip_band(d, tmp):
    _, doc = libs_json(d)
    band = libdir(d, "gfx950") / band_of(doc, K1)["file"]
    data = bytearray(band.read_bytes())
    data[len(data) // 2] ^= 0x40
    band.write_bytes(bytes(data))


def delete_band(d, tmp):
    _, doc = libs_json(d)
    (libdir(d, "gfx950") / band_of(doc, K1)["file"]).unlink()


def delete_libs_json(d, tmp):
    libs_json(d)[0].unlink()


def truncate_libs_json(d, tmp):
    path, _ = libs_json(d)
    path.write_text(path.read_text()[:200])


def forge_raw_sha256(d, tmp):
    """libs.json's raw_sha256 changed: the band's own bytes are fine."""
    path, doc = libs_json(d)
    band_of(doc, K1)["raw_sha256"] = "ab" * 32
    path.write_text(json.dumps(doc))


def band_symlinked_outside(d, tmp):
    """The band replaced by a symlink to identical bytes outside lib/."""
    _, doc = libs_json(d)
    band = libdir(d, "gfx950") / band_of(doc, K1)["file"]
    outside = tmp / "elsewhere" / band.name
    outside.parent.mkdir()
    shutil.move(band, outside)
    band.symlink_to(outside)


def band_symlinked_inside(d, tmp):
    """The band replaced by a symlink to another band of the same lib/."""
    _, doc = libs_json(d)
    band = libdir(d, "gfx950") / band_of(doc, K1)["file"]
    band.unlink()
    band.symlink_to(band_of(doc, K2W)["file"])


def lib_folder_symlinked(d, tmp):
    """The arch's whole lib/ folder a symlink to a copy elsewhere."""
    lib = libdir(d, "gfx950")
    shutil.move(lib, tmp / "lib-elsewhere")
    lib.symlink_to(tmp / "lib-elsewhere")


def key_under_wrong_band(d, tmp):
    """libs.json lists K1 under the s41-48 band (which does not export it)."""
    path, doc = libs_json(d)
    own, other = band_of(doc, K1), band_of(doc, K2W)
    other["entries"][K1] = own["entries"].pop(K1)
    path.write_text(json.dumps(doc))


def linked_from_another_object(d, tmp):
    path, doc = libs_json(d)
    band_of(doc, K1)["entries"][K1] = "0" * 64
    path.write_text(json.dumps(doc))


def other_releases_libs_json(d, tmp):
    shutil.copyfile(libs_json(d, release=OLD)[0], libs_json(d)[0])


def flip_manifest_abi(d, tmp):
    path = room(d, "gfx950") / "manifest.json"
    doc = json.loads(path.read_text())
    aid = doc["entries"][K1]["abi"]
    doc["abis"][aid][0]["size"] = 4
    path.write_text(json.dumps(doc))


def delete_manifest(d, tmp):
    (room(d, "gfx950") / "manifest.json").unlink()


def mixed_sources(d, tmp):
    """One entry altered to another mono sources digest (and the manifest's
    own field kept): a room no installed vLLM could match."""
    path = room(d, "gfx950") / "manifest.json"
    doc = json.loads(path.read_text())
    doc["entries"][K1]["source"]["mono_sources"] = "0" * 16
    path.write_text(json.dumps(doc))


def source_without_linker(d, tmp):
    """One entry's source identity lacking a field: no build wrote it, so the manifest is refused whole."""
    path = room(d, "gfx950") / "manifest.json"
    doc = json.loads(path.read_text())
    del doc["entries"][K1]["source"]["linker"]
    path.write_text(json.dumps(doc))


BAND_FIELDS = ("file", "sha256", "bytes", "raw_sha256", "raw_bytes")


def other_releases_band(d, tmp):
    """N1: the 0.32.0 room's libs.json names the 0.33.0 s01-08 band for K1's
    chunk, with that band's real sha256 and sizes; its keys and the objects
    they were linked from stay 0.32.0's. Both releases' bands export the
    same entry names."""
    path, doc = libs_json(d, release=OLD)
    theirs = band_of(libs_json(d)[1], K1)
    band_of(doc, K1).update({f: theirs[f] for f in BAND_FIELDS})
    path.write_text(json.dumps(doc))


def band_of_objects_with_equal_abis(d, tmp):
    """N1 where the two builds' ABIs are equal (made here): K1's object is
    replaced by a stub exporting the same entry with the same ABI and the
    room relinked; libs.json then names the band linked from the real
    object, with its real sha256 and sizes. Exports and ABI match: only
    what the band was linked from tells them apart."""
    from test_launch_abi import put_stub

    _, doc = libs_json(d)
    real = dict(band_of(doc, K1))
    data = (libdir(d, "gfx950") / real["file"]).read_bytes()
    put_stub(d, NEWEST, K1, False, tmp)
    run_cli("link", "--dir", d, "--arch", "gfx950", "--release", NEWEST)
    (libdir(d, "gfx950") / real["file"]).write_bytes(data)  # link removed it: no room named it any more
    path, doc = libs_json(d)
    mine = band_of(doc, K1)
    assert mine["entries"][K1] != real["entries"][K1] and mine["file"] != real["file"]
    mine.update({f: real[f] for f in BAND_FIELDS})
    path.write_text(json.dumps(doc))


def _edit_entry(d, **fields):
    path = room(d, "gfx950") / "manifest.json"
    doc = json.loads(path.read_text())
    doc["entries"][K1].update(fields)
    path.write_text(json.dumps(doc))


def edit_symbol(d, tmp):
    """N2: an entry's kernel symbol edited (its object intact)."""
    _edit_entry(d, symbol="_ZN5aiter12dsv41_editedE")


def edit_resources(d, tmp):
    """N2: an entry's code object figures edited."""
    res = json.loads((room(d, "gfx950") / "manifest.json").read_text())["entries"][K1]["resources"]
    _edit_entry(d, resources=dict(res, vgpr_count=res["vgpr_count"] - 1))


def edit_code_object_sha256(d, tmp):
    """N2: an entry's code object digest edited."""
    _edit_entry(d, code_object_sha256="0" * 64)


def edit_entry_point(d, tmp):
    """N2: an entry's C entry point name edited (not the key's own: Manifest.parse refuses it)."""
    _edit_entry(d, entry="dsv41_k1_gfx950_edited")


def delete_object(d, tmp):
    path = room(d, "gfx950") / "manifest.json"
    obj = json.loads(path.read_text())["entries"][K1]["object"]
    (d / "gfx950" / obj).unlink()


def stray_file_in_lib(d, tmp):
    """A file that is no band in lib/ (P11c of the fault report at 24a0152: the gate's fix was link, which looped)."""
    (libdir(d, "gfx950") / "notes.txt").write_text("notes\n")


def stray_folder_in_lib(d, tmp):
    """A folder in lib/ (its fix was rm, which cannot remove a folder)."""
    (libdir(d, "gfx950") / "subdir").mkdir()
    (libdir(d, "gfx950") / "subdir" / "x").write_text("x\n")


def band_not_xz(d, tmp):
    """A band that is no xz stream, its digest and name in libs.json made to match its bytes."""
    path, doc = libs_json(d)
    forge_band(d, "gfx950", path, doc, band_of(doc, K1), b"not an xz stream\n" * 64)


def libs_json_not_an_object(d, tmp):
    """libs.json is JSON, but a list: no link record."""
    libs_json(d)[0].write_text("[]\n")


# fault, the problem kind verify reports, the loader's verdict binding K1
ROWS = [
    (stray_file_in_lib, "file", "ok"),
    (stray_folder_in_lib, "file", "ok"),
    (flip_band, "band", "IntegrityError"),
    (delete_band, "band", "IntegrityError"),
    (delete_libs_json, "libs", "ManifestError"),
    (truncate_libs_json, "libs", "ManifestError"),
    (libs_json_not_an_object, "libs", "ManifestError"),
    (band_not_xz, "band", "IntegrityError"),
    (forge_raw_sha256, "band", "IntegrityError"),
    (band_symlinked_outside, "band", "ManifestError"),
    (band_symlinked_inside, "band", "ManifestError"),
    (lib_folder_symlinked, "band", "ManifestError"),
    (key_under_wrong_band, "band", "LoadError"),
    (linked_from_another_object, "link", "ManifestError"),
    (other_releases_libs_json, "libs", "ManifestError"),
    (flip_manifest_abi, "manifest", "ManifestError"),
    (delete_manifest, "manifest", "ManifestError"),
    (mixed_sources, "manifest", "ManifestError"),
    (source_without_linker, "manifest", "ManifestError"),
    (delete_object, "object", "ok"),
    (other_releases_band, "band", "IntegrityError"),
    (band_of_objects_with_equal_abis, "band", "IntegrityError"),
    (edit_symbol, "band", "IntegrityError"),
    (edit_resources, "entry", "ok"),
    (edit_code_object_sha256, "band", "IntegrityError"),
    (edit_entry_point, "manifest", "ManifestError"),
]
RELEASE = {other_releases_band: OLD}  # the room a row's fault is in, when not NEWEST's

_BIND = """
import sys, dsv41_aot
from dsv41_aot.errors import AotError
try:
    dsv41_aot.load_key(sys.argv[1], release=sys.argv[2], prebuilt=sys.argv[3]).bind()
except AotError as e:
    print(type(e).__name__, e.message if sys.argv[4:] == ["message"] else type(e).__mro__[1].__name__)
else:
    print("ok")
"""


def loader_verdict(d: Path, release: str = NEWEST, key: str = K1, message: bool = False) -> str:
    """What a fresh serving process meets binding ``key`` of ``release`` from ``d``: the error's
    class and its base class (``message``: and its message instead of the base), or "ok"."""
    env = {k: v for k, v in os.environ.items() if k != "DSV41_AOT_ARCH"}
    if release != NEWEST:  # the installed vLLM is the newest: run an older room's kernels anyway
        env["DSV41_AOT_ALLOW_SOURCE_MISMATCH"] = "1"
    r = subprocess.run([sys.executable, "-c", _BIND, key, release, str(d), *(["message"] if message else [])],
                       capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def verify_json(d: Path) -> tuple[int, dict]:
    code, out, err = run_cli("verify", "--dir", d, "--json", check=False)
    return code, json.loads(out)


@pytest.mark.faults
@pytest.mark.parametrize("fault, kind, loader", ROWS, ids=[r[0].__name__ for r in ROWS])
def test_fault_table(smoke_dir, tmp_path, fault, kind, loader):
    release = RELEASE.get(fault, NEWEST)
    d = copy_of(smoke_dir, tmp_path / "p")
    assert verify_json(d)[0] == 0 and loader_verdict(d, release) == "ok"
    fault(d, tmp_path)

    code, doc = verify_json(d)
    assert code == 1, doc
    mine = [f for f in doc["failures"] if f.get("release") in (release, None) and (f.get("what") == kind
                                                                                  or (kind == "object" and f["key"] == K1))]
    assert mine, doc["failures"]
    got = loader_verdict(d, release)
    assert loader in got.split(), got
    # verify says which of its failures the loader refuses (``serving``), and the loader agrees
    serving = {f["serving"] for f in doc["failures"]}
    if loader == "ok":  # a builder's problem (a stored object, an entry's figures): the room still serves
        assert serving == {False}, doc["failures"]
    else:
        assert True in serving and serving <= {True, False}, doc["failures"]

    assert all(f.get("fix") for f in doc["failures"]), doc["failures"]  # each names the command that fixes it
    fixes = list(dict.fromkeys(f["fix"] for f in doc["failures"]))
    for fix in fixes:  # word for word, each command of it
        for command in fix.split(" && "):
            argv = shlex.split(command)
            assert argv[0] in ("dsv41-aot", "rm"), fix  # a file no tool owns is removed by hand
            if argv[0] == "rm":
                r = subprocess.run(argv, capture_output=True, text=True)
                code, out, err = r.returncode, r.stdout, r.stderr
            else:
                code, out, err = run_cli(*argv[1:], check=False)
            assert code == 0, f"{fix}\n{out}\n{err}"

    code, doc = verify_json(d)
    assert code == 0, doc["failures"]
    assert loader_verdict(d, release) == "ok"


def test_an_entry_that_differs_from_its_object_names_each_field(smoke_dir, tmp_path):
    """An entry whose figures were edited: verify names the key and every field its object does not match."""
    d = copy_of(smoke_dir, tmp_path / "p")
    path = room(d, "gfx950") / "manifest.json"
    doc = json.loads(path.read_text())
    doc["entries"][K1]["code_object_bytes"] += 1
    doc["entries"][K1]["resources"]["lds_bytes"] += 1
    path.write_text(json.dumps(doc))
    code, doc = verify_json(d)
    (own,) = [f for f in doc["failures"] if f["key"] == K1]
    assert code == 1 and "manifest entry differs from its object's: code_object_bytes, resources" in own["error"], own


def test_a_key_linked_but_not_in_the_manifest_is_the_one_key_refused(smoke_dir, tmp_path):
    """A manifest that lost K1's entry while libs.json still links it: verify names that one key, with the relink
    as its fix, and every other key of the room still serves, as the loader finds."""
    d = copy_of(smoke_dir, tmp_path / "p")
    path = room(d, "gfx950") / "manifest.json"
    doc = json.loads(path.read_text())
    del doc["entries"][K1]
    path.write_text(json.dumps(doc))
    code, doc = verify_json(d)
    (link,) = [f for f in doc["failures"] if f["what"] == "link"]
    assert code == 1 and (link["key"], link["keys"], link["serving"]) == (K1, [K1], True), link
    assert link["fix"] == f"dsv41-aot link --dir {d} --arch gfx950 --release {NEWEST}"
    assert all(r["ok"] for r in doc["reports"] if r["key"] == K2W), doc["reports"]
    assert (loader_verdict(d).split()[0], loader_verdict(d, key=K2W)) == ("KeyNotPrebuiltError", "ok")


def test_a_band_that_does_not_export_a_key_it_lists_is_a_band_failure_of_that_key(smoke_dir, tmp_path):
    """K1's band rewritten (packed again, libs.json forged to match) so that it no longer exports K1's module
    load: verify names K1 and that band, with the relink as its fix, and the room does not serve K1."""
    import lzma

    from dsv41_aot.manifest import entry_name

    d = copy_of(smoke_dir, tmp_path / "p")
    path, doc = libs_json(d)
    lib = band_of(doc, K1)
    load = f"{entry_name(K1)}__module_load".encode()
    raw = lzma.decompress((libdir(d, "gfx950") / lib["file"]).read_bytes()).replace(load + b"\0", load[:-1] + b"X\0")
    forge_library(d, "gfx950", path, doc, lib, raw)
    code, out = verify_json(d)
    (f,) = [f for f in out["failures"] if f["key"] == K1]
    assert f["error"].endswith(f"lists it under {lib['file']}, which does not export {load.decode()}"), f
    assert (f["what"], f["serving"], f["keys"]) == ("band", True, [K1]), f
    assert code == 1 and f["fix"] == f"dsv41-aot link --dir {d} --arch gfx950 --release {NEWEST}"


# ways to keep a symbol in .dynsym, defined, where dlsym does not find it: (st_info, st_other, st_value) edits
UNBOUND = {
    "hidden": lambda info, other, value: (info, other & ~3 | 2, value),
    "internal": lambda info, other, value: (info, other & ~3 | 1, value),
    "local": lambda info, other, value: (info & 0xF, other, value),
    "a section symbol": lambda info, other, value: (info & 0xF0 | 3, other, value),
    "no address": lambda info, other, value: (info, other, 0),
}


@pytest.mark.faults
@pytest.mark.parametrize("how", sorted(UNBOUND))
def test_an_entry_the_dynamic_linker_cannot_bind_is_not_exported(smoke_dir, tmp_path, how):
    """K1's launch entry kept in its band's dynamic symbols, defined, but made one the dynamic linker skips:
    verify fails K1 as not exported (it passed, and the loader failed at bind), and the loader refuses it
    with the same words."""
    import lzma
    import struct

    from dsv41_aot.elf import SHT_DYNSYM, Elf
    from dsv41_aot.manifest import entry_name

    d = copy_of(smoke_dir, tmp_path / "p")
    path, doc = libs_json(d)
    lib, entry = band_of(doc, K1), entry_name(K1)
    raw = bytearray(lzma.decompress((libdir(d, "gfx950") / lib["file"]).read_bytes()))
    elf = Elf(bytes(raw))
    (table,) = [s for s in elf.sections if s.type == SHT_DYNSYM]
    (at,) = [table.offset + 24 * i for i, sym in enumerate(elf.symbols(SHT_DYNSYM)) if sym.name == entry]
    info, other, value = UNBOUND[how](raw[at + 4], raw[at + 5], struct.unpack_from("<Q", raw, at + 8)[0])
    raw[at + 4], raw[at + 5] = info, other
    struct.pack_into("<Q", raw, at + 8, value)
    forge_library(d, "gfx950", path, doc, lib, bytes(raw))
    code, out = verify_json(d)
    (f,) = [f for f in out["failures"] if f["key"] == K1]
    said = f"lists it under {lib['file']}, which does not export {entry}"
    assert code == 1 and f["error"].endswith(said) and (f["what"], f["serving"]) == ("band", True), f
    bound = loader_verdict(d, message=True)
    assert bound.startswith("IntegrityError ") and bound.endswith(said), bound


# ---------------------------------------------------------------- rooms of another vLLM tree


def _set_sources(d: Path, digest: str, keys) -> None:
    """Record ``keys`` of gfx950's room as built from mono sources ``digest`` (a room of two sources records none)."""
    path = room(d, "gfx950") / "manifest.json"
    doc = json.loads(path.read_text())
    for k in keys:
        doc["entries"][k]["source"]["mono_sources"] = digest
    digests = {e["source"]["mono_sources"] for e in doc["entries"].values()}
    doc["mono_sources"] = digests.pop() if len(digests) == 1 else None
    path.write_text(json.dumps(doc))


@pytest.mark.faults
def test_building_some_keys_of_a_room_of_another_tree_is_refused_naming_what_differs(smoke_dir, tmp_path):
    """A room built from other mono sources: rebuilding one key from this vLLM would leave it of two sources.
    The build stops before it compiles (exit 2), naming both sources and which identity fields differ."""
    d = copy_of(smoke_dir, tmp_path / "p")
    other = "0123456789abcdef"
    _set_sources(d, other, json.loads((room(d, "gfx950") / "manifest.json").read_text())["entries"])
    code, out, err = run_cli("build", "--out", d, "--key", K1, check=False)
    assert code == 2 and f"were built from mono sources {other} (vLLM {NEWEST})" in err, err
    assert "; mono_sources differ. Building only some keys" in err and "fix: rebuild the whole room" in err, err


@pytest.mark.faults
def test_proving_a_room_of_another_tree_is_refused_at_once_naming_the_tree(smoke_dir, tmp_path):
    """Q4 of the fault report at 3f0364f: the stale-proof warning's command
    (``Room.prove_cmd``) on a room built from another vLLM tree JIT-built
    every key from the installed vLLM for minutes, then failed each key's
    launch. It now stops before any JIT build (exit 2), naming the room's
    mono sources and the options that name its tree."""
    from dsv41_aot.room import Room

    d = copy_of(smoke_dir, tmp_path / "p")
    other = "0123456789abcdef"
    _set_sources(d, other, json.loads((room(d, "gfx950") / "manifest.json").read_text())["entries"])
    prove = shlex.split(Room(d, "gfx950", NEWEST).prove_cmd)
    code, out, err = run_cli(*prove[1:], "--key", K1, "--no-progress", check=False)
    assert code == 2, out + err
    assert other in err and K1 in err and "--vllm-src" in err and "--matrix" in err, err
    assert not (room(d, "gfx950") / "verified.json").exists()


@pytest.mark.faults
def test_a_stopped_build_from_another_tree_is_finished_by_verifys_fix(smoke_dir, tmp_path):
    """Q5 of the fault report at 3f0364f: a build from another tree (here
    the installed vLLM, named by --vllm-src, over keys of an older tree) was
    killed after one key. verify's fix rebuilt that one key, the build
    refused it (two sources, exit 2) and verify printed the same fix again.
    The fix now builds every key with the stopped build's options, and runs
    word for word. The keys of the older tree come from a build cache that
    holds their objects under the new tree's identity (their GPU code did not
    change), so nothing compiles."""
    from dsv41_aot import pending, source
    from dsv41_aot.aot import toolchain
    from dsv41_aot.aot.cache import COMPILE, BuildCache
    from dsv41_aot.keys import BuildKey
    from dsv41_aot.room import Room

    d, cache = copy_of(smoke_dir, tmp_path / "p"), tmp_path / "cache"
    r = Room(d, "gfx950", NEWEST)
    entries = r.manifest().entries
    store = BuildCache(cache, toolchain.find())
    for k, e in entries.items():
        store.put(COMPILE, BuildKey.parse(k, NEWEST), entries[K2W].source, (r.arch_dir / e.object).read_bytes(),
                  export_bytes=e.export_bytes, seconds=1)
    old = sorted(k for k in entries if k != K2W)
    _set_sources(d, "0" * 16, old)  # K2W was rebuilt from the new tree before the kill; the rest are the old tree's
    pending.write(r.arch_dir, {NEWEST: sorted(entries)}, ["--vllm-src", str(source.find().root), "--cache", str(cache)])

    code, doc = verify_json(d)
    (mixed,) = [f for f in doc["failures"] if f["what"] == "sources"]
    assert code == 1 and "mixes 2 source identities" in mixed["error"], mixed
    for command in mixed["fix"].split(" && "):
        code, out, err = run_cli(*shlex.split(command)[1:], check=False)
        assert code == 0, f"{mixed['fix']}\n{out}\n{err}"
    code, doc = verify_json(d)
    assert code == 0, doc["failures"]
    assert {e.source for e in Room(d, "gfx950", NEWEST).manifest().entries.values()} == {entries[K2W].source}


@pytest.mark.faults
def test_a_copied_shipped_room_is_restored_by_copying_not_by_reinstalling(smoke_dir, tmp_path, monkeypatch):
    """Q13 of the fault report at 3f0364f: a shipped room (no objects/) in a
    folder of its own (a --dir copy, DSV41_AOT_PREBUILT) was told to
    reinstall the dsv41-aot package, which restores the package's kernels,
    not that folder. Only the installed package's own kernels are."""
    from dsv41_aot import room as room_mod
    from dsv41_aot import verdict
    from dsv41_aot.room import REINSTALL, Room

    d = copy_of(smoke_dir, tmp_path / "p")
    for arch in ("gfx950", "gfx942"):
        shutil.rmtree(d / arch / "objects")
    flip_band(d, tmp_path)
    code, doc = verify_json(d)
    fixes = {f["fix"] for f in doc["failures"] if f["what"] == "band"}
    assert code == 1 and fixes == {Room(d, "gfx950", NEWEST).fix_restore}, doc["failures"]
    assert REINSTALL not in fixes.pop() and str(d) in Room(d, "gfx950", NEWEST).fix_restore
    monkeypatch.setattr(room_mod, "PACKAGED", d.resolve())  # the same room, as the installed package's kernels
    assert {p.fix for p in verdict.problems(Room(d, "gfx950", NEWEST)) if p.what == "band"} == {REINSTALL}
