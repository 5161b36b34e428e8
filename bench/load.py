"""Runtime figures: the prebuilt loader beside FlyDSL's own JIT paths, one run.

    python bench/load.py --dir DIR [--arch gfx950] [--flydsl-keys 3] [--old-ref REF]

Prints, for the keys of one arch in DIR (a built and linked prebuilt folder)
of the installed vLLM's release (its room, picked by its mono sources digest):

- import time of the runtime (``import dsv41_aot.runtime.loader`` in a fresh process)
  beside the import FlyDSL's path needs (flydsl, torch, vLLM's mono layer);
- a fresh process to Launchers for every key of DIR/ARCH (manifest read,
  checks), then binding: the first band alone (read, sha256, xz, sha256,
  memfd, dlopen, entry, ABI check), every band of one deployment (the first
  key's TP), then every band of the room; beside the same on the old layout
  (git ``--old-ref``: one manifest an arch, raw .so libraries, sha256 of the
  file then dlopen of its path), linked by that tree from the same objects
  (the room's manifest written back as that tree's schema 1);
- Python-side cost of one launch up to the C call: the real
  ``Launcher.__call__`` on the real library, the module marked loaded without
  a device, so the C entry returns FLYDSL_AOT_ERR_NOT_INITIALIZED with no HIP
  call; shown as pack + C call into one shared buffer (the old, racy path),
  the same through this thread's buffer (the new path: a threading.local
  lookup more), and the whole ``__call__`` including the LaunchError it
  then raises;
- FlyDSL's JIT compile of the same keys (cold cache), and the first call from
  its warm disk cache, timed up to where it fails for want of a GPU.

No timing is asserted anywhere; these are measurements on this machine.
"""

from __future__ import annotations

import argparse
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


def py(code: str, env: dict | None = None, timeout: int = 1800) -> str:
    full = dict(os.environ, PYTHONPATH=str(REPO))
    full.setdefault("DSV41_AOT_ALLOW_HIP_VERSION", "5.2")  # this CPU machine's Debian HIP stand-in
    full.update(env or {})
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=full,
                       timeout=timeout, cwd=full["PYTHONPATH"])  # the cwd comes first on sys.path
    if r.returncode:
        raise SystemExit(f"bench subprocess failed:\n{r.stderr[-4000:]}")
    return r.stdout.strip().splitlines()[-1]


def median_of(n: int, code: str, env: dict | None = None) -> float:
    return statistics.median(float(py(code, env)) for _ in range(n))


# a serving process imported these long before the loader runs (vLLM and torch
# do): the second timing leaves out their first import
VLLM_STDLIB = "import dataclasses, inspect, pathlib, re, hashlib, ctypes, struct, threading, logging, difflib, json\n"

READY = """
import json, os, time
t0 = time.perf_counter()
import dsv41_aot
from dsv41_aot.runtime import hip, host, loader
t1 = time.perf_counter()
host._installed_vllm()
tv = time.perf_counter()
keys = loader.keys(ARCH, prebuilt=ROOT)
t2 = time.perf_counter()
ls = [dsv41_aot.load_key(k, prebuilt=ROOT) for k in keys]
t3 = time.perf_counter()
ls2 = [dsv41_aot.load_key(k, prebuilt=ROOT) for k in keys]
t4 = time.perf_counter()
# what first calls (or preload) add before their GPU work: libamdhip64, then
# each band (or old library) verified and dlopened, each entry resolved
hip.load()
th = time.perf_counter()
ls[0].bind()
tb = time.perf_counter()
tp = ls[0].key.split("tp=")[1].split(",")[0]
deployment = [l for l in ls if l.key.split("tp=")[1].split(",")[0] == tp]
for l in deployment:
    l.bind()
td = time.perf_counter()
for l in ls:
    l.bind()
t5 = time.perf_counter()
libs = {l.library for l in ls}
dep_libs = {l.library for l in deployment}
print(json.dumps(dict(keys=len(keys), import_s=t1 - t0, vllm_digest_s=tv - t1, index_s=t2 - tv,
                      launchers_s=t3 - t2, again_s=t4 - t3, total_s=t3 - t0, hip_s=th - t4,
                      first_band_s=tb - th, deployment=f"tp={tp}", deployment_keys=len(deployment),
                      deployment_bands=len(dep_libs), deployment_s=td - th, bind_s=t5 - th,
                      libraries=len(libs), library_bytes=sum(os.path.getsize(p) for p in libs))))
"""


