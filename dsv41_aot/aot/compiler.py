"""Compile one key into one stripped, content-addressed export object.

Runs inside a worker bound to one architecture: the mono package fixes its
target at import (``common/arch.py`` reads ``ARCH``). The compile is FlyDSL's
own JIT compile without a launch, then its ``export_to_c``, both reached
through ``aot/flydsl_api.py``.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import subprocess
import tempfile
from importlib import import_module
from pathlib import Path

from .. import elf, source
from ..errors import CompileError, ResidencyError
from ..facts.kinds import KINDS
from ..keys import BuildKey
from ..manifest import OBJECTS, Entry, SourceIdentity, abi_id, atomic_write, sha256_file


def worker_env(arch: str, rocm_path: str, cache_dir: str) -> dict:
    """The environment a compile worker for ``arch`` runs in.

    FlyDSL options a user may have set are cleared, so a build compiles
    exactly what vLLM's JIT compiles with FlyDSL's defaults."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLYDSL_")}
    env.update(
        ARCH=arch,
        FLYDSL_GPU_ARCH=arch,
        ROCM_PATH=rocm_path,
        FLYDSL_RUNTIME_CACHE_DIR=cache_dir,
        FLYDSL_RUNTIME_ENABLE_CACHE="0",
    )
    return env


def check_arch(arch: str) -> None:
    """Refuse to run unless this process was started with ``ARCH=arch`` (``worker_env``)."""
    if os.environ.get("ARCH") != arch:
        raise RuntimeError(f"worker for {arch} started with ARCH={os.environ.get('ARCH')!r}")


def typed_args(launcher) -> tuple:
    """Compile arguments for a launcher: a typed zero per parameter, stream left out.

    Each zero is the parameter's annotation called with 0 (``fx.Int64(0)``)."""
    params = inspect.signature(launcher.func).parameters.values()
    return tuple(p.annotation(0) for p in params if p.default is inspect.Parameter.empty)  # the stream has a default


def source_identity(src: source.MonoSource, linker: str, mono_sources: str | None = None) -> SourceIdentity:
    """The source identity every key built from ``src`` now carries: the one place it is made.

    ``mono_sources`` is the digest vLLM's own ``mono.sources`` module says (a
    compile worker's, which the build compares with its own); else it is
    computed from the files. FlyDSL is the installed one."""
    from ..facts.flydsl import installed
    from . import compat

    return SourceIdentity(vllm_version=src.version, mono_sources=mono_sources or src.digest,
                          helpers=compat.install_aiter_shim(), flydsl_version=installed().version, linker=linker)


class ArchCompiler:
    """Compiles keys of one architecture; lives for a worker's lifetime."""

    def __init__(self, arch: str, vllm_root: str, arch_dir: str, strip: str, linker: str, *, release: str):
        check_arch(arch)  # before anything imports the mono package
        from . import compat

        self.arch = arch
        self.arch_dir = Path(arch_dir)
        self.src = source.MonoSource(root=Path(vllm_root))
        self.release = release
        self.before_write = lambda: None  # the worker's parent check (worker.ensure_parent)
        self.strip = strip
        compat.install_aiter_shim()  # before the mono package imports aiter's helpers
        from . import flydsl_api

        flydsl_api.cache_frame_lookups()  # and verify's JIT worker (aot/jit.py): the same answers
        self.layer = source.import_mono(self.src, "layer")
        self.identity = source_identity(self.src, linker, mono_sources=import_module(f"{source.MONO}.sources").SOURCES)

    def launcher(self, key: BuildKey):
        """vLLM's launcher for ``key``, built exactly as the runner builds it."""
        build = getattr(self.layer, KINDS[key.kind].builder)
        return build(self.layer.MonoBuild(**key.build_fields()))

    def compile(self, key: BuildKey) -> tuple[Entry, list]:
        """Compile ``key``, store its object, and return (manifest entry, ABI).

        The entry holds nothing measured (same inputs, same bytes): the worker
        protocol reports the seconds beside it."""
        if key.arch != self.arch or key.release != self.release:
            raise CompileError(f"{key.describe()}: sent to the {self.arch} worker of vLLM {self.release}")
        from . import flydsl_api

        launcher = self.launcher(key)
        args = typed_args(launcher)
        cache_key = flydsl_api.compile_without_launch(launcher, args)
        with tempfile.TemporaryDirectory(prefix="dsv41-export-") as tmp:
            raw = flydsl_api.export_c(launcher, args, cache_key, Path(tmp), key.entry)
            stripped = Path(tmp) / "stripped.o"
            proc = subprocess.run([self.strip, "--strip-debug", str(raw), "-o", str(stripped)], capture_output=True, text=True)
            if proc.returncode != 0:
                raise CompileError(f"{key}: llvm-strip failed: {proc.stderr.strip()}")
            data = stripped.read_bytes()
            raw_bytes = raw.stat().st_size
        entry, abi = describe_object(key, data, self.identity)
        store_object(self.arch_dir, entry, data, self.before_write)
        return entry.replace(export_bytes=raw_bytes), abi


