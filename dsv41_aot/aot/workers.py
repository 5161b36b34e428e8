"""The pool of per-room worker processes: the parent side of the key protocol.

``build`` runs compile workers (``aot/worker.py``) here and ``verify
--against-jit`` runs JIT workers (``aot/jit.py``); both speak
``worker.serve``'s protocol.

- At most ``jobs`` workers at once. A free slot goes to the arch with the most
  estimated work left per worker; an arch's keys go longest first. A worker
  whose arch has no key left is retired, so its slot serves the other arches.
- Every key gets exactly one answer: the worker's, or the pool's own
  (``"pool": true``) when the worker died, could not start, or ran one key
  past ``key_timeout`` seconds (it is killed and replaced; the rest goes on).
- Workers die with this process (see ``aot/worker.py``). Their logs, FlyDSL
  caches and temp files live in one run folder, ``$TMPDIR/dsv41-aot-workers-*``,
  removed at the end of the run. A killed run's folder is removed by the next
  run or arch lock (``lock.arch_lock``); the ``owner.lock`` flock held for the
  run's life tells a live run's folder from a dead one's.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import json
import os
import selectors
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable

from ..errors import AotError
from ..keys import BuildKey
from .shards import estimate_seconds
from .worker import PARENT_ENV

RUN_PREFIX = "dsv41-aot-workers-"
OWNER_LOCK = "owner.lock"
DEFAULT_KEY_TIMEOUT = 600.0
TAIL_LINES = 3

# (arch, the worker's own folder) -> (argv, environment); the pool adds the
# parent pid, PYTHONPATH and TMPDIR
Spawn = Callable[[str, Path], tuple[list, dict]]


def check_jobs(jobs: int | None) -> int:
    """``--jobs``: None means the CPU count; below 1 is bad input."""
    if jobs is None:
        return os.cpu_count() or 1
    if jobs < 1:
        raise AotError(f"--jobs {jobs}: must be at least 1", fix="pass --jobs N with N >= 1 (default: the CPU count)")
    return jobs


def check_key_timeout(seconds: float | None) -> float:
    """``--key-timeout``: None means the default; it must be positive."""
    if seconds is None:
        return DEFAULT_KEY_TIMEOUT
    if not seconds > 0:
        raise AotError(f"--key-timeout {seconds}: must be a positive number of seconds",
                       fix=f"pass --key-timeout SECONDS (default {DEFAULT_KEY_TIMEOUT:.0f})")
    return float(seconds)


# ---------------------------------------------------------------- run folders


def clean_stale_runs() -> None:
    """Remove the run folders under $TMPDIR whose ``owner.lock`` nobody holds."""
    for d in sorted(Path(tempfile.gettempdir()).glob(RUN_PREFIX + "*")):
        lock_path = d / OWNER_LOCK
        try:
            fd = os.open(lock_path, os.O_RDWR)
        except OSError:
            continue  # not ours to judge (no owner lock: made by an older version, or being created)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # its run is alive
        finally:
            os.close(fd)
        shutil.rmtree(d, ignore_errors=True)


class RunFolder:
    """This run's folder under $TMPDIR, locked for the run's life.

    Its ``owner.lock`` is flocked under another name and renamed into place,
    so another process's ``clean_stale_runs`` never sees it unheld."""

    def __init__(self):
        clean_stale_runs()
        self.path = Path(tempfile.mkdtemp(prefix=RUN_PREFIX))
        self._lock = open(self.path / f".{OWNER_LOCK}.new", "w")
        fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(self.path / f".{OWNER_LOCK}.new", self.path / OWNER_LOCK)

    def close(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        self._lock.close()


# ---------------------------------------------------------------- workers


class _Worker:
    """One worker process; its stderr is a log file whose tail explains a death."""

    def __init__(self, arch: str, folder: Path, argv: list, env: dict):
        self.arch = arch
        self.key: BuildKey | None = None
        self.ready = False
        self.since = time.monotonic()  # start, then the send of the key in flight
        self.log = open(folder / "worker.log", "w+")
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, env=env,
                                     text=True, bufsize=1, cwd=str(folder))

    def send(self, key: BuildKey) -> None:
        self.key, self.since = key, time.monotonic()
        self.proc.stdin.write(f"{key}\n")
        self.proc.stdin.flush()

    def tail(self) -> str:
        self.log.seek(0)
        lines = [ln for ln in self.log.read().strip().splitlines() if ln.strip()]
        return " | ".join(lines[-TAIL_LINES:]) or "(empty log)"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


