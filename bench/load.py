"""Runtime figures on a real deployment, beside FlyDSL's JIT (the anchor), one run.

    .venv/bin/python bench/load.py [--dir DIR] [--runs 5] [--flydsl-keys 3] [--no-runner]

DIR is the shared full deployment by default (``../shared/prebuilt-gfx950-tp4``
beside the repository: what the gfx950 TP4 wheel installs, 1,152 keys of vLLM
0.33.0 and 0.32.0); any built and linked prebuilt folder works, a smoke build
too (``dsv41-aot build --profile smoke --out D && dsv41-aot link --dir D``).

Prints the issue-21 table, each figure the median (min-max) of ``--runs``
fresh processes beside its goal and the load average (1 min) it was measured
under, for the arch's room of the running vLLM (picked by its mono sources
digest, as in a vLLM process):

- ``import dsv41_aot``;
- Launchers for every key of that room: ``keys()`` + ``load_key`` each, from
  right after ``import dsv41_aot`` (so the loader's own first import is in it),
  broken down;
- the first bind: the first key vLLM asks for (K1 s=1 TP4 ratio 0 when the
  room has it), its band read, checked, decompressed and dlopened, entry and
  ABI checked; the libamdhip64 dlopen before it shown apart (a torch-ROCm
  process has it mapped already);
- every band of the deployment bound (``dsv41_aot.bind`` of every Launcher
  of the room, a fresh process: one thread per band, as many as the CPUs);
- vLLM's own runner (0.33.0), patched strict by the plugin: every launcher it
  can ask for at TP4 handed out and bound, one at a time as vLLM asks (the
  runner module's import, torch and FlyDSL, not counted), with the CPU and
  memory of its first band and of all of them.

Then the anchor, measured in the same run: FlyDSL's JIT compile of the first
keys vLLM asks for (cold cache), their first call from its warm disk cache
(timed up to where it stops for want of a GPU: loading the HIP module), both
extrapolated to the room's key count; and one launch's Python side.

No timing is asserted anywhere; these are measurements on this machine.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
SHARED = REPO.parent / "shared" / "prebuilt-gfx950-tp4"
FIRST_KEY = "k1@{arch}:s=1,tp=4,r=0"  # the first launch vLLM's runner asks for at TP4


# compiled bytecode, as an installed wheel has it (pip compiles it): this
# environment's PYTHONDONTWRITEBYTECODE would make every process compile the
# project's modules again (room.py alone ~6 ms); kept out of the tree
PYCACHE = tempfile.mkdtemp(prefix="dsv41-bench-pycache-")
atexit.register(shutil.rmtree, PYCACHE, True)


def py(code: str, *args, env: dict | None = None, timeout: int = 1800) -> dict:
    """``code`` in a fresh process: its last stdout line, as JSON."""
    full = dict(os.environ, PYTHONPATH=str(REPO), PYTHONPYCACHEPREFIX=PYCACHE)
    full.pop("PYTHONDONTWRITEBYTECODE", None)
    full.setdefault("DSV41_AOT_ALLOW_HIP_VERSION", "5.2")  # this CPU machine's Debian HIP stand-in
    full.update(env or {})
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *map(str, args)], capture_output=True,
                       text=True, env=full, timeout=timeout, cwd=REPO, check=False)
    if r.returncode:
        raise RuntimeError(f"bench subprocess failed:\n{r.stderr[-4000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def runs(n: int, code: str, *args, env: dict | None = None) -> tuple[list, tuple]:
    """``n`` fresh processes of ``code`` (after one not counted: bytecode
    written, files in the page cache), and the 1-minute load average before
    and after them."""
    py(code, *args, env=env)
    before = os.getloadavg()[0]
    out = [py(code, *args, env=env) for _ in range(n)]
    return out, (before, os.getloadavg()[0])


# one fresh process: Launchers for every key of the running vLLM's room, then
# either the first key's bind or every band's (MODE), libamdhip64 timed apart
PROCESS = """
import json, os, sys, time
root, arch, first, mode = sys.argv[1:5]
if mode == "stdlib":  # what a vLLM process has imported long before (vLLM, torch): left out of the figures
    import ctypes, dataclasses, datetime, hashlib, inspect, logging, pathlib, re, struct, threading
