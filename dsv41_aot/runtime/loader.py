"""The runtime: prebuilt launch symbols as Launchers, with no JIT in the process.

``load_key("k2@gfx950:s=4,tp=4,r=1")`` looks the key up in the prebuilt
directory's manifest (read once per arch and indexed), checks it (arch, vLLM
source digest, link record) and returns a :class:`Launcher`, a drop-in for
what vLLM's ``build_mono_*`` returns: ``launcher(*ints, stream=...)``.

``Launcher.bind()`` (its first call or preload does it too) binds the key's
band: the compressed library file is read once, its sha256 checked, it is
decompressed in memory, the raw sha256 checked, and exactly those bytes are
dlopened from a sealed memfd (``/proc/self/fd/N``): nothing is written to
disk and only the bands a process binds are decompressed. Then the entry is
resolved and its ABI checked against the library's own export metadata.

Nothing reaches the GPU until a Launcher is first called (or preloaded): each
key's code object is loaded by its own ``<entry>__module_load``, once, under a
lock, and never inside a graph capture (a first load there raises
CaptureError, as vLLM's runner does for a first scratch allocation).

Runtime-side module: standard library only (plus hip.py's ctypes binding).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import re
import struct
import sys
import threading
from pathlib import Path

from . import hip as _hip
from ..manifest import (  # noqa: F401 (ENV_PREBUILT: the plugin reads it here)
    BAND_RE, ENV_PREBUILT, LIB, LIBS_JSON, LIBS_SCHEMA, MANIFEST, OBJECTS, Manifest, abi_id, prebuilt_dir,
    releases_in, sha256_file,
)
from ..facts.releases import NEWEST
from ..errors import (
    ArchMismatchError,
    CaptureError,
    HipUnavailableError,
    IntegrityError,
    KeyNotPrebuiltError,
    LaunchError,
    ManifestError,
    ReleaseMismatchError,
    SourceMismatchError,
)

# keys.py (dataclasses) is imported at first use: ``import
# dsv41_aot.runtime.loader`` stays a few stdlib modules.

ENV_ARCH = "DSV41_AOT_ARCH"
ENV_ALLOW_SOURCE = "DSV41_AOT_ALLOW_SOURCE_MISMATCH"
ENV_CACHE = "DSV41_AOT_CACHE"  # where bands are unpacked when the kernel has no memfd

_ARCH_RE = re.compile(r"gfx[0-9a-f]+")
_SHA_RE = re.compile(r"[0-9a-f]{64}")

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
        self.indexes: dict = {}  # (arch folder, release) -> _Index
        self.picked: dict = {}  # arch folder -> the release the running vLLM is (its room)
        self.libraries: dict = {}  # band path -> ctypes.CDLL
        self.fds: dict = {}  # band path -> the descriptor it was dlopened through (kept open: see _dlopen_fd)
        self.launchers: dict = {}  # (prebuilt dir, release, key) -> Launcher
        self.device_arch: str | None = None
        self.device_arch_read = False
        self.hip_version: tuple | None = None  # (major, minor), checked once
        self.installed_digest: tuple | None = None  # (digest or None, source.MonoSource, mono dir, error or None)
        self.abi_checked: dict = {}  # export metadata (entry name removed) -> ABI id it was checked against
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
    integers straight into a buffer, and each slot's offset in it."""

    def __init__(self, slots: list, aid: str = "?"):
        if not isinstance(slots, list) or not all(isinstance(s, dict) for s in slots):
            raise ManifestError(f"ABI {aid}: not a list of slots")
        if not slots or slots[-1].get("name") != "stream" or slots[-1].get("ctype") != "pointer":
            raise ManifestError(f"ABI {aid} {slots[-1:] if slots else '[]'} does not end with the stream slot")
        fmt, offsets, pos = "<", [], 0
        for slot in slots:
            code, size = _CODES.get(slot.get("ctype")), slot.get("size")
            if code is None or struct.calcsize("<" + code) != size:
                raise ManifestError(f"ABI {aid} slot {slot} has an unknown C type or size")
            pad = -pos % size
            fmt += "x" * pad
            pos += pad
            offsets.append(pos)
            fmt += code
            pos += size
        self.id = aid
        self.slots = slots
        self.names = [s["name"] for s in slots[:-1]]
        # what the library's export metadata must say, slot by slot
        self.signature = [(s["name"], s["ctype"], s["size"]) for s in slots]
        self.struct = struct.Struct(fmt)
        self.offsets = offsets
        self.argv_type = ctypes.c_void_p * len(slots)
        self.proto = ctypes.PYFUNCTYPE(ctypes.c_int32, self.argv_type)


