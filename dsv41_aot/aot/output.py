"""The one JSON document every ``dsv41-aot ... --json`` prints on stdout.

Every document starts with the same counts (``keys``, ``ok``, ``failed``,
``failures``), then the command's own fields; a command stopped by an error
prints ``command``, ``error``, ``fix`` and ``exit_code`` too. See
docs/building.md ("Commands") for the fields.
"""

from __future__ import annotations

import json
import sys

from ..errors import message_of


def tally(keys: int, ok: int, failures: list, **fields) -> dict:
    """A --json document: the shared counts, then the command's fields."""
    return {"keys": keys, "ok": ok, "failed": len(failures), "failures": failures, **fields}


def _stopped_doc(command: str, message: str, fix: str | None, exit_code: int) -> dict:
    """The --json document of a command stopped before its end, with its exit code."""
    return tally(0, 0, [{"key": None, "error": message, "fix": fix}], command=command, error=message, fix=fix,
                 exit_code=exit_code)


def error_doc(command: str, err) -> dict:
    """The --json document of a command stopped by a dsv41_aot error."""
    return _stopped_doc(command, message_of(err), getattr(err, "fix", None),
                       getattr(err, "exit_code", 1))


INTERNAL_ERROR = 70  # sysexits' EX_SOFTWARE: a bug of dsv41-aot, not the input (2) nor a check (1)


def internal_error_doc(command: str, err: BaseException) -> dict:
    """The --json document of a command stopped by an unexpected exception.

    Its traceback goes to stderr."""
    return _stopped_doc(command, f"internal error: {type(err).__name__}: {err}",
                       "report it with the traceback printed on stderr", INTERNAL_ERROR)


def progress_bar(total: int, desc: str, unit: str):
    """A tqdm progress bar on stderr, since stdout is --json's."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True)


def print_json(doc) -> None:
    """Print the one JSON document of a --json command on stdout."""
    sys.stdout.write(json.dumps(doc, indent=1) + "\n")
    sys.stdout.flush()
