"""Link step: smoke objects -> per-arch libraries that load on any ROCm host.

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

from _smoke import REPO, cli, copy_of, smoke_count, smoke_dir
from dsv41_aot.build import link
from dsv41_aot.errors import IntegrityError
from dsv41_aot.keys import BuildKey
from dsv41_aot.manifest import Manifest, sha256_file
from dsv41_aot.runtime.loader import read_band

pytestmark = pytest.mark.slow
READELF = "/usr/lib/llvm-19/bin/llvm-readelf"


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    return smoke_dir(tmp_path_factory)


def _libs(arch_dir: Path) -> list[dict]:
    return json.loads((arch_dir / "lib" / "libs.json").read_text())["libraries"]


def test_every_key_is_linked_into_a_library_with_the_recorded_sha(smoke):
    for arch in ("gfx950", "gfx942"):
        man = Manifest.read(smoke / arch)
        libs = _libs(smoke / arch)
        held = {k: sha for lib in libs for k, sha in lib["entries"].items()}
        assert held == {k: e["sha256"] for k, e in man.entries.items()}
        for lib in libs:
            path = smoke / arch / "lib" / lib["file"]
            assert sha256_file(path) == lib["sha256"] and path.stat().st_size == lib["bytes"]
            assert lib["file"] == f"{lib['chunk']}.{lib['sha256'][:16]}.so.xz"
            assert all(link.chunk_name(BuildKey.parse(k)) == lib["chunk"] for k in lib["entries"])
            raw = lzma.decompress(path.read_bytes())  # a plain xz file, independent of the loader
            assert raw[:4] == b"\x7fELF" and len(raw) == lib["raw_bytes"]
            assert hashlib.sha256(raw).hexdigest() == lib["raw_sha256"] and read_band(path, lib) == raw
            assert lib["bytes"] < lib["raw_bytes"] // 2
        # nothing but bands and the link record: no raw library left on disk
        assert sorted(p.name for p in (smoke / arch / "lib").iterdir()) == sorted([*(l["file"] for l in libs),
                                                                                   "libs.json"])


def test_an_older_link_record_is_relinked_into_bands(smoke, tmp_path):
    d = copy_of(smoke, tmp_path / "old")
    lib_dir = d / "gfx942" / "lib"
    doc = json.loads((lib_dir / "libs.json").read_text())
    for lib in doc["libraries"]:  # what schema 1 left: raw .so files named in libs.json
        raw = read_band(lib_dir / lib["file"], lib)
        (lib_dir / lib["file"]).unlink()
        lib["file"], lib["sha256"], lib["bytes"] = lib["file"][:-3], lib["raw_sha256"], len(raw)
        (lib_dir / lib["file"]).write_bytes(raw)
        del lib["raw_sha256"], lib["raw_bytes"]
    doc["schema"] = 1
    (lib_dir / "libs.json").write_text(json.dumps(doc))
    r = cli("link", "--dir", d, "--arch", "gfx942", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["arches"][0]["linked"] == len(doc["libraries"])
    assert sorted(p.name for p in lib_dir.iterdir()) == sorted(p.name for p in (smoke / "gfx942" / "lib").iterdir())


def test_no_libamdhip64_soname_is_baked_in(smoke, tmp_path):
    bands = sorted(smoke.glob("*/lib/*.so.xz"))
    assert len(bands) >= 2
    for band in bands:
        lib = tmp_path / band.name[: -len(".xz")]
        lib.write_bytes(lzma.decompress(band.read_bytes()))
        dyn = subprocess.run([READELF, "-d", str(lib)], capture_output=True, text=True, check=True).stdout
        assert "NEEDED" not in dyn, dyn  # not libamdhip64.so.5 (the build host's), nor anything else
        info = link.dynamic_info(lib.read_bytes())
        assert info["needed"] == []
        assert "hipModuleLaunchKernel" in info["undefined"] and "hipModuleLoadData" in info["undefined"]
        syms = subprocess.run([READELF, "--dyn-syms", "-W", str(lib)], capture_output=True, text=True).stdout
        assert "libamdhip64" not in syms and "GLIBC_2.34" not in syms


def test_link_is_deterministic_and_incremental(smoke, tmp_path):
    a = copy_of(smoke, tmp_path / "a")
    b = copy_of(smoke, tmp_path / "b")
    for d in (a, b):
        for lib in d.glob("*/lib"):
            for p in lib.iterdir():
                p.unlink()
        assert cli("link", "--dir", d).returncode == 0
    for arch in ("gfx950", "gfx942"):
        la, lb = sorted((a / arch / "lib").iterdir()), sorted((b / arch / "lib").iterdir())
        assert [p.name for p in la] == [p.name for p in lb]
        assert all(x.read_bytes() == y.read_bytes() for x, y in zip(la, lb))
        assert [p.name for p in la] == sorted(p.name for p in (smoke / arch / "lib").iterdir())
    r = cli("link", "--dir", a, "--json")
    assert r.returncode == 0, r.stderr
    assert [s["linked"] for s in json.loads(r.stdout)["arches"]] == [0, 0]  # nothing changed: nothing relinked


def test_a_flipped_byte_in_an_object_is_refused_and_nothing_is_written(smoke, tmp_path):
    d = copy_of(smoke, tmp_path / "p")
    man = Manifest.read(d / "gfx950")
    key = sorted(man.entries)[0]
    obj = d / "gfx950" / man.entries[key]["object"]
    data = bytearray(obj.read_bytes())
    data[len(data) // 2] ^= 0x01
    obj.write_bytes(bytes(data))
    for p in (d / "gfx950" / "lib").iterdir():
        p.unlink()
    with pytest.raises(IntegrityError, match=key.replace("=", ".").split(":")[0]):
        link.link_arch(d / "gfx950")
    assert list((d / "gfx950" / "lib").iterdir()) == []
    r = cli("link", "--dir", d, "--arch", "gfx950")
    assert r.returncode == 1 and "does not match its manifest sha256" in r.stderr and "dsv41-aot build" in r.stderr


def test_link_of_a_folder_without_a_build_is_bad_input(tmp_path):
    r = cli("link", "--dir", tmp_path / "nothing")
    assert r.returncode == 2 and "dsv41-aot build" in r.stderr


# the library's own metadata (read back through dlopen/dlsym) against vLLM's
# launcher parameters, each side in its own process
_READ_METADATA = r"""
import ctypes, json, lzma, os, sys, tempfile
from pathlib import Path
ctypes.CDLL("libamdhip64.so", mode=ctypes.RTLD_GLOBAL | os.RTLD_NOW)
root = Path(sys.argv[1]); out = {}; tmp = Path(tempfile.mkdtemp())
for arch in ("gfx950", "gfx942"):
    for lib in json.loads((root / arch / "lib" / "libs.json").read_text())["libraries"]:
        so = tmp / lib["file"][:-3]  # unpacked with plain xz, not through the loader
        so.write_bytes(lzma.decompress((root / arch / "lib" / lib["file"]).read_bytes()))
        h = ctypes.CDLL(str(so), mode=os.RTLD_NOW | os.RTLD_LOCAL)
        man = json.loads((root / arch / "manifest.json").read_text())
        for key in lib["entries"]:
            meta = ctypes.c_char.in_dll(h, man["entries"][key]["entry"] + "__metadata")
            out[key] = json.loads(ctypes.string_at(ctypes.addressof(meta)).decode())
