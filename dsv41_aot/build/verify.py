"""``dsv41-aot verify``: prove a prebuilt directory is what vLLM would run.

No AMD GPU runs here, so the strongest evidence that a prebuilt launch
behaves as vLLM's JIT launch is that it is the same GPU code object, reached
through the same kernel name and kernarg layout. Two levels:

- integrity (always): the manifest parses; every object exists with its
  recorded sha256; the code object inside it, its kernel name, export ABI and
  resource figures match the manifest; the symbol can be resident (see
  ``dsv41_aot.resources``); ``lib/libs.json`` parses, every library it names
  is inside ``lib/`` with its recorded sha256, and it links every manifest
  key from the manifest's object (what the loader checks before it loads);
- ``--against-jit``: for each chosen key, vLLM's own runner
  (``DSV41MonoLayer.kernels`` / ``ffn_kernel``, on a runner object made
  without a GPU) picks the launcher exactly as at serving time (gfx942's K2
  without the key-table build included), FlyDSL's JIT compiles it without
  launching into a fresh FlyDSL disk cache, and the GPU code object is taken
  from that cache's pickled artifact (its IR's ``gpu.binary``), not from
  ``export_to_c``. Bytes, kernel name and kernarg layout are compared with
  the prebuilt code object, and the launcher's parameters with the ABI.

One JIT worker process per arch (``python -m dsv41_aot.build.verify ARCH``): the
mono package fixes its target at import from ``ARCH``.
"""

from __future__ import annotations

import hashlib
import json
import random
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from . import elf
from ..errors import AotError, IntegrityError
from ..facts.kinds import kind_facts
from ..keys import BuildKey
from ..manifest import LIB, LIBS_JSON, Manifest, arch_dirs, sha256_file
from .codeobject import code_object_resources, manifest_figures
from .output import tally
from .residency import residency_problems

# FlyDSL annotation class name -> the ABI ctype export_to_c records
CTYPES = {"Int64": "int64", "Int32": "int32"}


@dataclass
class KeyReport:
    """What verify found for one key: problems fail it, notes do not."""

    key: str
    arch: str
    checks: list = field(default_factory=list)  # names of the checks that ran
    problems: list = field(default_factory=list)
    jit_seconds: float | None = None

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict:
        return {"key": self.key, "arch": self.arch, "ok": self.ok, "checks": self.checks,
                "problems": self.problems, "jit_seconds": self.jit_seconds}


# ---------------------------------------------------------------- integrity


def check_entry(man: Manifest, key: str) -> tuple[KeyReport, bytes | None]:
    """Integrity of one manifest entry; returns the report and the stored
    GPU code object (None when it could not be read)."""
    e = man.entries[key]
    rep = KeyReport(key, man.arch)
    rep.checks.append("sha256")
    try:
        man.check_object(key)
    except IntegrityError as err:
        rep.problems.append(str(err).split("\n")[0])
        return rep, None
    try:
        parsed = BuildKey.parse(key)
    except AotError as err:
        rep.problems.append(f"manifest key does not parse: {err}")
        return rep, None
    if str(parsed) != key:
        rep.problems.append(f"manifest key is not canonical (canonical: {parsed})")
    if "resources" not in e:
        rep.problems.append("manifest entry lacks resources")
    if (e["kind"], e["arch"], e["fields"]) != (parsed.kind, parsed.arch, parsed.build_fields()):
        rep.problems.append(f"manifest kind / arch / fields differ from the key's ({parsed.kind}, {parsed.arch}, "
                            f"{parsed.build_fields()})")
    if e["symbol"] != parsed.kernel_symbol or e["entry"] != parsed.entry:
        rep.problems.append(f"manifest names symbol {e['symbol']} / entry {e['entry']}, the key's are {parsed.kernel_symbol} / {parsed.entry}")
    rep.checks.append("export")
    try:
        meta_raw, code = elf.exported_parts(man.object_path(key).read_bytes(), e["entry"])
        meta = json.loads(meta_raw)
    except (elf.ElfError, ValueError) as err:
        rep.problems.append(f"object {e['object']} is not an export of entry {e['entry']}: {err}")
        return rep, None
    if hashlib.sha256(code).hexdigest() != e["code_object_sha256"] or len(code) != e["code_object_bytes"]:
        rep.problems.append("GPU code object inside the object differs from the manifest's code_object_sha256 / bytes")
    if meta.get("arch") != man.arch:
        rep.problems.append(f"export metadata says arch {meta.get('arch')!r}, the manifest {man.arch}")
    slots = [{"name": a["arg_name"], "ctype": a["ctype"], "size": a["size"]} for a in meta.get("abi", [])]
    if slots != man.abi(key):
        rep.problems.append("export metadata's ABI slots differ from the manifest's ABI")
    rep.checks.append("resources")
    try:
        res = code_object_resources(code)
    except (elf.ElfError, ValueError) as err:
        rep.problems.append(f"GPU code object metadata unreadable: {err}")
        return rep, code
    if res["name"] != e["symbol"]:
        rep.problems.append(f"GPU kernel is named {res['name']}, the manifest says {e['symbol']}")
    figures = manifest_figures(res)
    if "resources" in e and e["resources"] != figures:
        changed = sorted(k for k in set(figures) | set(e["resources"]) if figures.get(k) != e["resources"].get(k))
        rep.problems.append(f"manifest resources differ from the code object's: {', '.join(changed)}")
    rep.problems += kernarg_problems(slots, res)  # the object's own ABI (the manifest's was compared above)
    rep.problems += [f"cannot be resident: {p}" for p in residency_problems(res, man.arch)]
    return rep, code


