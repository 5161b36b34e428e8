"""The resource report: MessagePack decoding, AMDGPU metadata, residency.

The slow tests read the code objects of a real ``smoke`` build (built once a
test session into pytest's temp folder; a second module's build is a no-op)
and cross-check the project's decoder against ``llvm-readelf --notes``.
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from dsv41_aot.build import residency as resources
from dsv41_aot.build.elf import exported_parts
from dsv41_aot.errors import UnknownArchError
from dsv41_aot.keys import BuildKey
from dsv41_aot.manifest import Manifest, arch_dirs
from dsv41_aot.build.residency import MsgpackError, manifest_figures, residency_problems, unpackb

from _smoke import smoke_count, smoke_dir

READELF = shutil.which("llvm-readelf-19") or shutil.which("llvm-readelf") or "/usr/lib/llvm-19/bin/llvm-readelf"


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> Path:
    return smoke_dir(tmp_path_factory)


def code_objects(root: Path):
    for d in arch_dirs(root):
        man = Manifest.read(d)
        for key, e in sorted(man.entries.items()):
            meta, code = exported_parts(man.object_path(key).read_bytes(), e["entry"])
            yield man, key, json.loads(meta), code


# ---------------------------------------------------------------- MessagePack


def test_msgpack_every_type_family():
    cases = {
        b"\x05": 5,
        b"\xff": -1,
        b"\xcc\xc8": 200,
        b"\xcd\x01\x00": 256,
        b"\xce\x00\x01\x00\x00": 65536,
        b"\xcf" + struct.pack(">Q", 1 << 40): 1 << 40,
        b"\xd0\x80": -128,
        b"\xd1\xff\x00": -256,
        b"\xd2\xff\xff\xff\xfe": -2,
        b"\xd3" + struct.pack(">q", -(1 << 40)): -(1 << 40),
        b"\xca" + struct.pack(">f", 1.5): 1.5,
        b"\xcb" + struct.pack(">d", -2.25): -2.25,
        b"\xc0": None,
        b"\xc2": False,
        b"\xc3": True,
        b"\xa3abc": "abc",
        b"\xd9\x03xyz": "xyz",
        b"\xda\x00\x02hi": "hi",
        b"\xc4\x02\x00\x01": b"\x00\x01",
        b"\x92\x01\xa1a": [1, "a"],
        b"\xdc\x00\x01\xc3": [True],
        b"\x81\xa1k\x90": {"k": []},
        b"\xde\x00\x01\x01\x02": {1: 2},
        b"\xd4\x07\x2a": (7, b"\x2a"),
    }
    for raw, want in cases.items():
        assert unpackb(raw) == want, raw


def test_msgpack_refuses_broken_input():
    with pytest.raises(MsgpackError, match="truncated"):
        unpackb(b"\xa5ab")
    with pytest.raises(MsgpackError, match="truncated"):
        unpackb(b"\x82\xa1k")
    with pytest.raises(MsgpackError, match="trailing"):
        unpackb(b"\x01\x02")
    with pytest.raises(MsgpackError, match="0xc1"):
        unpackb(b"\xc1")


# ---------------------------------------------------------------- residency rule


def figures(**over) -> dict:
    base = dict(vgpr_count=152, agpr_count=0, sgpr_count=98, vgpr_spill_count=0, sgpr_spill_count=0,
                lds_bytes=33984, scratch_bytes=0, dynamic_stack=False, kernarg_bytes=320,
                wavefront_size=64, max_flat_workgroup_size=512, vgpr_alloc=152, accum_offset=152, args=[])
    base.update(over)
    return base


def test_residency_accepts_the_tightest_gfx950_k2_figures():
    # measured here: gfx950 K2 uses up to 158,752 bytes of LDS and 251 VGPRs
    assert residency_problems(figures(lds_bytes=158752, vgpr_count=251, vgpr_alloc=256), "gfx950") == []


def test_residency_refuses_the_broken_gfx942_k2_s17_tp2():
    # measured here: gfx942 K2 tokens=17 tp=2 r=2 needs 77,056 bytes of LDS and 325 VGPRs
    problems = residency_problems(figures(lds_bytes=77056, vgpr_count=325, vgpr_alloc=328), "gfx942")
    assert any("LDS 77056" in p and "65536" in p for p in problems), problems
    assert any("VGPRs 325" in p and "> 256 a wave" in p for p in problems), problems
    assert any("325 arch VGPRs > 256" in p for p in problems), problems
    # the same LDS fits gfx950's 160 KiB: only the registers are refused there
    assert not any("LDS" in p for p in residency_problems(figures(lds_bytes=77056), "gfx950"))


def test_residency_counts_lds_in_allocation_granules():
    # 65,000 bytes round up to 65,024 on gfx942 (512-byte granules): fits; 65,537 does not
    assert residency_problems(figures(lds_bytes=65000), "gfx942") == []
    assert any("LDS 65537" in p for p in residency_problems(figures(lds_bytes=65537), "gfx942"))
    # gfx950 allocates 1,280-byte granules: 163,841 bytes is over 160 KiB
    assert any("1280-byte" in p for p in residency_problems(figures(lds_bytes=163841), "gfx950"))


def test_residency_unified_register_file_counts_agprs():
    # 200 arch VGPRs + 64 AGPRs = 264 in the unified file: 2 waves a SIMD do not fit
    problems = residency_problems(figures(vgpr_count=264, agpr_count=64, vgpr_alloc=264, accum_offset=200), "gfx950")
    assert any("AGPRs 64" in p and "> 256 a wave" in p for p in problems), problems
    # the kernel descriptor's allocation wins over the note's count
    assert residency_problems(figures(vgpr_count=250, vgpr_alloc=264), "gfx942")


def test_residency_refuses_scratch_and_small_workgroups():
    assert any("scratch" in p and "spills" in p for p in residency_problems(figures(scratch_bytes=16, vgpr_spill_count=4), "gfx950"))
    assert any("dynamic stack" in p for p in residency_problems(figures(dynamic_stack=True), "gfx950"))
    assert any("max_flat_workgroup_size 256" in p for p in residency_problems(figures(max_flat_workgroup_size=256), "gfx942"))
    with pytest.raises(UnknownArchError, match="gfx1100"):  # an unknown arch is an error, never gfx950's limits
        residency_problems(figures(), "gfx1100")


# ---------------------------------------------------------------- real code objects


def readelf_notes(code: bytes, tmp_path: Path) -> dict:
    yaml = pytest.importorskip("yaml")
    if not Path(READELF).exists():
        pytest.skip("llvm-readelf (llvm-19) not installed")
    path = tmp_path / "co.elf"
    path.write_bytes(code)
    out = subprocess.run([READELF, "--notes", str(path)], capture_output=True, text=True, check=True).stdout
    doc = out[out.index("---"): out.index("\n...", out.index("---"))]
    return yaml.safe_load(doc)


@pytest.mark.slow
def test_decoder_agrees_with_llvm_readelf_on_every_smoke_object(smoke, tmp_path):
    n = 0
    for man, key, _, code in code_objects(smoke):
        mine = resources.amdgpu_metadata(code)
        theirs = readelf_notes(code, tmp_path)
        assert mine == theirs, key
        n += 1
    assert n == smoke_count()


@pytest.mark.slow
def test_figures_agree_with_export_metadata_and_manifest(smoke):
    kinds = set()
    for man, key, meta, code in code_objects(smoke):
        res = resources.code_object_resources(code)
        k = BuildKey.parse(key)
        kinds.add((k.kind, k.arch))
        assert res["name"] == k.kernel_symbol == man.entries[key]["symbol"]
        assert res["symbol"] == res["name"] + ".kd"
        assert res["target"].endswith(man.arch) and meta["arch"] == man.arch
        # one by-value kernarg per scalar ABI slot (stream last, not a kernarg), same sizes, in order
        slots = [a for a in meta["abi"] if a["arg_name"] != "stream"]
        assert meta["abi"][-1]["ctype"] == "pointer" or meta["abi"][-1]["arg_name"] == "stream"
        assert [a["size"] for a in slots] == [a["size"] for a in res["args"]], key
        assert all(a["value_kind"] == "by_value" for a in res["args"])
        offsets = [a["offset"] for a in res["args"]]
        assert offsets == sorted(offsets) and offsets[0] == 0
        assert res["args"][-1]["offset"] + res["args"][-1]["size"] <= res["kernarg_bytes"]
        assert res["wavefront_size"] == 64 and res["max_flat_workgroup_size"] == 512
        # the kernel descriptor's allocation covers the note's count, in granules of 8
        assert res["vgpr_alloc"] % 8 == 0 and res["vgpr_alloc"] >= res["vgpr_count"]
        assert residency_problems(res, man.arch) == [], key
        # what the builder stored is what the code object says
        assert man.entries[key]["resources"] == manifest_figures(res)
    assert kinds == {(k, a) for k in ("k1", "k2", "ffn") for a in ("gfx950", "gfx942")}


@pytest.mark.slow
def test_inspect_command_json_table_and_plot(smoke, tmp_path):
    png = tmp_path / "figures.png"
    proc = subprocess.run(
        [sys.executable, "-m", "dsv41_aot.cli", "inspect", "--dir", str(smoke), "--json", "--plot", str(png)],
        capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert len(rows) == smoke_count() and all(r["resident"] and r["waves_per_simd"] >= 2 for r in rows)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = subprocess.run([sys.executable, "-m", "dsv41_aot.cli", "inspect", "--dir", str(smoke)],
                           capture_output=True, text=True)
    assert table.returncode == 0
    assert "k2@gfx950:s=4,tp=4,r=1" in table.stdout and f"{smoke_count()} symbols, 0 cannot be resident" in table.stdout


def test_inspect_command_refuses_an_empty_dir(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "dsv41_aot.cli", "inspect", "--dir", str(tmp_path)],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "holds no prebuilt architecture" in proc.stderr
