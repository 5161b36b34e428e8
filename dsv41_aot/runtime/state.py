"""The runtime's process state: one :class:`Prebuilt`, reset in a forked child.

It holds what this process has indexed, opened and loaded, and what the
vLLM plugin's runner patch found and handed out. Every runtime module
reaches it through :func:`current`; tests take a new one with :func:`fresh`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading

log = logging.getLogger("dsv41_aot")  # the runtime's logger: warn_once's warnings and the plugin's lines


class Prebuilt:
    """A process's loaded rooms, bands and caches, in one object."""

    def __init__(self):
        self.lock = threading.RLock()
        # what the loader resolves once: (how the directory was named, cwd if relative) -> absolute prebuilt dir
        self.roots: dict = {}
        self.indexes: dict = {}  # (prebuilt dir, arch, release) -> rooms.RoomIndex
        self.picked: dict = {}  # (prebuilt dir, arch) -> the release the running vLLM is (its room)
        # (prebuilt dir, arch, release) -> (room.Room, its manifest's file version): the room release_of
        # parsed to pick it, taken over once by rooms.index_of
        self.read_rooms: dict = {}
        self.libraries: dict = {}  # band path -> ctypes.CDLL
        self.band_refused: dict = {}  # band path -> {key, or None for the whole band: verdict.Problem}, read at bind
        # band path -> the lock its first bind holds, so bands bind concurrently (bands.open_library)
        self.band_locks: dict = {}
        self.band_locks_guard = threading.Lock()  # only around band_locks.setdefault
        self.fds: dict = {}  # band path -> the descriptor it was dlopened through (kept open: see bands.open_library)
        self.launchers: dict = {}  # (prebuilt dir, release, key) -> Launcher
        self.archs: dict = {}  # HIP device number -> its arch, read once per device (arch_of)
        self.hip_version: tuple | None = None  # (major, minor), checked once
        self.installed_digest: tuple | None = None  # (digest or None, source.MonoSource, mono dir, error or None)
        self.abi_checked: dict = {}  # export metadata (entry name removed) -> ABI id it was checked against
        self.warned: set = set()  # what warn_once has told; ("runner", ...) keys are the runner patch's
        self.warned_guard = threading.Lock()  # only around warned's check and add
        # what the plugin's runner patch found and handed out (runner_patch), forgotten by its uninstall()
        self.runner_room: tuple | None = None  # (arch, release) of the patched vLLM runner, found at its first build
        self.served: dict = {"aot": 0, "jit": 0}  # launchers handed to vLLM's runner, by origin
        # the parent's pid when this is a fork() child of a process that had used HIP: nothing loads here
        self.forked_after_hip: int | None = None

    def warn_once(self, what, message: str) -> bool:
        """Log ``message`` as a warning the first time ``what`` is told, never again.

        True when this call logged it. Safe from any thread: it takes no lock
        but its own, so a caller may hold ``lock`` or a band's lock."""
        with self.warned_guard:
            first = what not in self.warned
            self.warned.add(what)
        if first:
            log.warning("%s", message)
        return first

    def count_served(self, origin: str) -> None:
        """Count one launcher handed to vLLM's runner: ``origin`` is "aot" or "jit"."""
        with self.lock:
            self.served[origin] += 1

    def forget_runner(self) -> None:
        """Forget what the runner patch found, counted and warned about (its uninstall())."""
        with self.lock:
            self.runner_room = None
            self.served = dict.fromkeys(self.served, 0)
            with self.warned_guard:
                self.warned = {w for w in self.warned if not (isinstance(w, tuple) and w[:1] == ("runner",))}

    def device_arch(self) -> str | None:
        """The current HIP device's arch; None without a device or when it cannot be read."""
        from . import hip

        h = hip.load()
        status, count = h.device_count()
        if status or count < 1:
            return None
        status, device = h.current_device()
        if status:
            return None
        return self.arch_of(device)[1]  # None when HIP could not read it

    def arch_of(self, device: int) -> tuple[int, str | None]:
        """(status, arch) of HIP device ``device`` (``hip.Hip.device_arch``), read once per device.

        A failed read is not kept: the next call asks HIP again."""
        from . import hip

        with self.lock:
            if device not in self.archs:
                status, arch = hip.load().device_arch(device)
                if status:
                    return status, None
                self.archs[device] = arch
            return 0, self.archs[device]

    def band_lock(self, path: str) -> threading.Lock:
        """The lock the first bind of the band at ``path`` holds."""
        with self.band_locks_guard:
            return self.band_locks.setdefault(path, threading.Lock())

    def _after_fork(self) -> None:
        from . import hip

        self.lock = threading.RLock()
        self.warned_guard = threading.Lock()
        self.band_locks, self.band_locks_guard = {}, threading.Lock()
        self.archs = {}
        if self.forked_after_hip is None and hip.touched():
            self.forked_after_hip = os.getppid()
        for launcher in self.launchers.values():
            launcher.forget_loads()


_current = Prebuilt()


def current() -> Prebuilt:
    """This process's Prebuilt."""
    return _current


@contextlib.contextmanager
def fresh():
    """A new, empty Prebuilt while the block runs (tests); the old one after it."""
    global _current
    before, _current = _current, Prebuilt()
    try:
        yield _current
    finally:
        _current = before


def _after_fork_in_child() -> None:
    """Reset the state in a forked child, since HIP does not survive fork.

    In a child of a process that had used HIP (a device query or a module
    load), every Launcher's first call raises ForkError; a child forked
    before any HIP use loads its own modules. No Launcher keeps the parent's
    loads, and the locks are new (one held at fork would never be released):
    the runner patch's install() and uninstall() take ``lock`` too."""
    _current._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
