"""``verify --against-jit`` compares the launch as well as the code object:
vLLM's JIT (in its JIT worker) and the prebuilt Launcher (in a fresh runtime
process) each launch the key once with the same values through the recording
HIP, the stand-in for the AMD GPU (MOCK-GPU, dsv41_aot/aot/hiprec/), and the
image sha256, kernel name, grid, block, shared memory, stream and argument
bytes must agree. Each slip below is made in the prebuilt path only, and
verify fails the key naming the field. One cheap key; its JIT build comes
from the session's build cache after the first run (the prebuilt side
launches every time).
"""

from __future__ import annotations

import json
import shutil
import sys
import textwrap
from pathlib import Path

import pytest

from dsv41_aot.aot import hiprec, verify
from dsv41_aot.aot.cache import cache_dir
from dsv41_aot.aot.hiprec import prebuilt
from dsv41_aot.errors import ManifestError
from dsv41_aot.keys import BuildKey
from dsv41_aot.proof import Proof
from dsv41_aot.room import Room

KEY = BuildKey.parse("ffn@gfx950:s=4,tp=4,r=0", "0.33.0")


@pytest.fixture
def copy(smoke_dir, tmp_path) -> Path:
    return Path(shutil.copytree(smoke_dir, tmp_path / "prebuilt"))


def run(root: Path, record: bool = False) -> dict:
    return verify.verify(root, against_jit=True, keys=[KEY], record=record, jobs=1, cache=cache_dir(None))


def problems(report: dict) -> list[str]:
    (rep,) = report["reports"]
    assert "launch" in rep["checks"], rep
    return rep["problems"]


# the prebuilt launch process with its packing slipped: the first two arguments of one C type swapped
_SWAP = """
import runpy
from dsv41_aot.runtime import abi

init = abi.Abi.__init__

class Swapped:
    def __init__(self, inner, i, j):
        self.inner, self.size, self.i, self.j = inner, inner.size, i, j

    def pack_into(self, buf, offset, *args):
        args = list(args)
        args[self.i], args[self.j] = args[self.j], args[self.i]
        self.inner.pack_into(buf, offset, *args)

def slipped(self, slots, aid="?"):
    init(self, slots, aid)
    types = [s["ctype"] for s in slots[:-1]]
    i = next(i for i, t in enumerate(types) if types.count(t) > 1)
    self.struct = Swapped(self.struct, i, types.index(types[i], i + 1))

abi.Abi.__init__ = slipped
runpy.run_module("dsv41_aot.aot.hiprec.prebuilt", run_name="__main__")
"""


@pytest.mark.slow
def test_the_same_launch_passes_and_record_keeps_its_digest(copy):
    report = run(copy, record=True)
    assert report["failed"] == 0 and problems(report) == [], report["failures"]
    proof = Room(copy, KEY.arch, KEY.release).proof().keys[str(KEY)]
    assert proof.evidence.launch_sha256 and len(proof.evidence.launch_sha256) == 64


@pytest.mark.slow
def test_swapped_arguments_in_the_prebuilt_packing_fail_naming_the_argument(copy, monkeypatch):
    monkeypatch.setattr(prebuilt, "launch_argv", lambda: [sys.executable, "-c", textwrap.dedent(_SWAP)])
    report = run(copy, record=True)
    (bad,) = [p for p in problems(report) if p.startswith("launch ")]
    assert bad.startswith("launch argument bytes differ: argument "), bad
    assert report["failed"] == 1 and str(KEY) in json.dumps(report["failures"])
    assert str(KEY) not in Room(copy, KEY.arch, KEY.release).proof().keys  # no proof of a failed key


