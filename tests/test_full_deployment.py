"""The runtime on a real full deployment: every key of both rooms bound.

``../shared/prebuilt-gfx950-tp4/`` beside the repository (``DSV41_AOT_FULL_DEPLOYMENT``
names another) is what the wheel installs for gfx950 TP4: 1,152 keys, 912 of
vLLM 0.33.0 and 240 of vLLM 0.32.0, in 12 xz bands, no ``objects/``. Nothing
here compiles and nothing is timed (bench/load.py measures); each process
that dlopens a band is a subprocess, so the suite's own process maps none.

Under ``CI=true`` a missing deployment (or vLLM 0.32.0's tree) fails the
tests: CI must run them. Elsewhere they skip, saying what is missing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dsv41_aot.manifest import folder_name

REPO = Path(__file__).resolve().parents[1]
ENV_DEPLOYMENT = "DSV41_AOT_FULL_DEPLOYMENT"
DEFAULT = Path(__file__).resolve().parents[2] / "shared" / "prebuilt-gfx950-tp4"
ARCH, NEW, OLD = "gfx950", "0.33.0", "0.32.0"
# the deployment as shipped (its README): keys per room, bands per room
SHIPPED = {NEW: (912, 6), OLD: (240, 6)}


def _unavailable(why: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{why} (CI=true: these tests must run, not skip)")
    pytest.skip(why)


@pytest.fixture(scope="module")
def deployment() -> Path:
    d = Path(os.environ.get(ENV_DEPLOYMENT) or DEFAULT)
    if not all((d / ARCH / folder_name(r) / "libs.json").is_file() for r in SHIPPED):
        _unavailable(f"no full gfx950 TP4 deployment of vLLM {NEW} and {OLD} at {d} "
                     f"(the shared prebuilt-gfx950-tp4 folder, or {ENV_DEPLOYMENT}=DIR)")
    return d.resolve()


@pytest.fixture(scope="module")
def old_tree() -> Path:
    """vLLM 0.32.0's kernel source (``dsv41-aot fetch-vllm 0.32.0``, the tree cache ci/bootstrap.sh fills)."""
    from dsv41_aot import source

    src = source.MonoSource(root=source.trees_dir() / OLD)
    if src.version != OLD:
        _unavailable(f"no vLLM {OLD} tree at {src.root}: dsv41-aot fetch-vllm {OLD}")
    return src.root


def run(code: str, *args, env: dict | None = None, timeout: int = 300) -> dict:
    """``code`` in a fresh process (this checkout's dsv41_aot, this machine's
    HIP 5.2 stand-in accepted as conftest does): its last line, as JSON."""
    full = {k: v for k, v in os.environ.items() if not k.startswith(("DSV41_AOT_", "FLYDSL_"))}
    full.update(PYTHONPATH=f"{REPO}{os.pathsep}{REPO / 'tests'}", DSV41_AOT_ALLOW_HIP_VERSION="5.2", **(env or {}))
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *map(str, args)], capture_output=True,
                          text=True, env=full, cwd=REPO, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def room_keys(d: Path, release: str) -> set:
    from dsv41_aot.room import Room

    return set(Room(d, ARCH, release).manifest().entries)


def mono_sources(d: Path, release: str) -> str:
    from dsv41_aot.room import Room

    return Room(d, ARCH, release).manifest().mono_sources


def memfd_bands(maps: list) -> set:
    return {p.split(" ")[0][len("/memfd:"):] + ".xz" for p in maps if p.startswith("/memfd:libdsv41_")}


def band_files(d: Path, release: str) -> set:
    from dsv41_aot.room import Room

    return {b.file for b in Room(d, ARCH, release).links().bands}


# ---------------------------------------------------------------- the loader


_LOADER = """
import json, os, sys
import dsv41_aot
from dsv41_aot.runtime import state
root, release = sys.argv[1], sys.argv[2] or None
keys = dsv41_aot.keys("gfx950", release=release, prebuilt=root)
launchers = dsv41_aot.bind(keys, release=release, prebuilt=root)  # the bands a thread each; no GPU work
with open("/proc/self/maps") as f:
    maps = sorted({line.split(None, 5)[5].strip() for line in f if len(line.split(None, 5)) == 6})
print(json.dumps(dict(
    releases=dsv41_aot.releases("gfx950", prebuilt=root),
    keys=keys, bound=sum(l._lib is not None for l in launchers),
    rooms=sorted({l._idx.room.release for l in launchers}),
    sources=sorted({l._idx.entries[l.key].source.mono_sources for l in launchers}),
    again=all(dsv41_aot.load_key(l.key, release=release, prebuilt=root) is l for l in launchers),
    libraries=len(state.current().libraries), maps=maps)))
"""


