"""What every ``dsv41-aot ... --json`` prints: exactly one JSON object on
stdout and nothing else there (progress, warnings and FAILED lines go to
stderr), with one vocabulary across build, verify, link, coverage, list and
inspect:

- ``keys``: how many keys the command looked at;
- ``ok``: how many of them passed (built or up to date, verified, linked,
  present, resident);
- ``failed``: how many problems it found (an int), and ``failures``: the
  list of them, each ``{"key", "error"}`` (``key`` null when the problem is
  a file's; ``file`` and ``fix`` where there is one);

then the command's own fields. A command that stops on an error (exit 2 bad
input, 1 failed check) prints ``{"command", "error", "fix", "exit_code",
"keys": 0, "ok": 0, "failed": 1, "failures": [...]}``.
"""

from __future__ import annotations

import json
import sys


def tally(keys: int, ok: int, failures: list, **fields) -> dict:
    """A --json document: the shared counts, then the command's fields."""
    return {"keys": keys, "ok": ok, "failed": len(failures), "failures": failures, **fields}


def error_doc(command: str, err) -> dict:
    """The --json document of a command stopped by a dsv41_aot error."""
    message = getattr(err, "message", str(err))
    fix = getattr(err, "fix", None)
    return tally(0, 0, [{"key": None, "error": message, "fix": fix}], command=command, error=message, fix=fix,
                 exit_code=getattr(err, "exit_code", 1))


INTERNAL_ERROR = 70  # sysexits' EX_SOFTWARE: a bug of dsv41-aot, not the input (2) nor a check (1)


def internal_error_doc(command: str, err: BaseException) -> dict:
    """The --json document of a command stopped by an unexpected exception
    (its traceback goes to stderr)."""
    message = f"internal error: {type(err).__name__}: {err}"
    fix = "report it with the traceback printed on stderr"
    return tally(0, 0, [{"key": None, "error": message, "fix": fix}], command=command, error=message, fix=fix,
                 exit_code=INTERNAL_ERROR)


def print_json(doc) -> None:
    """Print the one JSON document of a --json command on stdout."""
    sys.stdout.write(json.dumps(doc, indent=1) + "\n")
    sys.stdout.flush()
