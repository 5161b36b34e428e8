"""dsv41_aot.vllm: vLLM's own mono runner, patched, hands out the prebuilt
Launchers; the plugin decides and says why; the entry point is installed.

The runner tests run vLLM 0.33.0's real ``runner.py`` (imported in isolation,
one arch per subprocess: tests/_vllm_probe.py) on a runner object made
without a GPU, against the real linked smoke libraries. No GPU is mocked.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from _smoke import OLD, REPO, SMOKE_KEYS, cli, copy_of, libdir, room, smoke_count
from dsv41_aot import elf
from dsv41_aot import vllm as plugin
from dsv41_aot.runtime import runner_patch, state
from dsv41_aot.errors import AotError
from dsv41_aot.keys import BuildKey
from dsv41_aot.facts.releases import NEWEST
from dsv41_aot.room import Room

PROBE = REPO / "tests" / "_vllm_probe.py"


@pytest.fixture(scope="module")
def smoke(smoke_dir):
    return smoke_dir


def probe(arch: str, prebuilt: Path, mode: str, order: str, calls: list, **options) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLYDSL_", "DSV41_AOT_"))}
    # this machine's Debian HIP 5.2 stand-in, accepted as conftest does (the loader refuses it otherwise)
    env.update(ARCH=arch, FLYDSL_GPU_ARCH=arch, PYTHONPATH=str(REPO), DSV41_AOT_ALLOW_HIP_VERSION="5.2")
    argv = [sys.executable, str(PROBE), str(prebuilt), mode, order, json.dumps(calls), json.dumps(options)]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def code_object_symbols(prebuilt: Path, key: str, release: str = NEWEST) -> set:
    """The symbols of the GPU code object inside a key's stored export object."""
    bk = BuildKey.parse(key, release)
    man = Room(prebuilt, bk.arch, release).manifest()
    _, code = elf.exported_parts(man.object_path(key).read_bytes(), bk.entry)
    return {s.name for s in elf.Elf(code).symbols()}


# ---------------------------------------------------------------- the patched runner


@pytest.mark.slow
def test_gfx950_runner_gets_the_prebuilt_launchers_vllm_would_compile(smoke):
    calls = [["kernels", 4, 1, True, False], ["ffn", 4, 384, 6], ["kernels", 5, 1, True, False]]
    out = probe("gfx950", smoke, "strict", "hook", calls)
    # installed before vLLM's runner was imported: the meta_path hook patched it on import
    assert out["before_import"]["hooked"] and not out["before_import"]["patched"]
    assert out["patched"] and not out["gfx942"]
    layer, ffn, missing = out["results"]
    vllm_layer, vllm_ffn, _ = out["vllm"]
    want = {"k1": "k1@gfx950:s=4,tp=4,r=1", "k2": "k2@gfx950:s=4,tp=4,r=1"}
    for kind, key in want.items():
        got = layer[kind]
        assert got["origin"] == "aot" and got["key"] == key
        # the kernel vLLM's own build_mono_* names, the key's symbol, the code object's
        assert got["kernel_name"] == vllm_layer[kind] == BuildKey.parse(key, NEWEST).kernel_symbol
        assert got["kernel_name"] in code_object_symbols(smoke, key)
    assert ffn["ffn"]["origin"] == "aot" and ffn["ffn"]["key"] == "ffn@gfx950:s=4,tp=4,r=0"
    assert ffn["ffn"]["kernel_name"] == vllm_ffn["ffn"] == BuildKey.parse("ffn@gfx950:s=4,tp=4,r=0", NEWEST).kernel_symbol
    assert ffn["ffn"]["kernel_name"] in code_object_symbols(smoke, "ffn@gfx950:s=4,tp=4,r=0")
    # vLLM's memo: same object on the second call, under vLLM's own memo keys
    assert layer["memo"] and ffn["memo"]
    assert out["memo_keys"] == ["(4, 'ffn', 384, 6)", "(4, 1, True, False)"]
    # strict: a key that is not prebuilt raises, naming it and the build command
    assert missing["error"] == "KeyNotPrebuiltError"
    assert "k1@gfx950:s=5,tp=4,r=1" in missing["message"] and "dsv41-aot build --release 0.33.0 --out " in missing["message"]
    assert out["installed"]["served_jit"] == 0
    assert out["uninstalled"]


def old_tree() -> str:
    """vLLM 0.32.0's kernel source: the tree cache ci/bootstrap.sh fills
    (``dsv41-aot fetch-vllm 0.32.0``: the release's own wheel, unpacked in part)."""
    from dsv41_aot import source
    from dsv41_aot.aot import matrix

    return str(source.find_release(OLD, matrix.load().releases[OLD]).root)


def bands_of(prebuilt: Path, arch: str, release: str) -> set:
    return {lib["file"] for lib in json.loads((room(prebuilt, arch, release) / "libs.json").read_text())["libraries"]}


