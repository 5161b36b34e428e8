"""vLLM's mono package: where it is, its identity, and an isolated import.

The mono package (``vllm/models/deepseek_v41/amd/mono/``) is the kernel source
of truth. Importing it through its parents would import all of vLLM (the model,
platform detection); registering the parents as bare packages whose
``__path__`` points at the folders imports only the mono package.

``mono_digest`` recomputes vLLM's own ``SOURCES`` (``common/plan.source_digest``:
sha256 over each ``.py`` file's path relative to the mono folder, then its
bytes, files sorted, first 16 hex digits) without importing anything, so the
runtime can compare an installed vLLM with the digest a build recorded.

Shared core (build and runtime): standard library only.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import sys
import types
from dataclasses import dataclass
from pathlib import Path

from .errors import ToolchainError

MONO_REL = Path("vllm/models/deepseek_v41/amd/mono")
PARENTS = ("vllm", "vllm.models", "vllm.models.deepseek_v41", "vllm.models.deepseek_v41.amd")
MONO = "vllm.models.deepseek_v41.amd.mono"
VLLM_VERSION = "0.33.0"  # the version whose mono package this project targets
FIX_VLLM = f"pip install --no-deps vllm=={VLLM_VERSION}  (or pass --vllm-src PATH to a vLLM checkout)"


@dataclass(frozen=True)
class MonoSource:
    """One vLLM tree holding the mono package."""

    root: Path  # the folder holding the ``vllm`` package

    @functools.cached_property
    def version(self) -> str:
        """vLLM's version ("unknown" for a checkout without one); read on
        demand: finding it lists site-packages, which the runtime's source
        check does not need."""
        return _version_of(self.root)

    @property
    def mono_dir(self) -> Path:
        return self.root / MONO_REL

    @property
    def digest(self) -> str:
        return mono_digest(self.mono_dir)


def mono_digest(mono_dir: Path) -> str:
    """vLLM's ``mono.sources.SOURCES`` for the package in ``mono_dir``."""
    files = sorted(mono_dir.rglob("*.py"))
    if not files:
        raise ToolchainError(f"no mono kernel sources under {mono_dir}", fix=FIX_VLLM)
    h = hashlib.sha256()
    for f in files:
        h.update(str(f.relative_to(mono_dir)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def _version_of(root: Path) -> str:
    """vLLM's version without importing vLLM: its dist-info beside the package,
    else ``vllm/_version.py``."""
    for info in sorted(root.glob("vllm-*.dist-info")):
        meta = info / "METADATA"
        if meta.is_file():
            for line in meta.read_text(errors="replace").splitlines():
                if line.startswith("Version:"):
                    return line.split(":", 1)[1].strip()
    ver = root / "vllm" / "_version.py"
    if ver.is_file():
        for line in ver.read_text().splitlines():
            if line.startswith(("__version__", "version")) and "=" in line:
                return line.split("=", 1)[1].strip().strip("'\"")
    return "unknown"


def find(vllm_src: str | os.PathLike | None = None, *, check_version: bool = True) -> MonoSource:
    """The vLLM tree to build from: ``vllm_src`` (a checkout or site-packages
    folder holding ``vllm/``), else the installed vllm, found without
    importing it."""
    if vllm_src is not None:
        root = Path(vllm_src).resolve()
        if (root / "vllm").is_dir() is False and (root / MONO_REL).is_dir() is False:
            raise ToolchainError(f"--vllm-src {root}: no vllm/ package folder there", fix=FIX_VLLM)
    else:
        spec = importlib.util.find_spec("vllm")
        if spec is None or not spec.submodule_search_locations:
            raise ToolchainError("vLLM is not installed: it is the kernel source dsv41-aot builds from", fix=FIX_VLLM)
        root = Path(list(spec.submodule_search_locations)[0]).resolve().parent
    src = MonoSource(root=root)
    if not src.mono_dir.is_dir():
        raise ToolchainError(f"vLLM at {root} ({src.version}) has no mono package at {MONO_REL}", fix=FIX_VLLM)
    # a checkout may carry no version: its mono digest still names it exactly
    if check_version and src.version not in (VLLM_VERSION, "unknown"):
        where = f"vLLM at {root}" if vllm_src is not None else "installed vLLM"
        raise ToolchainError(f"{where} is vLLM {src.version}; dsv41-aot targets vLLM {VLLM_VERSION}", fix=FIX_VLLM)
    return src


def import_mono(src: MonoSource, module: str = "layer") -> types.ModuleType:
    """Import ``vllm.models.deepseek_v41.amd.mono.<module>`` from ``src`` with
    its parents registered as bare packages. Set ``ARCH`` first: the mono
    package fixes its target at import (``common/arch.py``). Build side only:
    this imports flydsl (and, for ``runner``, torch)."""
    for i, name in enumerate(PARENTS):
        existing = sys.modules.get(name)
        folder = src.root.joinpath(*name.split("."))
        if existing is not None:
            continue
        pkg = types.ModuleType(name)
        pkg.__path__ = [str(folder)]
        pkg.__package__ = name
        sys.modules[name] = pkg
        if i:
            setattr(sys.modules[PARENTS[i - 1]], name.rsplit(".", 1)[1], pkg)
    return importlib.import_module(f"{MONO}.{module}")