def runtime_side(root: Path, arch: str, tree: Path = REPO) -> dict:
    out = {}
    env = {"PYTHONPATH": str(tree)}
    out["import_s"] = median_of(5, """
        import time; t = time.perf_counter(); import dsv41_aot.runtime.loader; print(time.perf_counter() - t)""", env)
    consts = f"ARCH, ROOT = {arch!r}, {str(root)!r}\n"
    out["ready"] = json.loads(py(consts + READY, env))
    out["ready_in_vllm"] = json.loads(py(VLLM_STDLIB + consts + READY, env))
    if tree != REPO:
        return out
    call = json.loads(py(f"""
        import ctypes, json, timeit
        import dsv41_aot
        from dsv41_aot.errors import LaunchError
        out = {{}}
        every = __import__("dsv41_aot.runtime.loader").runtime.loader.keys({arch!r}, prebuilt={str(root)!r})
        # the call path depends on the ABI only: time one key of each launch kind
        sample = {{k.split("@")[0]: k for k in every}}.values()
        for k in sample:
            l = dsv41_aot.load_key(k, prebuilt={str(root)!r})
            l.bind()
            l._ready = True  # no device: the C entry answers -1 (not initialized) without any HIP call
            args = list(range(len(l.abi) - 1))
            abi, pack, c = l._abi, l._pack, l._call
            shared = ctypes.create_string_buffer(abi.struct.size)
            argv = abi.argv_type(*[ctypes.addressof(shared) + off for off in abi.offsets])
            assert c(argv) == -1
            l._thread_buffer()
            tls = l._tls
            def old():  # one buffer per Launcher: what two threads raced on
                pack(shared, 0, *args, 0); c(argv)
            def new():  # this thread's buffer
                b, v = tls.args
                pack(b, 0, *args, 0); c(v)
            def full():
                try:
                    l(*args, stream=0)
                except LaunchError:
                    pass
            n = 100000
            best = lambda f: min(timeit.repeat(f, number=n, repeat=3)) / n * 1e6
            out[k] = dict(slots=len(l.abi), shared_us=best(old), thread_us=best(new), call_raise_us=best(full))
        print(json.dumps(out))
    """))
    out["call"] = call
    return out


def as_old_layout(root: Path, dest: Path) -> Path:
    """The installed vLLM's rooms of ``root`` as the old tree reads a prebuilt
    dir: ``<arch>/manifest.json`` (schema 1: no release, no mono_sources) beside
    the same objects; ``bench._old.old_prebuilt`` links it with that tree."""
    from dsv41_aot.manifest import MANIFEST, OBJECTS, arch_dirs
    from dsv41_aot.room import Room
    from dsv41_aot.runtime import loader

    for arch_dir in arch_dirs(root):
        man = Room(root, arch_dir.name, loader.release_of(root, arch_dir.name)).manifest()
        # schema 1: no release, no mono_sources, each key's compile seconds in its entry
        doc = {"schema": 1, "arch": man.arch, "abis": man.abis, "refused": man.refused,
               "entries": {k: dict(e, compile_seconds=man.timings.get(k, 0.0)) for k, e in man.entries.items()}}
        (dest / arch_dir.name).mkdir(parents=True)
        (dest / arch_dir.name / MANIFEST).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        shutil.copytree(arch_dir / OBJECTS, dest / arch_dir.name / OBJECTS)
    return dest