def test_every_key_of_the_running_vllms_room_binds_through_the_loader(deployment):
    """The installed vLLM is 0.33.0: keys() and load_key name its room's
    launches (picked by its mono sources digest), and every one binds."""
    out = run(_LOADER, deployment, "")
    keys, bands = SHIPPED[NEW]
    assert out["releases"] == [OLD, NEW]
    assert set(out["keys"]) == room_keys(deployment, NEW) and len(out["keys"]) == keys
    assert out["bound"] == keys and out["rooms"] == [NEW] and out["again"]
    assert out["libraries"] == bands and memfd_bands(out["maps"]) == band_files(deployment, NEW)
    assert not [p for p in out["maps"] if p.startswith(str(deployment))]  # bands from memory, nothing mapped from disk


def test_every_key_of_the_older_room_binds_by_release(deployment):
    """vLLM 0.32.0's room by ``release=``: its own keys, its own bands. The
    installed vLLM is 0.33.0, so its sources check is waived the documented way."""
    out = run(_LOADER, deployment, OLD, env={"DSV41_AOT_ALLOW_SOURCE_MISMATCH": "1"})
    keys, bands = SHIPPED[OLD]
    assert set(out["keys"]) == room_keys(deployment, OLD) and len(out["keys"]) == keys
    assert out["bound"] == keys and out["rooms"] == [OLD] and out["again"]
    assert out["sources"] == [mono_sources(deployment, OLD)] != [mono_sources(deployment, NEW)]
    assert out["libraries"] == bands and memfd_bands(out["maps"]) == band_files(deployment, OLD)


_CONCURRENT = """
import json, sys, threading
import dsv41_aot
from dsv41_aot.linkrecord import Band
root = sys.argv[1]
keys = dsv41_aot.keys("gfx950", prebuilt=root)
launchers = [dsv41_aot.load_key(k, prebuilt=root) for k in keys]
first_of = {}
for l in launchers:
    first_of.setdefault(l.library, l)
two = list(first_of.values())[:2]
# each band's unpack (sha256, xz, raw sha256) waits for the other's: under one
# process-wide lock the second never starts and the barrier breaks
met = threading.Barrier(2, timeout=20)
unpack = Band.unpack
def meeting(self, data, where, fix):
    met.wait()
    return unpack(self, data, where, fix)
Band.unpack = meeting
dsv41_aot.bind(two, prebuilt=root, workers=2)
Band.unpack = unpack
print(json.dumps(dict(bands=len(first_of), bound=[l._lib is not None for l in two], broken=met.broken)))
"""


def test_bands_bind_concurrently_each_under_its_own_lock(deployment):
    out = run(_CONCURRENT, deployment)
    assert out == {"bands": SHIPPED[NEW][1], "bound": [True, True], "broken": False}


_CACHED = """
import json, os, pathlib, sys
import dsv41_aot
from dsv41_aot import manifest, room
from dsv41_aot.runtime import loader, rooms
root, elsewhere = sys.argv[1], sys.argv[2]
os.environ["DSV41_AOT_PREBUILT"] = root
keys = dsv41_aot.keys("gfx950")
first = dsv41_aot.load_key(keys[0])
assert dsv41_aot.load_key(keys[0], prebuilt=root) is first  # the directory named the other way, resolved once
# from here on, nothing a key needs is looked up again: no path resolved, no
# room picked or read, no import
def refuse(*a, **k):
    raise AssertionError("looked up again")
saved = (pathlib.Path.resolve, os.path.realpath, manifest.prebuilt_dir, room.Room.manifest, rooms.release_of,
         loader.release_of, rooms.index_of, loader.index_of)
pathlib.Path.resolve = os.path.realpath = manifest.prebuilt_dir = room.Room.manifest = refuse
rooms.release_of = loader.release_of = rooms.index_of = loader.index_of = refuse
launchers = [dsv41_aot.load_key(k) for k in keys]
named = [dsv41_aot.load_key(k, prebuilt=root) for k in keys]
attribute = "load_key" in vars(dsv41_aot)  # bound at first use: no module __getattr__ a call
(pathlib.Path.resolve, os.path.realpath, manifest.prebuilt_dir, room.Room.manifest, rooms.release_of,
 loader.release_of, rooms.index_of, loader.index_of) = saved
# what can change is the key: another DSV41_AOT_PREBUILT is another directory
os.environ["DSV41_AOT_PREBUILT"] = elsewhere
try:
    dsv41_aot.load_key(keys[0])
    moved = "served"
except Exception as e:
    moved = type(e).__name__
os.environ["DSV41_AOT_PREBUILT"] = root
print(json.dumps(dict(keys=len(keys), same=launchers[0] is first and named == launchers, attribute=attribute,
                      moved=moved, back=dsv41_aot.load_key(keys[0]) is first)))
"""