@pytest.mark.slow
def test_vllm_0_32_runner_is_served_its_own_release_and_never_0_33s(smoke):
    """vLLM 0.32.0's own runner module (kernels(tokens, ratio), ffn_kernel(tokens),
    MonoBuild(tokens, tp, ratio, timeline)), patched: its release is told by its
    mono sources digest, and each launcher comes from the 0.32.0 room."""
    calls = [["kernels", 4, 1], ["ffn", 4], ["kernels", 4, 2]]
    out = probe("gfx950", smoke, "strict", "hook", calls, vllm_src=old_tree(), install_arch="gfx950")
    assert out["patched"] and not out["gfx942"]
    layer, ffn, missing = out["results"]
    vllm_layer, vllm_ffn, _ = out["vllm"]
    old, new = bands_of(smoke, "gfx950", OLD), bands_of(smoke, "gfx950", NEWEST)
    for kind, got, jit in (("k1", layer["k1"], vllm_layer["k1"]), ("k2", layer["k2"], vllm_layer["k2"]),
                           ("ffn", ffn["ffn"], vllm_ffn["ffn"])):
        key = f"{kind}@gfx950:s=4,tp=4,r={0 if kind == 'ffn' else 1}"
        assert got["origin"] == "aot" and got["key"] == key
        # 0.32.0 names its kernels without fold / index / experts: the name its JIT gives, in 0.32.0's code object
        assert got["kernel_name"] == jit == BuildKey.parse(key, OLD).kernel_symbol
        assert got["kernel_name"] != BuildKey.parse(key, NEWEST).kernel_symbol
        assert got["kernel_name"] in code_object_symbols(smoke, key, OLD)
        # a band of the 0.32.0 room that the 0.33.0 room does not name: 0.33.0's objects differ
        band = Path(got["library"]).name
        assert band in old and band not in new
    assert layer["memo"] and ffn["memo"] and out["memo_keys"] == ["(4, 'ffn')", "(4, 1)"]
    # strict: a 0.32.0 key not prebuilt is named with its release and the command that builds it
    assert missing["error"] == "KeyNotPrebuiltError"
    assert f"k1@gfx950:s=4,tp=4,r=2 is not prebuilt for vLLM {OLD}" in missing["message"]
    assert f"--release {OLD}" in missing["message"]


@pytest.mark.slow
@pytest.mark.faults
def test_a_release_the_install_does_not_hold_is_jit_with_one_line_or_an_error(smoke, tmp_path):
    d = copy_of(smoke, tmp_path / "pb")
    shutil.rmtree(room(d, "gfx950", OLD))
    calls = [["kernels", 4, 1], ["ffn", 4]]
    out = probe("gfx950", d, "fallback", "hook", calls, vllm_src=old_tree(), install_arch="gfx950")
    layer, ffn = out["results"]
    # the 0.33.0 room holds the same key strings: none of them serves the 0.32.0 runner
    assert layer["k1"]["origin"] == layer["k2"]["origin"] == ffn["ffn"]["origin"] == "jit"
    assert layer["k1"]["kernel_name"] == out["vllm"][0]["k1"] == BuildKey.parse("k1@gfx950:s=4,tp=4,r=1", OLD).kernel_symbol
    (line,) = out["warnings"]
    assert "ReleaseMismatchError" in line and "matches no prebuilt release" in line and f"vLLM {NEWEST}" in line
    out = probe("gfx950", d, "strict", "hook", calls[:1], vllm_src=old_tree(), install_arch="gfx950")
    assert out["results"][0]["error"] == "ReleaseMismatchError"


@pytest.mark.slow
def test_gfx942_k2_is_the_one_built_without_index_and_fallback_jits_the_rest(smoke):
    calls = [["kernels", 4, 1, True, True], ["ffn", 4, 128, 3], ["ffn", 4, 384, 6]]
    out = probe("gfx942", smoke, "fallback", "now", calls)
    assert out["before_install"] == {"patched": False} and out["patched"] and out["gfx942"]
    layer, draft_ffn, ffn = out["results"]
    vllm_layer = out["vllm"][0]
    # an index source on gfx942: K2 is served by the index=False key ...
    assert layer["k2"]["origin"] == "aot" and layer["k2"]["key"] == "k2@gfx942:s=4,tp=4,r=1"
    assert layer["k2"]["kernel_name"] == vllm_layer["k2"] == "_ZN5aiter30dsv41_mono_k2_s4_tp4_r1_tl0_i0E"
    assert layer["k2"]["kernel_name"] in code_object_symbols(smoke, "k2@gfx942:s=4,tp=4,r=1")
    # ... while its K1 keeps index=True: not in the smoke set, so vLLM's JIT builds it
    assert layer["k1"]["origin"] == "jit" and layer["k1"]["kernel_name"] == vllm_layer["k1"]
    assert vllm_layer["k1"] == BuildKey.parse("k1@gfx942:s=4,tp=4,r=1,i=1", NEWEST).kernel_symbol
    assert draft_ffn["ffn"]["origin"] == "jit" and draft_ffn["ffn"]["kernel_name"].endswith("_e128E")
    assert ffn["ffn"]["origin"] == "aot" and ffn["ffn"]["key"] == "ffn@gfx942:s=4,tp=4,r=0"
    # one warning a missing key, though a second runner asked again
    warned = sorted(w.split(" not served")[0].removeprefix("dsv41-aot: ") for w in out["warnings"])
    assert warned == ["ffn@gfx942:s=4,tp=4,r=0,e=128,k=3 (vLLM 0.33.0)", "k1@gfx942:s=4,tp=4,r=1,i=1 (vLLM 0.33.0)"]


