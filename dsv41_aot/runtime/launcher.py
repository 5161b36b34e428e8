"""``Launcher``: one prebuilt launch symbol, called like vLLM's FlyDSL launcher.

A Launcher binds its band, checks its ABI against the library's export
metadata, loads its code object (never inside a graph capture), packs the
integers and calls the C entry. See docs/loader.md ("Launcher call path").
"""

from __future__ import annotations

import ctypes
import json
import os
import struct
import sys
import threading

from . import hip as _hip
from . import state
from .abi import CODES, Abi
from .bands import open_library
from .hip import ERR_NOT_INITIALIZED, ERR_NOT_LOADED, FIX_DEVICE
from .host import ENV_ARCH
from .rooms import RoomIndex
from ..elf import embedded_code_objects
from ..errors import ArchMismatchError, CaptureError, ForkError, IntegrityError, LaunchError, ManifestError
from ..manifest import Entry


def _capturing(stream: int, key: str) -> bool:
    """Whether a graph capture is under way: torch's word (when imported and able to tell), else HIP's on ``stream``."""
    torch = sys.modules.get("torch")  # only if the process already imported it
    if torch is not None:
        try:
            if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
                return True
        except Exception:
            pass
    return _hip.load().stream_capturing(stream, what=key)


def _stream_handle(stream, key: str) -> int:
    """A HIP stream as an integer, from an int, None, a torch stream or a pointer (``key``: who asks)."""
    if stream is None:
        return 0
    handle = getattr(stream, "cuda_stream", None)
    if handle is None:
        handle = stream.value if isinstance(stream, ctypes.c_void_p) else stream  # a NULL pointer's is None
    if handle is None or handle.__class__ is int:
        return handle or 0
    try:
        return handle.__index__()
    except AttributeError:
        raise LaunchError(f"{key}: stream={stream!r} is not a HIP stream; nothing was launched",
                          fix="pass stream= a HIP stream handle (int), a torch.cuda.Stream or None") from None