# ------------------------------------------------------------------ per-arch index


class _Index:
    """One room's manifest and link record (the keys of one vLLM release on
    one arch), read once. Its bands are in the arch's lib/."""

    def __init__(self, root: Path, arch: str, release: str):
        self.root = root
        self.arch = arch
        self.release = release
        self.dir = root / arch
        self.manifest = Manifest.read(self.dir, arch, release=release)
        self.entries = self.manifest.entries
        self.link_cmd = f"dsv41-aot link --dir {root} --arch {arch} --release {release}"
        fix = f"link it: {self.link_cmd}" if (self.dir / OBJECTS).is_dir() else self.fix_reinstall
        path = self.manifest.room / LIBS_JSON
        self.libs_path = path
        try:
            doc = json.loads(path.read_bytes())
        except FileNotFoundError:
            raise ManifestError(f"{path} is missing: the objects of {self.dir} were never linked", fix=fix) from None
        except ValueError as e:
            raise ManifestError(f"{path}: malformed JSON ({e})", fix=fix) from None
        self.libdir = self.dir / LIB
        self.lib_of: dict = {}
        try:
            if doc.get("arch") != arch or doc.get("release") != release:
                raise ManifestError(f"{path}: link record for {doc.get('arch')!r} vLLM {doc.get('release')!r} in "
                                    f"the {arch} vLLM {release} folder", fix=fix)
            if doc.get("schema") != LIBS_SCHEMA:
                raise ManifestError(f"{path}: link record schema {doc.get('schema')!r}, this loader reads "
                                    f"{LIBS_SCHEMA} (compressed bands)", fix=fix)
            for lib in doc["libraries"]:
                name = lib["file"]
                if not isinstance(name, str) or not BAND_RE.fullmatch(name):
                    raise ManifestError(f"{path}: library {lib.get('chunk')!r} names file {name!r}, not a band "
                                        f"file inside {self.libdir}", fix=fix)
                if not all(isinstance(lib[f], str) and _SHA_RE.fullmatch(lib[f]) for f in ("sha256", "raw_sha256")) \
                        or not all(type(lib[f]) is int for f in ("bytes", "raw_bytes")):
                    raise ManifestError(f"{path}: library {name}: sha256 / raw_sha256 / bytes / raw_bytes malformed",
                                        fix=fix)
                for key, obj_sha in lib["entries"].items():
                    self.lib_of[key] = (lib, obj_sha)
        except (KeyError, TypeError, AttributeError):
            raise ManifestError(f"{path}: not a dsv41-aot link record", fix=fix) from None
        self.fix_link = fix
        self.abis: dict = {}

    def abi(self, aid: str) -> _Abi:
        """The compiled ABI ``aid``, whose id must be the hash of its slots."""
        a = self.abis.get(aid)
        if a is None:
            slots = self.manifest.abis[aid]
            if abi_id(slots) != aid:
                raise ManifestError(f"{self.manifest.path}: ABI {aid} does not hash to its id ({abi_id(slots)}): "
                                    f"its slots were altered", fix=self.fix_reinstall)
            a = self.abis[aid] = _Abi(slots, aid)
        return a

    @property
    def fix_reinstall(self) -> str:
        """How to get a good copy of this arch folder: rebuild where it was
        built (objects/ present), else reinstall the wheel it came from."""
        if (self.dir / OBJECTS).is_dir():
            return (f"rebuild and relink: dsv41-aot build --arch {self.arch} --release {self.release} "
                    f"--out {self.root} && {self.link_cmd}")
        return "reinstall the kernels: pip install --force-reinstall --no-deps dsv41-aot"


