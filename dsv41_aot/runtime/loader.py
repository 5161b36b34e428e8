"""The runtime: prebuilt launch symbols as Launchers, with no JIT in the process.

``load_key("k2@gfx950:s=4,tp=4,r=1")`` looks the key up in the prebuilt
directory's manifest (read once per arch and indexed), checks it (arch, vLLM
source digest, library sha256), opens the key's linked library once and
returns a :class:`Launcher`, a drop-in for what vLLM's ``build_mono_*``
returns: ``launcher(*ints, stream=...)``.

Nothing reaches the GPU until a Launcher is first called (or preloaded): each
key's code object is loaded by its own ``<entry>__module_load``, once, under a
lock, and never inside a graph capture (a first load there raises
CaptureError, as vLLM's runner does for a first scratch allocation).

Runtime-side module: standard library only (plus hip.py's ctypes binding).
"""

from __future__ import annotations

import ctypes
import json
import os
import struct
import sys
import threading
from pathlib import Path

from . import hip as _hip
from ..manifest import ENV_PREBUILT, LIB, LIBS_JSON, MANIFEST, Manifest, prebuilt_dir, sha256_file
from ..errors import (
    ArchMismatchError,
    CaptureError,
    HipUnavailableError,
    IntegrityError,
    KeyNotPrebuiltError,
    LaunchError,
    ManifestError,
    SourceMismatchError,
)

# keys.py (dataclasses) is imported at first use: ``import
# dsv41_aot.runtime.loader`` stays a few stdlib modules.

ENV_ARCH = "DSV41_AOT_ARCH"
ENV_ALLOW_SOURCE = "DSV41_AOT_ALLOW_SOURCE_MISMATCH"

# slot ctype -> struct code (the export metadata's C types; "pointer" is the stream)
_CODES = {
    "int64": "q", "uint64": "Q", "int32": "i", "uint32": "I", "int16": "h", "uint16": "H",
    "int8": "b", "uint8": "B", "bool": "?", "float": "f", "double": "d", "pointer": "Q",
}


# ------------------------------------------------------------------ process state


class _State:
    """What one process has opened and loaded; reset in a forked child."""

    def __init__(self):
        self.lock = threading.RLock()
        self.indexes: dict = {}  # arch folder -> _Index
        self.libraries: dict = {}  # library path -> ctypes.CDLL
        self.launchers: dict = {}  # (arch folder, key) -> Launcher
        self.device_arch: str | None = None
        self.device_arch_read = False
        self.installed_digest: tuple | None = None  # (digest or None, source.MonoSource, mono dir)
        self.warned: set = set()


_state = _State()


def _after_fork_in_child() -> None:
    """HIP modules do not survive fork: a child reloads each code object on its
    first call. Locks are new (one held by another thread at fork would never
    be released here)."""
    old = _state
    _state.lock = threading.RLock()
    _state.device_arch, _state.device_arch_read = None, False
    for launcher in old.launchers.values():
        launcher._ready = False


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


# ------------------------------------------------------------------ ABI


class _Abi:
    """One ABI (slot list) compiled once: a struct layout for packing the
    integers straight into one buffer, and each slot's offset in it."""

    def __init__(self, slots: list):
        if not slots or slots[-1].get("name") != "stream" or slots[-1].get("ctype") != "pointer":
            raise ManifestError(f"ABI {slots[-1:] if slots else '[]'} does not end with the stream slot")
        fmt, offsets, pos = "<", [], 0
        for slot in slots:
            code, size = _CODES.get(slot.get("ctype")), slot.get("size")
            if code is None or struct.calcsize("<" + code) != size:
                raise ManifestError(f"ABI slot {slot} has an unknown C type or size")
            pad = -pos % size
            fmt += "x" * pad
            pos += pad
            offsets.append(pos)
            fmt += code
            pos += size
        self.slots = slots
        self.names = [s["name"] for s in slots[:-1]]
        self.struct = struct.Struct(fmt)
        self.offsets = offsets
        self.argv_type = ctypes.c_void_p * len(slots)
        self.proto = ctypes.PYFUNCTYPE(ctypes.c_int32, self.argv_type)


# ------------------------------------------------------------------ per-arch index


