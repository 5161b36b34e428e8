"""The record of an unfinished build, and the command that builds keys again.

``rebuild_cmd`` is the one place a printed fix names ``dsv41-aot build`` with
a build's own options, so the fix builds from the same matrix and vLLM tree.
A build records its keys and options in ``<arch>/.build-pending.json``
before it compiles and removes it when done; a record left once the build's
lock is free names a killed build (see docs/building.md).

Shared core: standard library only.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from .manifest import atomic_write

PENDING = ".build-pending.json"
VERSION = 1


def rebuild_cmd(root, release: str, keys, options=()) -> str:
    """The ``dsv41-aot build`` command that builds ``keys`` of ``release`` into ``root``.

    ``options`` are the original build's own argv words."""
    words = ["dsv41-aot", "build", "--release", release, "--out", str(root), "--key", *sorted(keys), *options]
    return shlex.join(words)


def write(arch_dir: Path, keys_by_release: dict, options=()) -> None:
    """Record atomically that a build of ``arch_dir`` was given these keys and options.

    ``keys_by_release`` maps a release to its key strings."""
    doc = {"version": VERSION, "options": list(options),
           "keys": {r: sorted(ks) for r, ks in sorted(keys_by_release.items())}}
    atomic_write(Path(arch_dir) / PENDING, (json.dumps(doc, indent=1) + "\n").encode())


def clear(arch_dir: Path) -> None:
    """Remove the record: the build of ``arch_dir`` finished."""
    (Path(arch_dir) / PENDING).unlink(missing_ok=True)


def options(arch_dir: Path) -> list[str]:
    """The options of the arch's unfinished build ([] without a readable record)."""
    doc = _load(arch_dir)
    return list(doc["options"]) if doc else []


def asked(arch_dir: Path) -> dict:
    """Release -> key strings of the arch's unfinished build ({} without a readable record)."""
    doc = _load(arch_dir)
    return dict(doc["keys"]) if doc else {}


def command(arch_dir: Path, root, release: str) -> str | None:
    """The command that finishes the arch's build of ``release``; None if none is unfinished."""
    doc = _load(arch_dir)
    keys = doc["keys"].get(release) if doc else None
    return rebuild_cmd(root, release, keys, doc["options"]) if keys else None


def read(arch_dir: Path, release: str | None = None) -> list[str]:
    """The commands that finish an unfinished build of ``arch_dir``, one per release.

    Only ``release``'s when given; [] without a readable record: the
    caller's own fix then stands."""
    doc = _load(arch_dir)
    if not doc:
        return []
    root = Path(arch_dir).resolve().parent
    return [rebuild_cmd(root, r, ks, doc["options"]) for r, ks in doc["keys"].items() if release in (None, r)]


def _load(arch_dir: Path) -> dict | None:
    try:
        doc = json.loads((Path(arch_dir) / PENDING).read_text())
    except (OSError, ValueError):
        return None
    ok = (isinstance(doc, dict) and doc.get("version") == VERSION and isinstance(doc.get("options"), list)
          and all(isinstance(o, str) for o in doc["options"]) and isinstance(doc.get("keys"), dict)
          and all(isinstance(r, str) and isinstance(ks, list) and all(isinstance(k, str) for k in ks)
                  for r, ks in doc["keys"].items()))
    return doc if ok else None