def check_libraries(man: Manifest) -> list[dict]:
    """The linked libraries of one arch folder against its manifest: a
    failure {"key", "file", "error", "fix"} per problem (key None when the
    problem is the file's), [] when the loader would accept them."""
    from .link import read_libs

    libdir = man.dir / LIB
    path = libdir / LIBS_JSON
    relink = f"dsv41-aot link --dir {man.dir.parent} --arch {man.arch}"

    def failure(error: str, file: Path = path, key: str | None = None) -> dict:
        return {"key": key, "file": str(file), "error": error, "fix": relink}

    if not path.is_file():
        return [failure(f"{path} is missing: the loader cannot open any {man.arch} key")]
    try:
        libraries = read_libs(man.dir, strict=True)["libraries"]
        linked = {}
        for lib in libraries:
            if not isinstance(lib.get("file"), str) or not isinstance(lib.get("sha256"), str):
                raise ValueError(f"a library record lacks file / sha256: {str(lib)[:200]}")
            linked.update({k: (lib["file"], sha) for k, sha in lib["entries"].items()})
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        return [failure(f"{path} is not a dsv41-aot link record ({type(e).__name__}: {e})")]
    out = []
    for lib in libraries:
        file = (libdir / lib["file"]).resolve()
        if file.parent != libdir.resolve():
            out.append(failure(f"{path} names {lib['file']!r}, outside {libdir}"))
        elif not file.is_file():
            out.append(failure(f"{file} is missing (named by {path})", file))
        elif sha256_file(file) != lib["sha256"]:
            out.append(failure(f"{file} does not match its sha256 in {path} (corrupt or altered)", file))
    for key, e in sorted(man.entries.items()):
        if key not in linked:
            out.append(failure(f"{key} is in {man.path} but no library links it", key=key))
        elif linked[key][1] != e["sha256"]:
            out.append(failure(f"{key}: {path} links it from object {linked[key][1][:16]}, the manifest names "
                               f"{e['sha256'][:16]}", key=key))
    for key in sorted(set(linked) - set(man.entries)):
        out.append(failure(f"{key} is linked (in {linked[key][0]}) but not in {man.path}", key=key))
    return out


def check_sources(man: Manifest) -> list[dict]:
    """One arch folder's entries must come from one source identity (vLLM
    mono digest and version, helpers, FlyDSL, linker): no installed vLLM
    matches a mix, and a single altered entry shows up as one."""
    sources: dict = {}
    for key, e in sorted(man.entries.items()):
        sources.setdefault(json.dumps(e["source"], sort_keys=True), []).append(key)
    if len(sources) < 2:
        return []
    fewest = min(sources.values(), key=len)
    return [{"key": None, "file": str(man.path),
             "error": f"{man.path} mixes {len(sources)} source identities ({len(fewest)} key(s) differ from the rest, "
                      f"e.g. {fewest[0]})",
             "fix": f"rebuild: dsv41-aot build --arch {man.arch} --out {man.dir.parent}"}]