class _Index:
    """One arch folder's manifest and link record, read once."""

    def __init__(self, root: Path, arch: str):
        self.root = root
        self.arch = arch
        self.dir = root / arch
        self.manifest = Manifest.read(self.dir, arch)
        self.entries = self.manifest.entries
        fix = f"link it: dsv41-aot link --dir {root} --arch {arch}"
        path = self.dir / LIB / LIBS_JSON
        try:
            doc = json.loads(path.read_bytes())
        except FileNotFoundError:
            raise ManifestError(f"{path} is missing: the objects of {self.dir} were never linked", fix=fix) from None
        except ValueError as e:
            raise ManifestError(f"{path}: malformed JSON ({e})", fix=fix) from None
        self.lib_of: dict = {}
        try:
            if doc.get("arch") != arch:
                raise ManifestError(f"{path}: link record for {doc.get('arch')!r} in the {arch} folder", fix=fix)
            for lib in doc["libraries"]:
                for key, obj_sha in lib["entries"].items():
                    self.lib_of[key] = (lib, obj_sha)
        except (KeyError, TypeError, AttributeError):
            raise ManifestError(f"{path}: not a dsv41-aot link record", fix=fix) from None
        self.fix_link = fix
        self.abis: dict = {}

    def abi(self, aid: str) -> _Abi:
        a = self.abis.get(aid)
        if a is None:
            a = self.abis[aid] = _Abi(self.manifest.abis[aid])
        return a


def _index(root: Path, arch: str) -> _Index:
    folder = root / arch
    idx = _state.indexes.get(folder)
    if idx is None:
        with _state.lock:
            idx = _state.indexes.get(folder)
            if idx is None:
                if not (folder / MANIFEST).is_file():
                    others = sorted(p.parent.name for p in root.glob(f"*/{MANIFEST}"))
                    if others:
                        raise ArchMismatchError(
                            f"{root} holds prebuilt kernels for {', '.join(others)}, not {arch}",
                            fix=f"install the {arch} wheel, or build: dsv41-aot build --arch {arch} --out {root}",
                        )
                    raise ManifestError(
                        f"no prebuilt kernels for {arch} at {folder} (no manifest.json)",
                        fix=f"build them: dsv41-aot build --arch {arch} --out {root} && dsv41-aot link --dir {root}",
                    )
                idx = _state.indexes[folder] = _Index(root, arch)
    return idx


# ------------------------------------------------------------------ checks


def _device_arch() -> str | None:
    """The current HIP device's arch (None without a device), read once."""
    if not _state.device_arch_read:
        _state.device_arch = _hip.load().arch()
        _state.device_arch_read = True
    return _state.device_arch


def resolve_arch(arch: str | None = None) -> str:
    """``arch``, else DSV41_AOT_ARCH, else the current HIP device's."""
    arch = arch or os.environ.get(ENV_ARCH)
    if arch:
        return arch
    found = _device_arch()
    if found is None:
        raise HipUnavailableError(
            "no HIP device to read the GPU architecture from",
            fix=f"run on a ROCm GPU host, or name the arch: {ENV_ARCH}=gfx950 (or arch=...)",
        )
    return found


def _installed_vllm() -> tuple:
    """(mono digest, version, mono dir) of the vLLM this process would import,
    found without importing it; (None, None, None) when there is none."""
    if _state.installed_digest is None:
        from .. import source

        try:
            src = source.find(check_version=False)
            _state.installed_digest = (source.mono_digest(src.mono_dir), src, str(src.mono_dir))
        except Exception:  # no vLLM, or one without the mono package: nothing to compare
            _state.installed_digest = (None, None, None)
    return _state.installed_digest


def _check_source(key: str, entry: dict) -> None:
    digest, src, mono = _installed_vllm()
    built = entry["source"].get("mono_sources")
    if digest is None or built == digest:
        return
    msg = (f"{key}: installed vLLM {src.version} mono sources ({mono}) digest {digest} differ from the "
           f"{built} the prebuilt kernels were built from (vLLM {entry['source'].get('vllm_version')})")
    if os.environ.get(ENV_ALLOW_SOURCE) == "1":
        if (digest, built) not in _state.warned:
            _state.warned.add((digest, built))
            import logging

            logging.getLogger("dsv41_aot").warning("%s; running them anyway (%s=1)", msg, ENV_ALLOW_SOURCE)
        return
    raise SourceMismatchError(
        msg,
        fix=(f"install vllm=={entry['source'].get('vllm_version')}, or rebuild against this vLLM "
             f"(dsv41-aot build ...), or accept the difference with {ENV_ALLOW_SOURCE}=1"),
    )


