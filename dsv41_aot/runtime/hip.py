"""The few HIP runtime calls the loader makes, through ctypes.

The linked kernel libraries leave every ``hip*`` symbol undefined (no
``DT_NEEDED libamdhip64.so.N``: the build machine's ROCm must not decide which
one a serving host loads). This module opens the host's libamdhip64 with
``RTLD_GLOBAL`` before any kernel library is opened, so their references bind
to it. A libamdhip64 already mapped in the process (torch's ROCm build, say) is
reused, never a second copy beside it.
"""

from __future__ import annotations

import ctypes
import os
import re
import threading

from ..errors import HipUnavailableError, HipVersionError, LaunchError

SONAMES = ("libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6")
FIX_HIP = (
    "install ROCm 6 or 7 (libamdhip64), set ROCM_PATH to it, "
    "or name the library with DSV41_AOT_HIP_LIB=/path/to/libamdhip64.so"
)
FIX_DEVICE = "check the ROCm install and that a GPU is visible (rocm-smi; HIP_VISIBLE_DEVICES)"
HIP_SUCCESS = 0
ERR_NOT_INITIALIZED, ERR_NOT_LOADED = -1, -2  # FlyDSL's AOT runtime's own codes (its export header)
# ROCm 6.x and 7.x (hipRuntimeGetVersion: major * 10,000,000 + minor * 100,000 + patch): the AOT
# runtime of every FlyDSL dsv41-aot supports targets ROCm 6+ (hipGetDevicePropertiesR0600's
# layout, gfx950 code objects), which ROCm 5's HIP predates.
ACCEPTED = ((6, 0), (8, 0))  # [from, to)
ENV_ALLOW_VERSION = "DSV41_AOT_ALLOW_HIP_VERSION"  # "5.2": also accept exactly that major.minor
_ARCH_RE = re.compile(rb"gfx[0-9a-f]+(?::[A-Za-z0-9+\-:]*)?\x00")
# hipDeviceProp_t grew between ROCm 5 and 6 (hipGetDevicePropertiesR0600): a buffer larger
# than either, scanned for the gcnArchName string, needs neither layout.
_PROPS_BYTES = 16384

_lock = threading.Lock()
_hip: "Hip | None" = None


def candidates() -> list[str]:
    """Where libamdhip64 is looked for, in order."""
    out = []
    mapped = _mapped_hip()
    if mapped:
        out.append(mapped)
    explicit = os.environ.get("DSV41_AOT_HIP_LIB")
    if explicit:  # named explicitly: that library or none
        return out + [explicit]
    rocm = os.environ.get("ROCM_PATH")
    if rocm:
        out += [os.path.join(rocm, "lib", name) for name in SONAMES]
    out += list(SONAMES)
    out += [os.path.join("/opt/rocm/lib", name) for name in SONAMES]
    return list(dict.fromkeys(out))


