"""The build toolchain, found and checked before any compile starts.

FlyDSL's ROCDL serializer links GPU code objects with
``$ROCM_PATH/llvm/bin/ld.lld``. A ROCm install provides it; on a CPU-only
machine Debian's ``lld-19`` does, through a shim folder laid out like ROCm's.
Debug info is stripped with ``llvm-strip`` from the same LLVM.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ..errors import ToolchainError
from ..facts.flydsl import installed
from ..manifest import user_cache_dir
from ..source import assigned

FIX_LLD = "install a ROCm (set ROCM_PATH) or Debian's lld-19 and llvm-19: apt-get install lld-19 llvm-19"
SHIM_DIR = user_cache_dir() / "rocm"


@dataclass(frozen=True)
class Toolchain:
    """The tools a build compiles with, and their versions."""

    rocm_path: Path  # what ROCM_PATH is set to in the compile workers
    lld: Path
    strip: Path
    lld_version: str
    flydsl_version: str


def _llvm_dirs():
    """LLVM bin folders to look in, best first: ROCm's, then Debian's.

    Never the shim's own folder (a compile worker's ROCM_PATH): its ld.lld
    would relink the shim to itself, a loop every build then fails on."""
    for rocm in (os.environ.get("ROCM_PATH"), "/opt/rocm"):
        if rocm and os.path.realpath(rocm) != os.path.realpath(SHIM_DIR):
            yield Path(rocm) / "llvm" / "bin"
    for d in sorted(Path("/usr/lib").glob("llvm-*"), key=lambda p: -int(p.name[5:]) if p.name[5:].isdigit() else 0):
        yield d / "bin"


def llvm_tool(name: str) -> Path | None:
    """``name`` (ld.lld, llvm-strip) from the first LLVM folder holding it."""
    return next((d / name for d in _llvm_dirs() if (d / name).is_file()), None)


def tool_version(tool: Path) -> str:
    """The first line ``tool --version`` prints: the tool's identity."""
    try:
        out = subprocess.run([str(tool), "--version"], capture_output=True, text=True, timeout=30)
    except OSError as e:
        raise ToolchainError(f"{tool} does not run: {e}", fix=FIX_LLD) from None
    if out.returncode != 0:
        raise ToolchainError(f"{tool} --version failed: {out.stderr.strip()}", fix=FIX_LLD)
    return out.stdout.strip().splitlines()[0]


def find() -> Toolchain:
    """Find ld.lld and llvm-strip, make a ROCM_PATH FlyDSL can use, check FlyDSL."""
    lld, strip = llvm_tool("ld.lld"), llvm_tool("llvm-strip")
    if lld is None:
        raise ToolchainError("no ld.lld found (FlyDSL links GPU code objects with $ROCM_PATH/llvm/bin/ld.lld)", fix=FIX_LLD)
    if strip is None:
        found = shutil.which("llvm-strip")
        if not found:
            raise ToolchainError("no llvm-strip found (debug info is stripped from exported objects)", fix=FIX_LLD)
        strip = Path(found)
    lld_version = tool_version(lld)
    if lld.parent.name == "bin" and lld.parent.parent.name == "llvm":  # a ROCm's <rocm>/llvm/bin/ld.lld
        rocm = lld.parents[2]
    else:  # Debian's lld, behind the shim folder (never the shim itself: _llvm_dirs skips it)
        rocm = SHIM_DIR
        link = SHIM_DIR / "llvm" / "bin" / "ld.lld"
        link.parent.mkdir(parents=True, exist_ok=True)
        if not (link.is_symlink() and Path(os.readlink(link)) == lld):
            tmp = link.with_name(f".ld.lld.{os.getpid()}")
            tmp.unlink(missing_ok=True)
            tmp.symlink_to(lld)
            os.replace(tmp, link)
    return Toolchain(rocm, lld, strip, lld_version, flydsl_version())


def flydsl_version() -> str:
    """The installed FlyDSL's version, once its metadata and the module Python imports agree on it.

    A dist-info of one release in front of another's module would fail every key (exit 1 each)."""
    have = installed().version
    spec = importlib.util.find_spec("flydsl")
    module = assigned(Path(spec.origin), "__version__") if spec is not None and spec.origin else None
    if spec is None or module not in (None, have):  # None: a __version__ not written as a string, not judged
        raise ToolchainError(f"FlyDSL's installed metadata says {have}, but " + (
            f"the flydsl module Python imports ({spec.origin}) is {module}" if spec else "Python finds no flydsl"),
                             fix=f"reinstall FlyDSL so the two agree: pip install --force-reinstall --no-deps "
                                 f"flydsl=={have}, and take any other flydsl off sys.path (PYTHONPATH)")
    return have