def kernarg_problems(abi: list, res: dict) -> list[str]:
    """The export ABI (stream last) against the kernel's kernarg layout: one
    by-value kernarg per scalar slot, same size, in order."""
    scalars = [s for s in abi if s["name"] != "stream"]
    args = res["args"]
    if len(scalars) != len(args):
        return [f"ABI has {len(scalars)} scalar slots, the kernel {len(args)} kernargs"]
    out = []
    for i, (s, a) in enumerate(zip(scalars, args)):
        if a["size"] != s["size"] or a["value_kind"] != "by_value":
            out.append(f"slot {i} {s['name']}: ABI {s['ctype']} ({s['size']} bytes), kernarg {a['value_kind']} {a['size']} bytes")
    last = args[-1]["offset"] + args[-1]["size"] if args else 0
    if last > res["kernarg_bytes"]:
        out.append(f"kernargs end at {last} bytes, kernarg segment is {res['kernarg_bytes']}")
    return out


# ---------------------------------------------------------------- JIT side


def choose_keys(man: Manifest, keys: list[str] | None, sample: int | None, seed: int) -> list[str]:
    """The keys of this arch to rebuild: named ones, a seeded sample, or all."""
    have = sorted(man.entries)
    if keys:
        return [k for k in keys if k in man.entries]
    if sample is not None and sample < len(have):
        return sorted(random.Random(f"dsv41-aot verify {man.arch} {seed}").sample(have, sample))
    return have


def start_jit_worker(arch: str, out_dir: Path, *, vllm_src: str | None = None, log=None) -> subprocess.Popen:
    """Start the JIT worker for ``arch``: a fresh FlyDSL cache under
    ``out_dir``, FlyDSL options a user set cleared (vLLM's JIT runs with
    FlyDSL's defaults), ROCM_PATH pointing at a usable ld.lld."""
    from . import toolchain

    from .compiler import worker_env

    env = worker_env(arch, str(toolchain.find().rocm_path), str(out_dir / f"flydsl-cache-{arch}"))
    env["FLYDSL_RUNTIME_ENABLE_CACHE"] = "1"  # the artifact is read back from FlyDSL's disk cache
    argv = [sys.executable, "-m", "dsv41_aot.build.verify", arch, str(out_dir)] + (["--vllm-src", vllm_src] if vllm_src else [])
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log or subprocess.DEVNULL,
                            env=env, text=True, cwd=str(Path(__file__).resolve().parents[2]))
    return proc


def _worker_main(argv: list[str]) -> int:
    """JIT worker: keys on stdin, one JSON answer a key on stdout (worker.serve)."""
    from .worker import serve

    arch, out_dir = argv[0], Path(argv[1])
    vllm_src = argv[3] if len(argv) > 3 and argv[2] == "--vllm-src" else None

    def answer(jit, key):
        code, params = jit.code_object(key)
        path = out_dir / f"{key.entry}.jit.co"
        path.write_bytes(code)
        return {"code": str(path), "params": params}

    return serve(arch, lambda: _VllmJit(arch, vllm_src), answer)


