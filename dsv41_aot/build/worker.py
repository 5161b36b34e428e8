"""Per-arch worker processes, and the compile worker:
``python -m dsv41_aot.build.worker ARCH VLLM_ROOT ARCH_DIR STRIP LINKER``.

A worker is bound to one architecture for its life (the mono package fixes its
target at import; ``ARCH`` is in its environment before Python starts). It
reads key strings on stdin, one a line, and answers one JSON line a key on the
stdout it was started with. Its first line says it is ready or why it cannot
start. Everything FlyDSL or vLLM print goes to stderr, so the answer channel
stays clean. ``serve`` is that protocol, shared by the compile worker here and
``verify``'s JIT worker.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback


def describe(e: BaseException) -> str:
    """An exception from the kernel source, with the line that raised it (a
    bare ``assert`` in vLLM's mono package has no message of its own)."""
    from ..errors import AotError

    if isinstance(e, AotError):
        return str(e)
    frames = traceback.extract_tb(e.__traceback__)
    where = ""
    if frames:
        f = frames[-1]
        where = f" (at {f.filename.split('site-packages/')[-1]}:{f.lineno}: {f.line})"
    return f"{type(e).__name__}: {e}{where}"


def serve(arch: str, start, answer, ready=lambda state: {}) -> int:
    """Run the key protocol. ``start()`` makes the per-arch state; each key
    then gets ``{"ok": true, "key", "seconds", **answer(state, key)}``, or
    ``{"ok": false, "key", "error", "kind", "seconds"}`` when it raises (one
    key's failure never stops the others). The ready line carries
    ``ready(state)``."""
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # stray prints go to stderr

    def say(obj) -> None:
        answers.write(json.dumps(obj) + "\n")
        answers.flush()

    try:
        if os.environ.get("ARCH") != arch:
            raise RuntimeError(f"worker for {arch} started with ARCH={os.environ.get('ARCH')!r}")
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
        t0 = time.perf_counter()
        try:
            out = answer(state, BuildKey.parse(text))
            say({"ok": True, "key": text, "seconds": time.perf_counter() - t0, **out})
        except Exception as e:  # noqa: BLE001 - one key's failure must not stop the others
            traceback.print_exc()
            say({"ok": False, "key": text, "error": describe(e), "kind": type(e).__name__,
                 "seconds": time.perf_counter() - t0})
    return 0


def main(argv: list[str]) -> int:
    arch, vllm_root, arch_dir, strip, linker = argv

    def start():
        from .compiler import ArchCompiler

        return ArchCompiler(arch, vllm_root, arch_dir, strip, linker)

    def answer(compiler, key):
        entry, abi = compiler.compile(key)
        return {"entry": entry, "abi": abi}

    return serve(arch, start, answer, ready=lambda compiler: {"identity": compiler.identity})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
