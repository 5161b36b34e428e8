"""Runtime loader against the real smoke libraries and Debian's libamdhip64.

No GPU anywhere here: the HIP runtime is real and answers "no device". Every
bind is real (band sha256, decompression, memfd dlopen, entry, ABI against
the library's metadata). The places that need a device state (a graph
capture in progress, a device of another arch, module loads that succeed)
stand in for the AMD GPU only, marked MOCK-GPU where they are made.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
import threading

import pytest
from _smoke import OLD, REPO, cli, copy_of, libdir, room, smoke_count

import dsv41_aot
from dsv41_aot.errors import (
    ArchMismatchError,
    HipUnavailableError,
    IntegrityError,
    KeyFormatError,
    KeyNotPrebuiltError,
    LoadError,
    ManifestError,
    ReleaseMismatchError,
    SourceMismatchError,
)
from dsv41_aot.facts.releases import NEWEST
from dsv41_aot.keys import BuildKey
from dsv41_aot.room import Room
from dsv41_aot.runtime import loader, state

pytestmark = pytest.mark.slow
K1 = "k1@gfx950:s=4,tp=4,r=1"


@pytest.fixture(scope="module")
def smoke(smoke_dir):
    return smoke_dir



def _run(code: str, env: dict | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    full = dict(os.environ, PYTHONPATH=str(REPO), **(env or {}))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, env=full, cwd=REPO)


# ---------------------------------------------------------------- the happy path


def test_launchers_for_every_smoke_key(smoke, fresh):
    for arch in ("gfx950", "gfx942"):
        for text in fresh.keys(arch, prebuilt=smoke):
            launcher = dsv41_aot.load_key(text, prebuilt=smoke)
            key = BuildKey.parse(text, NEWEST)
            assert launcher.key == text and launcher.arch == arch
            assert launcher.kernel_name == key.kernel_symbol and launcher.entry == key.entry
            assert launcher.abi[-1]["name"] == "stream" and launcher.abi == Room(smoke, arch, NEWEST).manifest().abi(text)
            assert dsv41_aot.load_key(text, prebuilt=smoke) is launcher  # one Launcher per key


def test_load_names_the_key_vllm_builds(smoke, fresh, monkeypatch):
    monkeypatch.setenv(loader.ENV_ARCH, "gfx950")
    assert dsv41_aot.load("k2", tokens=4, tp=4, ratio=1, prebuilt=smoke).key == "k2@gfx950:s=4,tp=4,r=1"
    # ffn_kernel builds MonoBuild(tokens, tp, 0, ...): the ratio does not name another symbol
    assert dsv41_aot.load("ffn", tokens=4, tp=4, ratio=2, prebuilt=smoke).key == "ffn@gfx950:s=4,tp=4,r=0"
    assert dsv41_aot.load("k1", tokens=4, tp=4, ratio=1, arch="gfx942", prebuilt=smoke).arch == "gfx942"


def test_runtime_imports_only_the_standard_library():
    r = _run("""
        import sys
        before = set(sys.modules)
        import dsv41_aot
        assert set(sys.modules) - before == {"dsv41_aot"}, set(sys.modules) - before
        import dsv41_aot.runtime.loader
        new = {m.split(".")[0] for m in set(sys.modules) - before}
        print(sorted(new - set(sys.stdlib_module_names) - {"dsv41_aot"}))
        print(sorted(m for m in sys.modules if m.startswith("dsv41_aot.")))
    """)
    assert r.returncode == 0, r.stderr
    third_party, ours = r.stdout.splitlines()
    assert third_party == "[]"
    build_side = [m for m in ast.literal_eval(ours) if m.split(".")[1] in ("aot", "cli")]
    assert build_side == [], build_side  # the compiler, matrix, worker, toolchain, link all live in aot/


# flydsl, torch, vllm, yaml, tqdm and the build side blocked from import; a
# spec lookup still answers (the source check finds vLLM without importing it)
_BLOCKED = """
import importlib.abc, importlib.machinery, sys
BLOCK = ("flydsl", "torch", "vllm", "yaml", "tqdm", "mlir", "_mlir", "dsv41_aot.aot", "dsv41_aot.aot.compiler",
         "dsv41_aot.aot.matrix", "dsv41_aot.aot.worker", "dsv41_aot.aot.toolchain", "dsv41_aot.aot.link")
