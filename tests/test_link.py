"""Link step: smoke objects -> per-arch libraries that load on any ROCm host.

Real parts throughout: the builder's objects, ld.lld, Debian's libamdhip64
(ROCm 5.2) to dlopen against, vLLM's mono launchers in a subprocess.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from _smoke import REPO, cli, copy_of, smoke_count, smoke_dir
from dsv41_aot.build import link
from dsv41_aot.errors import IntegrityError
from dsv41_aot.keys import BuildKey
from dsv41_aot.manifest import Manifest, sha256_file

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
            assert lib["file"].startswith(lib["chunk"] + ".") and lib["sha256"][:16] in lib["file"]
            assert all(link.chunk_name(BuildKey.parse(k)) == lib["chunk"] for k in lib["entries"])


def test_no_libamdhip64_soname_is_baked_in(smoke):
    for lib in sorted(smoke.glob("*/lib/*.so")):
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
import ctypes, json, os, sys
from pathlib import Path
ctypes.CDLL("libamdhip64.so", mode=ctypes.RTLD_GLOBAL | os.RTLD_NOW)
root = Path(sys.argv[1]); out = {}
for arch in ("gfx950", "gfx942"):
    for lib in json.loads((root / arch / "lib" / "libs.json").read_text())["libraries"]:
        h = ctypes.CDLL(str(root / arch / "lib" / lib["file"]), mode=os.RTLD_NOW | os.RTLD_LOCAL)
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
