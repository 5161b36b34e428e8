"""vLLM's own JIT build of a key for ``verify --against-jit``, and its proof.

A JIT worker (``python -m dsv41_aot.aot.jit ARCH RELEASE FOLDER VLLM_ROOT
[HIP]``) runs on the worker pool (``aot/workers.py``), one per room. It asks
its release's runner for the key's launcher exactly as at serving time, has
FlyDSL's JIT compile it without launching, and reads the GPU code object
from the JIT's disk-cache artifact (its IR's ``gpu.binary``), not from
``export_to_c``. Given the recording HIP (the stand-in for the AMD GPU), it
also launches it once. The parent compares both with the prebuilt key.

The worker reports what only its run produced (``proof.Evidence``), so a
proof copied from the manifest can be told apart (a claim, not a signature:
docs/releases.md). FlyDSL internals are reached only through
``aot/flydsl_api.py``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import os
import sys
from importlib import import_module
from pathlib import Path

from .. import elf, source
from ..errors import AotError
from ..facts.kinds import kind_facts
from ..keys import BuildKey
from ..manifest import Manifest, atomic_write
from ..proof import VERIFIED, KeyProof, Proof, parse_evidence
from . import hiprec
from .codeobject import code_object_resources
from .integrity import scalar_slots

# FlyDSL annotation class name -> the ABI ctype export_to_c records
CTYPES = {"Int64": "int64", "Int32": "int32"}
# a runner method's parameter -> the key field it is given (mono/runner.py)
RUNNER_ARGS = ("tokens", "ratio", "fold", "index", "experts", "topk")


# ---------------------------------------------------------------- worker side


class VllmJit:
    """One release's vLLM runner and FlyDSL's JIT, in a worker bound to one room.

    ``vllm_root`` is the folder holding that release's vllm/."""

    def __init__(self, arch: str, release: str, vllm_root: str):
        from ..facts.flydsl import installed
        from . import compat, flydsl_api

        compat.install_aiter_shim()
        # as the compile worker does: no position reaches the code object, FlyDSL's
        # artifact or module, or the launch (tests/test_source_positions.py)
        flydsl_api.cache_frame_lookups()
        src = source.MonoSource(Path(vllm_root).resolve())
        self.runner_mod = source.import_mono(src, "runner")
        self.arch, self.release = arch, release
        self.identity = {
            "release": release,
            "vllm_version": src.version,
            "mono_sources": import_module(f"{source.MONO}.sources").SOURCES,
            "mono_dir": str(Path(self.runner_mod.__file__).resolve().parent),
            "flydsl_version": installed().version,
        }

    def runner(self, key: BuildKey):
        """A DSV41MonoLayer made without a GPU, holding only what ``kernels`` reads."""
        cls = self.runner_mod.DSV41MonoLayer
        r = cls.__new__(cls)
        r.tp, r.timeline = key.tp, key.timeline
        r.experts, r.topk, r.ug_groups, r.swa_width = key.experts, key.topk, key.ug_groups, key.swa_width
        r._kernels = {}
        return r

    def launcher(self, key: BuildKey):
        """The launcher vLLM's runner uses for ``key``.

        It is asked for with the arguments the release's method takes
        (0.33.0: ``kernels(tokens, ratio, fold, index)``, ``ffn_kernel(tokens,
        experts, topk)``; 0.32.0: ``kernels(tokens, ratio)``,
        ``ffn_kernel(tokens)``). On 0.33.0 gfx942 the runner drops ``index``."""
        if key.release != self.release or key.arch != self.arch:
            raise AotError(f"{key.describe()}: sent to the {self.arch} JIT worker of vLLM {self.release}",
                           fix="report it: the worker pool keeps one worker per room")
        kind = kind_facts(key.kind)
        if kind.runner_method not in ("kernels", "ffn_kernel"):
            raise AotError(f"{key.describe()}: verify does not know how vLLM's runner asks for a {key.kind} launch "
                           f"({kind.runner_method})", fix="teach aot/jit.py VllmJit.launcher that runner method")
        method = getattr(self.runner(key), kind.runner_method)
        params = list(inspect.signature(method).parameters)
        unknown = [p for p in params if p not in RUNNER_ARGS]
        if unknown:
            raise AotError(f"{key.describe()}: vLLM {self.release}'s {kind.runner_method} takes {', '.join(unknown)}, "
                           f"which verify cannot give from a key", fix="teach aot/jit.py RUNNER_ARGS that parameter")
        got = method(*(getattr(key, p) for p in params))
        return got[kind.runner_index] if kind.runner_index is not None else got

    def code_object(self, key: BuildKey, launch_in: Path | None = None) -> tuple[bytes, list, dict]:
        """JIT-build ``key``: (GPU code object, launcher parameters, evidence).

        Parameters are [name, annotation class name] pairs; the evidence has
        ``proof.Evidence``'s fields: the sha256 of the JIT's artifact and of its
        module (both differ from key to key) and when it ran. With ``launch_in``
        (a folder, when the process's HIP is the recording HIP), the launcher
        is also launched once and the evidence carries that launch (``launch``)."""
        from datetime import datetime, timezone

        from . import flydsl_api
        from .compiler import typed_args

        launcher = self.launcher(key)
        params = [[p.name, getattr(p.annotation, "__name__", str(p.annotation))]
                  for p in inspect.signature(launcher.func).parameters.values()]
        at = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        cache_key = flydsl_api.compile_without_launch(launcher, typed_args(launcher))
        raw = flydsl_api.disk_artifact(launcher, cache_key).read_bytes()
        ir_text = flydsl_api.artifact_ir(raw)
        code = flydsl_api.gpu_binary(ir_text)
        module = ir_text.encode() if isinstance(ir_text, str) else bytes(ir_text)
        evidence = {"artifact_sha256": hashlib.sha256(raw).hexdigest(),
                    "module_sha256": hashlib.sha256(module).hexdigest(), "at": at}
        if launch_in is not None:
            evidence["launch"] = self.launch(key, launcher, params, code, launch_in)
        return code, params, evidence

    @staticmethod
    def launch(key: BuildKey, launcher, params: list, code: bytes, folder: Path) -> dict:
        """Launch the compiled ``launcher`` once; return what the recording HIP saw.

        The values are those the prebuilt launch is given (``hiprec.launch_values``)."""
        log, layouts = folder / f"{key.entry}.jit.hip.log", folder / f"{key.entry}.jit.layouts"
        hiprec.write_layout_file(layouts, [hiprec.kernel_metadata(code)])
        values = hiprec.launch_values([ctype for _, ctype in scalar_params(params)])
        os.environ.update(RECORDING_HIP_LOG=str(log), RECORDING_HIP_KERNELS=str(layouts))  # read at each call
        try:
            launcher(*values, stream=hiprec.Stream())
        finally:
            os.environ.pop("RECORDING_HIP_LOG", None)
        return hiprec.recorded_launch(log, f"{key.describe()}: vLLM's JIT launch")