@pytest.mark.slow
@pytest.mark.parametrize("field, slip", [
    ("image_sha256", lambda v: "0" * 64),  # another image loaded
    ("kernel", lambda v: v + "_other"),
    ("grid", lambda v: "128,1,1"),
    ("block", lambda v: "256,1,1"),
    ("shared", lambda v: v + 1024),
    ("stream", lambda v: "0x0"),  # the null stream, not the one given
])
def test_a_different_launch_field_fails_naming_it(copy, monkeypatch, field, slip):
    real = verify.prebuilt_launches

    def slipped(*args, **kwargs):
        out = real(*args, **kwargs)
        for launch in out.values():
            launch[field] = slip(launch[field])
        return out

    monkeypatch.setattr(verify, "prebuilt_launches", slipped)
    report = run(copy)
    assert [p.split(":")[0] for p in problems(report)] == [f"launch {field} differs"], problems(report)
    assert report["failed"] == 1


def test_compare_launch_names_the_field_and_the_argument():
    kernel = {".args": [{".offset": 0, ".size": 8}, {".offset": 8, ".size": 4}], ".kernarg_segment_size": 16}
    a = {"image_sha256": "a" * 64, "kernel": "k", "grid": "256,1,1", "block": "512,1,1", "shared": 0,
         "stream": "0x7e57", "kernarg": hiprec.kernarg(kernel, [1, 2])}
    assert hiprec.compare_launch(a, dict(a), kernel) == []
    b = dict(a, kernarg=hiprec.kernarg(kernel, [1, 3]), grid="1,1,1")
    assert hiprec.compare_launch(a, b, kernel) == [
        "launch grid differs: prebuilt 256,1,1, JIT 1,1,1",
        "launch argument bytes differ: argument 1 (offset 8, 4 bytes): prebuilt 02000000, JIT 03000000"]
    assert hiprec.launch_digest(a) != hiprec.launch_digest(b) and hiprec.launch_digest(a) == hiprec.launch_digest(dict(a))


def test_a_launch_missing_on_either_side_fails_naming_that_side():
    """A JIT answer with no launch (a worker that ran without the recording HIP) and a prebuilt launch that failed
    each fail the key, naming which side has none: never compared as equal."""
    a = {"image_sha256": "a" * 64, "kernel": "k", "grid": "1,1,1", "block": "1,1,1", "shared": 0, "stream": "0x1",
         "kernarg": ""}
    assert verify._compare_launches(a, None, b"") == [
        "the JIT answer carries no launch through the recording HIP (stand-in for the AMD GPU)"]
    assert verify._compare_launches("hipModuleLaunchKernel returned 98", a, b"") == [
        "prebuilt launch through the recording HIP failed: hipModuleLaunchKernel returned 98"]


def _proof(evidence: dict) -> bytes:
    jit = {"release": "0.33.0", "vllm_version": "0.33.0", "mono_sources": "6d37d13d1b3c9e47",
           "flydsl_version": "0.4.2"}
    return json.dumps({"version": 2, "arch": "gfx950", "release": "0.33.0", "keys": {
        str(KEY): {"code_object_sha256": "c" * 64, "jit": jit, "evidence": evidence}}}).encode()


def test_proofs_with_and_without_a_launch_digest_are_read():
    ev = {"artifact_sha256": "a" * 64, "cache_key_sha256": "b" * 64, "at": "2026-12-01T22:00:00Z"}
    old = Proof.parse(_proof(ev), "verified.json", "gfx950", "0.33.0", "fix")
    assert old.keys[str(KEY)].evidence.launch_sha256 is None
    assert "launch_sha256" not in old.keys[str(KEY)].evidence.as_dict()  # written back as it was
    new = Proof.parse(_proof(dict(ev, launch_sha256="d" * 64)), "verified.json", "gfx950", "0.33.0", "fix")
    assert new.keys[str(KEY)].evidence.launch_sha256 == "d" * 64
    assert json.loads(new.to_bytes())["keys"][str(KEY)]["evidence"]["launch_sha256"] == "d" * 64
    with pytest.raises(ManifestError, match="launch_sha256"):
        Proof.parse(_proof(dict(ev, launch_sha256="not a digest")), "verified.json", "gfx950", "0.33.0", "fix")
