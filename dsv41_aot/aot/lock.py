"""The lock of an arch folder, held by whoever writes ``<dir>/<arch>/``.

A build holds it from reading its manifests to the end of its link, and
``dsv41-aot link`` while it links. A second writer waits, saying so on
stderr, instead of failing, so two builds on one ``--out`` both end up built
and linked. The lock is ``flock`` on ``<arch>/.build.lock``: a killed holder
releases it with its last file descriptor. The holder writes its pid into
the file for the waiting message.

The holder is the folder's only writer, so on acquiring it removes what
killed writers left: temporary files and link folders, and the worker
pool's stale run folders (``workers.clean_stale_runs``; a build that
compiles nothing starts no pool to clean them).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import sys
from pathlib import Path

from ..listing import rooms_of
from ..manifest import LIB, OBJECTS

LOCK_FILE = ".build.lock"


@contextlib.contextmanager
def arch_lock(arch_dir: Path, what: str = "build", log=None):
    """Hold the lock of ``arch_dir`` for the ``with`` block.

    Waiting for another holder prints one message on ``log`` (default stderr)."""
    arch_dir = Path(arch_dir)
    arch_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(arch_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            print(f"dsv41-aot {what}: waiting for another build or link of {arch_dir} (pid {holder}) "
                  f"to finish", file=log or sys.stderr, flush=True)
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        remove_leftovers(arch_dir)
        from .workers import clean_stale_runs

        clean_stale_runs()
        yield
    finally:
        os.close(fd)  # releases the flock


def remove_leftovers(arch_dir: Path) -> None:
    """Remove what killed writers of ``arch_dir`` left behind.

    That is atomic_write's ``.<name>.*.tmp`` files (in the folder, objects/,
    lib/ and each room) and link's ``lib/.link-*`` folders. Call it only
    while holding the arch lock."""
    rooms = [room.dir for room in rooms_of(arch_dir)]
    for folder in (arch_dir, arch_dir / OBJECTS, arch_dir / LIB, *rooms):
        if not folder.is_dir():
            continue
        for p in folder.iterdir():
            if p.name.startswith(".") and p.name.endswith(".tmp") and p.is_file():
                p.unlink(missing_ok=True)
            elif folder.name == LIB and p.name.startswith(".link-") and p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
