"""The worker side of the key protocol, and the compile worker.

The compile worker is ``python -m dsv41_aot.aot.worker ARCH RELEASE VLLM_ROOT
ARCH_DIR STRIP LINKER``. A worker is bound to one architecture for its life
(the mono package fixes its target at import; ``ARCH`` is in its environment
before Python starts). It reads key strings on stdin, one per line, and
answers each with one JSON line on the stdout it was started with. Its first
line says it is ready or why it cannot start. Everything FlyDSL or vLLM print
goes to stderr, so the answer channel stays clean. ``serve`` is that
protocol, shared by the compile worker here and ``verify``'s JIT worker
(``aot/jit.py``); ``aot/workers.py`` is its parent side.

A worker dies with its parent: the kernel sends it SIGKILL when the parent
goes (``PR_SET_PDEATHSIG``), and it checks its parent before every write (an
answer, a stored object), so nothing is written after a build was killed.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import time
import traceback

PARENT_ENV = "DSV41_AOT_PARENT_PID"  # set by dsv41_aot.aot.workers
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def bind_to_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent dies, then
    check the parent did not die before that took effect."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    ensure_parent()


def ensure_parent() -> None:
    """Exit at once unless the process that started this worker is still its parent."""
    want = os.environ.get(PARENT_ENV)
    if want is not None and os.getppid() != int(want):
        os._exit(3)


def describe(e: BaseException) -> str:
    """An exception's text, with the source line that raised it.

    A bare ``assert`` in vLLM's mono package has no message of its own."""
    from ..errors import AotError

    if isinstance(e, AotError):
        return str(e)
    frames = traceback.extract_tb(e.__traceback__)
    where = ""
    if frames:
        f = frames[-1]
        where = f" (at {f.filename.split('site-packages/')[-1]}:{f.lineno}: {f.line})"
    return f"{type(e).__name__}: {e}{where}"


def serve(arch: str, start, answer, *, release: str, ready=lambda state: {}) -> int:
    """Run the key protocol until stdin closes; return the exit status.

    ``start()`` makes the per-arch state and the ready line carries
    ``ready(state)``. Each key then gets ``{"ok": true, "key", "seconds",
    **answer(state, key)}``, or ``{"ok": false, "key", "error", "kind",
    "seconds"}`` when it raises; one key's failure never stops the others.
    Keys are parsed as keys of vLLM ``release``, the tree the worker imports."""
    bind_to_parent()
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # stray prints go to stderr

    def say(obj) -> None:
        ensure_parent()
        answers.write(json.dumps(obj) + "\n")
        answers.flush()

    try:
        from .compiler import check_arch

        check_arch(arch)
        state = start()
    except Exception as e:  # noqa: BLE001 - reported to the parent, which fails the arch's keys
        traceback.print_exc()
        say({"ready": False, "error": describe(e)})
        return 1
    say({"ready": True, "pid": os.getpid(), **ready(state)})

    from ..keys import BuildKey

    for line in sys.stdin:
        text = line.strip()
        if not text:
            continue
        print(f"dsv41-aot worker {os.getpid()}: {text}", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        try:
            out = answer(state, BuildKey.parse(text, release))
            say({"ok": True, "key": text, "seconds": time.perf_counter() - t0, **out})
        except Exception as e:  # noqa: BLE001 - one key's failure must not stop the others
            traceback.print_exc()
            say({"ok": False, "key": text, "error": describe(e), "kind": type(e).__name__,
                 "seconds": time.perf_counter() - t0})
    return 0


def main(argv: list[str]) -> int:
    """Run the compile worker with its command-line arguments."""
    arch, release, vllm_root, arch_dir, strip, linker = argv

    def start():
        from .compiler import ArchCompiler

        compiler = ArchCompiler(arch, vllm_root, arch_dir, strip, linker, release=release)
        compiler.before_write = ensure_parent
        return compiler

    def answer(compiler, key):
        entry, abi = compiler.compile(key)
        return {"entry": entry.to_dict(), "abi": abi}

    return serve(arch, start, answer, ready=lambda compiler: {"identity": compiler.identity.as_dict()}, release=release)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
