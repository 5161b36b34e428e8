"""The residency report: code-object reading, residency rules, spills,
and the ``inspect`` command's headroom summary, JSON and picture.

The slow tests read the code objects of a real ``smoke`` build (built once a
test session into pytest's temp folder; a second module's build is a no-op)
and cross-check the metadata reading against ``llvm-readelf --notes``.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _smoke import SMOKE_RELEASE_KEYS, cli

from dsv41_aot.aot import codeobject, inspection
from dsv41_aot.aot.codeobject import manifest_figures
from dsv41_aot.elf import Elf, ElfError, exported_parts
from dsv41_aot.aot.residency import residency_problems, spill_notes, usage
from dsv41_aot.errors import UnknownArchError
from dsv41_aot.facts.arches import arch_facts
from dsv41_aot.facts.releases import NEWEST, RELEASES, release_facts, version_order
from dsv41_aot.keys import BuildKey
from dsv41_aot.listing import built_rooms

ALL = sum(map(len, SMOKE_RELEASE_KEYS.values()))  # smoke keys of every release

READELF = shutil.which("llvm-readelf-19") or shutil.which("llvm-readelf") or "/usr/lib/llvm-19/bin/llvm-readelf"


@pytest.fixture(scope="module")
def smoke(smoke_dir) -> Path:
    return smoke_dir


def code_objects(root: Path):
    for r in built_rooms(root):
        man = r.manifest()
        for key, e in sorted(man.entries.items()):
            meta, code = exported_parts(man.object_path(key).read_bytes(), e.entry)
            yield man, key, json.loads(meta), code


# ---------------------------------------------------------------- residency rule


def figures(**over) -> dict:
    base = dict(vgpr_count=152, agpr_count=0, sgpr_count=98, vgpr_spill_count=0, sgpr_spill_count=0,
                lds_bytes=33984, scratch_bytes=0, dynamic_stack=False, kernarg_bytes=320,
                wavefront_size=64, max_flat_workgroup_size=512, vgpr_alloc=152, accum_offset=152, args=[])
    base.update(over)
    return base


def test_residency_accepts_the_tightest_gfx950_k2_figures():
    # measured here: gfx950 K2 uses up to 158,752 bytes of LDS and 251 VGPRs
    assert residency_problems(figures(lds_bytes=158752, vgpr_count=251, vgpr_alloc=256), "gfx950", NEWEST) == []


def test_residency_refuses_the_broken_gfx942_k2_s17_tp2():
    # measured here: gfx942 K2 tokens=17 tp=2 r=2 needs 77,056 bytes of LDS and 325 VGPRs
    problems = residency_problems(figures(lds_bytes=77056, vgpr_count=325, vgpr_alloc=328), "gfx942", NEWEST)
    assert any("LDS 77056" in p and "65536" in p for p in problems), problems
    assert any("VGPRs 325" in p and "> 256 per wave" in p for p in problems), problems
    assert any("325 arch VGPRs > 256" in p for p in problems), problems
    # the same LDS fits gfx950's 160 KiB: only the registers are refused there
    assert not any("LDS" in p for p in residency_problems(figures(lds_bytes=77056), "gfx950", NEWEST))


def test_residency_counts_lds_in_allocation_granules():
    # 65,000 bytes round up to 65,024 on gfx942 (512-byte granules): fits; 65,537 does not
    assert residency_problems(figures(lds_bytes=65000), "gfx942", NEWEST) == []
    assert any("LDS 65537" in p for p in residency_problems(figures(lds_bytes=65537), "gfx942", NEWEST))
    # gfx950 allocates 1,280-byte granules: 163,841 bytes is over 160 KiB
    assert any("1280-byte" in p for p in residency_problems(figures(lds_bytes=163841), "gfx950", NEWEST))


def test_residency_unified_register_file_counts_agprs():
    # 200 arch VGPRs + 64 AGPRs = 264 in the unified file: 2 waves per SIMD do not fit
    problems = residency_problems(figures(vgpr_count=264, agpr_count=64, vgpr_alloc=264, accum_offset=200), "gfx950", NEWEST)
    assert any("AGPRs 64" in p and "> 256 per wave" in p for p in problems), problems
    # the kernel descriptor's allocation wins over the note's count
    assert residency_problems(figures(vgpr_count=250, vgpr_alloc=264), "gfx942", NEWEST)


def test_a_spill_is_noted_not_refused():
    spilled = figures(scratch_bytes=16, vgpr_spill_count=4, sgpr_spill_count=2)
    assert residency_problems(spilled, "gfx950", NEWEST) == []
    assert spill_notes(spilled) == ["spills: scratch 16 bytes per lane (VGPR spills 4, SGPR spills 2)"]
    assert "dynamic stack" in spill_notes(figures(dynamic_stack=True))[0]
    # SGPR spills alone go to VGPR lanes, scratch 0: no spill
    assert spill_notes(figures(sgpr_spill_count=3)) == []


def test_residency_refuses_small_workgroups_and_unknown_arches():
    assert any("max_flat_workgroup_size 256" in p for p in residency_problems(figures(max_flat_workgroup_size=256), "gfx942", NEWEST))
    with pytest.raises(UnknownArchError, match="gfx1100"):  # an unknown arch is an error, never gfx950's limits
        residency_problems(figures(), "gfx1100", NEWEST)


def test_threads_a_cta_and_the_grid_are_the_keys_releases(monkeypatch):
    old = min(RELEASES, key=version_order)  # the grid is the key's release's, not the newest's
    res = figures()
    assert residency_problems(res, "gfx950", old) == []
    before = usage(res, "gfx950", old)["vgprs"][1]
    monkeypatch.setitem(RELEASES, old, dataclasses.replace(RELEASES[old], cta_threads=1024))
    assert any("max_flat_workgroup_size 512 < 1024 threads per CTA" in p for p in residency_problems(res, "gfx950", old))
    assert usage(res, "gfx950", old)["vgprs"][1] == before // 2  # twice the waves share a SIMD
    assert residency_problems(res, "gfx950", NEWEST) == []  # the other release keeps its own grid
    cus = arch_facts("gfx950").cus
    monkeypatch.setitem(RELEASES, old, dataclasses.replace(RELEASES[old], grid_ctas=cus + 1))
    assert any(f"grid of {cus + 1} CTAs needs a CU each: gfx950 has {cus}" in p
               for p in residency_problems(res, "gfx950", old))
    assert release_facts(NEWEST).grid_ctas <= cus


def test_usage_is_judged_against_the_arch_table():
    u = usage(figures(lds_bytes=158752, vgpr_count=251, vgpr_alloc=256, sgpr_count=98), "gfx950", NEWEST)
    lim = arch_facts("gfx950").limits()
    # 512 threads = 8 waves of 64 = 2 a SIMD: each wave gets half the SIMD's files
    assert u == {"lds": (158752, lim["lds_bytes"]), "vgprs": (256, lim["vgprs_per_simd"] // 2),
                 "agprs": (0, lim["max_agprs"]), "sgprs": (112, lim["sgprs_per_simd"] // 2)}
    assert usage(figures(), "gfx942", NEWEST)["lds"][1] == arch_facts("gfx942").lds_bytes


def row(key: str, lds: int, vgprs: int, scratch: int = 0, release: str = "0.33.0") -> dict:
    k = BuildKey.parse(key, release)
    res = figures(lds_bytes=lds, vgpr_count=vgprs, vgpr_alloc=-(-vgprs // 8) * 8, scratch_bytes=scratch)
    return {"key": key, "kind": k.kind, "arch": k.arch, "release": release, "tokens": k.tokens,
            "series": inspection.series(k),
            "usage": usage(res, k.arch, release), "spills": spill_notes(res),
            "resident": not residency_problems(res, k.arch, release)}


def test_summary_names_the_tightest_key_per_resource_and_the_spills():
    rows = [row("k2@gfx950:s=9,tp=4,r=1", 90000, 256, scratch=8), row("k2@gfx950:s=48,tp=2,r=2", 158752, 240),
            row("k2@gfx950:s=4,tp=4,r=1", 60000, 200), row("k1@gfx950:s=4,tp=4,r=1", 30000, 120),
            # the same key string in vLLM 0.32.0, tighter: its own summary, never 0.33.0's
            row("k2@gfx950:s=4,tp=4,r=1", 160000, 120, release="0.32.0")]
    summ = {(s["arch"], s["release"], s["kind"]): s for s in inspection.summary(rows)}
    k2 = summ[("gfx950", "0.33.0", "k2")]
    assert k2["keys"] == 3 and k2["spills"] == ["k2@gfx950:s=9,tp=4,r=1"] and k2["not_resident"] == []
    assert k2["resources"]["lds"] == {"key": "k2@gfx950:s=48,tp=2,r=2", "use": 158752, "limit": 163840}
    assert k2["resources"]["vgprs"] == {"key": "k2@gfx950:s=9,tp=4,r=1", "use": 256, "limit": 256}
    assert summ[("gfx950", "0.33.0", "k1")]["spills"] == []
    old = summ[("gfx950", "0.32.0", "k2")]
    assert old["keys"] == 1 and old["resources"]["lds"] == {"key": "k2@gfx950:s=4,tp=4,r=1", "use": 160000, "limit": 163840}
    text = "\n".join(inspection.summary_lines(inspection.summary(rows)))
    assert "158,752 of  163,840" in text and "3.1% left" in text and "spills (1): k2@gfx950:s=9,tp=4,r=1" in text
    assert "gfx950 0.32.0 k2 (1 key)" in text and "gfx950 0.33.0 k2 (3 keys)" in text


def test_series_tell_variants_apart():
    names = {inspection.series(BuildKey.parse(k, NEWEST)) for k in (
        "k2@gfx950:s=4,tp=4,r=1", "k2@gfx950:s=4,tp=2,r=1", "k2@gfx950:s=4,tp=4,r=1,i=1",
        "k1@gfx950:s=4,tp=4,r=0,f=0,e=128,k=3,g=1,w=192", "k1@gfx950:s=4,tp=4,r=0", "ffn@gfx942:s=4,tp=4,r=0,e=128,k=3")}
    assert names == {"k2 r1", "k2 r1 index", "k1 r0 e128/k3", "k1 r0", "ffn e128/k3"}


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
        mine = codeobject.amdgpu_metadata(code)
        theirs = readelf_notes(code, tmp_path)
        assert mine == theirs, key
        n += 1
    assert n == ALL


@pytest.mark.slow
def test_figures_agree_with_export_metadata_and_manifest(smoke):
    kinds = set()
    for man, key, meta, code in code_objects(smoke):
        res = codeobject.code_object_resources(code)
        k = BuildKey.parse(key, man.release)
        kinds.add((k.kind, k.arch, k.release))
        assert res["name"] == k.kernel_symbol == man.entries[key].symbol
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
        assert residency_problems(res, man.arch, man.release) == [] and spill_notes(res) == [], key
        # what the builder stored is what the code object says
        assert man.entries[key].resources == manifest_figures(res)
    assert kinds == {(k, a, "0.33.0") for k in ("k1", "k2", "ffn") for a in ("gfx950", "gfx942")} | {
        (k, "gfx950", "0.32.0") for k in ("k1", "k2", "ffn")}


@pytest.mark.slow
def test_a_broken_metadata_note_is_an_elf_error(smoke):
    _, key, _, code = next(code_objects(smoke))
    desc = next(d for owner, t, d in Elf(code).notes() if owner == "AMDGPU" and t == codeobject.NT_AMDGPU_METADATA)
    at = code.index(desc)
    broken = code[:at] + b"\xc1" + code[at + 1:]  # 0xc1: the one tag MessagePack never uses
    with pytest.raises(ElfError, match="not one MessagePack value"):
        codeobject.amdgpu_metadata(broken)


@pytest.mark.slow
def test_inspect_command_json_summary_and_plot(smoke, tmp_path):
    png = tmp_path / "residency.png"
    proc = subprocess.run(
        [sys.executable, "-m", "dsv41_aot.cli", "inspect", "--dir", str(smoke), "--json", "--plot", str(png)],
        capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    rows = doc["rows"]
    assert len(rows) == ALL and all(r["resident"] and r["waves_per_simd"] >= 2 and not r["spills"] for r in rows)
    # the limits judged against are the arch table's, so a script can redo the judgement
    assert doc["limits"] == {a: arch_facts(a).limits() for a in ("gfx942", "gfx950")} and doc["threads"] == 512
    for r in rows:
        lim = doc["limits"][r["arch"]]
        assert r["usage"]["lds"] == [r["resources"]["lds_bytes"], lim["lds_bytes"]]
        assert r["usage"]["vgprs"][1] == lim["vgprs_per_simd"] // 2
    rooms_ = {("gfx942", "0.33.0"), ("gfx950", "0.33.0"), ("gfx950", "0.32.0")}
    assert {(r["arch"], r["release"]) for r in rows} == rooms_
    assert {(s["arch"], s["release"], s["kind"]) for s in doc["summary"]} == {
        (a, rel, k) for a, rel in rooms_ for k in ("k1", "k2", "ffn")}
    k2 = next(s for s in doc["summary"] if (s["arch"], s["release"], s["kind"]) == ("gfx950", "0.33.0", "k2"))
    widest = max((r for r in rows if (r["kind"], r["arch"], r["release"]) == ("k2", "gfx950", "0.33.0")),
                 key=lambda r: r["usage"]["lds"][0])
    assert k2["resources"]["lds"]["key"] == widest["key"] == "k2@gfx950:s=44,tp=4,r=1,i=1"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    table = cli("inspect", "--dir", smoke)
    assert table.returncode == 0
    assert "0.32.0  k2@gfx950:s=4,tp=4,r=1" in table.stdout and "0.33.0  k2@gfx950:s=4,tp=4,r=1" in table.stdout
    assert f"{ALL} symbols, 0 cannot be resident" in table.stdout
    # the text ends with the headroom summary: per (arch, release, kind) four resources and the spills
    tail = table.stdout.split("headroom of one 512-thread CTA per CU")[1].strip().splitlines()
    assert len(tail) == 1 + 9 * 5 and tail[-1].strip() == "spills (0): none"
    assert any(line.strip().startswith("gfx950 0.33.0 k2") and " LDS " in line and widest["key"] in line for line in tail)
    # --release keeps one release's rooms
    only = json.loads(cli("inspect", "--dir", smoke, "--release", "0.32.0", "--json").stdout)
    assert {(r["arch"], r["release"]) for r in only["rows"]} == {("gfx950", "0.32.0")} and len(only["rows"]) == 3


def test_inspect_command_refuses_an_empty_dir(tmp_path):
    proc = cli("inspect", "--dir", tmp_path)
    assert proc.returncode == 2 and "holds no prebuilt architecture" in proc.stderr
    proc = cli("inspect", "--dir", tmp_path, "--release", "0.32.0")
    assert proc.returncode == 2 and "holds no vLLM 0.32.0 kernels" in proc.stderr