def _index(root: Path, arch: str, release: str | None = None) -> _Index:
    """The room of ``release`` (default: the running vLLM's, :func:`release_of`) on ``arch``."""
    if not isinstance(arch, str) or not _ARCH_RE.fullmatch(arch):  # never a path: no "/", no ".."
        raise ManifestError(f"arch {arch!r} is not a GPU arch name (gfx...): refusing to look for it under {root}",
                            fix=f"name it like gfx950: {ENV_ARCH}=gfx950 (or arch=...)")
    folder = root / arch
    if release is None:
        release = release_of(root, arch)
    idx = _state.indexes.get((folder, release))
    if idx is None:
        with _state.lock:
            idx = _state.indexes.get((folder, release))
            if idx is None:
                held = releases_in(folder)
                if release not in held:
                    _no_room(root, arch, release, held)
                idx = _state.indexes[(folder, release)] = _Index(root, arch, release)
    return idx


def _no_room(root: Path, arch: str, release: str, held: list) -> None:
    folder = root / arch
    build = f"dsv41-aot build --arch {arch} --release {release} --out {root} && dsv41-aot link --dir {root}"
    if held:
        raise ReleaseMismatchError(
            f"{folder} holds prebuilt kernels for vLLM {', '.join(held)}, not vLLM {release}",
            fix=f"install the dsv41-aot wheel that serves vLLM {release}, or build: {build}")
    others = sorted({p.parent.parent.name for p in root.glob(f"*/vllm-*/{MANIFEST}")})
    if others:
        raise ArchMismatchError(
            f"{root} holds prebuilt kernels for {', '.join(others)}, not {arch}",
            fix=f"install the {arch} wheel, or build: dsv41-aot build --arch {arch} --out {root}",
        )
    raise ManifestError(f"no prebuilt kernels for {arch} at {folder} (no vllm-<release>/manifest.json)",
                        fix=f"build them: {build}")


def release_of(root: Path, arch: str) -> str:
    """The release whose room serves this process on ``arch``: the room whose
    manifest records the installed vLLM's mono sources digest, computed once
    (without importing vLLM); without vLLM installed, the newest room. A
    vLLM whose digest no room has is a ReleaseMismatchError, or with
    DSV41_AOT_ALLOW_SOURCE_MISMATCH=1 the room of its version (else the newest),
    with a warning."""
    folder = root / arch
    picked = _state.picked.get(folder)
    if picked is not None:
        return picked
    held = releases_in(folder)
    if not held:
        _no_room(root, arch, NEWEST, held)
    digest, src, mono = _installed_vllm()
    if digest is None:
        pick = held[-1]
    else:
        digests, broken = {}, {}
        for release in held:
            try:
                digests[release] = Manifest.read(folder, arch, release=release).mono_sources
            except ManifestError as e:
                broken[release] = e  # a corrupt room is reported when it is the one asked for
        match = [r for r, d in digests.items() if d == digest]
        if match:
            pick = match[-1]
        elif src.version in broken:  # the running release's own room is corrupt: say so, not "no release"
            raise broken[src.version]
        else:
            have = ", ".join(f"vLLM {r} ({d})" for r, d in digests.items()) or "none readable"
            msg = (f"running vLLM {src.version} mono sources ({mono}) digest {digest} matches no prebuilt "
                   f"release in {folder}: {have}")
            fallback = src.version if src.version in held else held[-1]
            if os.environ.get(ENV_ALLOW_SOURCE) != "1":
                raise ReleaseMismatchError(
                    msg, fix=f"install one of those vLLM releases, or build this one's kernels "
                             f"(dsv41-aot build --release {src.version} ...), or run vLLM {fallback}'s kernels "
                             f"anyway with {ENV_ALLOW_SOURCE}=1")
            _warn_once(("release", digest), f"{msg}; using vLLM {fallback}'s ({ENV_ALLOW_SOURCE}=1)")
            pick = fallback
    _state.picked[folder] = pick
    return pick


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
        if not _ARCH_RE.fullmatch(arch):
            raise ManifestError(f"arch {arch!r} (argument or {ENV_ARCH}) is not a GPU arch name",
                                fix=f"name it like gfx950: {ENV_ARCH}=gfx950 (or arch=...)")
        return arch
    found = _device_arch()
    if found is None:
        raise HipUnavailableError(
            "no HIP device to read the GPU architecture from",
            fix=f"run on a ROCm GPU host, or name the arch: {ENV_ARCH}=gfx950 (or arch=...)",
        )
    return found


