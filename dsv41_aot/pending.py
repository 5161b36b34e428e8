"""The record of an unfinished build: the keys and options its fix builds again.

A build records its keys and options in ``<arch>/.build-pending.json``
before it compiles and removes it when done; a record left once the build's
lock is free names a killed build (see docs/building.md).

Shared core: standard library only.
"""

from __future__ import annotations

import json
from pathlib import Path

from . import commands
from .manifest import atomic_write

PENDING = ".build-pending.json"
VERSION = 1


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
    doc = _read(arch_dir)[0]
    return list(doc["options"]) if doc else []


def asked(arch_dir: Path) -> dict:
    """Release -> key strings of the arch's unfinished build ({} without a readable record)."""
    doc = _read(arch_dir)[0]
    return dict(doc["keys"]) if doc else {}


def command(arch_dir: Path, root, release: str) -> str | None:
    """The command that finishes the arch's build of ``release``; None if none is unfinished."""
    doc = _read(arch_dir)[0]
    keys = doc["keys"].get(release) if doc else None
    return commands.build(root, release=release, keys=keys, options=doc["options"]) if keys else None


def read(arch_dir: Path, release: str | None = None) -> list[str]:
    """The commands that finish an unfinished build of ``arch_dir``, one per release.

    Only ``release``'s when given; [] without a readable record: the
    caller's own fix then stands."""
    root = Path(arch_dir).resolve().parent
    releases = asked(arch_dir) if release is None else [release]
    return [cmd for r in releases if (cmd := command(arch_dir, root, r)) is not None]


# the options a build records, each with whether it takes a value (cli/build.py _rebuild_options)
OPTIONS = {"--matrix": True, "--vllm-src": True, "--cache": True, "--any-key": False, "--no-cache": False}


def problem(arch_dir: Path) -> str | None:
    """Why the arch's record of an unfinished build cannot be used (None: absent, or sound).

    A record is used only as written by a build of this dsv41-aot: known
    releases, keys that parse as their release's keys of this arch, and the
    options a build records, whose files and folders exist. Anything else is
    named, never echoed into a printed command."""
    return _read(arch_dir)[1]


def _read(arch_dir: Path) -> tuple[dict | None, str | None]:
    from .errors import AotError
    from .facts.releases import RELEASES
    from .keys import BuildKey
    from .source import MONO_REL

    path = Path(arch_dir) / PENDING
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError) as e:
        return None, f"{path} is not a readable record of a stopped build ({e})"
    if not isinstance(doc, dict) or doc.get("version") != VERSION:
        return None, f"{path} is not a version-{VERSION} record of a stopped build"
    keys, opts = doc.get("keys"), doc.get("options")
    if not isinstance(keys, dict) or not keys or not isinstance(opts, list) or not all(isinstance(o, str) for o in opts):
        return None, f"{path}: keys must map a release to its keys, options be a list of words"
    for release, ks in keys.items():
        if release not in RELEASES:
            return None, f"{path}: vLLM {release!r} is not a release this dsv41-aot knows"
        if not isinstance(ks, list) or not ks:
            return None, f"{path}: the keys of vLLM {release} must be a list of at least one key"
        for k in ks:
            try:
                parsed = BuildKey.parse(k, release) if isinstance(k, str) else None
            except AotError:
                parsed = None
            if parsed is None or str(parsed) != k or parsed.arch != Path(arch_dir).name:
                return None, f"{path}: {k!r} is not a key of vLLM {release} on {Path(arch_dir).name}"
    words = iter(opts)
    for word in words:
        if word not in OPTIONS:
            return None, f"{path}: {word!r} is not an option a build records ({', '.join(OPTIONS)})"
        if OPTIONS[word]:
            value = next(words, None)
            tree = MONO_REL if word == "--vllm-src" else ""  # a folder holding no vLLM tree would fail the fix
            exists = value is not None and (Path(value).is_file() if word == "--matrix"
                                            else (Path(value) / tree).is_dir())
            if not exists and word != "--cache":
                return None, f"{path}: {word} {value!r} names no {'vLLM tree' if tree else 'such file'} on this host"
    return doc, None
