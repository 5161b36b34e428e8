"""The recording HIP in the suite: the package's own (dsv41_aot/aot/hiprec/,
the suite's one stand-in for the AMD GPU, MOCK-GPU: its builder, environment
and log reader, re-exported here), and ``python``, a fresh process of this
checkout to run code in.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from dsv41_aot.aot.hiprec import (ARCH_NAMES, ROCM_6_4_3, SONAME, Call, build, calls, env,  # noqa: F401
                                  kernarg, kernel_metadata, write_layout_file)

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def write_layouts(images: Path, path: Path) -> dict:
    """Write the layout file of every image the recording HIP saved in ``images``; return sha256 -> metadata."""
    out = {f.stem: kernel_metadata(f.read_bytes()) for f in sorted(Path(images).glob("*.co"))}
    write_layout_file(path, out.values())
    return out


def python(code: str, *args, env: dict, timeout: int = 300, check: bool = True) -> subprocess.CompletedProcess:
    """``code`` in a fresh process of this checkout, with ``env`` over a
    copy of this one's without any DSV41_AOT_ / FLYDSL_ / RECORDING_HIP_ setting."""
    full = {k: v for k, v in os.environ.items() if not k.startswith(("DSV41_AOT_", "FLYDSL_", "RECORDING_HIP_"))}
    full.update(PYTHONPATH=f"{REPO}{os.pathsep}{HERE}", **env)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *map(str, args)], capture_output=True,
                          text=True, env=full, cwd=REPO, timeout=timeout)
    if check:
        assert proc.returncode == 0, proc.stderr[-4000:]
    return proc