class Launcher:
    """One prebuilt launch symbol, called as ``launcher(*ints, stream=...)``.

    The integers are packed by the manifest's ABI into a buffer owned by the
    calling thread, then the C entry is called with pointers into it, so one
    Launcher serves any number of threads. Making one reads only the
    manifest. ``bind()`` (done by the first call or ``preload`` too) opens
    the band and checks the entry's ABI; the first call then loads the code
    object on the device."""

    __slots__ = ("key", "kernel_name", "entry", "abi", "library", "arch", "_abi", "_idx", "_librec", "_lib",
                 "_tls", "_call", "_pack", "_ready", "_devices", "_launched", "_image_sha")

    def __init__(self, key: str, entry: Entry, abi: Abi, idx: RoomIndex, lib):
        self.key = key
        self.kernel_name = entry.symbol
        self.entry = entry.entry
        self.arch = entry.arch
        self.abi = abi.slots
        self.library = idx.band_paths[lib.file]
        self._abi = abi
        self._idx = idx
        self._librec = lib
        self._lib = None
        self._ready = False  # a launch succeeded: calls take the short path
        self._devices: set = set()  # devices this Launcher loaded its module on
        self._launched: set = set()  # devices a launch of it succeeded on (its kernel looked up there)
        self._image_sha = entry.code_object_sha256

    def bind(self) -> None:
        """Verify and open this key's band, resolve its entry, check its ABI.

        No GPU work. Idempotent and thread-safe; every failure is a
        LoadError. The band is opened under its own lock (``open_library``),
        so Launchers of different bands bind concurrently (``bind_all``)."""
        if self._lib is not None:
            return
        lib = open_library(self._idx, self._librec)
        refused = state.current().band_refused[self.library]  # open_library recorded the band's verdict
        if problem := refused.get(None) or refused.get(self.key):  # verdict.band_problems, as verify judges it
            raise problem.error()
        with state.current().lock:
            if self._lib is not None:
                return
            try:
                fn = getattr(lib, self.entry)
            except AttributeError:
                raise IntegrityError(f"{self.key}: {self.library} does not export {self.entry}",
                                     fix=self._idx.room.fix_reinstall) from None
            self._check_metadata(lib)
            self._call = self._abi.proto(ctypes.cast(fn, ctypes.c_void_p).value)
            self._pack = self._abi.struct.pack_into
            self._tls = threading.local()
            self._lib = lib  # last: a bound Launcher has every field above

    def _check_metadata(self, lib: ctypes.CDLL) -> None:
        """Check the manifest's ABI against the library's own export metadata.

        ``<entry>__metadata`` is written by FlyDSL's export: a tampered
        manifest must not make the entry read past the argument array."""
        fix = self._idx.room.fix_reinstall
        try:
            text = ctypes.string_at(ctypes.addressof(ctypes.c_char.in_dll(lib, self.entry + "__metadata")))
        except ValueError:
            raise IntegrityError(f"{self.key}: {self.library} has no {self.entry}__metadata", fix=fix) from None
        # entries of one ABI differ only in their names: check each text once
        same = text.replace(self.entry.encode(), b"")
        if state.current().abi_checked.get(same) == self._abi.id:
            return
        try:
            meta = json.loads(text)
            have = [(s["arg_name"], s["ctype"], s["size"]) for s in meta["abi"]]  # as the build read them
            symbol, arch = meta["symbol"], meta["arch"]
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise IntegrityError(f"{self.key}: {self.entry}__metadata in {self.library} is unreadable ({e})",
                                 fix=fix) from None
        if symbol != self.entry or arch != self.arch:
            raise IntegrityError(f"{self.key}: {self.library}'s {self.entry}__metadata describes {symbol} for "
                                 f"{arch}", fix=fix)
        want = self._abi.signature
        if have != want:
            i = next((i for i, (a, b) in enumerate(zip(have, want)) if a != b), min(len(have), len(want)))
            raise ManifestError(
                f"{self.key}: manifest ABI {self._abi.id} ({len(want)} slots) is not the entry's own "
                f"({len(have)} slots, from {self.entry}__metadata); first difference at slot {i}: manifest "
                f"{want[i] if i < len(want) else 'none'}, library {have[i] if i < len(have) else 'none'}",
                fix=fix,
            )
        state.current().abi_checked[same] = self._abi.id

    def _thread_buffer(self) -> tuple:
        """This thread's argument buffer and the ``void*`` array into it."""
        abi = self._abi
        buf = ctypes.create_string_buffer(abi.struct.size)
        base = ctypes.addressof(buf)
        pair = self._tls.args = (buf, abi.argv_type(*[base + off for off in abi.offsets]))
        return pair

    def __repr__(self) -> str:
        return f"<Launcher {self.key} {self.kernel_name} ({len(self.abi) - 1} args + stream)>"

    def __call__(self, *args, stream=0):
        if not self._ready:
            return self._first_call(args, stream)
        if stream.__class__ is not int:
            stream = _stream_handle(stream, self.key)
        try:
            buf, argv = self._tls.args
        except AttributeError:
            buf, argv = self._thread_buffer()
        try:
            self._pack(buf, 0, *args, stream)
        except struct.error:
            raise self._bad_args(args, stream) from None
        status = self._call(argv)
        if status:
            self._recover(status, stream, argv)

    def _first_call(self, args, stream) -> None:
        """Load the module on the current device, then launch by the short path.

        ``_ready`` is set before that launch and cleared again if it fails,
        so only a success makes later calls skip this step."""
        stream = _stream_handle(stream, self.key)
        device = self.load_module(stream)
        self._ready = True
        try:
            self(*args, stream=stream)
        except BaseException:
            self._ready = False
            raise
        self._launched.add(device)

    def _recover(self, status: int, stream: int, argv) -> None:
        """Handle a nonzero status from the entry: reload once, or raise.

        FLYDSL_AOT_ERR_NOT_LOADED means the band holds no module of this key
        for the current device (a hipSetDevice since the first load): load it
        there and call again, once. Anything else raises, naming the HIP call
        that failed."""
        if status == ERR_NOT_LOADED:
            device = self.load_module(stream)
            status = self._call(argv)
            if not status:
                self._launched.add(device)
                return
        raise self._failed(status)

    def load_module(self, stream=None) -> int:
        """Load this key's code object on the current device; return the device.

        Once per device. Refused in a fork() child of a process that had used
        HIP, inside a graph capture, and on a device of another arch."""
        if state.current().forked_after_hip is not None:
            raise self._fork_error()
        hip = _hip.load()
        status, device = hip.current_device()
        if status:
            raise self._error(f"hipGetDevice failed: {hip.status_text(status)}; nothing was loaded",
                              status, FIX_DEVICE)
        if device in self._devices:
            return device
        stream = _stream_handle(stream, self.key)
        with state.current().lock:
            if device in self._devices:
                return device
            self.bind()
            status, arch = state.current().arch_of(device)
            if status or arch is None:  # an arch HIP cannot tell is no answer: never read as a match
                why = f"hipGetDeviceProperties failed: {hip.status_text(status)}" if status else \
                    "its properties name no gfx arch"
                raise self._error(f"cannot tell the arch of device {device} ({why}); nothing was loaded",
                                  status, FIX_DEVICE)
            if arch != self.arch:
                raise ArchMismatchError(
                    f"{self.key}: built for {self.arch}, but the current device is {arch} (device {device})",
                    fix=f"install the {arch} kernels (or unset {ENV_ARCH})",
                )
            if _capturing(stream, self.key):
                raise CaptureError(
                    f"{self.key}: first load of its code object inside a HIP/CUDA graph capture",
                    fix="call it once eagerly before capturing, or dsv41_aot.preload([...]) its keys at start-up",
                )
            init = getattr(self._lib, self.entry + "__module_init")
            init.restype = ctypes.c_int32
            status = init()
            if status:  # FlyDSL's own state (host memory), before any HIP call
                raise self._error(f"{self.entry}__module_init failed: {hip.status_text(status)}", status,
                                  "check the host's free memory")
            load = getattr(self._lib, self.entry + "__module_load")
            load.restype = ctypes.c_int32
            status = load(ctypes.c_int32(-1))  # the current device: hipGetDevice, then hipModuleLoadData
            if status:
                raise self._error(f"hipModuleLoadData of {self.kernel_name}'s code object on device {device} "
                                  f"failed: {hip.status_text(status)}; nothing was launched", status,
                                  _load_fix(status, self.arch, device))
            self._devices.add(device)
        return device

    def forget_loads(self) -> None:
        """After fork(): the parent's modules are not this process's."""
        self._ready = False
        self._devices = set()
        self._launched = set()

    def _fork_error(self) -> ForkError:
        return ForkError(
            f"{self.key}: this process (pid {os.getpid()}) was forked from pid {state.current().forked_after_hip} "
            f"after that process had used HIP; HIP does not survive fork(), so nothing was loaded or launched",
            fix="start GPU worker processes with spawn, as vLLM does (multiprocessing.get_context('spawn'); "
                "VLLM_WORKER_MULTIPROC_METHOD=spawn), or fork before the parent's first HIP call",
        )

    def _error(self, what: str, status: int, fix: str) -> LaunchError:
        return _hip.launch_error(f"{self.key}: {what}", status, fix)

    def _bad_args(self, args, stream) -> LaunchError:
        names = self._abi.names
        if len(args) != len(names):
            why = f"takes {len(names)} positional integers ({', '.join(names)}) and stream=, got {len(args)}"
        else:
            why = "stream is not a valid pointer"
            for name, slot, value in zip(names, self.abi, args):
                try:
                    struct.pack("<" + CODES[slot["ctype"]], value)
                except struct.error:
                    why = f"argument {name!r} ({slot['ctype']}) got {value!r}"
                    break
        return LaunchError(f"{self.key}: {why}; nothing was launched")

    def _failed(self, status: int) -> LaunchError:
        """The error of a failed launch, naming the call that failed.

        FlyDSL's own codes are named as such. After a success on this device
        the call is hipModuleLaunchKernel (the band caches the kernel's
        function per device). Before one, the band also looked the kernel up
        (hipModuleGetFunction): a fresh lookup in the same code object tells
        which of the two failed."""
        hip = _hip.load()
        name = hip.status_text(status)
        if status in (ERR_NOT_INITIALIZED, ERR_NOT_LOADED):
            return self._error(f"launch of {self.kernel_name} failed: {name}", status, FIX_DEVICE)
        hip_status, device = hip.current_device()
        where = f"on device {device}" if not hip_status else "on the current device"
        if device not in self._launched:
            image = self._image()
            found = hip.kernel_lookup(image, self.kernel_name) if image is not None else None
            if found:
                return self._error(
                    f"hipModuleGetFunction of {self.kernel_name} {where} failed: {name} (a fresh lookup in the same "
                    f"code object fails with {hip.status_text(found)}); nothing was launched", status,
                    f"the band does not hold the kernel its manifest names: {self._idx.room.fix_reinstall}")
            if found is None:
                return self._error(
                    f"hipModuleGetFunction or hipModuleLaunchKernel of {self.kernel_name} {where} failed: {name} "
                    f"(its code object no longer loads, so the lookup cannot be told from the launch)", status,
                    FIX_DEVICE)
        return self._error(f"hipModuleLaunchKernel of {self.kernel_name} {where} failed: {name}", status,
                           _launch_fix(status))

    def _image(self) -> bytes | None:
        """This key's code object, found by its sha256 in the band's dlopened bytes."""
        fd = state.current().fds.get(self.library)
        if fd is None:
            return None
        return embedded_code_objects(os.pread(fd, self._librec.raw_bytes, 0)).get(self._image_sha)


def _load_fix(status: int, arch: str, device: int) -> str:
    """The fix for a failed hipModuleLoadData, by its status."""
    if status == 2:  # hipErrorOutOfMemory
        return f"free device memory on device {device} (another process? rocm-smi --showmemuse)"
    if status in (200, 209, 218, 300, 301, 302, 303):  # an image this device or runtime cannot load
        return (f"the code object is {arch}'s: check that device {device} is a {arch} (rocminfo) and that ROCm is "
                f"6.0 to 7.x (hipRuntimeGetVersion)")
    return FIX_DEVICE


def _launch_fix(status: int) -> str:
    """The fix for a failed hipModuleLaunchKernel, by its status."""
    if status in (9, 701):  # hipErrorInvalidConfiguration, hipErrorLaunchOutOfResources
        return ("every CTA of the persistent grid must be resident at once: check that no other kernel holds the "
                "device's CUs (rocm-smi) and that HIP_VISIBLE_DEVICES names a whole GPU")
    if status in (1, 400):  # hipErrorInvalidValue, hipErrorInvalidHandle
        return "pass a live HIP stream of the current device (stream=torch.cuda.current_stream(), or 0)"
    return FIX_DEVICE + "; FlyDSL's runtime prints the failing call on stderr"