class Refuse(importlib.abc.Loader):
    def create_module(self, spec):
        raise ImportError(f"runtime imported {spec.name}")
    def exec_module(self, module):
        raise ImportError(f"runtime imported {module.__name__}")
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name in BLOCK or name.startswith(tuple(b + "." for b in BLOCK)):
            real = importlib.machinery.PathFinder.find_spec(name, path)
            spec = importlib.machinery.ModuleSpec(name, Refuse(), is_package=bool(real and real.submodule_search_locations))
            if real is not None and real.submodule_search_locations:
                spec.submodule_search_locations = list(real.submodule_search_locations)
            return spec
sys.meta_path.insert(0, Block())
"""


def test_every_smoke_key_loads_with_the_build_side_blocked(smoke):
    r = _run(_BLOCKED + f"""
import json, sys
import dsv41_aot
from dsv41_aot.runtime import host, loader
out = {{}}
for arch in ("gfx950", "gfx942"):
    for key in loader.keys(arch, prebuilt={str(smoke)!r}):
        launcher = dsv41_aot.load_key(key, prebuilt={str(smoke)!r})
        launcher.bind()  # band sha256 x2, memfd, dlopen, entry, ABI vs export metadata
        out[key] = [launcher.kernel_name, launcher._call is not None]
assert host.installed_vllm()[0] is not None  # the source check ran on the installed vLLM
maps = open("/proc/self/maps").read()
bands = sorted({{l.split("/memfd:")[1].split(" ")[0] for l in maps.splitlines() if "/memfd:libdsv41_" in l}})
print(json.dumps(out))
print(json.dumps(bands))
print(sorted(m for m in sys.modules if m.split(".")[0] in ("flydsl", "torch", "vllm", "yaml", "tqdm")))
""")
    assert r.returncode == 0, r.stderr
    out, bands, imported = r.stdout.splitlines()
    assert len(json.loads(out)) == smoke_count() and imported == "[]"
    assert all(bound for _, bound in json.loads(out).values())
    # every band of both arches' rooms of the installed vLLM (0.33.0) bound
    # from memory, none from the prebuilt dir, and none of vLLM 0.32.0's
    want = sorted(lib["file"][: -len(".xz")] for arch in ("gfx950", "gfx942")
                  for lib in json.loads((room(smoke, arch) / "libs.json").read_text())["libraries"])
    old = {lib["file"][: -len(".xz")] for lib in json.loads((room(smoke, "gfx950", OLD) / "libs.json").read_text())["libraries"]}
    assert json.loads(bands) == want and not old & set(want)


# ---------------------------------------------------------------- launches


def test_a_launch_with_no_device_raises_the_hip_error_name(smoke):
    r = _run(f"""
import dsv41_aot
from dsv41_aot.errors import LaunchError
l = dsv41_aot.load_key({K1!r}, prebuilt={str(smoke)!r})
try:
    l(*range(len(l.abi) - 1), stream=0)
except LaunchError as e:
    print(e.status, str(e).splitlines()[0])