class _VllmJit:
    """vLLM's runner and FlyDSL's JIT, in a process bound to one arch."""

    def __init__(self, arch: str, vllm_src: str | None):
        from .. import source
        from . import compat

        compat.install_aiter_shim()
        src = source.find(vllm_src)
        self.runner_mod = source.import_mono(src, "runner")
        self.arch = arch

    def runner(self, key: BuildKey):
        """A DSV41MonoLayer made without a GPU, holding only what its
        ``kernels`` / ``ffn_kernel`` read."""
        cls = self.runner_mod.DSV41MonoLayer
        r = cls.__new__(cls)
        r.tp, r.timeline = key.tp, key.timeline
        r.experts, r.topk, r.ug_groups, r.swa_width = key.experts, key.topk, key.ug_groups, key.swa_width
        r._kernels = {}
        return r

    def launcher(self, key: BuildKey):
        """The launcher vLLM's runner uses for ``key``. A K2 key names the
        layer's fields; on gfx942 the runner itself drops ``index``."""
        kind = kind_facts(key.kind)
        r = self.runner(key)
        if kind.runner_method == "ffn_kernel":
            return r.ffn_kernel(key.tokens, key.experts, key.topk)
        if kind.runner_method == "kernels":
            return r.kernels(key.tokens, key.ratio, key.fold, key.index)[kind.runner_index]
        raise AotError(f"{key}: verify does not know how vLLM's runner asks for a {key.kind} launch "
                       f"({kind.runner_method})", fix="teach build/verify.py _VllmJit.launcher that runner method")

    def code_object(self, key: BuildKey) -> tuple[bytes, list]:
        import inspect
        import pickle

        from .compiler import typed_args

        launcher = self.launcher(key)
        params = [[p.name, getattr(p.annotation, "__name__", str(p.annotation))]
                  for p in inspect.signature(launcher.func).parameters.values()]
        launcher._compile_or_execute(typed_args(launcher), {}, execute=False)
        cache_key, _ = launcher._last_compiled
        mgr = launcher.cache_manager
        if mgr is None:
            raise RuntimeError("FlyDSL's disk cache is off: FLYDSL_RUNTIME_CACHE_DIR / ENABLE_CACHE not honoured")
        pkl = mgr._cache_file(launcher._cache_key_to_str(cache_key))
        if not pkl.is_file():
            raise RuntimeError(f"FlyDSL wrote no cache artifact at {pkl}")
        with open(pkl, "rb") as f:
            artifact = pickle.load(f)
        return gpu_binary(artifact._ir_text), params


def gpu_binary(ir_text: str) -> bytes:
    """The one GPU code object in a FlyDSL artifact's compiled IR (its
    ``gpu.binary`` op's object)."""
    from flydsl._mlir import ir
    from flydsl._mlir.dialects import gpu
    from flydsl.compiler.jit_function import _create_mlir_context

    with _create_mlir_context():
        module = ir.Module.parse(ir_text)
        objs = [
            gpu.ObjectAttr(a).object
            for op in module.body.operations
            if op.operation.name == "gpu.binary"
            for a in ir.ArrayAttr(op.operation.attributes["objects"])
        ]
    if len(objs) != 1:
        raise RuntimeError(f"FlyDSL artifact holds {len(objs)} GPU objects, expected 1")
    return bytes(objs[0])


def compare_jit(man: Manifest, key: str, prebuilt: bytes, answer: dict) -> list[str]:
    """Differences between the prebuilt code object and vLLM's JIT one."""
    if "error" in answer:
        return [f"JIT build failed: {answer['error']}"]
    jit = Path(answer["code"]).read_bytes()
    out = []
    if jit != prebuilt:
        out.append(
            f"GPU code object differs: prebuilt sha256 {hashlib.sha256(prebuilt).hexdigest()[:16]} ({len(prebuilt)} bytes),"
            f" JIT {hashlib.sha256(jit).hexdigest()[:16]} ({len(jit)} bytes)"
        )
    try:
        a, b = code_object_resources(prebuilt), code_object_resources(jit)
    except (elf.ElfError, ValueError) as err:
        return out + [f"code object metadata unreadable: {err}"]
    if a["name"] != b["name"]:
        out.append(f"kernel name differs: prebuilt {a['name']}, JIT {b['name']}")
    if a["args"] != b["args"] or a["kernarg_bytes"] != b["kernarg_bytes"]:
        out.append(f"kernarg layout differs: prebuilt {len(a['args'])} args / {a['kernarg_bytes']} bytes, JIT {len(b['args'])} / {b['kernarg_bytes']}")
    abi = man.abi(key)
    want = [[s["name"], s["ctype"]] for s in abi if s["name"] != "stream"]
    got = [[n, CTYPES.get(t, t)] for n, t in answer["params"] if n != "stream"]
    if want != got:
        out.append(f"vLLM's launcher parameters {got} differ from the ABI {want}")
    return out


