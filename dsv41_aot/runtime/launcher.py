"""``Launcher``, one prebuilt launch symbol called like vLLM's FlyDSL
launcher: binding its band, checking its ABI against the library's export
metadata, loading its code object (never inside a graph capture), packing
the integers and calling the C entry; and the stream handle it accepts.

Runtime-side module: standard library only (plus hip.py's ctypes binding).
"""

from __future__ import annotations

import ctypes
import json
import struct
import sys
import threading

from . import hip as _hip
from . import state
from .abi import _CODES, _Abi
from .bands import _open_library
from .host import ENV_ARCH, _device_arch
from .rooms import _Index
from ..errors import ArchMismatchError, CaptureError, IntegrityError, LaunchError, ManifestError
from ..manifest import Entry


def _capturing(stream: int, key: str) -> bool:
    torch = sys.modules.get("torch")  # only if the process already imported it
    if torch is not None:
        try:
            if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
                return True
        except Exception:
            pass
    return _hip.load().stream_capturing(stream, what=key)


def _stream_handle(stream) -> int:
    """A HIP stream as an integer: int, None, a torch stream (``.cuda_stream``)
    or a ctypes pointer."""
    if stream is None:
        return 0
    handle = getattr(stream, "cuda_stream", None)
    if handle is None:
        handle = getattr(stream, "value", stream) if isinstance(stream, ctypes.c_void_p) else stream
    if handle is None or handle.__class__ is int:
        return handle or 0
    try:
        return handle.__index__()
    except AttributeError:
        raise LaunchError(f"stream={stream!r} is not a HIP stream (int handle, torch stream or None)") from None


# ------------------------------------------------------------------ Launcher


class Launcher:
    """One prebuilt launch symbol, called like vLLM's FlyDSL launcher:
    ``launcher(*ints, stream=...)``. The integers are packed by the manifest's
    ABI into a buffer of the calling thread (one per thread, made at its
    first call), then the C entry is called with pointers into it: threads
    never share a buffer, so one Launcher serves any number of threads.

    ``bind()`` (done by the first call or ``preload`` too) verifies and opens
    the key's band (once per band), resolves its entry and checks the ABI
    against the library's own export metadata; then the first call loads the
    code object on the device. Making a Launcher reads only the manifest, so a
    whole deployment's Launchers are ready at once, and a corrupt band is
    refused before any of it is mapped."""

    __slots__ = ("key", "kernel_name", "entry", "abi", "library", "arch", "_abi", "_idx", "_librec", "_lib",
                 "_tls", "_call", "_pack", "_ready", "_hip")

    def __init__(self, key: str, entry: Entry, abi: _Abi, idx: _Index, lib):
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
        self._ready = False
        self._hip = None

    def bind(self) -> None:
        """Verify and open this key's band, resolve its C entry, check its ABI;
        no GPU work. Idempotent and thread-safe; every failure is a LoadError.
        The band is opened under its own lock (``_open_library``), so
        Launchers of different bands bind concurrently (``bind_all``)."""
        if self._lib is not None:
            return
        lib = _open_library(self._idx, self._librec)
        with state._state.lock:
            if self._lib is not None:
                return
            try:
                fn = getattr(lib, self.entry)
            except AttributeError:
                raise IntegrityError(f"{self.key}: {self.library} does not export {self.entry}",
                                     fix=self._idx.fix_reinstall) from None
            self._check_metadata(lib)
            abi = self._abi
            self._call = abi.proto(ctypes.cast(fn, ctypes.c_void_p).value)
            self._pack = abi.struct.pack_into
            self._tls = threading.local()
            self._lib = lib  # last: a bound Launcher has every field above

    def _check_metadata(self, lib: ctypes.CDLL) -> None:
        """The manifest's ABI must be the one the library says its entry takes
        (``<entry>__metadata``, written by FlyDSL's export): a tampered
        manifest must not make the entry read past the argument array."""
        fix = self._idx.fix_reinstall
        try:
            text = ctypes.string_at(ctypes.addressof(ctypes.c_char.in_dll(lib, self.entry + "__metadata")))
        except ValueError:
            raise IntegrityError(f"{self.key}: {self.library} has no {self.entry}__metadata", fix=fix) from None
        # entries of one ABI differ only in their names: check each text once
        same = text.replace(self.entry.encode(), b"")
        if state._state.abi_checked.get(same) == self._abi.id:
            return
        try:
            meta = json.loads(text)
            have = [(s.get("arg_name") or "stream", s["ctype"], s["size"]) for s in meta["abi"]]
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
        state._state.abi_checked[same] = self._abi.id

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
            self.load_module(stream)
        if stream.__class__ is not int:
            stream = _stream_handle(stream)
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
            raise self._failed(status)

    def load_module(self, stream=None) -> None:
        """Load this key's code object on the current device (once): refused
        inside a graph capture, and on a device of another arch."""
        if self._ready:
            return
        stream = _stream_handle(stream)
        with state._state.lock:
            if self._ready:
                return
            self.bind()
            device = _device_arch()
            if device is not None and device != self.arch:
                raise ArchMismatchError(
                    f"{self.key}: built for {self.arch}, but the current device is {device}",
                    fix=f"install the {device} kernels (or unset {ENV_ARCH})",
                )
            if _capturing(stream, self.key):
                raise CaptureError(
                    f"{self.key}: first load of its code object inside a HIP/CUDA graph capture",
                    fix="call it once eagerly before capturing, or dsv41_aot.preload([...]) its keys at start-up",
                )
            self._hip = _hip.load()
            for step, arg in (("__module_init", None), ("__module_load", -1)):
                fn = getattr(self._lib, self.entry + step)
                fn.restype = ctypes.c_int32
                status = fn() if arg is None else fn(ctypes.c_int32(arg))
                if status:
                    err = LaunchError(
                        f"{self.key}: {self.entry}{step} failed: {self._hip.error_name(status)} ({status})",
                        fix="check the ROCm install and that a GPU is visible (rocm-smi; HIP_VISIBLE_DEVICES)",
                    )
                    err.status = status
                    raise err
            self._ready = True

    def _bad_args(self, args, stream) -> LaunchError:
        names = self._abi.names
        if len(args) != len(names):
            why = f"takes {len(names)} positional integers ({', '.join(names)}) and stream=, got {len(args)}"
        else:
            why = "stream is not a valid pointer"
            for name, slot, value in zip(names, self.abi, args):
                try:
                    struct.pack("<" + _CODES[slot["ctype"]], value)
                except struct.error:
                    why = f"argument {name!r} ({slot['ctype']}) got {value!r}"
                    break
        return LaunchError(f"{self.key}: {why}; nothing was launched")

    def _failed(self, status: int) -> LaunchError:
        hip = self._hip or _hip.load()
        err = LaunchError(f"{self.key}: launch of {self.kernel_name} failed: {hip.error_name(status)} ({status})")
        err.status = status
        return err
