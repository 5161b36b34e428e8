"""The runtime's process state: one ``_state`` object holding what this
process has indexed, opened and loaded (indexes, picked rooms, libraries and
their descriptors, Launchers, the device arch, the vLLM digest, warnings),
and the fork handler that resets it in a child.

Every other runtime module reads it as ``state._state`` (a module
attribute), so replacing it (tests' ``fresh`` fixture) reaches all of them.

Runtime-side module: standard library only.
"""

from __future__ import annotations

import os
import threading


class _State:
    """What one process has opened and loaded; reset in a forked child."""

    def __init__(self):
        self.lock = threading.RLock()
        # what the loader resolves once: (how the directory was named, cwd if relative) -> absolute prebuilt dir
        self.roots: dict = {}
        self.indexes: dict = {}  # (prebuilt dir, arch, release) -> _Index
        self.picked: dict = {}  # (prebuilt dir, arch) -> the release the running vLLM is (its room)
        # (prebuilt dir, arch, release) -> (room.Room, its manifest's file version): the room release_of
        # parsed to pick it, taken over once by rooms._index
        self.read_rooms: dict = {}
        self.libraries: dict = {}  # band path -> ctypes.CDLL
        # band path -> the lock its first bind holds (reading, checking, decompressing, dlopening it), so
        # bands bind concurrently; never held while taking ``lock`` (see bands._open_library)
        self.band_locks: dict = {}
        self.band_locks_guard = threading.Lock()  # only around band_locks.setdefault
        self.fds: dict = {}  # band path -> the descriptor it was dlopened through (kept open: see bands._open_library)
        self.launchers: dict = {}  # (prebuilt dir, release, key) -> Launcher
        self.device_arch: str | None = None
        self.device_arch_read = False
        self.hip_version: tuple | None = None  # (major, minor), checked once
        self.installed_digest: tuple | None = None  # (digest or None, source.MonoSource, mono dir, error or None)
        self.abi_checked: dict = {}  # export metadata (entry name removed) -> ABI id it was checked against
        self.warned: set = set()
        # this process is a fork() child of one that had used HIP: no module may be loaded here (the parent's
        # pid); see _after_fork_in_child
        self.forked_after_hip: int | None = None


_state = _State()


def _after_fork_in_child() -> None:
    """HIP does not survive fork: in a child of a process that had used HIP
    (a device query or a module load), every Launcher's first call raises
    ForkError (launcher.load_module); a child forked before any HIP use loads
    its own modules. Either way no Launcher keeps the parent's loads. Locks
    are new (one held by another thread at fork would never be released here)."""
    from . import hip

    old = _state
    _state.lock = threading.RLock()
    _state.band_locks, _state.band_locks_guard = {}, threading.Lock()
    _state.device_arch, _state.device_arch_read = None, False
    if _state.forked_after_hip is None and hip._hip is not None and hip._hip.touched:
        _state.forked_after_hip = os.getppid()
    for launcher in old.launchers.values():
        launcher._forget_loads()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
