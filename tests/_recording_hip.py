"""The recording HIP: tests/hip_recorder/recording_hip.c, the suite's one
stand-in for the AMD GPU (MOCK-GPU), built with gcc and read back.

``build(folder)`` compiles it to ``folder/libamdhip64.so.7`` (SONAME
libamdhip64.so.7, every hip* at version hip_4.2, as FlyDSL's JIT runtime
binds). ``env(lib, log)`` is what a process needs to use it: the loader finds
it by DSV41_AOT_HIP_LIB, FlyDSL's JIT runtime by LD_LIBRARY_PATH. ``calls``
reads its log; ``write_layouts`` gives it each kernel's argument layout from
the code object's own AMDGPU metadata (aot/codeobject.py), so it can build
the argument segment HIP would hand the GPU.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SOURCE = HERE / "hip_recorder" / "recording_hip.c"
VERSION_SCRIPT = HERE / "hip_recorder" / "recording_hip.map"
SONAME = "libamdhip64.so.7"
ROCM_6_4_3 = 60443483  # hipRuntimeGetVersion of ROCm 6.4.3: inside the loader's accepted range
ARCH_NAMES = {"gfx950": "gfx950:sramecc+:xnack-", "gfx942": "gfx942:sramecc+:xnack-"}


def build(folder: Path) -> Path:
    """Compile the recording HIP into ``folder`` (made if missing)."""
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / SONAME
    subprocess.run(["gcc", "-O2", "-g0", "-fPIC", "-shared", "-Wall", "-Wextra", "-Werror", "-o", str(out),
                    f"-Wl,-soname,{SONAME}", f"-Wl,--version-script={VERSION_SCRIPT}", str(SOURCE), "-lpthread"],
                   check=True)
    return out


def env(lib: Path, log: Path | None, *, arch: str = "gfx950", devices: int = 1, version: int = ROCM_6_4_3,
        fail: str | None = None, images: Path | None = None, layouts: Path | None = None,
        capturing: bool = False) -> dict:
    """The environment of a process whose HIP is the recording HIP at ``lib``
    (the loader's DSV41_AOT_HIP_LIB, the JIT runtime's LD_LIBRARY_PATH)."""
    out = {
        "DSV41_AOT_HIP_LIB": str(lib),
        "LD_LIBRARY_PATH": os.pathsep.join(filter(None, [str(lib.parent), os.environ.get("LD_LIBRARY_PATH")])),
        "RECORDING_HIP_ARCH": ARCH_NAMES.get(arch, arch),
        "RECORDING_HIP_DEVICES": str(devices),
        "RECORDING_HIP_VERSION": str(version),
        "RECORDING_HIP_CAPTURING": str(int(capturing)),
    }
    for name, value in (("LOG", log), ("FAIL", fail), ("IMAGES", images), ("KERNELS", layouts)):
        if value is not None:
            out[f"RECORDING_HIP_{name}"] = str(value)
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


@dataclass
class Call:
    """One HIP call the recording HIP answered: its process, name, status and fields."""

    pid: int
    name: str
    status: int
    fields: dict

    def __getitem__(self, field: str) -> str:
        return self.fields[field]


def calls(log: Path, name: str | None = None) -> list[Call]:
    """The calls in ``log``, in order (only those named ``name`` if given)."""
    out = []
    if not log.exists():
        return out
    for line in log.read_text().splitlines():
        pid, call, status, *fields = line.split("\t")
        if name is None or call == name:
            out.append(Call(int(pid), call, int(status), dict(f.split("=", 1) for f in fields if f)))
    return out


def kernel_metadata(code: bytes) -> dict:
    """The one kernel's map of a code object's AMDGPU metadata (``amdhsa.kernels[0]``)."""
    from dsv41_aot.aot.codeobject import amdgpu_metadata

    (kernel,) = amdgpu_metadata(code)["amdhsa.kernels"]
    return kernel


def write_layouts(images: Path, path: Path) -> dict:
    """Write the recording HIP's layout file for every image it saved in
    ``images`` (``<sha256>.co``); return sha256 -> kernel metadata."""
    out, lines = {}, []
    for f in sorted(images.glob("*.co")):
        k = out[f.stem] = kernel_metadata(f.read_bytes())
        args = ",".join(f"{a['.offset']}:{a['.size']}" for a in k[".args"])
        lines.append(f"{k['.name']}\t{k['.kernarg_segment_size']}\t{args}\n")
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(lines))
    os.replace(tmp, path)
    return out


def kernarg(kernel: dict, values: list) -> str:
    """The argument segment (hex) a launch of ``kernel`` with ``values`` must
    carry: each value at its argument's .offset, .size bytes, little-endian
    two's complement, zeros everywhere else."""
    seg = bytearray(kernel[".kernarg_segment_size"])
    assert len(values) == len(kernel[".args"]), (kernel[".name"], len(values), len(kernel[".args"]))
    for arg, v in zip(kernel[".args"], values):
        off, size = arg[".offset"], arg[".size"]
        seg[off:off + size] = (v % (1 << (8 * size))).to_bytes(size, "little")
    return seg.hex()