def running_vllm(mono_dir: Path | None) -> None:
    """Say which vLLM mono package this process runs (the plugin does, from
    the runner module it patched): its digest, not the installed vLLM's
    (they differ only when a tree is imported from elsewhere), picks the
    release's room and is checked against every key loaded. None: back to
    the installed vLLM."""
    from .. import source

    with _state.lock:
        _state.picked.clear()
        if mono_dir is None:
            _state.installed_digest = None
            return
        src = source.MonoSource(root=Path(mono_dir).parents[len(source.MONO_REL.parts) - 1])
        _state.installed_digest = (source.mono_digest(Path(mono_dir)), src, str(mono_dir), None)


def _installed_vllm() -> tuple:
    """(mono digest, source.MonoSource, mono dir) of the vLLM this process
    would import, found without importing it; (None, None, None) when none is
    installed (or it has no mono package). A digest that fails to compute is
    not "no vLLM": it raises SourceMismatchError, at every load."""
    if _state.installed_digest is None:
        from .. import source
        from ..errors import ToolchainError

        try:
            src = source.find(check_version=False)
        except ToolchainError:  # no vLLM, or one without the mono package: nothing to compare
            _state.installed_digest = (None, None, None, None)
        except Exception as e:  # noqa: BLE001 - finding it failed: that is no answer
            _state.installed_digest = (None, None, "vllm", e)
        else:
            try:
                _state.installed_digest = (source.mono_digest(src.mono_dir), src, str(src.mono_dir), None)
            except Exception as e:  # noqa: BLE001 - unreadable sources: no answer either
                _state.installed_digest = (None, src, str(src.mono_dir), e)
    digest, src, mono, error = _state.installed_digest
    if error is not None:
        msg = f"cannot compute the installed vLLM's mono source digest ({mono}): {type(error).__name__}: {error}"
        if os.environ.get(ENV_ALLOW_SOURCE) != "1":
            raise SourceMismatchError(msg, fix=f"repair the vLLM install (pip install --force-reinstall vllm), or "
                                               f"run without the check: {ENV_ALLOW_SOURCE}=1")
        _warn_once(("digest", mono), f"{msg}; running unchecked ({ENV_ALLOW_SOURCE}=1)")
    return digest, src, mono


def _warn_once(what, message: str) -> None:
    if what not in _state.warned:
        _state.warned.add(what)
        import logging

        logging.getLogger("dsv41_aot").warning("%s", message)


def _check_source(key: str, entry: dict) -> None:
    digest, src, mono = _installed_vllm()
    built = entry["source"].get("mono_sources")
    if digest is None or built == digest:
        return
    msg = (f"{key}: installed vLLM {src.version} mono sources ({mono}) digest {digest} differ from the "
           f"{built} the prebuilt kernels were built from (vLLM {entry['source'].get('vllm_version')})")
    if os.environ.get(ENV_ALLOW_SOURCE) == "1":
        _warn_once((digest, built), f"{msg}; running them anyway ({ENV_ALLOW_SOURCE}=1)")
        return
    raise SourceMismatchError(
        msg,
        fix=(f"install vllm=={entry['source'].get('vllm_version')}, or rebuild against this vLLM "
             f"(dsv41-aot build ...), or accept the difference with {ENV_ALLOW_SOURCE}=1"),
    )


# ------------------------------------------------------------------ bands


def read_band(path: Path, lib: dict, *, fix: str | None = None) -> bytes:
    """The raw library a band decompresses to, read once through one
    descriptor and checked twice: the compressed bytes against libs.json's
    sha256, the raw ones against its raw_sha256. IntegrityError otherwise."""
    data = _read_file(Path(path), fix)
    return unpack_band(Path(path), data, lib, fix)


