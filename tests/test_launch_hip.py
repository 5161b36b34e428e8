"""The launch path as HIP sees it, on the smoke build: what a Launcher's
first loads and launches hand HIP, and how a failure there is reported. HIP
is the recording HIP (dsv41_aot/aot/hiprec/recording_hip.c), the suite's one
stand-in for the AMD GPU (MOCK-GPU): the band's real exported host code runs,
and each test reads back the calls it made, by process.

- fork: a child of a process that had used HIP refuses with ForkError (HIP
  does not survive fork; docs/loader.md says why this and not a reload),
  making no HIP call at all; a child forked before any HIP use loads its own.
- devices: a Launcher used on another device loads its module there first,
  after reading that device's own arch (the recording HIP gives each its own).
- errors: a failing hipModuleLoadData, hipModuleGetFunction or
  hipModuleLaunchKernel is named, with its status and a fix that fits.
- wrong arguments: refused before any launch, naming the argument.
- exit: nothing is unloaded (docs/loader.md: a hung persistent kernel must
  not keep the process from exiting).
- the first load's refusals (capture, arch) and one load for many threads.
"""

from __future__ import annotations

import json

import pytest
import _recording_hip as rh

from dsv41_aot.facts.releases import NEWEST
from dsv41_aot.keys import BuildKey
from dsv41_aot.runtime.hip import FIX_DEVICE

K1 = "k1@gfx950:s=4,tp=4,r=1"
K2 = "k2@gfx950:s=4,tp=4,r=1"

# a prelude for each process: the smoke build, K1's Launcher, a call with distinct values
_PRELUDE = """
import json, os, sys
import dsv41_aot
from dsv41_aot.errors import LaunchError
from dsv41_aot.runtime import hip, state
root = sys.argv[1]
def launcher(key={k1!r}):
    return dsv41_aot.load_key(key, prebuilt=root)
def launch(l, stream=0x5150):
    l(*range(100, 100 + len(l.abi) - 1), stream=stream)
def set_device(d):
    assert hip.load().lib.hipSetDevice(d) == 0
""".format(k1=K1)


@pytest.fixture(scope="module")
def smoke(smoke_dir):
    return smoke_dir


def run(code: str, smoke, recording_hip, tmp_path, **opts):
    """``code`` after the prelude in a fresh process on the recording HIP:
    (its last stdout line as JSON, or None; every HIP call it and its children made)."""
    log = tmp_path / "hip.log"
    proc = rh.python(_PRELUDE + code, smoke, env=rh.env(recording_hip, log, **opts), timeout=120)
    lines = proc.stdout.strip().splitlines()
    return (json.loads(lines[-1]) if lines else None), rh.calls(log)


def names(calls, pid=None) -> list:
    return [c.name for c in calls if pid is None or c.pid == pid]


# ---------------------------------------------------------------- fork


_FORK = """
l = launcher()
{before}
state.current().lock.acquire()  # another thread holding the lock at fork time
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    try:
        launch(l)
        out = dict(launched=True)
    except LaunchError as e:
        out = dict(error=type(e).__name__, message=str(e))
    out.update(lock=state.current().lock.acquire(timeout=5), same=launcher() is l, pid=os.getpid())
    os.write(w, json.dumps(out).encode())
    os._exit(0)
os.close(w)
child = json.loads(os.read(r, 65536))
os.waitpid(pid, 0)
print(json.dumps(dict(child=child, parent=os.getpid())))
"""


def test_a_child_forked_after_its_parent_used_hip_refuses_naming_fork(smoke, recording_hip, tmp_path):
    out, calls = run(_FORK.format(before="launch(l)"), smoke, recording_hip, tmp_path)
    child = out["child"]
    assert child["error"] == "ForkError" and child["lock"] and child["same"]
    assert "was forked from pid" in child["message"] and "HIP does not survive fork()" in child["message"]
    assert "spawn" in child["message"] and "VLLM_WORKER_MULTIPROC_METHOD=spawn" in child["message"]
    # the child made no HIP call at all: not with the parent's function handle, not a reload
    assert names(calls, child["pid"]) == []
    assert names(calls, out["parent"]).count("hipModuleLaunchKernel") == 1