""", timeout=60)
    assert r.returncode == 0, r.stderr  # no crash, no hang
    status, message = r.stdout.strip().split(" ", 1)
    assert int(status) > 0 and "hipError" in message and K1 in message
    # no device: the first device call, before any load, fails and is named
    assert "hipGetDevice failed" in message and "nothing was loaded" in message


# (wrong arguments refused before any launch: tests/test_launch_hip.py, through the recording HIP)


def test_stream_handles(smoke, fresh):
    class TorchLikeStream:  # what torch.cuda.current_stream() hands vLLM's launchers
        cuda_stream = 1234

    import ctypes

    from dsv41_aot.runtime.launcher import _stream_handle

    assert _stream_handle(None, K1) == 0 and _stream_handle(TorchLikeStream(), K1) == 1234
    assert _stream_handle(ctypes.c_void_p(77), K1) == 77 and _stream_handle(5, K1) == 5


# ---------------------------------------------------------------- refusals

# (the first load's refusals, preload and fork: tests/test_launch_hip.py, through the recording HIP)


def test_key_not_prebuilt_lists_the_closest_and_the_build_command(smoke, fresh):
    with pytest.raises(KeyNotPrebuiltError) as e:
        dsv41_aot.load_key("k1@gfx950:s=5,tp=4,r=1", prebuilt=smoke)
    msg = str(e.value)
    assert "k1@gfx950:s=4,tp=4,r=1" in msg.split("closest:")[1]
    assert "is not prebuilt for vLLM 0.33.0" in msg
    assert "dsv41-aot build --release 0.33.0 --out " in msg and " --key k1@gfx950:s=5,tp=4,r=1 && " in msg
    assert isinstance(e.value, KeyError) and isinstance(e.value, LoadError) and e.value.exit_code == 1


def test_an_arch_that_is_not_prebuilt(smoke, fresh, tmp_path):
    d = tmp_path / "only950"
    d.mkdir()
    copy_of(smoke / "gfx950", d / "gfx950")
    with pytest.raises(ArchMismatchError, match="holds prebuilt kernels for gfx950, not gfx942"):
        dsv41_aot.load_key("k1@gfx942:s=4,tp=4,r=1", prebuilt=d)


def test_no_device_and_no_arch_named(smoke, fresh):
    with pytest.raises(HipUnavailableError, match="no HIP device"):
        dsv41_aot.load("k1", tokens=4, tp=4, ratio=1, prebuilt=smoke)


def test_libamdhip64_not_loadable(smoke):
    r = _run(f"""
import dsv41_aot
from dsv41_aot.errors import HipUnavailableError
try:
    dsv41_aot.load_key({K1!r}, prebuilt={str(smoke)!r}).bind()
except HipUnavailableError as e:
    print("refused:", e)
""", env={"DSV41_AOT_HIP_LIB": "/nonexistent/libamdhip64.so"})
    assert r.returncode == 0, r.stderr
    assert "refused: libamdhip64 cannot be loaded" in r.stdout and "ROCM_PATH" in r.stdout


_BIND_AND_MAPS = """
import json, sys
import dsv41_aot
from dsv41_aot.errors import IntegrityError
launcher = dsv41_aot.load_key(sys.argv[1], prebuilt=sys.argv[2])
try:
    launcher.bind()
    print("bound")
except IntegrityError as e:
    print("refused:", str(e).splitlines()[0])