def _open_library(idx: _Index, lib: dict) -> ctypes.CDLL:
    """dlopen one linked library, once, after verifying its sha256 and opening
    libamdhip64 globally (its hip* references bind to that)."""
    path = str(idx.dir / "lib" / lib["file"])
    handle = _state.libraries.get(path)
    if handle is not None:
        return handle
    with _state.lock:
        handle = _state.libraries.get(path)
        if handle is None:

            try:
                ok = sha256_file(Path(path)) == lib["sha256"]
            except FileNotFoundError:
                raise IntegrityError(f"{path} is missing", fix=idx.fix_link) from None
            if not ok:
                raise IntegrityError(f"{path} does not match the sha256 in {LIBS_JSON} (corrupt or altered)",
                                     fix=idx.fix_link)
            _hip.load()
            try:
                handle = ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_LOCAL)
            except OSError as e:
                if "undefined symbol: hip" in str(e):
                    raise HipUnavailableError(f"{path}: this host's libamdhip64 lacks a symbol ({e})",
                                              fix=_hip.FIX_HIP) from None
                raise IntegrityError(f"cannot dlopen {path}: {e}", fix=idx.fix_link) from None
            _state.libraries[path] = handle
    return handle


def _capturing(stream: int) -> bool:
    torch = sys.modules.get("torch")  # only if the process already imported it
    if torch is not None:
        try:
            if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
                return True
        except Exception:
            pass
    return _hip.load().stream_capturing(stream)


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
    ABI into a buffer made once; the C entry is called holding the GIL
    (ctypes.PYFUNCTYPE), so packing and call are one step for other threads.

    A Launcher is bound on its first call (or ``preload``): its library is
    checked against its sha256 and opened (once per library), its entry
    resolved, then its code object loaded on the device. Making one reads
    only the manifest, so a whole deployment's Launchers are ready at once
    and a corrupt library is refused before anything of it is loaded."""

    __slots__ = ("key", "kernel_name", "entry", "abi", "library", "arch", "_abi", "_idx", "_librec", "_lib",
                 "_buf", "_argv", "_call", "_pack", "_ready", "_hip")

    def __init__(self, key: str, entry: dict, abi: _Abi, idx: _Index, lib: dict):
        self.key = key
        self.kernel_name = entry["symbol"]
        self.entry = entry["entry"]
        self.arch = entry["arch"]
        self.abi = abi.slots
        self.library = str(idx.dir / "lib" / lib["file"])
        self._abi = abi
        self._idx = idx
        self._librec = lib
        self._lib = None
        self._ready = False
        self._hip = None

    def bind(self) -> None:
        """Open this key's library (sha256 first) and resolve its C entry; no
        GPU work. Idempotent and thread-safe."""
        if self._lib is not None:
            return
        with _state.lock:
            if self._lib is not None:
                return
            lib = _open_library(self._idx, self._librec)
            try:
                fn = getattr(lib, self.entry)
            except AttributeError:
                raise IntegrityError(f"{self.key}: {self.library} does not export {self.entry}",
                                     fix=f"relink: dsv41-aot link --arch {self.arch}") from None
            abi = self._abi
            self._call = abi.proto(ctypes.cast(fn, ctypes.c_void_p).value)
            self._buf = ctypes.create_string_buffer(abi.struct.size)
            base = ctypes.addressof(self._buf)
            self._argv = abi.argv_type(*[base + off for off in abi.offsets])
            self._pack = abi.struct.pack_into
            self._lib = lib  # last: a bound Launcher has every field above

    def __repr__(self) -> str:
        return f"<Launcher {self.key} {self.kernel_name} ({len(self.abi) - 1} args + stream)>"

    def __call__(self, *args, stream=0):
        if not self._ready:
            self.load_module(stream)
        if stream.__class__ is not int:
            stream = _stream_handle(stream)
        try:
            self._pack(self._buf, 0, *args, stream)
        except struct.error:
            raise self._bad_args(args, stream) from None
        status = self._call(self._argv)
        if status:
            raise self._failed(status)

    def load_module(self, stream=None) -> None:
        """Load this key's code object on the current device (once): refused
        inside a graph capture, and on a device of another arch."""
        if self._ready:
            return
        stream = _stream_handle(stream)
        with _state.lock:
            if self._ready:
                return
            self.bind()
            if _capturing(stream):
                raise CaptureError(
                    f"{self.key}: first load of its code object inside a HIP/CUDA graph capture",
                    fix="call it once eagerly before capturing, or dsv41_aot.preload([...]) its keys at start-up",
                )
            device = _device_arch()
            if device is not None and device != self.arch:
                raise ArchMismatchError(
                    f"{self.key}: built for {self.arch}, but the current device is {device}",
                    fix=f"install the {device} kernels (or unset {ENV_ARCH})",
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


# ------------------------------------------------------------------ public API


def load_key(key, *, prebuilt: str | os.PathLike | None = None) -> Launcher:
    """The Launcher of one key (its canonical string or a BuildKey)."""
    text = key if isinstance(key, str) else str(key)
    root = Path(prebuilt).resolve() if prebuilt is not None else prebuilt_dir()
    launcher = _state.launchers.get((root, text))
    if launcher is not None:
        return launcher
    # a canonical key of an arch already indexed needs no parsing
    idx = _state.indexes.get(root / text.partition("@")[2].partition(":")[0])
    entry = idx.entries.get(text) if idx is not None else None
    if entry is None:
        from ..keys import BuildKey

        bk = BuildKey.parse(text) if isinstance(key, str) else key
        text = str(bk)
        idx = _index(root, bk.arch)
        entry = idx.entries.get(text)
    if entry is None:
        from ..keys import neighbours

        close = neighbours(bk, idx.entries)
        raise KeyNotPrebuiltError(
            f"{text} is not prebuilt in {idx.dir} ({len(idx.entries)} keys); closest: {', '.join(close) or 'none'}",
            fix=f"dsv41-aot build --key '{text}' --out {root} && dsv41-aot link --dir {root}",
        )
    _check_source(text, entry)
    lib, obj_sha = idx.lib_of.get(text, (None, None))
    if lib is None or obj_sha != entry["sha256"]:
        raise ManifestError(f"{text}: {idx.dir / LIB / LIBS_JSON} is older than the manifest (key not linked from its "
                            f"current object)", fix=idx.fix_link)
    with _state.lock:
        launcher = _state.launchers.get((root, text))
        if launcher is None:
            launcher = Launcher(text, entry, idx.abi(entry["abi"]), idx, lib)
            _state.launchers[(root, text)] = launcher
    return launcher


def load(kind: str, *, tokens: int, tp: int, ratio: int, fold: bool = True, index: bool = False,
         experts: int = 384, topk: int = 6, ug_groups: int = 2, swa_width: int = 128, timeline: bool = False,
         arch: str | None = None, prebuilt: str | os.PathLike | None = None) -> Launcher:
    """The Launcher for the launch vLLM's ``build_mono_<kind>(MonoBuild(...))``
    would build, on ``arch`` (default: DSV41_AOT_ARCH, else the current device)."""
    from ..keys import BuildKey

    key = BuildKey(kind=kind, arch=resolve_arch(arch), tokens=tokens, tp=tp, ratio=ratio, fold=fold, index=index,
                   experts=experts, topk=topk, ug_groups=ug_groups, swa_width=swa_width, timeline=timeline)
    return load_key(key, prebuilt=prebuilt)


def preload(keys, *, prebuilt: str | os.PathLike | None = None, stream=None) -> list:
    """Load the code objects of ``keys`` (strings, BuildKeys or Launchers) on
    the current device now, so no first call pays for it (or meets a capture)."""
    out = []
    for k in keys:
        launcher = k if isinstance(k, Launcher) else load_key(k, prebuilt=prebuilt)
        launcher.load_module(stream)
        out.append(launcher)
    return out


def keys(arch: str | None = None, *, prebuilt: str | os.PathLike | None = None) -> list[str]:
    """Every prebuilt key of ``arch`` (default: as :func:`load`)."""
    root = Path(prebuilt).resolve() if prebuilt is not None else prebuilt_dir()
    return sorted(_index(root, resolve_arch(arch)).entries)