def test_a_child_forked_before_any_hip_use_loads_its_own_module(smoke, recording_hip, tmp_path):
    out, calls = run(_FORK.format(before="l.bind()"), smoke, recording_hip, tmp_path)
    child = out["child"]
    assert child["launched"] and child["lock"] and child["same"]
    mine = [c for c in calls if c.pid == child["pid"]]
    assert [c.name for c in mine if c.name.startswith("hipModule")] == \
        ["hipModuleLoadData", "hipModuleGetFunction", "hipModuleLaunchKernel"]
    lookup, launched = mine[-3:][1], [c for c in mine if c.name == "hipModuleLaunchKernel"][0]
    assert launched.status == 0 and launched["fn"] == lookup["fn"]
    assert names(calls, out["parent"]) == ["hipRuntimeGetVersion"]  # the parent only bound the band


# ---------------------------------------------------------------- devices


_DEVICES = """
l, other = launcher(), launcher({k2!r})
launch(l)
set_device(1)
launch(l)              # loads on device 1 first
dsv41_aot.preload([other], prebuilt=root)   # preload loads on the current device (1)
launch(other)
set_device(0)
launch(l)              # device 0's module again: no load
launch(other)          # loads on device 0
print(json.dumps(dict(devices=sorted(l._devices), other=sorted(other._devices))))
""".format(k2=K2)


def test_a_launcher_used_on_another_device_loads_its_module_there_first(smoke, recording_hip, tmp_path):
    out, calls = run(_DEVICES, smoke, recording_hip, tmp_path, devices=2)
    assert out == {"devices": [0, 1], "other": [0, 1]}
    seen = [(c.name, c["kernel"] if "kernel" in c.fields else c["sha256"][:8], c["device"])
            for c in calls if c.name in ("hipModuleLoadData", "hipModuleLaunchKernel")]
    k1, k2 = (c["kernel"] for c in calls if c.name == "hipModuleGetFunction" and c["device"] == "0")
    launches = [c for c in calls if c.name == "hipModuleLaunchKernel"]
    assert [(c["kernel"], c["device"]) for c in launches] == [(k1, "0"), (k1, "1"), (k2, "1"), (k1, "0"), (k2, "0")]
    assert all(c.status == 0 and c["fn_device"] == c["device"] for c in launches), seen
    assert [c["device"] for c in calls if c.name == "hipModuleLoadData"] == ["0", "1", "1", "0"]


_DEVICE_ARCH = """
from dsv41_aot.errors import ArchMismatchError
l, out = launcher(), []
for d in (1, 0):  # device 1 first: its arch is read before device 0's
    set_device(d)
    try:
        launch(l)
        out.append(None)
    except ArchMismatchError as e:
        out.append(str(e))
print(json.dumps([out, sorted(l._devices)]))
"""


@pytest.mark.parametrize("archs", ["gfx950,gfx942", "gfx942,gfx950"], ids=["device-1-other", "device-0-other"])
def test_each_device_s_arch_is_read_for_its_first_load(smoke, recording_hip, tmp_path, archs):
    """A gfx950 key loads only on the device that is gfx950, whichever of two
    it is: each device's own arch is read (P13d of the fault report at
    24a0152: once per process; S07: device 0's for every device)."""
    out, calls = run(_DEVICE_ARCH, smoke, recording_hip, tmp_path, devices=2, arch=archs)
    ours = archs.split(",").index("gfx950")
    for d, got in zip((1, 0), out[0]):
        if d == ours:
            assert got is None, out
        else:
            assert f"built for gfx950, but the current device is gfx942 (device {d})" in got, out
    assert out[1] == [ours]
    assert [c["device"] for c in calls if c.name == "hipModuleLoadData"] == [str(ours)]


@pytest.mark.parametrize("opts,why,status", [
    (dict(fail="hipGetDevicePropertiesR0600=100"), "hipGetDeviceProperties failed", 100),
    (dict(arch=""), "its properties name no gfx arch", 0),
], ids=["call-failed", "no-arch-named"])
def test_a_device_whose_arch_cannot_be_read_loads_nothing(smoke, recording_hip, tmp_path, opts, why, status):
    """A failing hipGetDeviceProperties, or properties that name no gfx arch,
    are no answer: the load is refused naming why, never taken for a device
    of the key's arch (P13d), nor for one of another arch (S06)."""
    code = """
try:
    launch(launcher())
    print(json.dumps(None))
except LaunchError as e:
    print(json.dumps([str(e), e.fix, e.status, type(e).__name__]))
"""
    out, calls = run(code, smoke, recording_hip, tmp_path, **opts)
    assert out is not None, "launched on a device whose arch it could not read"
    assert "cannot tell the arch of device 0" in out[0] and why in out[0], out
    assert out[0].startswith(K1) and out[2] == status and "rocm-smi" in out[1] and out[3] == "LaunchError"
    assert not [c for c in calls if c.name.startswith("hipModule")]


# ---------------------------------------------------------------- errors