t0 = time.perf_counter()
import dsv41_aot
t1 = time.perf_counter()
from dsv41_aot.runtime import host, loader  # what the first dsv41_aot.keys() imports
t2 = time.perf_counter()
host.installed_vllm()  # the installed vLLM's mono sources digest (release_of computes it first thing)
t3 = time.perf_counter()
keys = dsv41_aot.keys(arch, prebuilt=root)  # picks the room, reads its manifest and libs.json
t4 = time.perf_counter()
launchers = [dsv41_aot.load_key(k, prebuilt=root) for k in keys]
t5 = time.perf_counter()
from dsv41_aot.runtime import hip
hip.load()
t6 = time.perf_counter()
if mode == "first":
    dsv41_aot.load_key(first if first in keys else keys[0], prebuilt=root).bind()
elif mode == "all":
    dsv41_aot.bind(launchers)
t7 = time.perf_counter()
bands = {l.library for l in launchers}
print(json.dumps(dict(import_s=t1 - t0, loader_import_s=t2 - t1, digest_s=t3 - t2, room_s=t4 - t3,
                      load_key_s=t5 - t4, launchers_s=t5 - t1, hip_s=t6 - t5, bind_s=t7 - t6, keys=len(keys),
                      release=launchers[0]._idx.room.release, bands=len(bands),
                      bound=sum(l._lib is not None for l in launchers))))
"""

# vLLM's own runner module, patched strict by the plugin before its import (as
# in a vLLM process), asked for every launch it can build at TP4
RUNNER = """
import json, os, resource, sys, time, warnings
warnings.simplefilter("ignore")
from pathlib import Path
root, arch, calls = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
from dsv41_aot import source, vllm as plugin
from dsv41_aot.aot import compat
compat.install_aiter_shim()  # aiter's FlyDSL helpers are not installable here: the project's stand-ins
plugin.install("strict", prebuilt=root, arch=arch)
t0 = time.perf_counter()
mod = source.import_mono(source.find(), "runner")
t1 = time.perf_counter()

def memory():
    # RSS, and the bytes of the memfds the bound bands live in (shared memory, in RSS only where touched)
    from dsv41_aot.runtime import state
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return {"rss": int(fields["VmRSS"].split()[0]) * 1024,
            "memfd": sum(os.fstat(fd).st_size for fd in state.current().fds.values())}

def runner(fields):
    r = object.__new__(mod.DSV41MonoLayer)  # no GPU: only what kernels() / ffn_kernel() read
    for name, value in {**dict(tp=4, timeline=False, experts=384, topk=6, ug_groups=2, swa_width=128), **fields}.items():
        setattr(r, name, value)
    r._kernels = {}
    return r

runners, handed = {}, 0
def ask(call):
    fields = call.pop() if isinstance(call[-1], dict) else {}
    which = json.dumps(fields, sort_keys=True)  # one runner per set of fields, as vLLM has one per layer kind
    r = runners.get(which)
    if r is None:
        r = runners[which] = runner(fields)
    got = r.kernels(*call[1:]) if call[0] == "kernels" else r.ffn_kernel(*call[1:])
    return got if isinstance(got, tuple) else (got,)

m0, c0 = memory(), time.process_time()
t2 = time.perf_counter()
handed += len(ask(calls[0]))
t3 = time.perf_counter()
m1, c1 = memory(), time.process_time()
for call in calls[1:]:
    handed += len(ask(call))
t4 = time.perf_counter()
m2, c2 = memory(), time.process_time()
from dsv41_aot.runtime import state
print(json.dumps(dict(import_s=t1 - t0, first_s=t3 - t2, all_s=t4 - t2, launchers=handed,
                      bands=len(state.current().libraries), served=plugin.installed(),
                      first_cpu_s=c1 - c0, all_cpu_s=c2 - c0,
                      first_rss=m1["rss"] - m0["rss"], all_rss=m2["rss"] - m0["rss"],
                      first_memfd=m1["memfd"] - m0["memfd"], all_memfd=m2["memfd"] - m0["memfd"])))
