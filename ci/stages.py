"""What every stage of ci/release.py shares, and the stages that only read
the checkout and tell the workflow something: ``check-tag`` and ``facts``
(the version job, run by setup-python's bare interpreter before anything is
installed), ``cache-key`` (the shard job's build cache key) and
``source-date-epoch`` (the wheel job's timestamp for a reproducible wheel),
the last three as step outputs (``$GITHUB_OUTPUT``). Standard library only.

The stages that build, merge, pack and publish, and the command line that
runs every stage, are ci/release.py's.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
CACHE_PREFIX = "dsv41-build"


class StageError(Exception):
    """A stage refused: the message names what and the fix."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


def run(cmd: list, **kw) -> int:
    """Run one command, its output through; its exit code."""
    print("+ " + " ".join(map(str, cmd)), file=sys.stderr, flush=True)
    return subprocess.run([str(c) for c in cmd], **kw).returncode


def must(rc: int, what: str) -> None:
    if rc:
        raise StageError(f"{what} failed (exit {rc})", rc)


def cli(*args) -> list:
    """``dsv41-aot ARGS`` as this interpreter runs it."""
    return [PY, "-m", "dsv41_aot.cli", *map(str, args)]


# ---------------------------------------------------------------- check-tag


def package_version(root: Path = ROOT) -> str:
    """``dsv41_aot.__version__`` read as setuptools reads it (a literal in
    dsv41_aot/__init__.py; pyproject.toml's dynamic version), without
    importing the package."""
    init = root / "dsv41_aot" / "__init__.py"
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__version__" for t in node.targets):
            return ast.literal_eval(node.value)
    raise StageError(f"{init} assigns no literal __version__", 2)


def check_tag(ref_type: str | None, ref_name: str | None, version: str) -> str:
    """The line to print; StageError when a tag is not ``v`` + version."""
    if ref_type != "tag":
        return f"not a tag ({ref_type or 'no ref type'} {ref_name or ''}): nothing to check; version {version}".strip()
    want = f"v{version}"
    if ref_name != want:
        raise StageError(
            f"tag {ref_name!r} is not v + dsv41_aot.__version__ ({want!r}): refusing to build a release whose "
            f"wheel would say {version}\n  fix: tag the commit {want}, or set __version__ = \"{str(ref_name)[1:]}\" "
            f"in dsv41_aot/__init__.py, commit, and tag that commit")
    return f"tag {ref_name} = v + dsv41_aot.__version__ ({version}): ok"


def cmd_check_tag(args) -> int:
    print(check_tag(args.ref_type, args.ref_name, package_version()))
    return 0


# ---------------------------------------------------------------- cache-key


def cache_keys(arch: str, shard: str, identity: str) -> tuple[str, list]:
    """(key, restore keys): the shard's own cache first, then the arch's."""
    return f"{CACHE_PREFIX}-{arch}-{shard}-{identity}", [f"{CACHE_PREFIX}-{arch}-{shard}-", f"{CACHE_PREFIX}-{arch}-"]


def write_outputs(outputs: dict, path: str | None) -> None:
    """Step outputs: appended to ``$GITHUB_OUTPUT`` (multi-line values in
    its heredoc form), and printed."""
    lines = []
    for name, value in outputs.items():
        if "\n" in value:
            delim = "EOF_" + hashlib.sha256(value.encode()).hexdigest()[:16]
            lines += [f"{name}<<{delim}", value, delim]
        else:
            lines.append(f"{name}={value}")
    text = "\n".join(lines) + "\n"
    if path:
        with open(path, "a") as f:
            f.write(text)
    sys.stdout.write(text)


def cmd_cache_key(args) -> int:
    r = subprocess.run(cli("cache", "--identity"), capture_output=True, text=True, cwd=ROOT)
    if r.returncode:
        sys.stderr.write(r.stderr)
        raise StageError("dsv41-aot cache --identity failed", r.returncode)
    key, restore = cache_keys(args.arch, str(args.shard), r.stdout.strip())
    write_outputs({"key": key, "restore-keys": "\n".join(restore)}, os.environ.get("GITHUB_OUTPUT"))
    return 0


# ---------------------------------------------------------------- source-date-epoch


def source_date_epoch(root: Path = ROOT) -> str | None:
    """The commit time of the git checkout at ``root`` (``git log -1
    --format=%ct``: seconds since the epoch), the ``SOURCE_DATE_EPOCH`` a
    wheel build stamps every file with, so that two builds of one commit
    give the same sha256; None when ``root`` is not a git checkout (or git
    is absent)."""
    try:
        r = subprocess.run(["git", "-C", str(root), "log", "-1", "--format=%ct"], capture_output=True, text=True,
                           timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    t = r.stdout.strip()
    return t if r.returncode == 0 and t.isdigit() else None


def cmd_source_date_epoch(args) -> int:
    """The checkout's commit time as the step output ``epoch``."""
    t = source_date_epoch()
    if t is None:
        raise StageError(f"{ROOT} is not a git checkout: no commit time for SOURCE_DATE_EPOCH\n"
                         "  fix: run it in a clone of the repository (actions/checkout)", 2)
    write_outputs({"epoch": t}, os.environ.get("GITHUB_OUTPUT"))
    return 0


# ---------------------------------------------------------------- facts


def facts_outputs(doc: dict) -> dict:
    """What the later jobs' matrices read, from ``dsv41-aot facts --json``:
    ``arches`` (a JSON list of names), ``releases`` (a JSON list, newest
    last) and ``newest``."""
    return {"arches": json.dumps([a["name"] for a in doc["arches"]]),
            "releases": json.dumps([r["version"] for r in doc["releases"]]), "newest": doc["newest"]}


def cmd_facts(args) -> int:
    """The facts command, run by this interpreter with the checkout on its
    path (the facts are standard library only: nothing installed)."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    r = subprocess.run(cli("facts", "--json"), capture_output=True, text=True, cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=path))
    if r.returncode:
        sys.stderr.write(r.stderr)
        raise StageError("dsv41-aot facts --json failed", r.returncode)
    write_outputs(facts_outputs(json.loads(r.stdout)), os.environ.get("GITHUB_OUTPUT"))
    return 0