def flydsl_side(arch: str, keys: list[str]) -> dict:
    from dsv41_aot.aot import compiler, toolchain

    tc = toolchain.find()
    cache = tempfile.mkdtemp(prefix="dsv41-bench-flydsl-")
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
        from dsv41_aot.facts.kinds import KINDS
        compat.install_aiter_shim()
        layer = source.import_mono(source.find(), "layer")
        import_s = time.perf_counter() - t0
        keys = {keys!r}
        def launcher(k):
            k = BuildKey.parse(k)
            return getattr(layer, KINDS[k.kind].builder)(layer.MonoBuild(**k.build_fields()))
    """
    cold = json.loads(py(prelude + """
        out = {}
        for k in keys:
            t = time.perf_counter()
            f = launcher(k)
            f._compile_or_execute(typed_args(f), {}, execute=False)
            out[k] = time.perf_counter() - t
        print(json.dumps(dict(import_s=import_s, compile_s=out)))
    """, env))
    warm = json.loads(py(prelude + """
        out, errs = {}, {}
        for k in keys:
            f = launcher(k)
            n = len(typed_args(f))
            t = time.perf_counter()
            try:
                f(*range(n), stream=None)
            except BaseException as e:  # no GPU: the launch itself fails after the cache load
                errs[k] = f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
            out[k] = time.perf_counter() - t
        print(json.dumps(dict(import_s=import_s, first_call_s=out, stopped_at=errs)))
    """, warm_env))
    return {"cold": cold, "warm": warm, "cache": cache}


def main() -> int:
    from bench._old import OLD_REF, old_prebuilt, old_tree

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", required=True, help="a built and linked prebuilt directory")
    ap.add_argument("--arch", default="gfx950")
    ap.add_argument("--flydsl-keys", type=int, default=3, help="keys to JIT through FlyDSL (seconds each; 0: skip)")
    ap.add_argument("--old-ref", default=OLD_REF, help=f"git ref of the old raw-library layout (default {OLD_REF})")
    args = ap.parse_args()
    root = Path(args.dir).resolve()

    rt = runtime_side(root, args.arch)
    tmp = Path(tempfile.mkdtemp(prefix="dsv41-bench-load-old-"))
    old_src = old_tree(args.old_ref, tmp / "src")
    old = runtime_side(old_prebuilt(old_src, as_old_layout(root, tmp / "old-layout"), tmp / "prebuilt"), args.arch,
                       old_src)
    ready, calls, o = rt["ready"], rt["call"], old["ready"]
    by_kind = {}
    for k in sorted(calls):
        by_kind.setdefault(k.split("@")[0], k)
    sample = list(by_kind.values())[: args.flydsl_keys]
    fly = flydsl_side(args.arch, sample) if sample else None

    ms = lambda s: f"{s * 1e3:9.1f} ms"  # noqa: E731
    print(f"dsv41-aot runtime, {args.arch}, {ready['keys']} prebuilt keys in {root}")
    print(f"  (python {sys.version.split()[0]}, {os.cpu_count()} CPUs, no GPU; old = git {args.old_ref})\n")
    print(f"{'':52}{'old':>12}{'new':>12}")
    print(f"{'import (fresh process)':52}{ms(old['import_s']):>12}{ms(rt['import_s']):>12}")
    print(f"{'launchers for every key, fresh process':52}{ms(o['total_s']):>12}{ms(ready['total_s']):>12}"
          f"   target <= 50 ms")
    w, wo = rt["ready_in_vllm"], old["ready_in_vllm"]
    print(f"{'  the same where vLLM already imported the stdlib':52}{ms(wo['total_s']):>12}{ms(w['total_s']):>12}")
    print(f"  of which (new): import {ready['import_s']*1e3:.1f} ms, vLLM mono digest {ready['vllm_digest_s']*1e3:.1f} ms, "
          f"manifest {ready['index_s']*1e3:.1f} ms, load_key x {ready['keys']} {ready['launchers_s']*1e3:.1f} ms")
    print(f"{'libamdhip64 dlopen (none in a torch-ROCm process)':52}{ms(o['hip_s']):>12}{ms(ready['hip_s']):>12}")
    print(f"{'bind the first band (one key)':52}{ms(o['first_band_s']):>12}{ms(ready['first_band_s']):>12}"
          f"   target <= 50 ms")
    dep = f"bind a deployment ({ready['deployment']}: {ready['deployment_keys']} keys, {ready['deployment_bands']} bands)"
    print(f"{dep:52}{ms(o['deployment_s']):>12}{ms(ready['deployment_s']):>12}   target <= 300 ms")
    print(f"{'bind every key of the arch (' + str(ready['libraries']) + ' bands)':52}{ms(o['bind_s']):>12}"
          f"{ms(ready['bind_s']):>12}   files read: old {o['library_bytes'] / 1e6:.2f} MB raw, "
          f"new {ready['library_bytes'] / 1e6:.2f} MB xz")
    print(f"{'load_key per key':52}{o['launchers_s'] / o['keys'] * 1e6:9.0f} us{ready['launchers_s'] / ready['keys'] * 1e6:9.0f} us")
    print("\nPython-side cost of one launch (real Launcher, real library; C entry returns -1, no HIP call):")
    for k, c in sorted(calls.items()):
        print(f"  {k:34} {c['slots']:3} slots   pack + C call: shared buffer (old, racy) {c['shared_us']:5.2f} us, "
              f"this thread's buffer (new) {c['thread_us']:5.2f} us;  __call__ incl. raising LaunchError "
              f"{c['call_raise_us']:5.2f} us")
    if fly:
        per_key_cold = sum(fly["cold"]["compile_s"].values()) / len(sample)
        print(f"\nFlyDSL JIT anchor: import flydsl + torch + mono layer {fly['cold']['import_s']:.2f} s; per key "
              f"(cold compile s / first call from warm cache ms, stopped at):")
        for k in sample:
            print(f"  {k:34} {fly['cold']['compile_s'][k]:6.2f} s   {fly['warm']['first_call_s'][k] * 1e3:7.1f} ms   "
                  f"{fly['warm']['stopped_at'].get(k, 'returned')}")
        print(f"  launchers for every key by JIT: {per_key_cold * ready['keys']:.0f} s")
    print("\ntargets: first bind of a band <= 50 ms, a deployment's bands <= 300 ms, launchers for every key <= 50 ms,"
          " one launch <= 3 us (Python side)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