print(json.dumps(open("/proc/self/maps").read().splitlines()))
"""


def test_a_flipped_byte_in_the_launchers_own_band_is_never_mapped(smoke, tmp_path):
    d = copy_of(smoke, tmp_path / "p")
    libs = json.loads((room(d, "gfx950") / "libs.json").read_text())["libraries"]
    own = next(lib for lib in libs if K1 in lib["entries"])  # K1's band, not whichever the folder lists first
    band = libdir(d, "gfx950") / own["file"]
    data = bytearray(band.read_bytes())
    data[len(data) // 3] ^= 0x40
    band.write_bytes(bytes(data))
    r = subprocess.run([sys.executable, "-c", _BIND_AND_MAPS, K1, str(d)], capture_output=True, text=True,
                       timeout=60, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert r.returncode == 0, r.stderr
    verdict, maps = r.stdout.splitlines()
    assert verdict.startswith("refused:") and own["file"] in verdict and "does not match the sha256" in verdict
    mapped = [line for line in json.loads(maps) if own["chunk"] in line or str(d) in line]
    assert mapped == []  # neither the band file nor any memfd copy of it was mapped
    # the same check sees a band that is bound: the intact copy maps as a memfd
    r = subprocess.run([sys.executable, "-c", _BIND_AND_MAPS, K1, str(smoke)], capture_output=True, text=True,
                       timeout=60, env=dict(os.environ, PYTHONPATH=str(REPO)))
    verdict, maps = r.stdout.splitlines()
    mapped = [line for line in json.loads(maps) if own["chunk"] in line]
    assert verdict == "bound" and mapped and all("/memfd:" + own["file"][:-3] in line for line in mapped)


def test_a_flipped_byte_in_a_band_refuses_bind_and_preload(smoke, fresh, tmp_path):
    d = copy_of(smoke, tmp_path / "p")
    launcher = dsv41_aot.load_key(K1, prebuilt=d)  # the manifest is fine: a Launcher, unbound
    band = libdir(d, "gfx950") / launcher._librec.file
    data = bytearray(band.read_bytes())
    data[-100] ^= 0x01
    band.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="does not match the sha256"):
        launcher.bind()  # what its first call or preload does first
    with pytest.raises(IntegrityError, match="does not match the sha256"):
        dsv41_aot.preload([K1], prebuilt=d)
    assert not state.current().libraries  # nothing opened


def test_manifest_problems(smoke, fresh, tmp_path):
    d = copy_of(smoke, tmp_path / "m")
    here = room(d, "gfx950")

    def forget():  # read the rooms again, and pick the running vLLM's again
        state.current().indexes.clear()
        state.current().picked.clear()

    (here / "libs.json").write_text("{not json")
    with pytest.raises(ManifestError, match="malformed JSON"):
        dsv41_aot.load_key(K1, prebuilt=d)
    (here / "libs.json").unlink()
    forget()
    with pytest.raises(ManifestError, match="never linked") as e:
        dsv41_aot.load_key(K1, prebuilt=d)
    assert "dsv41-aot link" in str(e.value) and "--release 0.33.0" in str(e.value)
    # another room's link record is no stand-in for this one's
    (room(d, "gfx950", OLD) / "libs.json").replace(here / "libs.json")
    forget()
    with pytest.raises(ManifestError, match=f"link record for 'gfx950' vLLM '{OLD}' in the gfx950 vLLM 0.33.0 folder"):
        dsv41_aot.load_key(K1, prebuilt=d)
    # nor its manifest
    doc = json.loads((here / "manifest.json").read_text())
    (here / "manifest.json").write_text(json.dumps(dict(doc, release=OLD)))
    forget()
    with pytest.raises(ManifestError, match=f"manifest for vLLM '{OLD}' in the vLLM 0.33.0 folder"):
        dsv41_aot.load_key(K1, prebuilt=d)
    # a manifest whose mono_sources is not its entries'
    (here / "manifest.json").write_text(json.dumps(dict(doc, mono_sources="0" * 16)))
    forget()
    with pytest.raises(ManifestError, match="mono_sources '0000000000000000' is not its entries'"):
        dsv41_aot.load_key(K1, prebuilt=d)
    (here / "manifest.json").write_text('{"schema": 1, "arch": "gfx950"')
    forget()
    with pytest.raises(ManifestError, match="malformed JSON") as e:
        dsv41_aot.load_key(K1, prebuilt=d)  # the running vLLM's room is corrupt: not "no release matches"
    assert "--release 0.33.0" in e.value.fix
    (here / "manifest.json").unlink()
    forget()
    with pytest.raises(ManifestError, match="no prebuilt kernels for gfx950"):
        dsv41_aot.load_key(K1, prebuilt=d / "nowhere")


def _fix_command(err) -> list:
    """The dsv41-aot commands of an error's fix line, as argument lists."""
    import shlex

    fix = err.fix.split(": ", 1)[-1]
    return [shlex.split(part)[1:] for part in fix.split(" && ")]


def test_an_object_rebuilt_after_the_link_names_it_and_relink_fixes_it(smoke, fresh, tmp_path):
    d = copy_of(smoke, tmp_path / "s")
    path = room(d, "gfx950") / "libs.json"
    doc = json.loads(path.read_text())
    lib = next(lib for lib in doc["libraries"] if K1 in lib["entries"])
    lib["entries"][K1] = "1" * 64  # libs.json says the band was linked from another object
    path.write_text(json.dumps(doc))
    with pytest.raises(ManifestError, match="rebuilt after the last link") as e:
        dsv41_aot.load_key(K1, prebuilt=d)
    assert "links it from object 1111" in str(e.value)
    (cmd,) = _fix_command(e.value)
    r = cli(*cmd)
    assert r.returncode == 0, r.stderr
    state.current().indexes.clear()
    dsv41_aot.load_key(K1, prebuilt=d).bind()


