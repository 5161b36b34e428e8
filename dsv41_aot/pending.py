"""The command that builds given keys again, and a build's record of the keys
it was asked for.

``rebuild_cmd`` is the one place a printed fix names ``dsv41-aot build``
with a build's own options (``--matrix``, ``--vllm-src``, ``--any-key``,
cache options), so that a fix run word for word builds from the same matrix
and vLLM tree as the build it repairs. ``write`` records, in an arch folder
before anything compiles, which keys a build was asked for and with which
options (``<arch>/.build-pending.json``, written atomically); ``clear``
removes it when the build finishes. A record still there after the build's
lock is free names a killed build, and ``read`` gives the commands that
finish it.

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
    """The ``dsv41-aot build`` command line building ``keys`` of ``release``
    into ``root`` with a build's own ``options`` (argv words)."""
    words = ["dsv41-aot", "build", "--release", release, "--out", str(root), "--key", *sorted(keys), *options]
    return shlex.join(words)


def write(arch_dir: Path, keys_by_release: dict, options=()) -> None:
    """Record (atomically) that a build of ``arch_dir`` was asked for these
    keys ({release: [key strings]}) with these options."""
    doc = {"version": VERSION, "options": list(options),
           "keys": {r: sorted(ks) for r, ks in sorted(keys_by_release.items())}}
    atomic_write(Path(arch_dir) / PENDING, (json.dumps(doc, indent=1) + "\n").encode())


def clear(arch_dir: Path) -> None:
    """Remove the record: the build of ``arch_dir`` finished."""
    (Path(arch_dir) / PENDING).unlink(missing_ok=True)


def options(arch_dir: Path) -> list[str]:
    """The options of the build the arch's record names ([] with no record,
    or one that cannot be read)."""
    doc = _load(arch_dir)
    return list(doc["options"]) if doc else []


def asked(arch_dir: Path) -> dict:
    """{release: [key strings]} of the arch's unfinished build ({} with no
    record, or one that cannot be read)."""
    doc = _load(arch_dir)
    return dict(doc["keys"]) if doc else {}


def command(arch_dir: Path, root, release: str) -> str | None:
    """The command that finishes the arch's unfinished build of ``release``
    (into ``root``); None when no record names a key of it."""
    keys = asked(arch_dir).get(release)
    return rebuild_cmd(root, release, keys, options(arch_dir)) if keys else None


def read(arch_dir: Path) -> list[str]:
    """The commands that build again the keys of an unfinished build of
    ``arch_dir`` (one per release; [] with no record, or one that cannot be
    read: the caller's own fix then stands)."""
    doc = _load(arch_dir)
    if not doc:
        return []
    root = Path(arch_dir).resolve().parent
    return [rebuild_cmd(root, r, ks, doc["options"]) for r, ks in doc["keys"].items()]


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