# ---------------------------------------------------------------- command


def verify(root: Path, *, against_jit: bool = False, keys: list[str] | None = None, sample: int | None = None,
           seed: int = 0, vllm_src: str | None = None, progress: bool = False) -> dict:
    """Verify the prebuilt directory ``root``; returns the JSON report."""
    root = Path(root)
    dirs = arch_dirs(root)
    if not dirs:
        raise AotError(f"{root} holds no prebuilt architecture (no <arch>/manifest.json)", fix=f"dsv41-aot build --out {root}")
    wanted = [str(BuildKey.parse(k)) for k in keys] if keys else None
    if wanted:
        known = {k for d in dirs for k in Manifest.read(d).entries}
        unknown = [k for k in wanted if k not in known]
        if unknown:
            raise AotError(f"{root} does not hold {', '.join(unknown)}", fix=f"dsv41-aot list --dir {root}")
    reports, warnings, codes, chosen, lib_failures = [], [], {}, {}, []
    for d in dirs:
        man = Manifest.read(d)
        lib_failures += check_libraries(man) + check_sources(man)
        for orphan in man.orphans():
            warnings.append(f"{man.arch}: stored object {orphan.name} is named by no entry (left by an older or interrupted build)")
        names = [k for k in sorted(man.entries) if wanted is None or k in wanted]
        for k in names:
            rep, code = check_entry(man, k)
            reports.append(rep)
            codes[k] = (man, code)
        if against_jit:
            picked = choose_keys(man, names, None, seed) if wanted else choose_keys(man, None, sample, seed)
            chosen[man.arch] = [k for k in picked if codes[k][1] is not None]
    if against_jit:
        by_key = {r.key: r for r in reports}
        with tempfile.TemporaryDirectory(prefix="dsv41-verify-") as tmp:
            answers = _run_jit(chosen, Path(tmp), vllm_src, progress)
            for arch, ks in chosen.items():
                for k in ks:
                    rep = by_key[k]
                    rep.checks.append("jit")
                    man, code = codes[k]
                    ans = answers.get(k, {"error": "the JIT worker gave no answer"})
                    rep.jit_seconds = ans.get("seconds")
                    rep.problems += compare_jit(man, k, code, ans)
    failures = [{"key": r.key, "file": None, "error": "; ".join(r.problems),
                 "fix": _fix_for(r.key, r.problems, root)} for r in reports if not r.ok] + lib_failures
    return tally(len(reports), sum(r.ok for r in reports), failures, dir=str(root.resolve()),
                 jit_checked=sum(len(v) for v in chosen.values()), warnings=warnings,
                 reports=[r.as_dict() for r in reports])


def _fix_for(key: str, problems: list, root: Path) -> str:
    if all(p.startswith("cannot be resident") for p in problems):
        return f"{key} cannot launch as a persistent kernel (see dsv41-aot inspect): remove it from build_matrix.yaml"
    return f"rebuild it: dsv41-aot build --key '{key}' --out {root}"


def _run_jit(chosen: dict, tmp: Path, vllm_src: str | None, progress: bool) -> dict:
    """Run one JIT worker per arch, in parallel; key -> answer."""
    import selectors

    procs, answers, pending = [], {}, {}
    total = sum(len(v) for v in chosen.values())
    bar = None
    if progress and total:
        from tqdm import tqdm

        bar = tqdm(total=total, desc="verify --against-jit", unit="key", file=sys.stderr)
    sel = selectors.DefaultSelector()
    logs = {}
    for arch, ks in chosen.items():
        if not ks:
            continue
        work = tmp / arch
        work.mkdir()
        logs[arch] = open(work / "worker.log", "w+")
        p = start_jit_worker(arch, work, vllm_src=vllm_src, log=logs[arch])
        p.stdin.write("".join(k + "\n" for k in ks))
        p.stdin.close()
        pending[arch] = set(ks)
        sel.register(p.stdout, selectors.EVENT_READ, (arch, p))
        procs.append(p)
    try:
        while sel.get_map():
            for sk, _ in sel.select():
                arch, p = sk.data
                line = p.stdout.readline()
                if not line:
                    sel.unregister(p.stdout)
                    p.wait()
                    logs[arch].seek(0)
                    tail = logs[arch].read()[-2000:]
                    for k in pending[arch]:
                        answers[k] = {"error": f"JIT worker for {arch} exited ({p.returncode}) before answering: {tail}"}
                    continue
                msg = json.loads(line)
                if "ready" in msg:
                    if not msg["ready"]:
                        for k in pending[arch]:
                            answers[k] = {"error": f"JIT worker for {arch} could not start: {msg['error']}"}
                        pending[arch] = set()
                    continue
                answers[msg["key"]] = msg
                pending[arch].discard(msg["key"])
                if bar:
                    bar.update(1)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for f in logs.values():
            f.close()
        if bar:
            bar.close()
    return answers