def _read_file(path: Path, fix: str | None) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise IntegrityError(f"{path} is missing", fix=fix) from None
    except OSError as e:  # ELOOP: a symlink where a band must be
        raise ManifestError(f"{path}: cannot open it as a plain file inside its lib/ folder ({e})", fix=fix) from None
    with os.fdopen(fd, "rb") as f:
        return f.read()


def unpack_band(path: Path, data: bytes, lib: dict, fix: str | None) -> bytes:
    if hashlib.sha256(data).hexdigest() != lib["sha256"]:
        raise IntegrityError(f"{path} does not match the sha256 in {LIBS_JSON} (corrupt or altered)", fix=fix)
    import lzma  # first bind only: import dsv41_aot.runtime.loader stays small

    try:
        raw = lzma.decompress(data, format=lzma.FORMAT_XZ)
    except lzma.LZMAError as e:  # only a libs.json whose sha256 was forged with the file gets here
        raise IntegrityError(f"{path}: not an xz band ({e})", fix=fix) from None
    if len(raw) != lib["raw_bytes"] or hashlib.sha256(raw).hexdigest() != lib["raw_sha256"]:
        raise IntegrityError(f"{path} decompresses to a library whose sha256 is not the raw_sha256 in {LIBS_JSON} "
                             f"(altered band or link record)", fix=fix)
    return raw


def _band_path(idx: _Index, lib: dict) -> Path:
    """The band's path, which must resolve to a file directly inside the
    arch folder's own lib/ (libs.json's name was checked; a symlinked band or
    lib/ folder pointing elsewhere is caught here)."""
    path = idx.libdir / lib["file"]
    real = Path(os.path.realpath(path))
    if real.parent != Path(os.path.realpath(idx.dir)) / LIB or real.name != lib["file"]:
        raise ManifestError(f"{idx.libs_path}: library {lib['file']} resolves to {real}, outside "
                            f"{idx.libdir}", fix=idx.fix_reinstall)
    return path


def _open_library(idx: _Index, lib: dict) -> ctypes.CDLL:
    """Bind one band, once per process: check the HIP runtime, read, verify
    and decompress the band, dlopen exactly those bytes (libamdhip64 first,
    RTLD_GLOBAL: the library's hip* references bind to it)."""
    key = str(idx.libdir / lib["file"])
    handle = _state.libraries.get(key)
    if handle is not None:
        return handle
    with _state.lock:
        handle = _state.libraries.get(key)
        if handle is None:
            hip = _hip.load()
            if _state.hip_version is None:
                _state.hip_version = hip.check_version()
            path = _band_path(idx, lib)
            raw = read_band(path, lib, fix=idx.fix_reinstall)
            fd = _library_fd(raw, lib)
            try:
                handle = ctypes.CDLL(f"/proc/self/fd/{fd}", mode=os.RTLD_NOW | os.RTLD_LOCAL)
            except OSError as e:
                os.close(fd)
                if "undefined symbol: hip" in str(e):
                    raise HipUnavailableError(f"{path}: this host's libamdhip64 lacks a symbol ({e})",
                                              fix=_hip.FIX_HIP) from None
                raise IntegrityError(f"cannot dlopen {path}: {e}", fix=idx.fix_reinstall) from None
            # kept open: glibc knows a library by the path it was opened by, and
            # a closed descriptor's number (so its /proc/self/fd/N) is reused
            _state.fds[key] = fd
            _state.libraries[key] = handle
    return handle


def _library_fd(raw: bytes, lib: dict) -> int:
    """A descriptor holding exactly ``raw``: a sealed memfd, else (a kernel
    without memfd) a file of the per-user cache verified through the
    descriptor it is opened by."""
    name = lib["file"][: -len(".xz")]
    try:
        fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    except (AttributeError, OSError):
        return _cached_fd(raw, lib)
    try:
        view = memoryview(raw)
        while view:
            view = view[os.write(fd, view):]
        import fcntl

        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
                    | fcntl.F_SEAL_SEAL)
    except BaseException:
        os.close(fd)
        raise
    return fd


