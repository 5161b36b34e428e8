"""Link step: smoke objects -> per-room (arch, vLLM release) libraries that
load on any ROCm host, their bands shared by the arch's releases.

Real parts throughout: the builder's objects, ld.lld, Debian's libamdhip64
(ROCm 5.2) to dlopen against, vLLM's mono launchers in a subprocess.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import subprocess
import sys
from pathlib import Path

import pytest

from _smoke import OLD, REPO, SMOKE_RELEASE_KEYS, cli, copy_of, libdir, libs_json, room
from dsv41_aot import linkrecord
from dsv41_aot.aot import link
from dsv41_aot.elf import dynamic_info
from dsv41_aot.errors import AotError, IntegrityError
from dsv41_aot.facts.releases import NEWEST
from dsv41_aot.keys import BuildKey
from dsv41_aot.manifest import sha256_file
from dsv41_aot.room import Room
from dsv41_aot.listing import built_rooms

pytestmark = pytest.mark.slow
READELF = "/usr/lib/llvm-19/bin/llvm-readelf"


@pytest.fixture(scope="module")
def smoke(smoke_dir):
    return smoke_dir


def _libs(root: Path, arch: str, release: str = NEWEST) -> list[dict]:
    return libs_json(root, arch, release)[1]["libraries"]


def _rooms(root: Path) -> list[tuple[str, str]]:
    return [(r.arch, r.release) for r in built_rooms(root)]


def test_every_key_is_linked_into_a_library_with_the_recorded_sha(smoke):
    # every room of the smoke build: 0.33.0 on both arches, 0.32.0 on gfx950
    assert sorted(_rooms(smoke)) == [("gfx942", NEWEST), ("gfx950", OLD), ("gfx950", NEWEST)]
    named: dict = {}
    for arch, release in _rooms(smoke):
        man = Room(smoke, arch, release).manifest()
        doc = libs_json(smoke, arch, release)[1]
        assert (doc["arch"], doc["release"]) == (arch, release)
        libs = doc["libraries"]
        held = {k: sha for lib in libs for k, sha in lib["entries"].items()}
        assert held == {k: e.sha256 for k, e in man.entries.items()}
        assert sorted(held) == sorted(k for k in SMOKE_RELEASE_KEYS[release] if f"@{arch}:" in k)
        for lib in libs:
            path = libdir(smoke, arch) / lib["file"]
            assert sha256_file(path) == lib["sha256"] and path.stat().st_size == lib["bytes"]
            assert lib["file"] == f"{lib['chunk']}.{lib['sha256'][:16]}.so.xz"
            assert all(link.chunk_name(BuildKey.parse(k, release)) == lib["chunk"] for k in lib["entries"])
            raw = lzma.decompress(path.read_bytes())  # a plain xz file, independent of the loader
            assert raw[:4] == b"\x7fELF" and len(raw) == lib["raw_bytes"]
            r = Room(smoke, arch, release)
            assert hashlib.sha256(raw).hexdigest() == lib["raw_sha256"]
            assert r.read_band(next(b for b in r.links().bands if b.file == lib["file"])) == raw  # the loader's read
            assert lib["bytes"] < lib["raw_bytes"] // 2
            named.setdefault(arch, set()).add(lib["file"])
    for arch in ("gfx950", "gfx942"):
        # nothing but the bands some room names: no raw library, no link record in lib/
        assert sorted(p.name for p in libdir(smoke, arch).iterdir()) == sorted(named[arch])


def test_an_older_link_record_is_relinked_into_bands(smoke, tmp_path):
    d = copy_of(smoke, tmp_path / "old")
    lib_dir = libdir(d, "gfx942")
    record = room(d, "gfx942") / "libs.json"
    doc = json.loads(record.read_text())
    r = Room(d, "gfx942", NEWEST)
    raws = {b.file: r.read_band(b) for b in r.links().bands}
    for lib in doc["libraries"]:  # what schema 1 left: raw .so files named in libs.json
        raw = raws[lib["file"]]
        (lib_dir / lib["file"]).unlink()
        lib["file"], lib["sha256"], lib["bytes"] = lib["file"][:-3], lib["raw_sha256"], len(raw)
        (lib_dir / lib["file"]).write_bytes(raw)
        del lib["raw_sha256"], lib["raw_bytes"]
    doc["schema"] = 1
    record.write_text(json.dumps(doc))
    assert all(p.suffix == ".so" for p in lib_dir.iterdir())
    r = cli("link", "--dir", d, "--arch", "gfx942", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["arches"][0]["linked"] == len(doc["libraries"])
    assert sorted(p.name for p in lib_dir.iterdir()) == sorted(p.name for p in libdir(smoke, "gfx942").iterdir())
    assert _libs(d, "gfx942") == _libs(smoke, "gfx942")


def test_no_libamdhip64_soname_is_baked_in(smoke, tmp_path):
    bands = sorted(smoke.glob("*/lib/*.so.xz"))
    assert len(bands) >= 2
    for band in bands:
        lib = tmp_path / band.name[: -len(".xz")]
        lib.write_bytes(lzma.decompress(band.read_bytes()))
        dyn = subprocess.run([READELF, "-d", str(lib)], capture_output=True, text=True, check=True).stdout
        assert "NEEDED" not in dyn, dyn  # not libamdhip64.so.5 (the build host's), nor anything else
        info = dynamic_info(lib.read_bytes())
        assert info["needed"] == []
        assert "hipModuleLaunchKernel" in info["undefined"] and "hipModuleLoadData" in info["undefined"]
        syms = subprocess.run([READELF, "--dyn-syms", "-W", str(lib)], capture_output=True, text=True).stdout
        assert "libamdhip64" not in syms and "GLIBC_2.34" not in syms


def test_link_is_deterministic_and_incremental(smoke, tmp_path):
    """Two links of one build give the same bytes, whether --dir is absolute
    or relative to the working folder; a link with nothing new links nothing."""
    a = copy_of(smoke, tmp_path / "a")
    b = copy_of(smoke, tmp_path / "b")
    for d in (a, b):
        for lib in d.glob("*/lib"):
            for p in lib.iterdir():
                p.unlink()
    assert cli("link", "--dir", a).returncode == 0
    r = cli("link", "--dir", b.name, cwd=b.parent)  # ld.lld runs inside the arch folder: the path must still hold
    assert r.returncode == 0, r.stderr
    for arch in ("gfx950", "gfx942"):
        la, lb = sorted(libdir(a, arch).iterdir()), sorted(libdir(b, arch).iterdir())
        assert [p.name for p in la] == [p.name for p in lb]
        assert all(x.read_bytes() == y.read_bytes() for x, y in zip(la, lb))
        assert [p.name for p in la] == sorted(p.name for p in libdir(smoke, arch).iterdir())
    for arch, release in _rooms(a):
        assert _libs(a, arch, release) == _libs(b, arch, release) == _libs(smoke, arch, release)
    r = cli("link", "--dir", a, "--json")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)["arches"]
    # one summary a room; nothing changed: nothing relinked
    assert sorted((s["arch"], s["release"]) for s in summary) == sorted(_rooms(smoke))
    assert [s["linked"] for s in summary] == [0, 0, 0] and all(s["up_to_date"] for s in summary)


def test_a_flipped_byte_in_an_object_is_refused_and_nothing_is_written(smoke, tmp_path):
    d = copy_of(smoke, tmp_path / "p")
    man = Room(d, "gfx950", OLD).manifest()
    key = sorted(man.entries)[0]
    obj = d / "gfx950" / man.entries[key].object
    data = bytearray(obj.read_bytes())
    data[len(data) // 2] ^= 0x01
    obj.write_bytes(bytes(data))
    for p in libdir(d, "gfx950").iterdir():
        p.unlink()
    with pytest.raises(IntegrityError, match=key.replace("=", ".").split(":")[0]):
        link.link_room(d / "gfx950", OLD)
    assert list(libdir(d, "gfx950").iterdir()) == []
    r = cli("link", "--dir", d, "--arch", "gfx950", "--release", OLD)
    assert r.returncode == 1 and "does not match its manifest sha256" in r.stderr
    # the fix names the room's release
    assert f"dsv41-aot build --release {OLD} --out " in r.stderr and f" --key {key}" in r.stderr
    # the other release's room links: its objects are whole
    r = cli("link", "--dir", d, "--arch", "gfx950", "--release", NEWEST)
    assert r.returncode == 0, r.stderr
    assert {lib["file"] for lib in _libs(d, "gfx950")} == {p.name for p in libdir(d, "gfx950").iterdir()}


@pytest.mark.faults
@pytest.mark.parametrize("field", ["resources", "entry"])
def test_link_refuses_a_key_verify_refuses_and_its_fix_fixes_it(smoke, tmp_path, field):
    """P11b of the fault report at 24a0152: an entry edited so that it no
    longer describes its object used to be linked as up to date (resources)
    or refused as bad input with no fix (entry; now Manifest.parse's refusal, whose fix rebuilds the manifest)."""
    import shlex

    d = copy_of(smoke, tmp_path / "p")
    man = Room(d, "gfx950", NEWEST).manifest()
    key = sorted(k for k in man.entries if k.startswith("k1@"))[0]
    e = man.entries[key]
    man.entries[key] = e.replace(**({"resources": dict(e.resources, lds_bytes=e.resources["lds_bytes"] + 64)}
                                    if field == "resources" else {"entry": e.entry + "_edited"}))
    man.write()
    r = cli("link", "--dir", d, "--arch", "gfx950", "--release", NEWEST)
    # an entry point not the key's own is the manifest parser's refusal: the fix rebuilds the manifest
    said = "verify refuses" if field == "resources" else "names C entry point"
    assert r.returncode == 1 and key in r.stderr and said in r.stderr, r.stderr
    (fix,) = [ln.split("fix: ", 1)[1] for ln in r.stderr.splitlines() if "fix: " in ln]
    argv = shlex.split(fix)
    assert argv[:2] == ["dsv41-aot", "build"] and (key in argv or field == "entry"), fix
    assert cli(*argv[1:]).returncode == 0
    assert cli("link", "--dir", d, "--arch", "gfx950", "--release", NEWEST).returncode == 0
    assert cli("verify", "--dir", d).returncode == 0


def test_link_of_a_folder_without_a_build_is_bad_input(tmp_path):
    r = cli("link", "--dir", tmp_path / "nothing")
    assert r.returncode == 2 and "dsv41-aot build" in r.stderr


@pytest.mark.parametrize("args, words", [(["--arch", "gfx999"], "unknown arch 'gfx999'"),
                                         (["--release", "0.99.0"], "unknown vLLM release '0.99.0'"),
                                         (["--arch", "gfx950", "--arch", "gfx999"], "unknown arch 'gfx999'")])
def test_link_of_an_unknown_arch_or_release_names_the_known_ones(smoke, tmp_path, args, words):
    """Not "no built room" with a smoke build as the fix: exit 2 naming what
    dsv41-aot knows; nothing relinked."""
    from dsv41_aot.facts.arches import ARCHES
    from dsv41_aot.facts.releases import RELEASES

    d = copy_of(smoke, tmp_path / "p")
    before = {p: p.read_bytes() for p in d.rglob("*") if p.is_file()}
    r = cli("link", "--dir", d, *args)
    assert r.returncode == 2, r.stdout + r.stderr
    known = ARCHES if "arch" in words else RELEASES
    assert words in r.stderr and all(k in r.stderr for k in known), r.stderr
    assert "no built room" not in r.stderr
    assert {p: p.read_bytes() for p in d.rglob("*") if p.is_file()} == before


# the library's own metadata (read back through dlopen/dlsym) against vLLM's
# launcher parameters, each side in its own process
_READ_METADATA = r"""
import ctypes, json, lzma, os, sys, tempfile
from pathlib import Path
ctypes.CDLL("libamdhip64.so", mode=ctypes.RTLD_GLOBAL | os.RTLD_NOW)
root = Path(sys.argv[1]); out = {}; tmp = Path(tempfile.mkdtemp())
for room in sorted(root.glob("*/vllm-*")):
    arch, release = room.parent.name, room.name[len("vllm-"):]
    for lib in json.loads((room / "libs.json").read_text())["libraries"]:
        so = tmp / release / lib["file"][:-3]  # unpacked with plain xz, not through the loader
        so.parent.mkdir(exist_ok=True)
        so.write_bytes(lzma.decompress((root / arch / "lib" / lib["file"]).read_bytes()))
        h = ctypes.CDLL(str(so), mode=os.RTLD_NOW | os.RTLD_LOCAL)
        man = json.loads((room / "manifest.json").read_text())
        for key in lib["entries"]:
            meta = ctypes.c_char.in_dll(h, man["entries"][key]["entry"] + "__metadata")
            out[release + " " + key] = json.loads(ctypes.string_at(ctypes.addressof(meta)).decode())
print(json.dumps(out))
"""

_VLLM_SIGNATURES = r"""
import inspect, json, os, sys
arch, release, digest = sys.argv[1:4]
os.environ["ARCH"] = os.environ["FLYDSL_GPU_ARCH"] = arch
from dsv41_aot import source
from dsv41_aot.aot import compat
from dsv41_aot.keys import BuildKey
compat.install_aiter_shim()
layer = source.import_mono(source.find_release(release, digest), "layer")  # that release's own mono package
out = {}
for text in sys.argv[4:]:
    k = BuildKey.parse(text, release)
    build = getattr(layer, "build_mono_" + k.kind)(layer.MonoBuild(**k.build_fields()))
    sig = inspect.signature(build.func)
    out[text] = [(n, getattr(p.annotation, "__name__", str(p.annotation))) for n, p in sig.parameters.items()]
print(json.dumps(out))
"""

_ANNOTATION_CTYPE = {"Int64": "int64", "Int32": "int32", "Stream": "pointer"}


def test_library_metadata_matches_vllm_launcher_parameters(smoke):
    r = subprocess.run([sys.executable, "-c", _READ_METADATA, str(smoke)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    meta = json.loads(r.stdout)
    assert len(meta) == sum(map(len, SMOKE_RELEASE_KEYS.values()))
    for arch, release in _rooms(smoke):
        keys = sorted(k.split(" ")[1] for k in meta if k.startswith(f"{release} ") and f"@{arch}:" in k)
        man = Room(smoke, arch, release).manifest()
        assert keys == sorted(man.entries)
        r = subprocess.run([sys.executable, "-c", _VLLM_SIGNATURES, arch, release, man.mono_sources, *keys],
                           capture_output=True, text=True, timeout=300, cwd=REPO)
        assert r.returncode == 0, r.stderr[-3000:]
        vllm = json.loads(r.stdout)
        for key in keys:
            slots = meta[f"{release} {key}"]["abi"]
            assert meta[f"{release} {key}"]["arch"] == arch
            assert meta[f"{release} {key}"]["symbol"] == man.entries[key].entry
            got = [("stream" if s.get("arg_name") is None else s["arg_name"], s["ctype"]) for s in slots]
            want = [(n, _ANNOTATION_CTYPE[a]) for n, a in vllm[key]]
            assert got == want, key
            assert [(s["name"], s["ctype"]) for s in man.abi(key)] == want, key


def _soname(band: Path) -> str:
    return dynamic_info(lzma.decompress(band.read_bytes()))["soname"]


def test_a_chunk_two_releases_link_alike_is_one_band(smoke, tmp_path):
    d = copy_of(smoke, tmp_path / "shared")
    arch = "gfx950"  # the arch both releases run on
    # both rooms hold one key string both releases have, from the same object
    # (0.33.0's, to the byte, under the older release's name)
    shared = "k1@gfx950:s=4,tp=4,r=1"
    doc = json.loads((room(d, arch) / "manifest.json").read_text())
    doc["entries"] = {shared: doc["entries"][shared]}
    (room(d, arch) / "manifest.json").write_text(json.dumps(doc))
    doc["release"] = OLD
    (room(d, arch, OLD) / "manifest.json").write_text(json.dumps(doc))
    for stale in (room(d, arch) / "libs.json", room(d, arch, OLD) / "libs.json"):
        stale.unlink()
    assert cli("link", "--dir", d, "--arch", arch, "--release", NEWEST).returncode == 0
    r = cli("link", "--dir", d, "--arch", arch, "--json")
    assert r.returncode == 0, r.stderr
    new, old = _libs(d, arch, NEWEST), _libs(d, arch, OLD)
    # the same chunks, the same members: one band, named by both rooms' libs.json;
    # the old bands go once every room is linked (an unlinked room's are unknown)
    assert [lib["file"] for lib in new] == [lib["file"] for lib in old]
    before = sorted(p.name for p in libdir(d, arch).iterdir())
    assert before == sorted(lib["file"] for lib in new)
    assert len(new) == 1 and new[0]["entries"] == old[0]["entries"]
    # unlinking one room's record keeps the band the other still names
    (room(d, arch) / "libs.json").unlink()
    assert cli("link", "--dir", d, "--arch", arch, "--release", OLD).returncode == 0
    assert sorted(p.name for p in libdir(d, arch).iterdir()) == before


def test_chunks_with_different_members_have_different_sonames(smoke):
    # gfx950's s=1..8 TP4 chunk in each release: same chunk name, other kernels
    new = {lib["chunk"]: lib for lib in _libs(smoke, "gfx950", NEWEST)}
    old = {lib["chunk"]: lib for lib in _libs(smoke, "gfx950", OLD)}
    chunk = "libdsv41_gfx950_tp4_s01-08"
    assert chunk in new and chunk in old and new[chunk]["entries"] != old[chunk]["entries"]
    a, b = (libdir(smoke, "gfx950") / x[chunk]["file"] for x in (new, old))
    assert a != b and a.is_file() and b.is_file()
    sa, sb = _soname(a), _soname(b)
    # both named after the chunk, each by its own content: glibc would hand
    # out the first library dlopened under a SONAME for the second
    assert sa.startswith(chunk + ".") and sb.startswith(chunk + ".") and sa != sb
    # every band of the arch: one SONAME each
    sonames = [_soname(p) for p in libdir(smoke, "gfx950").iterdir()]
    assert len(set(sonames)) == len(sonames) == 3


def test_a_band_whose_keys_changed_is_relinked(smoke, tmp_path):
    """A key dropped from the room changes its band's members: link links
    that band again from the keys left (its SONAME names them), keeps the
    room's other band, and the band it replaced goes once no room names it."""
    d = copy_of(smoke, tmp_path / "p")
    drop = "k2@gfx950:s=4,tp=4,r=1"  # one of the three keys of 0.33.0's s01-08 band
    before = {lib["chunk"]: lib for lib in _libs(d, "gfx950")}
    chunk = next(c for c, lib in before.items() if drop in lib["entries"])
    man = Room(d, "gfx950", NEWEST).manifest()
    del man.entries[drop]
    man.write()
    r = cli("link", "--dir", d, "--arch", "gfx950", "--release", NEWEST, "--json")
    assert r.returncode == 0, r.stderr
    (summary,) = json.loads(r.stdout)["arches"]
    assert (summary["linked"], summary["up_to_date"]) == (1, len(before) - 1)
    after = {lib["chunk"]: lib for lib in _libs(d, "gfx950")}
    members = {k: sha for k, sha in before[chunk]["entries"].items() if k != drop}
    assert after[chunk]["entries"] == members and after[chunk]["file"] != before[chunk]["file"]
    assert _soname(libdir(d, "gfx950") / after[chunk]["file"]) == linkrecord.soname(chunk, members)
    assert all(after[c] == before[c] for c in before if c != chunk)
    assert not (libdir(d, "gfx950") / before[chunk]["file"]).exists() or any(
        before[chunk]["file"] == lib["file"] for lib in _libs(d, "gfx950", OLD))
    assert cli("verify", "--dir", d).returncode == 0


def _library(tmp_path: Path, c_source: str) -> bytes:
    """A shared library the C compiler builds from ``c_source`` (no libc: nothing needed)."""
    src, lib = tmp_path / "band.c", tmp_path / "band.so"
    src.write_text(c_source)
    subprocess.run(["cc", "-shared", "-fPIC", "-nostdlib", "-o", str(lib), str(src)], check=True, capture_output=True)
    return lib.read_bytes()


def test_link_and_the_room_judge_a_band_library_by_one_rule(tmp_path):
    # the launcher binds an entry and its __module_load: a band exporting only
    # the entry is refused by the room's verdict and by link alike
    from dsv41_aot.verdict import library_problems

    raw = _library(tmp_path, "void k1_entry(void) {}\nextern int not_on_any_host(void);\n"
                             "int k2_entry(void) { return not_on_any_host(); }\n"
                             "int k2_entry__module_load(int d) { return d; }\n")
    whole, lost = library_problems(raw, {"k1": "k1_entry", "k2": "k2_entry"})
    assert lost == {"k1": "k1_entry__module_load"}
    assert whole == ["leaves undefined symbols no ROCm host provides: not_on_any_host"]
    with pytest.raises(AotError, match="undefined symbols no ROCm host provides: not_on_any_host"):
        link._check_library(raw, "band.so", {"k1": "k1_entry"})
    sound = _library(tmp_path, "void e(void) {}\nint e__module_load(int d) { return d; }\nint hipModuleLaunchKernel(void);\n"
                               "int f(void) { return hipModuleLaunchKernel(); }\n")
    assert library_problems(sound, {"k": "e"}) == ([], {})
    link._check_library(sound, "band.so", {"k": "e"})


def test_a_band_whose_whole_library_is_unsound_names_the_band_and_the_relink(smoke, tmp_path):
    """A problem of the whole library (here an undefined symbol no ROCm host
    provides) is the band's: the room's verdict names the band's file and
    the relink that makes it again, as for a key it lacks."""
    from dsv41_aot.verdict import band_problems

    r = Room(smoke, "gfx950", NEWEST)
    band = r.links().bands[0]
    raw = _library(tmp_path, "extern int not_on_any_host(void);\nint f(void) { return not_on_any_host(); }\n")
    whole = [p for p in band_problems(r, band, r.manifest(), raw) if p.key is None]
    assert [p.message for p in whole] == [f"{r.lib / band.file} leaves undefined symbols no ROCm host provides: "
                                          "not_on_any_host"]
    assert (whole[0].what, whole[0].file, whole[0].fix, whole[0].band) == \
        ("band", str(r.lib / band.file), r.fix_relink, band.file)