def _mapped_hip() -> str | None:
    """The path of a libamdhip64 this process already has mapped, if any."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                if "libamdhip64.so" in line:
                    return line.split(None, 5)[-1].strip()
    except OSError:
        pass
    return None


class Hip:
    """An opened libamdhip64 and the calls the loader needs."""

    def __init__(self, lib: ctypes.CDLL, path: str):
        self.lib = lib
        self.path = path
        # set by the first call that reaches a device (count, current device, capture query): from then
        # on this process's HIP state is not a forked child's to use (state._after_fork_in_child)
        self.touched = False
        self._name = lib.hipGetErrorName
        self._name.restype = ctypes.c_char_p
        self._name.argtypes = [ctypes.c_int]

    def error_name(self, status: int) -> str:
        """hipGetErrorName of a HIP status, or FlyDSL's runtime codes."""
        if status == ERR_NOT_INITIALIZED:
            return "FLYDSL_AOT_ERR_NOT_INITIALIZED"
        if status == ERR_NOT_LOADED:
            return "FLYDSL_AOT_ERR_NOT_LOADED"
        try:
            name = self._name(status)
        except Exception:  # a status outside the enum: never fail while reporting
            name = None
        return name.decode() if name else f"HIP error {status}"

    def status_text(self, status: int) -> str:
        """A status as its name and number, as every message prints it: ``hipErrorOutOfMemory (2)``."""
        return f"{self.error_name(status)} ({status})"

    def device_count(self) -> tuple[int, int]:
        """(status, number of visible devices)."""
        self.touched = True
        n = ctypes.c_int(0)
        return self.lib.hipGetDeviceCount(ctypes.byref(n)), n.value

    def current_device(self) -> tuple[int, int]:
        """(status, hipGetDevice's current device of this thread)."""
        self.touched = True
        d = ctypes.c_int(-1)
        return self.lib.hipGetDevice(ctypes.byref(d)), d.value

    def kernel_lookup(self, image: bytes, name: str) -> int | None:
        """hipModuleGetFunction's status for ``name`` in a fresh module of ``image``.

        How a failed first launch tells the lookup from the launch; None when
        the image does not load."""
        module, fn = ctypes.c_void_p(), ctypes.c_void_p()
        buf = ctypes.create_string_buffer(image, len(image))
        if self.lib.hipModuleLoadData(ctypes.byref(module), buf) != HIP_SUCCESS:
            return None
        try:
            return self.lib.hipModuleGetFunction(ctypes.byref(fn), module, ctypes.c_char_p(name.encode()))
        finally:
            self.lib.hipModuleUnload(module)

    def device_arch(self, device: int) -> tuple[int, str | None]:
        """(hipGetDeviceProperties' status, ``device``'s gcnArchName without its features: ``gfx942``).

        The arch is None when the call succeeded but named no gfx arch."""
        self.touched = True
        props = ctypes.create_string_buffer(_PROPS_BYTES)
        fn = getattr(self.lib, "hipGetDevicePropertiesR0600", None) or self.lib.hipGetDeviceProperties
        status = fn(props, ctypes.c_int(device))
        if status != HIP_SUCCESS:
            return status, None
        m = _ARCH_RE.search(props.raw)
        return HIP_SUCCESS, (m.group(0).rstrip(b"\0").split(b":")[0].decode() if m else None)

    def stream_capturing(self, stream: int, what: str) -> bool:
        """Whether ``stream`` (0: the null stream) is being captured into a graph.

        A failed hipStreamIsCapturing is no answer: it raises LaunchError
        naming ``what`` (the key asking) and its status, never reads as "not capturing"."""
        self.touched = True
        state = ctypes.c_int(0)
        status = self.lib.hipStreamIsCapturing(ctypes.c_void_p(stream or None), ctypes.byref(state))
        if status != HIP_SUCCESS:
            raise launch_error(
                f"{what}: cannot tell whether stream {stream:#x} is being captured: hipStreamIsCapturing failed with "
                f"{self.status_text(status)}; nothing was loaded",
                status,
                FIX_DEVICE,
            )
        return state.value != 0  # hipStreamCaptureStatusNone == 0

    def check_version(self) -> tuple:
        """(major, minor) of this HIP runtime (hipRuntimeGetVersion, e.g. 60443483 for ROCm 6.4.3).

        Outside ACCEPTED, HipVersionError; DSV41_AOT_ALLOW_HIP_VERSION may
        name one more major.minor to accept."""
        version = ctypes.c_int(0)
        status = self.lib.hipRuntimeGetVersion(ctypes.byref(version))
        if status != HIP_SUCCESS:
            raise HipUnavailableError(f"{self.path}: hipRuntimeGetVersion failed: {self.status_text(status)}",
                                      fix=FIX_HIP)
        v = version.value
        major, minor = v // 10_000_000, v // 100_000 % 100
        if accepted((major, minor)) or os.environ.get(ENV_ALLOW_VERSION) == f"{major}.{minor}":
            return major, minor
        lo, hi = ACCEPTED
        raise HipVersionError(
            f"{self.path} is HIP {major}.{minor} (hipRuntimeGetVersion {v}); the prebuilt kernels are built for "
            f"ROCm {lo[0]}.{lo[1]} up to (not including) {hi[0]}.{hi[1]}",
            fix=f"install ROCm 6 or 7 and point to its libamdhip64 (ROCM_PATH or DSV41_AOT_HIP_LIB), or accept "
                f"this one at your own risk: {ENV_ALLOW_VERSION}={major}.{minor}",
        )


def launch_error(message: str, status: int, fix: str) -> LaunchError:
    """A LaunchError keeping the HIP (or FlyDSL) status of the call that failed as its ``status``."""
    err = LaunchError(message, fix=fix)
    err.status = status
    return err


def accepted(version: tuple) -> bool:
    """Whether a HIP (major, minor) is in ACCEPTED (DSV41_AOT_ALLOW_HIP_VERSION aside)."""
    return ACCEPTED[0] <= version < ACCEPTED[1]


def touched() -> bool:
    """Whether this process has used HIP (a device query or a module load)."""
    return _hip is not None and _hip.touched


def load() -> Hip:
    """libamdhip64, opened once per process with RTLD_GLOBAL; Hip.check_version checks its version."""
    global _hip
    if _hip is not None:
        return _hip
    with _lock:
        if _hip is None:
            tried = []
            for name in candidates():
                try:
                    lib = ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL | os.RTLD_NOW)
                    _hip = Hip(lib, name)
                    break
                except (OSError, AttributeError) as e:
                    tried.append(f"{name}: {e}")
            else:
                raise HipUnavailableError(
                    "libamdhip64 cannot be loaded; tried:\n    " + "\n    ".join(tried), fix=FIX_HIP
                )
    return _hip