@pytest.mark.slow
def test_gfx942_strict_refuses_the_missing_k1(smoke):
    out = probe("gfx942", smoke, "strict", "hook", [["kernels", 4, 1, True, True]])
    (res,) = out["results"]
    assert res["error"] == "KeyNotPrebuiltError" and "k1@gfx942:s=4,tp=4,r=1,i=1" in res["message"]
    assert "dsv41-aot build --release 0.33.0 --out " in res["message"] and " --key k1@gfx942:s=4,tp=4,r=1,i=1 && " in \
        res["message"]


def check_served(got: dict, key: str, vllm_name: str, prebuilt: Path) -> None:
    """A Launcher handed out for ``key``, bound, naming the kernel vLLM's own
    JIT launcher names for the same call, which is in the key's code object."""
    assert got["origin"] == "aot" and got["key"] == key and got["bound"], got
    assert got["kernel_name"] == vllm_name == BuildKey.parse(key, NEWEST).kernel_symbol
    assert got["kernel_name"] in code_object_symbols(prebuilt, key)


def check_jit(got: dict, vllm_name: str, key: str) -> None:
    """vLLM's own launcher handed out, for the kernel ``key`` names."""
    assert got["origin"] == "jit" and got["kernel_name"] == vllm_name == BuildKey.parse(key, NEWEST).kernel_symbol, got


# ---------------------------------------------------------------- every field of the MonoBuild is the key's


# the smoke keys the plain call kernels(4, 1) / ffn_kernel(4, 384, 6) is served by on gfx950
PLAIN = {"k1": "k1@gfx950:s=4,tp=4,r=1", "k2": "k2@gfx950:s=4,tp=4,r=1", "ffn": "ffn@gfx950:s=4,tp=4,r=0"}
# one MonoBuild field changed at a time from the plain call: the call, and the
# key of each launch vLLM's runner then builds (written out by hand). Each
# key but the fold call's K2 (K2 has no fold: the plain K2 is vLLM's) is one
# the smoke build does not hold, so a derivation that dropped the field
# would name a PLAIN key and hand out its Launcher.
FIELD_CALLS = {
    "fold": (["kernels", 4, 1, False, False], {"k1": "k1@gfx950:s=4,tp=4,r=1,f=0", "k2": PLAIN["k2"]}),
    "index": (["kernels", 4, 1, True, True], {"k1": "k1@gfx950:s=4,tp=4,r=1,i=1", "k2": "k2@gfx950:s=4,tp=4,r=1,i=1"}),
    "ratio": (["kernels", 4, 2, True, False], {"k1": "k1@gfx950:s=4,tp=4,r=2", "k2": "k2@gfx950:s=4,tp=4,r=2"}),
    "tokens": (["kernels", 5, 1, True, False], {"k1": "k1@gfx950:s=5,tp=4,r=1", "k2": "k2@gfx950:s=5,tp=4,r=1"}),
    "tp": (["kernels", 4, 1, True, False, {"tp": 2}], {"k1": "k1@gfx950:s=4,tp=2,r=1", "k2": "k2@gfx950:s=4,tp=2,r=1"}),
    "timeline": (["kernels", 4, 1, True, False, {"timeline": True}],
                 {"k1": "k1@gfx950:s=4,tp=4,r=1,tl=1", "k2": "k2@gfx950:s=4,tp=4,r=1,tl=1"}),
    "experts": (["kernels", 4, 1, True, False, {"experts": 128}],
                {"k1": "k1@gfx950:s=4,tp=4,r=1,e=128", "k2": "k2@gfx950:s=4,tp=4,r=1,e=128"}),
    "topk": (["kernels", 4, 1, True, False, {"topk": 3}],
             {"k1": "k1@gfx950:s=4,tp=4,r=1,k=3", "k2": "k2@gfx950:s=4,tp=4,r=1,k=3"}),
    "ug_groups": (["kernels", 4, 1, True, False, {"ug_groups": 1}],
                  {"k1": "k1@gfx950:s=4,tp=4,r=1,g=1", "k2": "k2@gfx950:s=4,tp=4,r=1,g=1"}),
    "swa_width": (["kernels", 4, 1, True, False, {"swa_width": 192}],
                  {"k1": "k1@gfx950:s=4,tp=4,r=1,w=192", "k2": "k2@gfx950:s=4,tp=4,r=1,w=192"}),
    "ffn tokens": (["ffn", 5, 384, 6], {"ffn": "ffn@gfx950:s=5,tp=4,r=0"}),
    "ffn tp": (["ffn", 4, 384, 6, {"tp": 2}], {"ffn": "ffn@gfx950:s=4,tp=2,r=0"}),
    "ffn timeline": (["ffn", 4, 384, 6, {"timeline": True}], {"ffn": "ffn@gfx950:s=4,tp=4,r=0,tl=1"}),
    "ffn experts": (["ffn", 4, 128, 6], {"ffn": "ffn@gfx950:s=4,tp=4,r=0,e=128"}),
    # ffn's kernel name omits top-k (vLLM's too): only the key tells this one from the plain FFN
    "ffn topk": (["ffn", 4, 384, 3], {"ffn": "ffn@gfx950:s=4,tp=4,r=0,k=3"}),
}


