"""The recording HIP, a stand-in for the AMD GPU (MOCK-GPU), and its readers.

``recording_hip.c`` answers the HIP calls the loader, the bands and FlyDSL's
JIT runtime make, does no GPU work, and logs each call with its arguments.
It builds a launch's argument bytes from a layout file that
``write_layout_file`` writes from the code objects' own AMDGPU metadata.
``verify --against-jit`` launches each key through it by vLLM's JIT and by
the prebuilt Launcher and compares the two (``compare_launch``). It is built
as ``libamdhip64.so.7``, every hip* at version hip_4.2, as FlyDSL's JIT
runtime binds. See docs/building.md, "What needs an AMD GPU". Build side only.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ...errors import AotError
from ...facts.arches import ARCHES
from ...manifest import atomic_write, user_cache_dir

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "recording_hip.c"
VERSION_SCRIPT = HERE / "recording_hip.map"
SONAME = "libamdhip64.so.7"
CC_FLAGS = ("-O2", "-g0", "-fPIC", "-shared", "-Wall", "-Wextra", "-Werror")
ROCM_6_4_3 = 60443483  # hipRuntimeGetVersion of ROCm 6.4.3, which the loader accepts
ARCH_NAMES = {a.name: a.gcn_arch_name for a in ARCHES.values()}  # what a device of each reports
# the fields of a launch compared, in the order a difference is reported
FIELDS = ("image_sha256", "kernel", "grid", "block", "shared", "stream", "kernarg")


def default_folder(cache: Path | None = None) -> Path:
    """Where ``build`` keeps the library: in the build cache, else the user's cache."""
    return (Path(cache) if cache else user_cache_dir()) / "recording-hip"


def build(folder: Path | None = None, *, cache: Path | None = None,
          warn=lambda why: print(f"warning: {why}", file=sys.stderr)) -> Path:
    """The recording HIP's path, compiled with ``cc`` once per source, script and flags.

    It is ``folder/<digest>/libamdhip64.so.7``, written atomically: a
    concurrent build renames the same bytes into place. A build cache
    (``cache``) it cannot write is a warning: the user's cache is used
    instead, as a build cache that cannot be used never fails a command (``warn`` is given why)."""
    digest = hashlib.sha256(SOURCE.read_bytes() + b"\0" + VERSION_SCRIPT.read_bytes() + b"\0"
                            + " ".join(CC_FLAGS).encode()).hexdigest()[:16]
    out = Path(folder or default_folder(cache)) / digest / SONAME
    if out.is_file():
        return out
    cc = shutil.which("cc")
    if cc is None:
        raise AotError("no C compiler (cc) to build the recording HIP, the stand-in for the AMD GPU that "
                       "verify --against-jit launches through", fix="install one (apt-get install gcc), then run again")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{SONAME}.", dir=out.parent)
    except OSError as e:
        if folder is not None or cache is None:
            raise AotError(f"cannot write the recording HIP into {out.parent} ({e.strerror or e})",
                           fix=f"make {out.parent.parent} writable, or set XDG_CACHE_HOME to a writable folder") from None
        warn(f"build cache {cache} cannot hold the recording HIP ({e.strerror or e}): it is built in "
             f"{default_folder()} instead")
        return build(default_folder())
    os.close(fd)
    try:
        proc = subprocess.run([cc, *CC_FLAGS, "-o", tmp, f"-Wl,-soname,{SONAME}",
                               f"-Wl,--version-script={VERSION_SCRIPT}", str(SOURCE), "-lpthread"],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise AotError(f"cc could not build the recording HIP ({SOURCE}): {proc.stderr.strip()[-600:]}",
                           fix="install a working C compiler (gcc), then run again")
        os.replace(tmp, out)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return out


def env(lib: Path, log: Path | None, *, arch: str = "gfx950", devices: int = 1, version: int = ROCM_6_4_3,
        fail: str | None = None, images: Path | None = None, layouts: Path | None = None,
        capturing: bool = False) -> dict:
    """The environment variables that make ``lib`` a process's HIP.

    ``arch`` is each device's, comma-separated (a device past the list is the
    last one's; "": none named). The loader finds the library by
    DSV41_AOT_HIP_LIB, FlyDSL's JIT runtime by LD_LIBRARY_PATH."""
    out = {
        "DSV41_AOT_HIP_LIB": str(lib),
        "LD_LIBRARY_PATH": os.pathsep.join(filter(None, [str(Path(lib).parent), os.environ.get("LD_LIBRARY_PATH")])),
        "RECORDING_HIP_ARCH": ",".join(ARCH_NAMES.get(a, a) for a in arch.split(",")),
        "RECORDING_HIP_DEVICES": str(devices),
        "RECORDING_HIP_VERSION": str(version),
        "RECORDING_HIP_CAPTURING": str(int(capturing)),
    }
    for name, value in (("LOG", log), ("FAIL", fail), ("IMAGES", images), ("KERNELS", layouts)):
        if value is not None:
            out[f"RECORDING_HIP_{name}"] = str(value)
    return out


def preload(lib: Path) -> None:
    """Map the recording HIP into this process globally, before anything needs HIP.

    FlyDSL's JIT runtime, whose RPATH names /opt/rocm/lib, then binds to it."""
    import ctypes

    ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)


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
    log = Path(log)
    if not log.exists():
        return out
    for line in log.read_text().splitlines():
        pid, call, status, *fields = line.split("\t")
        if name is None or call == name:
            out.append(Call(int(pid), call, int(status), dict(f.split("=", 1) for f in fields if f)))
    return out


