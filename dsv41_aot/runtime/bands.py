"""Bands, the compressed libraries of a room's keys, opened once per process.

``open_library`` dlopens exactly the bytes the room read and checked
(``room.Room.read_band``) from a sealed memfd, else from a file of the
per-user cache (``cache_dir``) verified through its descriptor.
``bind_all`` binds many Launchers' bands at once, one thread per band.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
from pathlib import Path

from . import hip as _hip
from . import state
from .. import verdict
from .rooms import RoomIndex
from ..errors import HipUnavailableError, IntegrityError
from ..linkrecord import Band
from ..manifest import atomic_write, user_cache_dir

ENV_CACHE = "DSV41_AOT_CACHE"  # where bands are unpacked when the kernel has no memfd


def open_library(idx: RoomIndex, lib: Band) -> ctypes.CDLL:
    """Bind one band, once per process, and return its library.

    The band is read, verified and decompressed by ``Room.read_band``, and
    libamdhip64 is opened first so the library's hip* references bind to it.
    The band's own lock lets two bands bind at once (xz, sha256 and the memfd
    write release the GIL). Lock order: whoever holds ``state.lock`` may take
    a band's lock, never the other way round (nothing here takes it)."""
    path = idx.band_paths[lib.file]
    st = state.current()
    handle = st.libraries.get(path)
    if handle is not None:
        return handle
    with st.band_lock(path):
        handle = st.libraries.get(path)
        if handle is None:
            hip = _hip.load()
            if st.hip_version is None:
                st.hip_version = hip.check_version()
            raw = idx.room.read_band(lib)  # the room's checks: inside lib/, a plain file, sha256, raw sha256
            # the room's verdict on this band (its exports, each key's code object and kernel): Launcher.bind asks it
            found = verdict.band_problems(idx.room, lib, idx.manifest, raw)
            refused = st.band_refused[path] = {p.key: p for p in found}
            if None in refused:  # the whole library is unsound: never dlopened
                raise refused[None].error()
            fd = _library_fd(raw, lib)
            del raw  # the memfd holds the library now: a deployment bound at once keeps one copy of each
            try:
                handle = ctypes.CDLL(f"/proc/self/fd/{fd}", mode=os.RTLD_NOW | os.RTLD_LOCAL)
            except OSError as e:
                os.close(fd)
                if "undefined symbol: hip" in str(e):
                    raise HipUnavailableError(f"{path}: this host's libamdhip64 lacks a symbol ({e})",
                                              fix=_hip.FIX_HIP) from None
                raise IntegrityError(f"cannot dlopen {path}: {e}", fix=idx.room.fix_reinstall) from None
            # kept open: glibc knows a library by the path it was opened by, and
            # a closed descriptor's number (so its /proc/self/fd/N) is reused
            st.fds[path] = fd
            st.libraries[path] = handle  # last: a handle seen here is whole
    return handle


def bind_all(launchers, workers: int | None = None) -> None:
    """Bind ``launchers``, their bands concurrently (``open_library``).

    One thread per band, up to ``workers`` (default: this process's CPUs).
    The first error, in the order the launchers came, is raised once every
    band has been tried; bands that bound stay bound."""
    launchers = list(launchers)
    todo: dict = {}  # band path -> its first Launcher, of a band not bound yet
    for launcher in launchers:
        if launcher._lib is None and state.current().libraries.get(launcher.library) is None:
            todo.setdefault(launcher.library, launcher)
    if workers is None:
        try:
            workers = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            workers = os.cpu_count() or 1
    workers = max(1, min(workers, len(todo)))
    errors: dict = {}
    if workers > 1:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(workers, thread_name_prefix="dsv41-aot-bind") as pool:
            futures = {path: pool.submit(open_library, l._idx, l._librec) for path, l in todo.items()}
        errors = {path: fut.exception() for path, fut in futures.items() if fut.exception() is not None}
    for launcher in launchers:
        error = errors.get(launcher.library)
        if error is not None:
            raise error
        launcher.bind()  # its band is open (or, one worker, opened here): the entry and its ABI


def _library_fd(raw: bytes, lib: Band) -> int:
    """A descriptor holding exactly ``raw``: a sealed memfd, else a cache file."""
    name = lib.file[: -len(".xz")]
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
    """Where bands are unpacked without memfd (DSV41_AOT_CACHE, else the user's cache)."""
    return user_cache_dir(env=ENV_CACHE)


def _cached_fd(raw: bytes, lib: Band) -> int:
    """Open the band's cache file and check its sha256 through that descriptor.

    The file is ``<cache>/<raw_sha256>.so``, (re)written atomically first
    when absent or wrong."""
    path = cache_dir() / f"{lib.raw_sha256}.so"
    for attempt in (0, 1):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except FileNotFoundError:
            fd = None
        if fd is not None:
            with open(fd, "rb", closefd=False) as f:
                same = hashlib.sha256(f.read()).hexdigest() == lib.raw_sha256
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