print(json.dumps(out))
"""

_VLLM_SIGNATURES = r"""
import inspect, json, os, sys
arch = sys.argv[1]
os.environ["ARCH"] = os.environ["FLYDSL_GPU_ARCH"] = arch
from dsv41_aot import source
from dsv41_aot.build import compat
from dsv41_aot.keys import BuildKey
compat.install_aiter_shim()
layer = source.import_mono(source.find(), "layer")
out = {}
for text in sys.argv[2:]:
    k = BuildKey.parse(text)
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
    assert len(meta) == smoke_count()
    for arch in ("gfx950", "gfx942"):
        keys = sorted(k for k in meta if f"@{arch}:" in k)
        r = subprocess.run([sys.executable, "-c", _VLLM_SIGNATURES, arch, *keys], capture_output=True, text=True,
                           timeout=300, cwd=REPO)
        assert r.returncode == 0, r.stderr[-3000:]
        vllm = json.loads(r.stdout)
        man = Manifest.read(smoke / arch)
        for key in keys:
            slots = meta[key]["abi"]
            assert meta[key]["arch"] == arch and meta[key]["symbol"] == man.entries[key]["entry"]
            got = [("stream" if s.get("arg_name") is None else s["arg_name"], s["ctype"]) for s in slots]
            want = [(n, _ANNOTATION_CTYPE[a]) for n, a in vllm[key]]
            assert got == want, key
            assert [(s["name"], s["ctype"]) for s in man.abi(key)] == want, key