def kernel_metadata(code: bytes) -> dict:
    """The one kernel's map of a code object's AMDGPU metadata (``amdhsa.kernels[0]``)."""
    from ..codeobject import amdgpu_metadata

    (kernel,) = amdgpu_metadata(code)["amdhsa.kernels"]
    return kernel


def write_layout_file(path: Path, kernels) -> None:
    """Write the layout file of ``kernels`` (metadata maps), atomically: a line per kernel."""
    lines = []
    for k in kernels:
        args = ",".join(f"{a['.offset']}:{a['.size']}" for a in k[".args"])
        lines.append(f"{k['.name']}\t{k['.kernarg_segment_size']}\t{args}\n")
    atomic_write(Path(path), "".join(lines).encode())


def kernarg(kernel: dict, values: list) -> str:
    """The argument segment (hex) a launch of ``kernel`` with ``values`` must carry.

    Each value sits at its argument's .offset in .size bytes, little-endian
    two's complement; every other byte is zero."""
    seg = bytearray(kernel[".kernarg_segment_size"])
    assert len(values) == len(kernel[".args"]), (kernel[".name"], len(values), len(kernel[".args"]))
    for arg, v in zip(kernel[".args"], values):
        off, size = arg[".offset"], arg[".size"]
        seg[off:off + size] = (v % (1 << (8 * size))).to_bytes(size, "little")
    return seg.hex()


# ---------------------------------------------------------------- the two launches a comparison reads


def launch_values(ctypes_: list) -> list:
    """The argument values both launches of a key get, one per scalar slot.

    All distinct: negative int32s and int64s with high bytes set, so a
    swapped, truncated or dropped argument shows in the argument bytes."""
    return [-(j + 1) * 7919 if t == "int32" else ((j + 1) << 40) + j for j, t in enumerate(ctypes_)]


class Stream:
    """The stream both launches get: like vLLM's torch stream, it has ``.cuda_stream``."""

    cuda_stream = 0x7E57  # what torch.cuda.current_stream().cuda_stream holds


def recorded_launch(log: Path, what: str) -> dict:
    """The one successful launch in ``log`` (``FIELDS``); else AotError naming ``what``."""
    got = calls(log, "hipModuleLaunchKernel")
    if len(got) != 1 or got[0].status != 0:
        states = [c.status for c in got]
        raise AotError(f"{what}: the recording HIP saw {len(got)} launch(es) (statuses {states}), not one "
                       f"successful launch", fix="report it: the launch path did not reach the stand-in HIP")
    c = got[0]
    return {"image_sha256": c["module"], "kernel": c["kernel"], "grid": c["grid"], "block": c["block"],
            "shared": int(c["shared"]), "stream": c["stream"], "kernarg": c["kernarg"]}


def launch_digest(launch: dict) -> str:
    """sha256 of a canonical recorded launch (its ``FIELDS``, sorted JSON)."""
    doc = {f: launch[f] for f in FIELDS}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def compare_launch(prebuilt: dict, jit: dict, kernel: dict | None = None) -> list[str]:
    """What differs between the prebuilt launch and the JIT launch, field by field.

    ``kernel``, the code object's metadata map, names the argument whose bytes differ."""
    out = []
    for f in FIELDS:
        a, b = prebuilt.get(f), jit.get(f)
        if a == b:
            continue
        if f == "kernarg" and isinstance(a, str) and isinstance(b, str):
            out.append(f"launch argument bytes differ: {_first_difference(a, b, kernel)}")
        else:
            out.append(f"launch {f} differs: prebuilt {str(a)[:80]}, JIT {str(b)[:80]}")
    return out


def _first_difference(a: str, b: str, kernel: dict | None) -> str:
    """Where two argument segments (hex) first differ, by argument when known."""
    if len(a) != len(b):
        return f"prebuilt {len(a) // 2} bytes, JIT {len(b) // 2}"
    at = next(i for i in range(0, len(a), 2) if a[i:i + 2] != b[i:i + 2]) // 2
    for j, arg in enumerate((kernel or {}).get(".args", [])):
        off, size = arg[".offset"], arg[".size"]
        if off <= at < off + size:
            return (f"argument {j} (offset {off}, {size} bytes): prebuilt {a[2 * off:2 * (off + size)]}, "
                    f"JIT {b[2 * off:2 * (off + size)]}")
    return f"first at byte {at}: prebuilt {a[2 * at:2 * at + 2]}, JIT {b[2 * at:2 * at + 2]}"