@pytest.mark.slow
def test_each_monobuild_field_changes_the_key_the_runner_gets(smoke):
    """Each field of the MonoBuild vLLM passes (fold, index, ratio, tokens,
    tp, timeline, experts, topk, ug_groups, swa_width), changed alone from a
    smoke key's, makes the plugin name the key vLLM builds: not prebuilt, so
    fallback hands out vLLM's own JIT launcher (warned once, by that key), never
    the smoke key's Launcher, which the plain calls do get."""
    assert all(key in SMOKE_KEYS for key in PLAIN.values())
    for _, want in FIELD_CALLS.values():  # the table itself: one canonical key each, none prebuilt but PLAIN's
        assert all(str(BuildKey.parse(k, NEWEST)) == k and (k in PLAIN.values() or k not in SMOKE_KEYS) for k in want.values())
    calls = [["kernels", 4, 1, True, False], ["ffn", 4, 384, 6]] + [call for call, _ in FIELD_CALLS.values()]
    out = probe("gfx950", smoke, "fallback", "hook", calls)
    assert out["patched"]
    (layer, ffn, *changed), (vllm_layer, vllm_ffn, *vllm_changed) = out["results"], out["vllm"]
    check_served(layer["k1"], PLAIN["k1"], vllm_layer["k1"], smoke)
    check_served(layer["k2"], PLAIN["k2"], vllm_layer["k2"], smoke)
    check_served(ffn["ffn"], PLAIN["ffn"], vllm_ffn["ffn"], smoke)
    jit_keys = []
    for (field, (call, want)), got, jit in zip(FIELD_CALLS.items(), changed, vllm_changed):
        assert got["call"] == call, field
        for launch, key in want.items():
            if key in PLAIN.values():
                check_served(got[launch], key, jit[launch], smoke)
            else:
                check_jit(got[launch], jit[launch], key)
                jit_keys.append(key)
    warned = sorted(w.split(" not served")[0].removeprefix("dsv41-aot: ") for w in out["warnings"])
    assert warned == sorted(f"{key} (vLLM {NEWEST})" for key in jit_keys)
    assert all("KeyNotPrebuiltError" in w for w in out["warnings"])


@pytest.mark.slow
def test_strict_refuses_the_unbuilt_fold_off_k1_instead_of_serving_the_fold_on_one(smoke):
    """kernels(4, 1, fold=False): vLLM's JIT builds the ``_f0_`` K1, which the
    smoke build lacks (it holds the f=1 K1 only): strict mode refuses the call,
    naming the f=0 key and the command that builds it."""
    f0 = "k1@gfx950:s=4,tp=4,r=1,f=0"
    assert f0 not in SMOKE_KEYS and PLAIN["k1"] in SMOKE_KEYS
    out = probe("gfx950", smoke, "strict", "hook", [["kernels", 4, 1, False, False], ["kernels", 4, 1, True, False]])
    refused, plain = out["results"]
    vllm_refused, vllm_plain = out["vllm"]
    assert refused.get("error") == "KeyNotPrebuiltError", refused
    assert f"{f0} is not prebuilt for vLLM {NEWEST}" in refused["message"]
    assert f"dsv41-aot build --release {NEWEST} --out " in refused["message"] and f" --key {f0} && " in refused["message"]
    assert vllm_refused["k1"] == BuildKey.parse(f0, NEWEST).kernel_symbol and "_f0_" in vllm_refused["k1"]
    # the f=1 K1 the refused call must not get, served to the call that builds it
    check_served(plain["k1"], PLAIN["k1"], vllm_plain["k1"], smoke)
    assert out["installed"]["served_jit"] == 0


# ---------------------------------------------------------------- tp 2, DSpark routing, timeline


# vLLM's DSpark draft runner: the draft's experts / topk / swa width, DRAFT_UG_GROUPS = 1
DSPARK = {"experts": 128, "topk": 3, "ug_groups": 1, "swa_width": 192}
VARIANT_KEYS = {  # written out by hand: what vLLM's runner builds for each call below
    "tp2 k1": "k1@gfx950:s=1,tp=2,r=0",
    "timeline k1": "k1@gfx950:s=4,tp=4,r=1,tl=1",
    "dspark k1": "k1@gfx950:s=4,tp=4,r=1,e=128,k=3,g=1,w=192",
    "dspark ffn": "ffn@gfx950:s=4,tp=4,r=0,e=128,k=3",
}