def test_an_altered_manifest_entry_names_it_and_its_fix_rebuilds(smoke, fresh, tmp_path):
    d = copy_of(smoke, tmp_path / "s")
    path = room(d, "gfx950") / "manifest.json"
    doc = json.loads(path.read_text())
    doc["entries"][K1]["sha256"] = "0" * 64
    path.write_text(json.dumps(doc))
    with pytest.raises(ManifestError, match="no longer describes its object") as e:
        dsv41_aot.load_key(K1, prebuilt=d)
    assert "records object sha256 0000" in str(e.value) and "dsv41-aot build --release 0.33.0 --out " in e.value.fix
    for cmd in _fix_command(e.value):  # what the old "relink" fix did: refused, so the fix is the build
        r = cli(*cmd, *(["--no-progress"] if cmd[0] == "build" else []), timeout=600)
        assert r.returncode == 0, r.stdout + r.stderr
    state.current().indexes.clear()
    dsv41_aot.load_key(K1, prebuilt=d).bind()


_FAKE_VLLM = """
import sys
sys.path.insert(0, {root!r})
import dsv41_aot, logging
logging.basicConfig(level=logging.WARNING, format="WARN %(message)s")
from dsv41_aot.errors import SourceMismatchError
try:
    print("loaded", dsv41_aot.load_key({key!r}, prebuilt={smoke!r}).key)
except SourceMismatchError as e:
    print("refused:", e)
"""


