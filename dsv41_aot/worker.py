"""A compile worker: ``python -m dsv41_aot.worker ARCH VLLM_ROOT ARCH_DIR STRIP LINKER``.

One process per architecture slot, started by ``build`` with ``ARCH`` already
in its environment. Reads key strings on stdin, one a line; answers one JSON
line a key on the stdout it was started with: ``{"ok": true, "entry", "abi"}``
or ``{"ok": false, "key", "error", "kind"}``. Its first line says it is ready
(with its source identity) or why it cannot start. Everything FlyDSL or vLLM
print goes to stderr, so the answer channel stays clean.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback


def _describe(e: BaseException) -> str:
    """An exception from the kernel source, with the line that raised it (a
    bare ``assert`` in vLLM's mono package has no message of its own)."""
    frames = traceback.extract_tb(e.__traceback__)
    where = ""
    if frames:
        f = frames[-1]
        where = f" (at {f.filename.split('site-packages/')[-1]}:{f.lineno}: {f.line})"
    return f"{type(e).__name__}: {e}{where}"


def main(argv: list[str]) -> int:
    arch, vllm_root, arch_dir, strip, linker = argv
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # stray prints go to stderr

    def say(obj) -> None:
        answers.write(json.dumps(obj) + "\n")
        answers.flush()

    try:
        from .compiler import ArchCompiler

        compiler = ArchCompiler(arch, vllm_root, arch_dir, strip, linker)
    except Exception as e:  # noqa: BLE001 - reported to the parent, which fails the arch's keys
        traceback.print_exc()
        say({"ready": False, "error": f"{type(e).__name__}: {e}"})
        return 1
    say({"ready": True, "identity": compiler.identity, "pid": os.getpid()})

    from .errors import AotError
    from .keys import BuildKey

    for line in sys.stdin:
        text = line.strip()
        if not text:
            continue
        t0 = time.perf_counter()
        try:
            entry, abi = compiler.compile(BuildKey.parse(text))
            say({"ok": True, "entry": entry, "abi": abi})
        except Exception as e:  # noqa: BLE001 - one key's failure must not stop the others
            traceback.print_exc()
            msg = str(e) if isinstance(e, AotError) else _describe(e)
            say({"ok": False, "key": text, "error": msg, "kind": type(e).__name__, "seconds": time.perf_counter() - t0})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