def _worker_main(argv: list[str]) -> int:
    """Run the JIT worker; each code object goes to FOLDER/<entry>.jit.co."""
    from .worker import ensure_parent, serve

    arch, release, folder, vllm_root = argv[0], argv[1], Path(argv[2]), argv[3]
    hip = argv[4] if len(argv) > 4 else None  # the recording HIP to launch through (stand-in for the AMD GPU)
    if hip:
        hiprec.preload(Path(hip))  # before FlyDSL maps any libamdhip64

    def answer(jit: VllmJit, key: BuildKey) -> dict:
        code, params, evidence = jit.code_object(key, folder if hip else None)
        path = folder / f"{key.entry}.jit.co"
        ensure_parent()
        path.write_bytes(code)
        return {"code": str(path), "params": params, "evidence": evidence}

    return serve(arch, lambda: VllmJit(arch, release, vllm_root), answer, ready=lambda jit: {"identity": jit.identity},
                 release=release)


# ---------------------------------------------------------------- parent side


def run(chosen: list[BuildKey], on_answer, *, jobs: int, key_timeout: float, sources: dict,
        hip: Path | None = None) -> None:
    """JIT-build ``chosen`` on the worker pool, one worker per room.

    Each worker imports the mono package of ``sources[key.release]`` (a
    ``source.MonoSource``); with ``hip`` (the recording HIP) each key is also
    launched once. ``on_answer(key, message)`` is called once per key with
    ``worker.serve``'s message plus ``identity`` (the worker's release, vLLM
    and FlyDSL); the file ``code`` names exists only during the call. A
    worker whose imported mono sources are not its tree's is refused."""
    from . import toolchain
    from .compiler import worker_env
    from .workers import Pool

    rocm = str(toolchain.find().rocm_path)
    rooms = {k.room: k for k in chosen}  # the pool names a worker by its keys' room
    identity: dict = {}  # room -> its worker's ready line's identity

    def spawn(room: str, folder: Path):
        key = rooms[room]
        env = worker_env(key.arch, rocm, str(folder / "flydsl-cache"))
        env["FLYDSL_RUNTIME_ENABLE_CACHE"] = "1"  # the artifact is read back from FlyDSL's disk cache
        root = str(sources[key.release].root)
        argv = [sys.executable, "-m", "dsv41_aot.aot.jit", key.arch, key.release, str(folder), root]
        if hip is not None:
            env.update(hiprec.env(hip, None, arch=key.arch))
            argv.append(str(hip))
        return argv, env

    def accept(room: str, ready: dict) -> str | None:
        got = ready.get("identity") or {}
        identity[room] = got
        src = sources[rooms[room].release]
        if got.get("mono_sources") != src.digest:
            return (f"the JIT worker of {room} imported mono sources {got.get('mono_sources')} "
                    f"({got.get('mono_dir')}), not vLLM {rooms[room].release}'s {src.digest} ({src.mono_dir})")
        return None

    def answer(key: BuildKey, msg: dict) -> None:
        on_answer(key, dict(msg, identity=identity.get(key.room)))
        if msg.get("code"):
            Path(msg["code"]).unlink(missing_ok=True)

    Pool(spawn, jobs=jobs, key_timeout=key_timeout, accept=accept, what="JIT build").run(chosen, answer)