class Pool:
    """Runs keys on per-room workers started by ``spawn``.

    A worker serves one ``BuildKey.room`` (an arch and a vLLM release), and
    ``spawn`` and ``accept`` are given that name (``"gfx950/vllm-0.33.0"``;
    ``arch`` in the code). ``accept(arch, ready_message)`` may refuse a
    worker that started (say, a source identity that differs from the
    parent's): its text fails that room's keys. ``what`` names the work in
    messages ("compile", "JIT build")."""

    def __init__(self, spawn: Spawn, *, jobs: int, key_timeout: float = DEFAULT_KEY_TIMEOUT,
                 accept: Callable[[str, dict], str | None] | None = None, what: str = "compile"):
        self.spawn, self.jobs, self.key_timeout = spawn, jobs, key_timeout
        self.accept, self.what = accept, what
        self.started = 0  # workers started over the run (replacements included)

    def run(self, keys: list[BuildKey], on_answer: Callable[[BuildKey, dict], None],
            on_tick: Callable[[], None] | None = None, tick_seconds: float = 1.0) -> None:
        """Give every key to a worker of its room and collect one answer per key.

        ``on_answer(key, message)`` is called once per key (``message["ok"]``
        says how it went), ``on_tick()`` at least every ``tick_seconds``."""
        pending: dict[str, collections.deque] = {}
        for k in sorted(keys, key=lambda k: (-estimate_seconds(k), str(k))):
            pending.setdefault(k.room, collections.deque()).append(k)  # one vLLM tree and ARCH per worker
        refused: dict[str, str] = {}  # arch -> why its workers cannot run (the first reason is kept)
        workers: list[_Worker] = []
        retired: list[_Worker] = []  # stdin closed or killed, not yet reaped
        sel = selectors.DefaultSelector()
        run = RunFolder()
        repo = str(Path(__file__).resolve().parents[2])

        def pool_answer(key: BuildKey, kind: str, error: str) -> None:
            on_answer(key, {"ok": False, "key": str(key), "error": error, "kind": kind, "pool": True})

        def start(arch: str) -> None:
            folder = run.path / f"{arch.replace('/', '-')}-{self.started}"
            (folder / "tmp").mkdir(parents=True)
            self.started += 1
            argv, env = self.spawn(arch, folder)
            env = {**env, PARENT_ENV: str(os.getpid()), "TMPDIR": str(folder / "tmp")}
            env["PYTHONPATH"] = os.pathsep.join(p for p in (repo, env.get("PYTHONPATH")) if p)
            w = _Worker(arch, folder, argv, env)
            workers.append(w)
            sel.register(w.proc.stdout, selectors.EVENT_READ, w)

        def retire(w: _Worker, kill: bool = False) -> None:
            sel.unregister(w.proc.stdout)
            workers.remove(w)
            retired.append(w)  # its log is closed once it has exited, after any answer has read its tail
            if kill:
                w.kill()
            else:
                with contextlib.suppress(OSError):
                    w.proc.stdin.close()

        last_tick = time.monotonic()
        try:
            while True:
                for arch, why in refused.items():
                    while pending.get(arch):
                        pool_answer(pending[arch].popleft(), "WorkerStart", why)
                for w in list(workers):
                    if w.ready and w.key is None:
                        if pending.get(w.arch):
                            w.send(pending[w.arch].popleft())
                        else:
                            retire(w)
                # free slots to the arch with the most estimated work per worker
                while len(workers) < self.jobs:
                    busy = collections.Counter(w.arch for w in workers)  # each busy or about to take a key
                    cand = [a for a, q in pending.items() if len(q) > busy[a] and a not in refused]
                    if not cand:
                        break
                    start(max(cand, key=lambda a: (sum(map(estimate_seconds, pending[a])) / (busy[a] + 1), a)))
                if not workers:
                    break
                now = time.monotonic()
                wait = min([1.0] + [max(0.0, w.since + self.key_timeout - now) for w in workers])
                for sk, _ in sel.select(timeout=wait):
                    self._read(sk.data, retire, refused.setdefault, on_answer, pool_answer)
                now = time.monotonic()
                for w in list(workers):
                    if now - w.since <= self.key_timeout:
                        continue
                    if w.key is not None:
                        retire(w, kill=True)
                        pool_answer(w.key, "KeyTimeout",
                                    f"{self.what} did not finish in {self.key_timeout:.0f} s (--key-timeout); worker "
                                    f"{w.proc.pid} killed, log: {w.tail()}")
                    elif not w.ready:
                        retire(w, kill=True)
                        refused.setdefault(w.arch, f"{self.what} worker for {w.arch} did not start in "
                                                   f"{self.key_timeout:.0f} s (--key-timeout): {w.tail()}")
                for w in list(retired):
                    if w.proc.poll() is not None:
                        retired.remove(w)
                        w.log.close()
                if on_tick is not None and now - last_tick >= tick_seconds:
                    on_tick()
                    last_tick = now
            lost = [k for q in pending.values() for k in q]
            if lost:  # the loop above ends only when every key was given out
                raise RuntimeError(f"internal error: worker pool stopped with {len(lost)} keys not run, e.g. {lost[0]}")
        finally:
            for w in retired:  # those whose stdin was closed may still be exiting: wait briefly
                with contextlib.suppress(subprocess.TimeoutExpired):
                    w.proc.wait(timeout=5)
            for w in workers + retired:
                w.kill()
                w.log.close()
            sel.close()
            run.close()

    def _read(self, w: _Worker, retire, refuse, on_answer, pool_answer) -> None:
        """Handle one line from worker ``w``: its ready line, an answer, or its death."""
        line = w.proc.stdout.readline()
        if not line:  # the worker died
            code = w.proc.wait()
            retire(w, kill=True)
            if w.key is not None:
                pool_answer(w.key, "WorkerDied", f"{self.what} worker died (exit {code}) on this key: {w.tail()}")
            elif not w.ready:
                refuse(w.arch, f"{self.what} worker for {w.arch} died at start (exit {code}): {w.tail()}")
            return
        msg = json.loads(line)
        if "ready" in msg:
            why = msg.get("error") if not msg["ready"] else (self.accept(w.arch, msg) if self.accept else None)
            if why:
                retire(w, kill=True)
                refuse(w.arch, why)
            else:
                w.ready, w.since = True, time.monotonic()
            return
        key, w.key = w.key, None
        if key is None or msg.get("key") != str(key):
            retire(w, kill=True)
            if key is not None:
                pool_answer(key, "WorkerDied", f"{self.what} worker answered {msg.get('key')!r} for {key}")
            return
        on_answer(key, msg)