def store_object(arch_dir: Path, entry: Entry, data: bytes, before_write=lambda: None) -> None:
    """Write ``entry``'s object ``data`` into ``arch_dir`` unless it is already there intact.

    ``before_write`` is called just before a write (a worker's parent check)."""
    obj = Path(arch_dir) / entry.object
    if not (obj.is_file() and sha256_file(obj) == entry.sha256):  # absent, or corrupt in place
        before_write()
        atomic_write(obj, data)


def describe_object(key: BuildKey, data: bytes, identity: SourceIdentity) -> tuple[Entry, list]:
    """Check ``key``'s stripped export object ``data``; return (manifest entry, ABI).

    It must be exported for the key's arch, hold the key's GPU kernel and be
    resident one CTA per CU, and made by the FlyDSL ``identity`` names (so a
    build cache's record of another FlyDSL's blob is a miss); a spill is
    recorded, not refused (vLLM's JIT launches the same code object). A fresh compile and a manifest recovered
    from objects/ both pass through here."""
    from .codeobject import code_object_resources, manifest_figures
    from .residency import residency_problems

    meta_bytes, code = elf.exported_parts(data, key.entry)
    meta = json.loads(meta_bytes)
    if meta.get("arch") != key.arch:
        raise CompileError(f"{key}: FlyDSL compiled for {meta.get('arch')!r}")
    if meta.get("flydsl_version") != identity.flydsl_version:  # an export says which FlyDSL made it
        raise CompileError(f"{key}: built by FlyDSL {meta.get('flydsl_version')}, its identity says "
                           f"{identity.flydsl_version}")
    names = {s.name for s in elf.Elf(code).symbols()}
    if key.kernel_symbol not in names:
        raise CompileError(f"{key}: code object lacks kernel {key.kernel_symbol} (has {sorted(n for n in names if n.startswith('_ZN'))})")
    res = code_object_resources(code)
    problems = residency_problems(res, key.arch, key.release)
    if problems:
        raise ResidencyError(f"{key}: cannot launch as a persistent kernel: {'; '.join(problems)}")
    sha = hashlib.sha256(data).hexdigest()
    # the call ABI export_to_c recorded: slots in call order
    abi = [{"name": a["arg_name"], "ctype": a["ctype"], "size": a["size"]} for a in meta["abi"]]
    entry = Entry(key=str(key), kind=key.kind, arch=key.arch, fields=key.build_fields(), symbol=key.kernel_symbol,
                  entry=key.entry, object=f"{OBJECTS}/{sha}.o", sha256=sha, bytes=len(data),
                  code_object_sha256=hashlib.sha256(code).hexdigest(), code_object_bytes=len(code),
                  abi=abi_id(abi), source=identity, resources=manifest_figures(res))
    return entry, abi