def test_installed_vllm_with_other_mono_sources(smoke, tmp_path):
    mono = tmp_path / "site" / "vllm" / "models" / "deepseek_v41" / "amd" / "mono"
    mono.mkdir(parents=True)
    (tmp_path / "site" / "vllm" / "__init__.py").write_text("raise ImportError('vllm must not be imported')\n")
    (mono / "layer.py").write_text("# a different kernel source\n")
    code = _FAKE_VLLM.format(root=str(tmp_path / "site"), key=K1, smoke=str(smoke))
    r = _run(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("refused:") and "DSV41_AOT_ALLOW_SOURCE_MISMATCH=1" in r.stdout
    r = _run(code, env={"DSV41_AOT_ALLOW_SOURCE_MISMATCH": "1"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"loaded {K1}" and "WARN" in r.stderr and "differ from" in r.stderr


def test_no_installed_vllm_means_no_source_check(smoke):
    r = subprocess.run(
        [sys.executable, "-S", "-c", f"import sys; sys.path.insert(0, {str(REPO)!r}); import dsv41_aot; "
         f"from dsv41_aot.runtime import host; print(dsv41_aot.load_key({K1!r}, prebuilt={str(smoke)!r}).key, "
         f"host.installed_vllm())"],
        capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"{K1} (None, None, None)"


# ---------------------------------------------------------------- releases


def _old_tree():
    """vLLM 0.32.0's source tree (the tree cache bootstrap fetches)."""
    from dsv41_aot import source

    src = source.MonoSource(root=source.trees_dir() / OLD)
    if src.version != OLD:
        pytest.skip(f"no vLLM {OLD} tree at {src.root}: dsv41-aot fetch-vllm {OLD}")
    return src


def test_a_key_string_is_served_by_the_running_vllms_room(smoke, fresh):
    assert fresh.releases("gfx950", prebuilt=smoke) == [OLD, "0.33.0"]
    assert fresh.releases("gfx942", prebuilt=smoke) == ["0.33.0"]
    # the installed vLLM is 0.33.0: a key string names its launch
    new = dsv41_aot.load_key(K1, prebuilt=smoke)
    assert new.kernel_name == BuildKey.parse(K1, NEWEST).kernel_symbol and new._idx.room.release == "0.33.0"
    # a vLLM 0.32.0 runner (its mono package, as the plugin says it): the same
    # string picks 0.32.0's room by the mono sources digest, its own kernel
    fresh.running_vllm(_old_tree().mono_dir)
    old = dsv41_aot.load_key(K1, prebuilt=smoke)
    assert old is not new and old._idx.room.release == OLD and old.key == K1
    assert old.kernel_name == BuildKey.parse(K1, OLD).kernel_symbol == "_ZN5aiter27dsv41_mono_k1_s4_tp4_r1_tl0E"
    assert old.abi == Room(smoke, "gfx950", OLD).manifest().abi(K1)
    old.bind()  # its band (0.32.0's room's) and its ABI against the library's metadata
    assert old.library != new.library and old.library.startswith(str(smoke / "gfx950" / "lib"))
    assert fresh.keys("gfx950", prebuilt=smoke) == sorted(Room(smoke, "gfx950", OLD).manifest().entries)
    assert dsv41_aot.load("k2", tokens=4, tp=4, ratio=1, arch="gfx950", prebuilt=smoke).kernel_name == \
        BuildKey.parse("k2@gfx950:s=4,tp=4,r=1", OLD).kernel_symbol
    # a field 0.32.0's MonoBuild lacks: bad input, naming it
    with pytest.raises(KeyFormatError, match="MonoBuild has no fold field"):
        dsv41_aot.load_key("k1@gfx950:s=4,tp=4,r=1,f=0", prebuilt=smoke)


def test_a_key_of_another_release_never_serves_the_running_vllm(smoke, fresh):
    # 0.33.0 installed: asking for 0.32.0's launch is refused (its sources differ)
    with pytest.raises(SourceMismatchError, match="built from .vLLM 0.32.0") as e:
        dsv41_aot.load_key(K1, release=OLD, prebuilt=smoke)
    assert not isinstance(e.value, ReleaseMismatchError)
    with pytest.raises(SourceMismatchError):
        dsv41_aot.load_key(BuildKey.parse(K1, OLD), prebuilt=smoke)  # a BuildKey carries its release
    # a 0.32.0 runner: 0.33.0's launch is refused the same way ...
    fresh.running_vllm(_old_tree().mono_dir)
    with pytest.raises(SourceMismatchError, match="built from .vLLM 0.33.0"):
        dsv41_aot.load_key(K1, release="0.33.0", prebuilt=smoke)
    # ... and an arch with no 0.32.0 room serves it nothing
    with pytest.raises(ReleaseMismatchError, match="matches no prebuilt release") as e:
        dsv41_aot.load_key("k1@gfx942:s=4,tp=4,r=1", prebuilt=smoke)
    assert "vLLM 0.33.0 (" in str(e.value) and "--release 0.32.0" in e.value.fix
    assert not any(launcher._idx.room.release == "0.33.0" for launcher in state.current().launchers.values())


def test_a_room_the_prebuilt_dir_does_not_hold(smoke, fresh, tmp_path):
    d = copy_of(smoke, tmp_path / "new-only")
    import shutil

    shutil.rmtree(room(d, "gfx950", OLD))
    with pytest.raises(ReleaseMismatchError, match=f"holds prebuilt kernels for vLLM 0.33.0, not vLLM {OLD}") as e:
        dsv41_aot.load_key(K1, release=OLD, prebuilt=d)
    assert f"dsv41-aot build --release {OLD} --arch gfx950" in e.value.fix


def test_an_allowed_source_mismatch_is_served_by_the_running_releases_room_not_the_newest(
        smoke, fresh, monkeypatch, tmp_path, caplog):
    """vLLM 0.32.0 with one mono file edited matches no room's digest: refused,
    and with DSV41_AOT_ALLOW_SOURCE_MISMATCH=1 served by the 0.32.0 room (its
    own release's), not the newest (0.33.0), with a warning naming 0.32.0."""
    import logging
    import shutil

    from dsv41_aot import source

    old = _old_tree()
    edited = source.MonoSource(root=tmp_path / "vllm-edited")
    shutil.copytree(old.root, edited.root, ignore=shutil.ignore_patterns("__pycache__"))
    layer = edited.mono_dir / "layer.py"
    layer.write_text(layer.read_text() + "\n# a local edit: the digest is no longer 0.32.0's\n")
    assert edited.version == OLD and edited.digest != old.digest
    fresh.running_vllm(edited.mono_dir)
    with pytest.raises(ReleaseMismatchError, match=f"running vLLM {OLD} mono sources .* matches no prebuilt") as e:
        dsv41_aot.load_key(K1, prebuilt=smoke)
    assert f"run vLLM {OLD}'s kernels anyway with DSV41_AOT_ALLOW_SOURCE_MISMATCH=1" in e.value.fix
    monkeypatch.setenv(loader.ENV_ALLOW_SOURCE, "1")
    with caplog.at_level(logging.WARNING, logger="dsv41_aot"):
        launcher = dsv41_aot.load_key(K1, prebuilt=smoke)
        launcher.bind()  # 0.32.0's band, and its ABI against that library's own metadata
    assert launcher._idx.room.release == OLD and launcher.key == K1
    assert launcher.kernel_name == BuildKey.parse(K1, OLD).kernel_symbol != BuildKey.parse(K1, NEWEST).kernel_symbol
    old_bands = {lib["file"] for lib in json.loads((room(smoke, "gfx950", OLD) / "libs.json").read_text())["libraries"]}
    assert os.path.basename(launcher.library) in old_bands
    assert fresh.keys("gfx950", prebuilt=smoke) == sorted(Room(smoke, "gfx950", OLD).manifest().entries)
    warned = [r.getMessage() for r in caplog.records if r.name == "dsv41_aot"]
    assert any(f"running vLLM {OLD} mono sources" in w and f"using vLLM {OLD}'s" in w for w in warned), warned


# ---------------------------------------------------------------- threads


def test_concurrent_first_loads_give_one_launcher(smoke, fresh):
    got, errors = [], []

    def one():
        try:
            launcher = dsv41_aot.load_key(K1, prebuilt=smoke)
            launcher.bind()  # the host side of a first call, raced
            got.append(launcher)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=one) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len({id(x) for x in got}) == 1 and len(state.current().libraries) == 1


@pytest.mark.faults
def test_a_mixed_source_room_is_named_so_when_no_room_matches(smoke, fresh, tmp_path):
    """A room whose keys were built from two vLLM trees matches no digest;
    the refusal says it is mixed (P13g of the fault report at 24a0152: it
    read "vLLM 0.33.0 (None)")."""
    d = copy_of(smoke, tmp_path / "mixed")
    path = room(d, "gfx950") / "manifest.json"
    doc = json.loads(path.read_text())
    first = sorted(doc["entries"])[0]
    real = doc["entries"][first]["source"]["mono_sources"]
    doc["entries"][first]["source"]["mono_sources"] = "0123456789abcdef"
    doc["mono_sources"] = None  # what a build writes for a room of two sources
    path.write_text(json.dumps(doc))
    with pytest.raises(ReleaseMismatchError, match="matches no prebuilt release") as e:
        dsv41_aot.load_key(K1, prebuilt=d)
    assert f"vLLM 0.33.0 (mixed: keys built from {' and '.join(sorted([real, '0123456789abcdef']))})" in str(e.value)
    assert "(None)" not in str(e.value)


@pytest.mark.faults
def test_an_arch_folder_named_as_the_prebuilt_directory_points_at_its_parent(smoke, fresh):
    """P13g of the fault report at 24a0152: it said "no prebuilt kernels ...
    at .../gfx950/gfx950"; the fix names the parent, and the parent serves."""
    with pytest.raises(ManifestError, match="is an arch folder") as e:
        dsv41_aot.load_key(K1, prebuilt=smoke / "gfx950")
    parent = e.value.fix.rsplit("DSV41_AOT_PREBUILT=", 1)[1]
    assert parent == str(smoke.resolve()) and dsv41_aot.load_key(K1, prebuilt=parent).key == K1