_FAIL = """
l = launcher()
out = []
for _ in range(2):
    try:
        launch(l)
        out.append(None)
    except LaunchError as e:
        out.append(dict(cls=type(e).__name__, status=e.status, message=str(e)))
print(json.dumps(out))
"""


@pytest.mark.parametrize("fail,call,status,fix", [
    ("hipModuleLoadData=209", "hipModuleLoadData", "hipErrorNoBinaryForGpu (209)", "rocminfo"),
    ("hipModuleGetFunction=500", "hipModuleGetFunction", "hipErrorNotFound (500)", "the band does not hold the kernel"),
    ("hipModuleLaunchKernel=701", "hipModuleLaunchKernel", "hipErrorLaunchOutOfResources (701)",
     "no other kernel holds the device's CUs (rocm-smi)"),
    ("hipModuleLaunchKernel=1@2", "hipModuleLaunchKernel", "hipErrorInvalidValue (1)", "stream"),
    ("hipModuleLoadData=2", "hipModuleLoadData", "hipErrorOutOfMemory (2)", "free device memory on device 0"),
    ("hipModuleLoadData=999", "hipModuleLoadData", "hipErrorUnknown (999)", FIX_DEVICE),
    ("hipModuleLaunchKernel=98", "hipModuleLaunchKernel", "hipErrorInvalidDeviceFunction (98)",
     FIX_DEVICE + "; FlyDSL's runtime prints the failing call on stderr"),
], ids=["load", "lookup", "launch", "launch-after-a-success", "load-out-of-memory", "load-other", "launch-other"])
def test_a_failing_hip_call_is_named_with_its_status_and_a_fitting_fix(smoke, recording_hip, tmp_path, fail,
                                                                       call, status, fix):
    out, calls = run(_FAIL, smoke, recording_hip, tmp_path, fail=fail)
    failed = [c for c in calls if c.status != 0]
    assert failed and {c.name for c in failed} == {call}  # the stand-in failed that call, and only it
    errors = [e for e in out if e is not None]
    assert errors, out
    first = errors[0]
    assert first["status"] == int(status.split("(")[1][:-1])
    assert f"{K1}: {call} " in first["message"] and status in first["message"], first["message"]
    assert fix in first["message"].split("fix:")[-1], first["message"]
    if fix.startswith(FIX_DEVICE):  # the general fix, for a status no other fits: given whole
        assert first["message"].endswith(f"\n  fix: {fix}"), first["message"]
    others = {"hipModuleLoadData", "hipModuleGetFunction", "hipModuleLaunchKernel"} - {call}
    assert not any(f"{o} " in first["message"].split("(")[0] for o in others), first["message"]
    if fail.endswith("@2"):  # the second launch failed: the first went through, no lookup was needed to tell
        assert out[0] is None and names(calls).count("hipModuleLoadData") == 1


def test_a_failed_launch_whose_device_cannot_be_read_names_no_device_number(smoke, recording_hip, tmp_path):
    """A launch fails, and hipGetDevice fails too as the error is explained (its fourth call: the arch, the band's
    load, the launch, then the explanation): the error says "on the current device", never a number HIP did not
    give; the next failure, its device read, names device 0."""
    out, calls = run(_FAIL, smoke, recording_hip, tmp_path, fail="hipModuleLaunchKernel=701,hipGetDevice=1@4")
    assert [c.status for c in calls if c.name == "hipGetDevice"][:5] == [0, 0, 0, 1, 0], names(calls)
    said = " failed: hipErrorLaunchOutOfResources (701)"
    assert [e["message"].split("\n")[0] for e in out] == [
        f"{K1}: hipModuleLaunchKernel of {BuildKey.parse(K1, NEWEST).kernel_symbol} {where}{said}"
        for where in ("on the current device", "on device 0")], out


def test_a_capture_query_that_fails_is_named_with_its_key_and_loads_nothing(smoke, recording_hip, tmp_path):
    """A failed hipStreamIsCapturing is no answer (never "not capturing"): the first launch fails naming the
    key, the call and its status, and no module is loaded."""
    out, calls = run(_FAIL, smoke, recording_hip, tmp_path, fail="hipStreamIsCapturing=1")
    first = next(e for e in out if e is not None)
    assert first["message"].startswith(f"{K1}: cannot tell whether stream 0x5150 is being captured: "
                                       "hipStreamIsCapturing failed with hipErrorInvalidValue (1)"), first
    assert "hipModuleLoadData" not in names(calls), names(calls)


# ---------------------------------------------------------------- wrong arguments