def cache_dir() -> Path:
    """Where bands are unpacked when memfd is unavailable: DSV41_AOT_CACHE,
    else $XDG_CACHE_HOME/dsv41-aot, else ~/.cache/dsv41-aot."""
    explicit = os.environ.get(ENV_CACHE)
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dsv41-aot"


def _cached_fd(raw: bytes, lib: dict) -> int:
    """Open ``<cache>/<raw_sha256>.so``, read it through that descriptor and
    check its sha256; (re)write it atomically first when absent or wrong."""
    from ..manifest import atomic_write

    path = cache_dir() / f"{lib['raw_sha256']}.so"
    for attempt in (0, 1):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except FileNotFoundError:
            fd = None
        if fd is not None:
            with open(fd, "rb", closefd=False) as f:
                same = hashlib.sha256(f.read()).hexdigest() == lib["raw_sha256"]
            if same:
                return fd
            os.close(fd)
        if attempt == 0:
            try:
                atomic_write(path, raw)
            except OSError as e:
                raise IntegrityError(f"no memfd on this kernel, and the band cache {path} cannot be written ({e})",
                                     fix=f"point {ENV_CACHE} at a writable folder") from None
    raise IntegrityError(f"{path} does not hold the library just written to it (another writer?)",
                         fix=f"remove it, or point {ENV_CACHE} at a folder only this user writes")


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

    def __init__(self, key: str, entry: dict, abi: _Abi, idx: _Index, lib: dict):
        self.key = key
        self.kernel_name = entry["symbol"]
        self.entry = entry["entry"]
        self.arch = entry["arch"]
        self.abi = abi.slots
        self.library = str(idx.libdir / lib["file"])
        self._abi = abi
        self._idx = idx
        self._librec = lib
        self._lib = None
        self._ready = False
        self._hip = None

    def bind(self) -> None:
        """Verify and open this key's band, resolve its C entry, check its ABI;
        no GPU work. Idempotent and thread-safe; every failure is a LoadError."""
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
        if _state.abi_checked.get(same) == self._abi.id:
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
        _state.abi_checked[same] = self._abi.id

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
        with _state.lock:
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


# ------------------------------------------------------------------ public API


def load_key(key, *, release: str | None = None, prebuilt: str | os.PathLike | None = None) -> Launcher:
    """The Launcher of one key: a BuildKey (of its release), or its string
    naming a launch of ``release`` (default: the running vLLM's, :func:`release_of`)."""
    text = key if isinstance(key, str) else str(key)
    if not isinstance(key, str):
        release = key.release
    root = Path(prebuilt).resolve() if prebuilt is not None else prebuilt_dir()
    arch = text.partition("@")[2].partition(":")[0]
    if release is None and _ARCH_RE.fullmatch(arch):
        release = release_of(root, arch)
    launcher = _state.launchers.get((root, release, text))
    if launcher is not None:
        return launcher
    # a canonical key of a room already indexed needs no parsing
    idx = _state.indexes.get((root / arch, release))
    entry = idx.entries.get(text) if idx is not None else None
    if entry is None:
        from ..keys import BuildKey

        bk = BuildKey.parse(text, release or NEWEST) if isinstance(key, str) else key
        text = str(bk)
        idx = _index(root, bk.arch, release)
        release = idx.release
        entry = idx.entries.get(text)
    if entry is None:
        from ..keys import neighbours

        close = neighbours(bk, idx.entries)
        raise KeyNotPrebuiltError(
            f"{text} is not prebuilt for vLLM {release} in {idx.manifest.room} ({len(idx.entries)} keys); "
            f"closest: {', '.join(close) or 'none'}",
            fix=f"dsv41-aot build --release {release} --key '{text}' --out {root} && dsv41-aot link --dir {root}",
        )
    _check_source(text, entry)
    lib, obj_sha = idx.lib_of.get(text, (None, None))
    if lib is None or obj_sha != entry["sha256"]:
        raise _link_mismatch(idx, text, entry, lib, obj_sha)
    with _state.lock:
        launcher = _state.launchers.get((root, release, text))
        if launcher is None:
            launcher = Launcher(text, entry, idx.abi(entry["abi"]), idx, lib)
            _state.launchers[(root, release, text)] = launcher
    return launcher