def test_a_launcher_asked_for_again_is_a_lookup_keyed_on_what_can_change(deployment, tmp_path):
    out = run(_CACHED, deployment, tmp_path)
    assert out == {"keys": SHIPPED[NEW][0], "same": True, "attribute": True, "moved": "ManifestError",
                   "back": True}


# ---------------------------------------------------------------- vLLM's own runners, patched


# tests/_vllm_probe.py's runners (made without a GPU); vLLM's runner module
# imported with the plugin's hook installed first, as in a vLLM process
_RUNNER = """
import importlib.machinery, json, sys, warnings
from pathlib import Path
warnings.simplefilter("ignore")
import _vllm_probe as probe
from dsv41_aot import source, vllm as plugin
from dsv41_aot.aot import compat
from dsv41_aot.runtime.loader import Launcher
prebuilt, tree, calls = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
compat.install_aiter_shim()
src = source.MonoSource(Path(tree)) if tree else source.find()
plugin.install("strict", prebuilt=prebuilt, arch="gfx950")
mod = source.import_mono(src, "runner")
runners = probe.Runners(mod)

class Stream:  # what vLLM's runner passes: torch.cuda.current_stream()
    cuda_stream = 0x7E57

served, rooms, unbound, launched = set(), set(), [], []
for call in calls:
    got = probe.ask(runners, call)
    for launcher in got if isinstance(got, tuple) else (got,):
        assert isinstance(launcher, Launcher), (call, launcher)
        if launcher.key not in served:  # each launch the runner hands out, launched once as vLLM calls it
            launcher(*range(1, len(launcher.abi)), stream=Stream())
            launched.append(launcher.key)
        served.add(launcher.key)
        rooms.add(launcher._idx.room.release)
        if launcher._lib is None:
            unbound.append(launcher.key)
with open("/proc/self/maps") as f:
    maps = sorted({line.split(None, 5)[5].strip() for line in f if len(line.split(None, 5)) == 6})
print(json.dumps(dict(patched=bool(getattr(mod.build_mono_k1, "__dsv41_aot__", False)), served=sorted(served),
                      rooms=sorted(rooms), unbound=unbound, installed=plugin.installed(), maps=maps,
                      launched=launched)))
"""


def runner_calls(release: str) -> list:
    """Every call vLLM ``release``'s runners can make at gfx950 TP4 with the
    DSpark draft build_matrix.yaml names: deployment.py's
    runner_calls, what ``dsv41-aot coverage`` and ``doctor`` count keys by."""
    from dsv41_aot.aot import matrix
    from dsv41_aot import deployment as coverage

    draft = coverage.parse_draft("dspark", matrix.load().drafts)
    return coverage.runner_calls(coverage.deployment(ARCH, 4, draft=draft, release=release))


@pytest.mark.parametrize("release", [NEW, OLD])
def test_vllms_own_runner_is_served_every_key_of_its_room_bound(deployment, release, request, recording_hip,
                                                                  tmp_path):
    """vLLM's runner of ``release`` (0.33.0: the installed one; 0.32.0: its
    tree from fetch-vllm), patched strict by the plugin, asks for every launch
    it can at TP4: each is a bound prebuilt Launcher of its own room, none
    missing, and together they are every key of the room, and every key
    coverage's rules say those calls build (deployment.py: the rules
    ``dsv41-aot coverage`` and ``doctor`` judge a deployment by agree with
    vLLM's own runner). Each is launched once as vLLM calls it (a torch-like
    stream) through the recording HIP, the stand-in for the AMD GPU: HIP is
    handed that key's kernel and image, on that stream."""
    import _recording_hip as rh

    from dsv41_aot.room import Room

    tree = str(request.getfixturevalue("old_tree")) if release == OLD else ""
    calls = runner_calls(release)
    log = tmp_path / "hip.log"
    out = run(_RUNNER, deployment, tree, json.dumps([c.as_json() for c in calls]),
              env={"ARCH": ARCH, "FLYDSL_GPU_ARCH": ARCH, **rh.env(recording_hip, log, arch=ARCH)})
    entries = Room(deployment, ARCH, release).manifest().entries
    launches = rh.calls(log, "hipModuleLaunchKernel")
    assert sorted(out["launched"]) == out["served"] and all(c.status == 0 for c in launches)
    assert [(c["kernel"], c["module"], c["stream"]) for c in launches] == \
        [(entries[k].symbol, entries[k].code_object_sha256, "0x7e57") for k in out["launched"]]
    assert out["patched"] and not out["unbound"] and out["rooms"] == [release]
    assert set(out["served"]) == room_keys(deployment, release) and len(out["served"]) == SHIPPED[release][0]
    assert set(out["served"]) == {str(k) for c in calls for k in c.keys}
    assert out["installed"]["served_jit"] == 0
    assert memfd_bands(out["maps"]) == band_files(deployment, release)  # its room's bands, none of the other's