_WRONG = """
l = launcher()
n = len(l.abi) - 1
cases = [
    (list(range(n - 1)), {}),
    (list(range(n + 1)), {}),
    ([*range(n - 1), 1.5], {}),
    ([*range(24), 2**31, *range(n - 25)], {}),
    ([*range(n - 1), "x"], {}),
    (list(range(n)), {"stream": "s"}),
]
out = []
for args, kw in cases:
    try:
        l(*args, **kw)
        out.append(None)
    except LaunchError as e:
        out.append([str(e), hasattr(e, "status")])
l(*range(n), stream=None)  # the right arguments are launched
print(json.dumps(dict(n=n, refused=out, repr=repr(l))))
"""


def test_wrong_arguments_are_refused_before_any_launch(smoke, recording_hip, tmp_path):
    out, calls = run(_WRONG, smoke, recording_hip, tmp_path)
    assert out["n"] == 40
    assert out["repr"].startswith(f"<Launcher {K1} ") and out["repr"].endswith(" (40 args + stream)>"), out["repr"]
    whys = ["takes 40 positional integers", "got 41", "argument 'tl' (int64) got 1.5",
            "argument 'swa_block' (int32) got 2147483648", "argument 'tl'", "not a HIP stream"]
    for why, got in zip(whys, out["refused"]):
        assert got is not None and why in got[0] and not got[1], (why, got)
        # each names the key (P13g of the fault report at 24a0152: a bad stream named none) and launched nothing
        assert got[0].startswith(K1) and "nothing was launched" in got[0], got
    (launch,) = [c for c in calls if c.name == "hipModuleLaunchKernel"]  # only the right call's
    assert launch.status == 0 and launch["stream"] == "0"


# ---------------------------------------------------------------- exit


def test_at_exit_nothing_is_unloaded(smoke, recording_hip, tmp_path):
    out, calls = run("launch(launcher()); print(1)", smoke, recording_hip, tmp_path)
    assert out == 1 and "hipModuleLaunchKernel" in names(calls)
    assert "hipModuleUnload" not in names(calls) and "hipDeviceSynchronize" not in names(calls)


# ---------------------------------------------------------------- the first load's refusals, one load for all


_REFUSED = """
from dsv41_aot.errors import ArchMismatchError, CaptureError
l = launcher()
out = []
for step in (lambda: dsv41_aot.preload([l], prebuilt=root), lambda: launch(l)):
    try:
        step()
        out.append(None)
    except (ArchMismatchError, CaptureError) as e:
        out.append([type(e).__name__, str(e)])
print(json.dumps(out))
"""


@pytest.mark.parametrize("opts,error,why,fix", [
    (dict(capturing=True), "CaptureError", "inside a HIP/CUDA graph capture",
     "call it once eagerly before capturing, or dsv41_aot.preload([...]) its keys at start-up"),
    (dict(arch="gfx942"), "ArchMismatchError", "built for gfx950, but the current device is gfx942",
     "install the gfx942 kernels (or unset DSV41_AOT_ARCH)"),
], ids=["capture", "arch"])
def test_a_first_load_is_refused_inside_a_capture_and_on_another_arch(smoke, recording_hip, tmp_path, opts,
                                                                      error, why, fix):
    out, calls = run(_REFUSED, smoke, recording_hip, tmp_path, **opts)
    assert [e[0] for e in out] == [error, error] and all(why in e[1] for e in out)
    assert all(e[1].endswith(f"\n  fix: {fix}") for e in out), out
    assert not [c for c in calls if c.name.startswith("hipModule")]  # nothing loaded, nothing launched


_TORCH = """
import types
from dsv41_aot.errors import CaptureError
def capturing():
    {torch}
cuda = types.SimpleNamespace(is_available=lambda: True, is_current_stream_capturing=capturing)
sys.modules["torch"] = types.SimpleNamespace(cuda=cuda)  # torch.cuda of a process on a GPU, mid-capture or not
try:
    launch(launcher())
    print(json.dumps(None))
except CaptureError as e:
    print(json.dumps(str(e)))
"""


@pytest.mark.parametrize("torch, hip_capturing, refused", [
    ("return True", False, True),
    ("return False", True, True),
    ("raise RuntimeError('no HIP GPUs are available')", False, False),
], ids=["torch-capturing", "hip-capturing", "torch-cannot-tell"])
def test_a_capture_torch_or_hip_reports_refuses_the_first_load(smoke, recording_hip, tmp_path, torch,
                                                               hip_capturing, refused):
    """In a process that imported torch, a graph capture either torch or HIP reports refuses the first load;
    a torch that cannot answer leaves HIP's answer. A stand-in torch.cuda plays the GPU's capture state (no
    AMD GPU here); the recording HIP plays the device."""
    out, calls = run(_TORCH.format(torch=torch), smoke, recording_hip, tmp_path, capturing=hip_capturing)
    loads = [c for c in calls if c.name == "hipModuleLoadData"]
    if refused:
        assert out is not None and out.startswith(f"{K1}: first load of its code object inside a HIP/CUDA graph "
                                                  "capture"), out
        assert not loads
    else:
        assert out is None and len(loads) == 1, out