@pytest.fixture(scope="module")
def variants(tmp_path_factory):
    """The keys above, built and linked for the test alone (about 20 s of
    compiles, one worker: a second one's start costs more CPU than it saves
    here); the smoke build holds none of them. No K2: each compiles for 15 s
    or more, and the K2s the runners ask for are checked by the key their
    JIT fallback names."""
    out = tmp_path_factory.mktemp("variants")
    keys = sorted(VARIANT_KEYS.values())
    assert [str(BuildKey.parse(k, NEWEST)) for k in keys] == keys  # each is its key's one string form
    r = cli("build", "--key", *keys, "--any-key", "--out", out, "--no-progress", "--jobs", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    return out


@pytest.mark.slow
def test_tp2_dspark_and_timeline_runners_get_the_keys_vllm_builds(variants):
    """Each runner field the key derivation reads, changed from the default
    one at a time: a derivation that ignored tp, the draft routing or the
    timeline would hand out another key's Launcher (its kernel name differs
    from vLLM's) or none at all (served by JIT)."""
    calls = [["kernels", 1, 0, True, False, {"tp": 2}],
             ["kernels", 4, 1, True, False, {"timeline": True}],
             ["kernels", 4, 1, True, False, DSPARK],
             ["ffn", 4, 128, 3, DSPARK]]
    out = probe("gfx950", variants, "fallback", "hook", calls)
    assert out["patched"]
    tp2, timeline, dspark, dspark_ffn = out["results"]
    vllm_tp2, vllm_timeline, vllm_dspark, vllm_dspark_ffn = out["vllm"]
    check_served(tp2["k1"], VARIANT_KEYS["tp2 k1"], vllm_tp2["k1"], variants)
    check_served(timeline["k1"], VARIANT_KEYS["timeline k1"], vllm_timeline["k1"], variants)
    check_served(dspark["k1"], VARIANT_KEYS["dspark k1"], vllm_dspark["k1"], variants)
    check_served(dspark_ffn["ffn"], VARIANT_KEYS["dspark ffn"], vllm_dspark_ffn["ffn"], variants)
    # the K2s not built: vLLM's JIT launchers, for the keys the derivation named
    check_jit(tp2["k2"], vllm_tp2["k2"], "k2@gfx950:s=1,tp=2,r=0")
    check_jit(timeline["k2"], vllm_timeline["k2"], "k2@gfx950:s=4,tp=4,r=1,tl=1")
    check_jit(dspark["k2"], vllm_dspark["k2"], "k2@gfx950:s=4,tp=4,r=1,e=128,k=3,g=1,w=192")
    warned = sorted(w.split(" not served")[0].removeprefix("dsv41-aot: ") for w in out["warnings"])
    assert warned == ["k2@gfx950:s=1,tp=2,r=0 (vLLM 0.33.0)", "k2@gfx950:s=4,tp=4,r=1,e=128,k=3,g=1,w=192 (vLLM 0.33.0)",
                      "k2@gfx950:s=4,tp=4,r=1,tl=1 (vLLM 0.33.0)"]


@pytest.mark.slow
def test_the_variant_k1_objects_are_what_vllms_jit_compiles(variants):
    """The code objects behind the K1 Launchers above are byte for byte (kernel
    name included) what vLLM's runner, given the same fields, makes FlyDSL
    compile: verify's compile-only JIT worker, K1s only (about 2 s each)."""
    k1s = [VARIANT_KEYS[n] for n in ("tp2 k1", "timeline k1", "dspark k1")]
    r = cli("verify", "--dir", variants, "--against-jit", "--key", *k1s, "--json", "--jobs", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(r.stdout)
    assert report["jit_checked"] == 3 and report["failed"] == 0
    assert sorted(x["key"] for x in report["reports"] if "jit" in x["checks"]) == sorted(k1s)


# ---------------------------------------------------------------- fallback really falls back


def library_of(prebuilt: Path, key: str) -> Path:
    arch = BuildKey.parse(key, NEWEST).arch
    libs = json.loads((room(prebuilt, arch) / "libs.json").read_text())["libraries"]
    (lib,) = [lib for lib in libs if key in lib["entries"]]
    return libdir(prebuilt, arch) / lib["file"]


@pytest.fixture
def corrupt(smoke, tmp_path):
    """A copy of the smoke build whose library holding K1 s=4 has one byte
    flipped in its middle; the gfx950 K2 s=44 library is intact."""
    d = copy_of(smoke, tmp_path / "pb")
    bad = library_of(d, "k1@gfx950:s=4,tp=4,r=1")
    good = library_of(d, "k2@gfx950:s=44,tp=4,r=1,i=1")
    assert bad != good
    data = bytearray(bad.read_bytes())
    data[len(data) // 2] ^= 0xFF
    bad.write_bytes(bytes(data))
    return d, bad, good


@pytest.mark.slow
@pytest.mark.faults
def test_fallback_jits_the_keys_of_a_corrupt_library_and_serves_the_rest(corrupt):
    d, bad, good = corrupt
    calls = [["kernels", 4, 1, True, False], ["ffn", 4, 384, 6], ["kernels", 44, 1, True, True]]
    out = probe("gfx950", d, "fallback", "hook", calls)
    layer, ffn, wide = out["results"]
    vllm_layer, vllm_ffn, vllm_wide = out["vllm"]
    # the corrupt library's keys: vLLM's own launchers, not Launchers that fail at the first call
    check_jit(layer["k1"], vllm_layer["k1"], "k1@gfx950:s=4,tp=4,r=1")
    check_jit(layer["k2"], vllm_layer["k2"], "k2@gfx950:s=4,tp=4,r=1")
    check_jit(ffn["ffn"], vllm_ffn["ffn"], "ffn@gfx950:s=4,tp=4,r=0")
    # the intact library's key: a prebuilt Launcher, already bound; its K1 is not prebuilt at all
    check_served(wide["k2"], "k2@gfx950:s=44,tp=4,r=1,i=1", vllm_wide["k2"], d)
    check_jit(wide["k1"], vllm_wide["k1"], "k1@gfx950:s=44,tp=4,r=1,i=1")
    # the corrupt band was never mapped into the process; the intact one was, at hand-out (from memory)
    assert out["mapped"] == [f"memfd:{good.name[:-len('.xz')]}"]
    # one warning line a key, naming the loader's refusal, though a second runner asked again
    warned = {w.split(" not served")[0].removeprefix("dsv41-aot: ").removesuffix(" (vLLM 0.33.0)"): w
              for w in out["warnings"]}
    assert sorted(warned) == ["ffn@gfx950:s=4,tp=4,r=0", "k1@gfx950:s=4,tp=4,r=1", "k1@gfx950:s=44,tp=4,r=1,i=1",
                              "k2@gfx950:s=4,tp=4,r=1"]
    assert len(out["warnings"]) == 4
    for key in ("ffn@gfx950:s=4,tp=4,r=0", "k1@gfx950:s=4,tp=4,r=1", "k2@gfx950:s=4,tp=4,r=1"):
        assert "IntegrityError" in warned[key] and bad.name in warned[key] and "sha256" in warned[key]
    assert "KeyNotPrebuiltError" in warned["k1@gfx950:s=44,tp=4,r=1,i=1"]
    # counted where they were served: 1 AOT and 4 JIT hand-outs a set of runners, two sets
    assert (out["installed"]["served_aot"], out["installed"]["served_jit"]) == (2, 8)


@pytest.mark.slow
@pytest.mark.faults
def test_strict_raises_the_loaders_error_at_hand_out(corrupt):
    from dsv41_aot.errors import IntegrityError
    from dsv41_aot.runtime import loader

    d, bad, _ = corrupt
    out = probe("gfx950", d, "strict", "now", [["kernels", 4, 1, True, False], ["ffn", 4, 384, 6]])
    layer, ffn = out["results"]
    # the loader's own refusal of that library, in this process
    with pytest.raises(IntegrityError) as e:
        loader.load_key("k1@gfx950:s=4,tp=4,r=1", prebuilt=d).bind()
    assert layer["error"] == ffn["error"] == "IntegrityError"
    assert layer["message"] == str(e.value) and bad.name in ffn["message"] and "sha256" in ffn["message"]
    assert out["mapped"] == [] and out["installed"]["served_aot"] == 0


@pytest.mark.slow
@pytest.mark.faults
def test_fallback_jits_a_key_it_cannot_derive_an_unknown_arch_and_one_that_disagrees(smoke):
    # a compress ratio no key has (vLLM's runner still makes its launchers): JIT, a warning for K1 and K2
    calls = [["kernels", 4, 4, True, False], ["kernels", 4, 1, True, False]]
    out = probe("gfx950", smoke, "fallback", "hook", calls)
    bad, good = out["results"]
    assert bad["k1"]["origin"] == bad["k2"]["origin"] == "jit"
    assert bad["k1"]["kernel_name"] == out["vllm"][0]["k1"] and "_r4_" in bad["k1"]["kernel_name"]
    assert bad["k2"]["kernel_name"] == out["vllm"][0]["k2"] and "_r4_" in bad["k2"]["kernel_name"]
    assert good["k1"]["origin"] == good["k2"]["origin"] == "aot"
    # (named by the build call vLLM made: the MonoBuild it passed)
    assert sorted(w.split("(MonoBuild(")[0] for w in out["warnings"]) == [
        f"dsv41-aot: build_mono_k{i}" for i in (1, 2)]
    assert all("ratio=4" in w and "KeyFormatError" in w and "r=4" in w for w in out["warnings"])
    # a runner compiling for gfx950 told it serves gfx942: every key JIT, strict refuses
    calls = [["kernels", 4, 1, True, False], ["ffn", 4, 384, 6]]
    out = probe("gfx950", smoke, "fallback", "hook", calls, install_arch="gfx942")
    layer, ffn = out["results"]
    assert layer["k1"]["origin"] == layer["k2"]["origin"] == ffn["ffn"]["origin"] == "jit"
    assert out["installed"]["served_aot"] == 0 and len(out["warnings"]) == 3
    assert all("GFX942=False but compiles for gfx942" in w for w in out["warnings"])
    out = probe("gfx950", smoke, "strict", "hook", calls[:1], install_arch="gfx942")
    assert out["results"][0]["error"] == "AotError" and "GFX942=False" in out["results"][0]["message"]
    # vLLM compiling for an arch dsv41-aot does not know: JIT
    out = probe("gfx90a", smoke, "fallback", "hook", calls[1:])
    assert out["results"][0]["ffn"]["origin"] == "jit" and out["results"][0]["ffn"]["kernel_name"] == out["vllm"][0]["ffn"]
    (line,) = out["warnings"]
    assert "UnknownArchError" in line and "gfx90a" in line


# ---------------------------------------------------------------- the plugin never breaks vLLM


@pytest.mark.slow
@pytest.mark.faults
@pytest.mark.parametrize("entry", ["install", "register"])
def test_a_runner_the_plugin_cannot_patch_still_imports_and_nothing_is_left_installed(smoke, entry):
    """vLLM's runner.py, loaded without its build_mono_ffn (a
    vLLM the plugin does not fit): through the meta_path hook the import
    succeeds, vLLM keeps its own methods, the plugin is off, one log line."""
    out = probe("gfx950", smoke, "strict", "hook", [["kernels", 4, 1, True, False]],
                entry=entry, runner_without="build_mono_ffn")
    assert out["before_import"]["hooked"]
    assert "import_error" not in out and out["runner_imported"] and not out["patched"]
    assert out["installed"] == {"mode": None, "prebuilt": None, "patched": False, "hooked": False,
                                "served_aot": 0, "served_jit": 0}  # as in a process never installed
    assert out["results"][0]["k1"]["origin"] == "jit"
    (line,) = out["warnings"]
    assert "could not patch" in line and "has no build_mono_ffn" in line
    # already imported: install() raises the plugin's error and leaves nothing; register() logs it, no raise
    out = probe("gfx950", smoke, "strict", "now", [], entry=entry, runner_without="build_mono_ffn")
    assert out["installed"]["mode"] is None and not out["installed"]["hooked"] and not out["patched"]
    if entry == "install":
        assert out["install_error"].startswith("AotError") and "has no build_mono_ffn" in out["install_error"]
        assert out["warnings"] == []
    else:
        assert "install_error" not in out
        (line,) = out["warnings"]
        assert "plugin off: AotError" in line and "has no build_mono_ffn" in line


@pytest.mark.faults
def test_the_plugin_lock_is_renewed_in_a_forked_child():
    """vLLM forks workers; the process state's lock, which install() takes,
    held by another thread at fork must not hang the child's install()."""
    held, release = threading.Event(), threading.Event()

    def hold():
        with state.current().lock:
            held.set()
            release.wait(30)

    t = threading.Thread(target=hold)
    t.start()
    assert held.wait(10)
    try:
        pid = os.fork()
        if pid == 0:  # the child: installs, or dies by SIGALRM on the parent's lock
            code = 3
            try:
                signal.alarm(5)
                plugin.install("fallback")
                code = 0 if plugin.installed()["mode"] == "fallback" else 1
                plugin.uninstall()
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
    finally:
        release.set()
        t.join()
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status


# ---------------------------------------------------------------- install / uninstall


def test_install_is_idempotent_and_uninstall_removes_the_hook():
    assert plugin.RUNNER not in sys.modules  # this process never imports vLLM's runner
    plugin.uninstall()
    before = list(sys.meta_path)
    try:
        plugin.install()
        plugin.install("fallback")
        hooks = [f for f in sys.meta_path if isinstance(f, runner_patch._RunnerHook)]
        assert len(hooks) == 1 and plugin.installed()["mode"] == "fallback"
        assert plugin.RUNNER not in sys.modules  # installing imports nothing of vLLM
    finally:
        plugin.uninstall()
    assert sys.meta_path == before and plugin.installed()["mode"] is None


def test_uninstall_forgets_the_runner_patch_counts_and_warnings_not_the_loaders():
    """What the runner patch found, counted and warned about lives on the
    process state: uninstall() forgets it and keeps the loader's warnings,
    and a new process state starts with none of it."""
    with state.fresh() as st:
        assert st.warn_once(("release", "digest"), "the loader's warning")
        assert st.warn_once(("runner", "a key"), "the runner patch's warning")
        st.count_served("jit")
        st.runner_room = ("gfx950", NEWEST)
        assert (plugin.installed()["served_aot"], plugin.installed()["served_jit"]) == (0, 1)  # counted from none
        plugin.uninstall()
        assert (st.runner_room, st.served, st.warned) == (None, {"aot": 0, "jit": 0}, {("release", "digest")})
        assert not st.warn_once(("release", "digest"), "told once only")
        assert st.warn_once(("runner", "a key"), "told again after uninstall()")
    assert state.current() is not st and state.current().served is not st.served


def test_install_refuses_an_unknown_mode():
    with pytest.raises(AotError, match="unknown dsv41-aot vLLM mode"):
        plugin.install("lenient")
    assert plugin.installed()["mode"] is None


# ---------------------------------------------------------------- the plugin's decision


def test_kfd_topology_gives_the_gpu_arch(tmp_path):
    nodes = tmp_path / "nodes"
    for i, v in enumerate((0, 90402, 90402)):  # a CPU node, two MI300X
        (nodes / str(i)).mkdir(parents=True)
        (nodes / str(i) / "properties").write_text(f"cpu_cores_count 0\ngfx_target_version {v}\nsimd_count 4\n")
    assert plugin.kfd_arches(nodes) == ["gfx942"]
    (nodes / "3").mkdir()
    (nodes / "3" / "properties").write_text("gfx_target_version 90500\n")
    assert plugin.kfd_arches(nodes) == ["gfx942", "gfx950"]
    assert plugin.kfd_arches(tmp_path / "absent") == []


def _enable(env: dict):
    plugin.uninstall()
    try:
        return plugin.enable(environ=env), plugin.installed()["mode"]
    finally:
        plugin.uninstall()


def test_disabled_by_the_environment(smoke, monkeypatch):
    monkeypatch.setenv("DSV41_AOT_PREBUILT", str(smoke))
    (ok, why, level), mode = _enable({"DSV41_AOT_DISABLE": "1", "DSV41_AOT_ARCH": "gfx950"})
    assert not ok and "DSV41_AOT_DISABLE=1" in why and level == logging.INFO and mode is None


def test_no_rocm_device_here(monkeypatch):
    monkeypatch.delenv("DSV41_AOT_ARCH", raising=False)
    if plugin.kfd_arches():
        pytest.skip("this host has a GPU")
    (ok, why, level), mode = _enable({})
    assert not ok and "no ROCm device" in why and level == logging.INFO and mode is None


@pytest.mark.slow
def test_enabled_names_arch_key_count_and_vllm_digest(smoke, monkeypatch):
    from dsv41_aot import source

    monkeypatch.setenv("DSV41_AOT_PREBUILT", str(smoke))
    (ok, why, level), mode = _enable({"DSV41_AOT_ARCH": "gfx950", "DSV41_AOT_MODE": "fallback"})
    digest = source.mono_digest(source.find().mono_dir)
    assert ok and level == logging.INFO and mode == "fallback"
    assert "gfx950" in why and f"{smoke_count('gfx950')} prebuilt keys of vLLM {NEWEST}" in why and digest in why


@pytest.mark.slow
def test_digest_mismatch_keeps_vllm_on_jit(smoke, tmp_path, monkeypatch):
    """The installed vLLM (0.33.0) is told apart by its mono sources digest:
    a 0.33.0 room built from other sources serves it only when allowed, and
    the 0.32.0 room never does."""
    d = copy_of(smoke, tmp_path / "pb")
    path = room(d, "gfx950") / "manifest.json"
    doc = json.loads(path.read_text())
    doc["mono_sources"] = "0123456789abcdef"
    for e in doc["entries"].values():
        e["source"]["mono_sources"] = "0123456789abcdef"
    path.write_text(json.dumps(doc))
    monkeypatch.setenv("DSV41_AOT_PREBUILT", str(d))
    (ok, why, level), mode = _enable({"DSV41_AOT_ARCH": "gfx950"})
    assert not ok and level == logging.WARNING and mode is None
    assert "matches no prebuilt release" in why and "vLLM 0.33.0 (0123456789abcdef)" in why and f"vLLM {OLD}" in why
    (ok, _, _), mode = _enable({"DSV41_AOT_ARCH": "gfx950", "DSV41_AOT_ALLOW_SOURCE_MISMATCH": "1"})
    assert ok and mode == "strict"


def test_no_prebuilt_dir_and_unknown_arch(tmp_path, monkeypatch):
    monkeypatch.setenv("DSV41_AOT_PREBUILT", str(tmp_path))
    (ok, why, level), _ = _enable({"DSV41_AOT_ARCH": "gfx950"})
    assert not ok and "no prebuilt kernels for gfx950" in why and level == logging.WARNING
    (ok, why, _), _ = _enable({"DSV41_AOT_ARCH": "gfx90a"})
    assert not ok and "gfx90a (from DSV41_AOT_ARCH) is not an arch" in why


def test_register_never_raises_and_logs_one_line(tmp_path):
    """In a fresh process, as vLLM calls it: one line on stderr, exit 0."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSV41_AOT_")}
    env.update(PYTHONPATH=str(REPO), DSV41_AOT_ARCH="gfx950", DSV41_AOT_PREBUILT=str(tmp_path / "nothing"))
    proc = subprocess.run([sys.executable, "-c", "import dsv41_aot.vllm as v; v.register()"],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=60)
    assert proc.returncode == 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "[dsv41_aot]" in lines[0] and "plugin off" in lines[0], proc.stderr


# ---------------------------------------------------------------- the entry point, installed for real


@pytest.mark.slow
def test_entry_point_found_after_pip_install_and_called_by_vllm(tmp_path, smoke):
    """A fresh venv, ``pip install --no-deps --no-build-isolation`` of the
    project: package metadata lists the plugin, and vLLM's own
    ``load_general_plugins`` calls it (the build side, setuptools and vLLM
    come from the project venv through a .pth placed after the fresh
    site-packages)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    ours = subprocess.run([sys.executable, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "zz_project_venv.pth").write_text(ours + "\n")
    # the fresh venv's bundled setuptools (65 on Python 3.11) is older than the
    # project's build requirement: without isolation the project venv's is used
    subprocess.run([str(py), "-m", "pip", "uninstall", "-q", "-y", "setuptools"], check=True, timeout=120)
    src = tmp_path / "src"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(".venv", ".git", "kernels_prebuilt", "*.egg-info",
                                                             "__pycache__", "dist", ".pytest_cache"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DSV41_AOT_", "PYTHON"))}
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index", str(src)],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    code = ("import importlib.metadata as m, json; "
            "print(json.dumps([[e.name, e.value, str(e.dist._path)] for e in m.entry_points(group='vllm.general_plugins')]))")
    r = subprocess.run([str(py), "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path, check=True)
    eps = {name: (value, dist) for name, value, dist in json.loads(r.stdout)}
    assert eps["dsv41_aot"][0] == "dsv41_aot.vllm:register"
    assert eps["dsv41_aot"][1].startswith(site)
    env.update(VLLM_PLUGINS="dsv41_aot", DSV41_AOT_ARCH="gfx950", DSV41_AOT_PREBUILT=str(smoke))
    code = ("import vllm.plugins as p; p.load_general_plugins(); import dsv41_aot.vllm as v, json; "
            "print(json.dumps([v.__file__, v.installed()]))")
    r = subprocess.run([str(py), "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    where, state = json.loads(r.stdout.strip().splitlines()[-1])
    assert where.startswith(site) and state["mode"] == "strict" and state["hooked"]
    assert (f"dsv41-aot vLLM plugin on: enabled (strict) for gfx950: {smoke_count('gfx950')} prebuilt keys of "
            f"vLLM {NEWEST}") in r.stderr