def register(sub) -> None:
    from ..manifest import prebuilt_dir

    p = sub.add_parser("verify", help="check prebuilt objects; with --against-jit, against vLLM's own JIT build")
    p.add_argument("--dir", default=str(prebuilt_dir()), help="prebuilt directory (default: $DSV41_AOT_PREBUILT, else kernels_prebuilt/)")
    p.add_argument("--against-jit", action="store_true",
                   help="rebuild keys through vLLM's runner and FlyDSL's JIT (compile only) and compare code objects")
    pick = p.add_mutually_exclusive_group()
    pick.add_argument("--sample", type=int, metavar="N", help="with --against-jit: N keys per arch, seeded")
    pick.add_argument("--key", action="extend", nargs="+", metavar="KEY", help="only these keys (--key A B, or --key A --key B)")
    p.add_argument("--seed", type=int, default=0, help="seed of --sample (default 0)")
    p.add_argument("--vllm-src", help="a vLLM checkout (folder holding vllm/) instead of the installed vllm")
    p.add_argument("--json", action="store_true", help="print one JSON report")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args) -> int:
    if args.sample is not None and args.sample < 1:
        raise AotError(f"--sample {args.sample}: must be at least 1", fix="pass --sample N with N >= 1")
    report = verify(Path(args.dir), against_jit=args.against_jit, keys=args.key, sample=args.sample, seed=args.seed,
                    vllm_src=args.vllm_src, progress=args.against_jit and not args.no_progress and not args.json)
    if args.json:
        from .output import print_json

        print_json(report)
        for w in report["warnings"]:
            print(f"warning: {w}", file=sys.stderr)
    else:
        for r in report["reports"]:
            status = "ok" if r["ok"] else "FAILED"
            jit = f"  jit {r['jit_seconds']:.1f} s" if r["jit_seconds"] is not None else ""
            print(f"{status:6} {r['key']:44} {'+'.join(r['checks'])}{jit}")
            for prob in r["problems"]:
                print(f"         {prob}")
        libs = [f for f in report["failures"] if f["file"] is not None]
        for f in libs:
            print(f"FAILED {f['file']}: {f['error']}")
        for w in report["warnings"]:
            print(f"warning: {w}", file=sys.stderr)
        print(f"{report['keys']} keys checked ({report['jit_checked']} against vLLM's JIT): "
              f"{report['keys'] - report['ok']} failed; {len(libs)} library problems")
        resident = {r["key"] for r in report["reports"] if any(p.startswith("cannot be resident") for p in r["problems"])}
        rebuild = [r["key"] for r in report["reports"] if any(not p.startswith("cannot be resident") for p in r["problems"])]
        if rebuild:
            print(f"fix: rebuild them: dsv41-aot build --key {' '.join(repr(k) for k in rebuild)} --out {args.dir}",
                  file=sys.stderr)
        if resident:
            print(f"fix: {', '.join(sorted(resident))} cannot launch as a persistent kernel (see dsv41-aot inspect):"
                  " remove it from build_matrix.yaml", file=sys.stderr)
        for fix in dict.fromkeys(f["fix"] for f in libs):
            print(f"fix: {fix}", file=sys.stderr)
    return 1 if report["failed"] else 0


if __name__ == "__main__":
    sys.exit(_worker_main(sys.argv[1:]))