def scalar_params(params: list) -> list[list[str]]:
    """A launcher's parameters as ABI slots name them: [name, ctype] pairs, the stream left out."""
    return [[name, CTYPES.get(t, t)] for name, t in params if name != "stream"]


def compare_jit(man: Manifest, key: str, prebuilt: bytes, answer: dict) -> list[str]:
    """Differences between the prebuilt code object and vLLM's JIT one."""
    if "error" in answer:
        return [f"JIT build failed: {answer.get('error')}"]
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
    want = [[s["name"], s["ctype"]] for s in scalar_slots(abi)]
    got = scalar_params(answer["params"])
    if want != got:
        out.append(f"vLLM's launcher parameters {got} differ from the ABI {want}")
    return out


# ---------------------------------------------------------------- verified.json


def write_verified(man: Manifest, proofs) -> None:
    """Write ``proofs`` (KeyProofs, or a dict of them) as the room's verified.json.

    Only proofs of the code object the manifest entry still holds are kept
    (``proof.Proof.of``)."""
    proofs = proofs.values() if isinstance(proofs, dict) else proofs
    atomic_write(man.room / VERIFIED, Proof.of(man.arch, man.release, proofs, man.entries).to_bytes())


def verified_record(key: str, code: bytes, identity: dict | None, evidence: dict) -> KeyProof:
    """The proof that vLLM's JIT built ``key``'s prebuilt code object ``code``.

    ``identity`` and ``evidence`` describe the JIT run; when the evidence
    carries the launch, the proof keeps its digest."""
    sha = hashlib.sha256(code).hexdigest()
    launch = evidence.get("launch")
    ev = parse_evidence({k: v for k, v in evidence.items() if k != "launch"}, sha, f"the JIT answer of {key}",
                        "report it: the JIT worker's evidence is malformed")
    if launch:
        ev = dataclasses.replace(ev, launch_sha256=hiprec.launch_digest(launch))
    return KeyProof(key, sha, dict(identity or {}), ev)


if __name__ == "__main__":
    sys.exit(_worker_main(sys.argv[1:]))