"""


def runner_calls(arch: str) -> list:
    """Every call vLLM 0.33.0's runners can make at TP4 with the DSpark draft
    (build_matrix.yaml's dspark draft), as JSON: deployment.py's
    runner_calls, the rules ``dsv41-aot coverage`` counts keys by. The first
    is the first launch a decode step asks for (K1/K2 of s=1, ratio 0)."""
    from dsv41_aot.aot import matrix
    from dsv41_aot import deployment as coverage

    draft = coverage.parse_draft("dspark", matrix.load().drafts)
    return [c.as_json() for c in coverage.runner_calls(coverage.deployment(arch, 4, draft=draft, release="0.33.0"))]


CALL = """
import json, sys, timeit
import dsv41_aot
from dsv41_aot.errors import LaunchError
root, arch = sys.argv[1:3]
every = dsv41_aot.keys(arch, prebuilt=root)
out = {}
for k in {k.split("@")[0]: k for k in every}.values():  # the call path depends on the ABI: one key per kind
    l = dsv41_aot.load_key(k, prebuilt=root)
    l.bind()
    l._ready = True  # no device: the C entry answers -1 (not initialized) without any HIP call
    args = list(range(len(l.abi) - 1))
    def call():
        try:
            l(*args, stream=0)
        except LaunchError:
            pass
    n = 100000
    out[k] = dict(slots=len(l.abi), us=min(timeit.repeat(call, number=n, repeat=3)) / n * 1e6)
print(json.dumps(out))
"""


def flydsl_side(arch: str, keys: list[str]) -> dict:
    """FlyDSL's JIT of ``keys`` (cold cache, each compiled without launching),
    then their first call from its warm disk cache in a new process, timed up
    to where it stops without a GPU (the HIP module load)."""
    from dsv41_aot.aot import compiler, toolchain

    tc = toolchain.find()
    cache = tempfile.mkdtemp(prefix="dsv41-bench-flydsl-")
    atexit.register(shutil.rmtree, cache, True)
    env = compiler.worker_env(arch, str(tc.rocm_path), cache)
    env["FLYDSL_RUNTIME_ENABLE_CACHE"] = "1"
    # FlyDSL's JIT runtime needs libamdhip64.so.7 to get as far as the launch;
    # Debian's ROCm 5.2 library stands in under that name (no GPU either way)
    shim = Path(cache) / "hip-shim"
    shim.mkdir()
    (shim / "libamdhip64.so.7").symlink_to(os.path.realpath("/usr/lib/x86_64-linux-gnu/libamdhip64.so"))
    warm_env = dict(env, LD_LIBRARY_PATH=f"{shim}:{os.environ.get('LD_LIBRARY_PATH', '')}")
    prelude = f"""
        import json, sys, time
        t0 = time.perf_counter()
        from dsv41_aot import source
        from dsv41_aot.aot import compat
        from dsv41_aot.keys import BuildKey
        from dsv41_aot.aot.compiler import typed_args
        from dsv41_aot.aot.flydsl_api import compile_without_launch
        from dsv41_aot.facts.kinds import KINDS
        compat.install_aiter_shim()
        src = source.find()
        layer = source.import_mono(src, "layer")
        import_s = time.perf_counter() - t0
        keys = {keys!r}
        def launcher(k):
            k = BuildKey.parse(k, src.version)  # a key of the installed vLLM, whose layer builds it
            return getattr(layer, KINDS[k.kind].builder)(layer.MonoBuild(**k.build_fields()))
    """
    cold = py(prelude + """
        out = {}
        for k in keys:
            t = time.perf_counter()
            f = launcher(k)
            compile_without_launch(f, typed_args(f))
            out[k] = time.perf_counter() - t
        print(json.dumps(dict(import_s=import_s, compile_s=out)))
    """, env=env)
    warm = py(prelude + """
        out, errs = {}, {}
        for k in keys:
            f = launcher(k)
            n = len(typed_args(f))
            t = time.perf_counter()
            try:
                f(*range(n), stream=None)
            except BaseException as e:  # no GPU: the launch itself fails after the cache load
                errs[k] = f"{type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''}"
            out[k] = time.perf_counter() - t
        print(json.dumps(dict(import_s=import_s, first_call_s=out, stopped_at=errs)))
    """, env=warm_env)
    return {"cold": cold, "warm": warm}


def figure(values: list, scale: float = 1e3, unit: str = "ms") -> str:
    med = statistics.median(values) * scale
    lo, hi = min(values) * scale, max(values) * scale
    digits = 1 if hi < 100 else 0
    return f"{med:.{digits}f} {unit} ({lo:.{digits}f}-{hi:.{digits}f})"


def load(pair: tuple) -> str:
    return f"{pair[0]:.2f}-{pair[1]:.2f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=str(SHARED), help=f"a built and linked prebuilt directory (default {SHARED})")
    ap.add_argument("--arch", default="gfx950")
    ap.add_argument("--runs", type=int, default=5, help="fresh processes per figure (default 5)")
    ap.add_argument("--flydsl-keys", type=int, default=3, help="keys FlyDSL JITs for the anchor (0: skip)")
    ap.add_argument("--no-runner", action="store_true", help="skip vLLM's runner (it imports torch and FlyDSL)")
    args = ap.parse_args()
    root = Path(args.dir).resolve()
    arch, n = args.arch, args.runs
    from dsv41_aot.listing import rooms_of

    rooms = rooms_of(root / arch)
    held = {r.release: len(r.manifest().entries) for r in rooms if r.manifest_path.is_file()}
    bands = {b.file: b for r in rooms if r.libs_path.is_file() for b in r.links().bands}
    first = FIRST_KEY.format(arch=arch)

    print(f"dsv41-aot runtime on {root}: {arch}, {sum(held.values()):,} keys "
          f"({', '.join(f'vLLM {v}: {k}' for v, k in held.items())}), {len(bands)} bands "
          f"({sum(b.bytes for b in bands.values()) / 1e6:.1f} MB xz, {sum(b.raw_bytes for b in bands.values()) / 1e6:.0f} "
          f"MB raw)")
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, no GPU; each figure: median (min-max) of {n} "
          f"fresh processes (after one not counted; bytecode cached, as installed); load: 1-minute load average "
          f"before-after\n")

    firsts, load_first = runs(n, PROCESS, root, arch, first, "first")
    alls, load_all = runs(n, PROCESS, root, arch, first, "all")
    warm, load_warm = runs(n, PROCESS, root, arch, first, "stdlib")
    f0 = firsts[0]
    rows = [("figure", "goal", "measured", "load"), ("---", "---", "---", "---")]
    both = firsts + alls
    rows.append(("import dsv41_aot", "<= 30 ms", figure([r["import_s"] for r in firsts]), load(load_first)))
    rows.append((f"Launchers for every key of {arch} ({f0['keys']} of the running vLLM's room, {f0['release']}): "
                 f"`keys()` + `load_key` each", "<= 50 ms", figure([r["launchers_s"] for r in both]),
                 f"{load(load_first)}, {load(load_all)}"))
    for name, field in (("the loader's first import (stdlib modules included)", "loader_import_s"),
                        ("the installed vLLM's mono sources digest", "digest_s"),
                        ("the room picked and read (manifest.json, libs.json)", "room_s"),
                        (f"`load_key` x {f0['keys']}", "load_key_s")):
        rows.append((f"&nbsp;&nbsp;of which {name}", "", figure([r[field] for r in both]), ""))
    rows.append(("&nbsp;&nbsp;the same where the stdlib modules vLLM imports first are imported (ctypes, "
                 "dataclasses, hashlib, json, pathlib, ...)", "", figure([r["launchers_s"] for r in warm]),
                 load(load_warm)))
    rows.append(("libamdhip64 dlopen (apart; a torch-ROCm process has it already)", "-",
                 figure([r["hip_s"] for r in both]), f"{load(load_first)}, {load(load_all)}"))
    rows.append((f"first bind: `{first}` (its band: read, sha256, xz, raw sha256, memfd, dlopen; entry, ABI)",
                 "<= 50 ms", figure([r["bind_s"] for r in firsts]), load(load_first)))
    a0 = alls[0]
    rows.append((f"every band of the TP4 deployment bound ({a0['bound']} keys, {a0['bands']} bands, "
                 f"`dsv41_aot.bind`: {os.cpu_count()} threads)", "<= 300 ms",
                 figure([r["bind_s"] for r in alls]), load(load_all)))
    runner = None
    if not args.no_runner:
        try:
            got, load_runner = runs(n, RUNNER, root, arch, json.dumps(runner_calls(arch)),
                                    env={"ARCH": arch, "FLYDSL_GPU_ARCH": arch})
            runner = got[0]
            rows.append((f"vLLM 0.33.0's runner, strict: all {runner['launchers']:,} launchers of {arch} TP4 "
                         f"(every layer kind, DSpark draft) handed out and bound as asked ({runner['bands']} bands)",
                         "-", figure([r["all_s"] for r in got]), load(load_runner)))
            rows.append(("&nbsp;&nbsp;of which its first call (K1 and K2 of s=1, ratio 0: the first band)", "",
                         figure([r["first_s"] for r in got]), ""))
        except RuntimeError as e:
            rows.append(("vLLM 0.33.0's runner, strict", "-", f"not measured: {str(e).splitlines()[-1][:80]}", ""))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    if runner is not None:
        print(f"\nvLLM's runner: its module's import (torch, FlyDSL, the mono package) "
              f"{figure([r['import_s'] for r in got], 1, 's')}, not counted above. Binding as asked: the first band "
              f"costs {runner['first_cpu_s'] * 1e3:.0f} ms CPU, {runner['first_memfd'] / 1e6:.1f} MB of memfd "
              f"(RSS +{runner['first_rss'] / 1e6:.1f} MB); all {runner['bands']} bands {runner['all_cpu_s'] * 1e3:.0f} "
              f"ms CPU, {runner['all_memfd'] / 1e6:.1f} MB of memfd (RSS +{runner['all_rss'] / 1e6:.1f} MB): "
              f"in each vLLM process (one per GPU)")

    call = py(CALL, root, arch)
    print("\nOne launch's Python side (real Launcher and library, the C entry answering -1 without a device): "
          + ", ".join(f"{k.split('@')[0]} {c['us']:.2f} us ({c['slots']} slots)" for k, c in call.items()))

    if args.flydsl_keys:
        room_keys = set(py("import json, sys, dsv41_aot; print(json.dumps(dsv41_aot.keys(sys.argv[2], "
                           "prebuilt=sys.argv[1])))", root, arch))
        sample = [k for k in (first, first.replace("k1@", "k2@"), f"ffn@{arch}:s=1,tp=4,r=0") if k in room_keys]
        sample = (sample or sorted(room_keys)[:1])[: args.flydsl_keys]
        load_before = os.getloadavg()[0]
        fly = flydsl_side(arch, sample)
        load_fly = (load_before, os.getloadavg()[0])
        cold = fly["cold"]["compile_s"]
        warm = fly["warm"]["first_call_s"]
        print(f"\nAnchor, FlyDSL's JIT (what vLLM does without dsv41-aot), the same run (load {load(load_fly)}): "
              f"import of flydsl + torch + the mono layer {fly['cold']['import_s']:.2f} s, then")
        print("| key | JIT compile (cold cache) | first call from its warm disk cache, up to the HIP module load |")
        print("| --- | --- | --- |")
        for k in sample:
            print(f"| `{k}` | {cold[k]:.2f} s | {warm[k] * 1e3:.0f} ms ({fly['warm']['stopped_at'].get(k, 'returned')}) |")
        keys = f0["keys"]
        print(f"| every key of the room ({keys}), extrapolated | {statistics.mean(cold.values()) * keys / 60:.0f} min "
              f"| {statistics.mean(warm.values()) * keys:.0f} s |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