def _link_mismatch(idx: _Index, key: str, entry: dict, lib: dict | None, obj_sha: str | None) -> ManifestError:
    """Name what disagrees between the manifest and libs.json, and the fix
    that works: relink (the object was rebuilt), rebuild (the manifest entry
    no longer matches its object) or reinstall (no objects: a wheel)."""
    libs = idx.libs_path
    if lib is None:
        what = f"{key} is in {idx.manifest.path} but in no library of {libs}"
    else:
        what = (f"{key}: {idx.manifest.path} records object sha256 {entry['sha256'][:16]}..., but {lib['file']} was "
                f"linked from object {obj_sha[:16]}... ({libs})")
    obj = idx.dir / entry["object"]
    if not (idx.dir / OBJECTS).is_dir():
        return ManifestError(f"{what}: the installed manifest and libraries disagree", fix=idx.fix_reinstall)
    try:
        actual = sha256_file(obj)
    except OSError:
        actual = None
    if actual == entry["sha256"]:  # the object was rebuilt after the link
        return ManifestError(f"{what}: the object was rebuilt after the last link", fix=f"relink: {idx.link_cmd}")
    state = "is missing" if actual is None else f"has sha256 {actual[:16]}..., not the manifest's"
    return ManifestError(
        f"{what}; the stored object {obj.name} {state}: the manifest entry no longer describes its object",
        fix=f"rebuild it: dsv41-aot build --release {idx.release} --key '{key}' --out {idx.root} && {idx.link_cmd}",
    )


def load(kind: str, *, tokens: int, tp: int, ratio: int, fold: bool = True, index: bool = False,
         experts: int = 384, topk: int = 6, ug_groups: int = 2, swa_width: int = 128, timeline: bool = False,
         arch: str | None = None, release: str | None = None, prebuilt: str | os.PathLike | None = None) -> Launcher:
    """The Launcher for the launch vLLM's ``build_mono_<kind>(MonoBuild(...))``
    would build, on ``arch`` (default: DSV41_AOT_ARCH, else the current
    device), in vLLM ``release`` (default: the running vLLM's)."""
    from ..keys import BuildKey

    arch = resolve_arch(arch)
    root = Path(prebuilt).resolve() if prebuilt is not None else prebuilt_dir()
    key = BuildKey(kind=kind, arch=arch, tokens=tokens, tp=tp, ratio=ratio, fold=fold, index=index,
                   experts=experts, topk=topk, ug_groups=ug_groups, swa_width=swa_width, timeline=timeline,
                   release=release or release_of(root, arch))
    return load_key(key, prebuilt=root)


def preload(keys, *, release: str | None = None, prebuilt: str | os.PathLike | None = None, stream=None) -> list:
    """Load the code objects of ``keys`` (strings, BuildKeys or Launchers) on
    the current device now, so no first call pays for it (or meets a capture)."""
    out = []
    for k in keys:
        launcher = k if isinstance(k, Launcher) else load_key(k, release=release, prebuilt=prebuilt)
        launcher.load_module(stream)
        out.append(launcher)
    return out


def keys(arch: str | None = None, *, release: str | None = None,
         prebuilt: str | os.PathLike | None = None) -> list[str]:
    """Every prebuilt key of ``arch`` (default: as :func:`load`) in vLLM
    ``release`` (default: the running vLLM's)."""
    root = Path(prebuilt).resolve() if prebuilt is not None else prebuilt_dir()
    return sorted(_index(root, resolve_arch(arch), release).entries)


def releases(arch: str | None = None, *, prebuilt: str | os.PathLike | None = None) -> list[str]:
    """The vLLM releases with prebuilt kernels for ``arch``, oldest first."""
    root = Path(prebuilt).resolve() if prebuilt is not None else prebuilt_dir()
    return releases_in(root / resolve_arch(arch))