_RESOLVE = """
from dsv41_aot.errors import HipUnavailableError
from dsv41_aot.runtime import host
{before}
try:
    print(json.dumps(host.resolve_arch()))
except HipUnavailableError as e:
    print(json.dumps(str(e)))
"""
NO_DEVICE = "no HIP device to read the GPU architecture from"


@pytest.mark.parametrize("before, opts, said", [
    ("", dict(arch="gfx942"), "gfx942"),
    ("set_device(1)", dict(arch="gfx950,gfx942", devices=2), "gfx942"),
    ("", dict(devices=0), NO_DEVICE),
    ("", dict(fail="hipGetDeviceCount=100"), NO_DEVICE),
    ("", dict(fail="hipGetDevice=100"), NO_DEVICE),
    ("", dict(fail="hipGetDevicePropertiesR0600=100"), NO_DEVICE),
], ids=["device", "current-device", "no-device", "count-fails", "current-fails", "properties-fail"])
def test_an_arch_not_named_is_the_current_device_s(smoke, recording_hip, tmp_path, before, opts, said):
    """With no arch given and DSV41_AOT_ARCH unset (how vLLM's plugin asks), the arch is the current HIP
    device's; no device, or one whose arch HIP cannot tell, is no arch at all."""
    out, _ = run(_RESOLVE.format(before=before), smoke, recording_hip, tmp_path, **opts)
    assert out == said or out.startswith(said + "\n  fix: "), out


_INIT_FAILS = """
l = launcher()
try:
    launch(l)
    print(json.dumps(None))
except LaunchError as e:
    print(json.dumps([e.message, e.fix]))
"""


def test_a_module_init_that_fails_is_named_and_nothing_is_loaded(smoke, recording_hip, tmp_path):
    """FlyDSL's ``<entry>__module_init`` sets up its host state before any HIP call; one that returns a nonzero
    status stops the first load, named with the status and its fix. The case: a band forged (libs.json made to
    match) whose K1 init is ``mov eax, 7; ret``, which nothing but a forger or a broken export makes."""
    import lzma

    from _smoke import band_of, copy_of, forge_library, libdir, libs_json

    from dsv41_aot.elf import SHT_DYNSYM, Elf
    from dsv41_aot.manifest import entry_name

    d = copy_of(smoke, tmp_path / "p")
    path, doc = libs_json(d)
    lib = band_of(doc, K1)
    raw = bytearray(lzma.decompress((libdir(d, "gfx950") / lib["file"]).read_bytes()))
    elf = Elf(bytes(raw))
    (sym,) = [s for s in elf.symbols(SHT_DYNSYM) if s.name == entry_name(K1) + "__module_init"]
    text = elf.sections[sym.shndx]
    at = text.offset + sym.value - text.addr
    raw[at:at + 6] = b"\xb8\x07\x00\x00\x00\xc3"  # x86-64: return 7
    forge_library(d, "gfx950", path, doc, lib, raw)
    out, calls = run(_INIT_FAILS, d, recording_hip, tmp_path)
    assert out is not None, "the forged init's failure was never raised"
    message, fix = out
    assert message.startswith(f"{K1}: {entry_name(K1)}__module_init failed: ") and fix == "check the host's free memory"
    assert not [c for c in calls if c.name.startswith("hipModule")]  # nothing loaded, nothing launched


_THREADS = """
import threading
ts = [threading.Thread(target=dsv41_aot.preload, args=([{k1!r}],), kwargs=dict(prebuilt=root)) for _ in range(8)]
for t in ts:
    t.start()
for t in ts:
    t.join()
l = launcher()
for _ in range(3):
    launch(l)
print(json.dumps(sorted(l._devices)))
""".format(k1=K1)


def test_eight_threads_preloading_one_key_load_it_once(smoke, recording_hip, tmp_path):
    out, calls = run(_THREADS, smoke, recording_hip, tmp_path)
    assert out == [0]
    modules = [c for c in calls if c.name.startswith("hipModule")]
    assert [c.name for c in modules] == ["hipModuleLoadData", "hipModuleGetFunction"] + ["hipModuleLaunchKernel"] * 3
