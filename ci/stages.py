"""What the ci/release.py stages share, and those that only read the checkout.

The version job runs ``check-tag`` and ``facts`` on a bare interpreter
before anything is installed, so this module uses the standard library
and the checkout's ``dsv41_aot.errors`` only. The other stages and the command line are in ci/release.py.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from dsv41_aot.errors import AotError

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
CACHE_PREFIX = "dsv41-build"


class StageError(AotError):
    """A stage that refused, with its exit code (1 a check failed, 2 bad input)."""

    def __init__(self, message: str, code: int = 1, *, fix: str | None = None):
        super().__init__(message, fix=fix)
        self.exit_code = code


def run(cmd: list, **kw) -> int:
    """Run one command with its output passed through, and return its exit code."""
    print("+ " + " ".join(map(str, cmd)), file=sys.stderr, flush=True)
    return subprocess.run([str(c) for c in cmd], **kw).returncode


def must(rc: int, what: str) -> None:
    if rc:
        raise StageError(f"{what} failed (exit {rc})", rc)


def cli(*args) -> list:
    """The command line of ``dsv41-aot ARGS`` run by this interpreter."""
    return [PY, "-m", "dsv41_aot.cli", *map(str, args)]


def cli_output(*args, env=None) -> str:
    """The standard output of ``dsv41-aot ARGS``; StageError when it fails."""
    r = subprocess.run(cli(*args), capture_output=True, text=True, cwd=ROOT, env=env)
    if r.returncode:
        sys.stderr.write(r.stderr)
        raise StageError(f"dsv41-aot {' '.join(args)} failed", r.returncode)
    return r.stdout


# ---------------------------------------------------------------- check-tag


def package_version(root: Path = ROOT) -> str:
    """``dsv41_aot.__version__``, read as setuptools does: without importing it."""
    init = root / "dsv41_aot" / "__init__.py"
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__version__" for t in node.targets):
            return ast.literal_eval(node.value)
    raise StageError(f"{init} assigns no literal __version__", 2)


def check_tag(ref_type: str | None, ref_name: str | None, version: str) -> str:
    """The line to print about a ref; StageError when a tag is not ``v`` + version."""
    if ref_type != "tag":
        return f"not a tag ({ref_type or 'no ref type'} {ref_name or ''}): nothing to check; version {version}".strip()
    want = f"v{version}"
    if ref_name != want:
        raise StageError(
            f"tag {ref_name!r} is not v + dsv41_aot.__version__ ({want!r}): refusing to build a release whose "
            f"wheel would say {version}",
            fix=f"tag the commit {want}, or set __version__ = \"{str(ref_name)[1:]}\" in dsv41_aot/__init__.py, "
                f"commit, and tag that commit")
    return f"tag {ref_name} = v + dsv41_aot.__version__ ({version}): ok"


def cmd_check_tag(args) -> int:
    print(check_tag(args.ref_type, args.ref_name, package_version()))
    return 0


# ---------------------------------------------------------------- cache-key


def cache_keys(arch: str, shard: str, identity: str) -> tuple[str, list]:
    """The build cache's key and restore keys: the shard's cache, then the arch's."""
    return f"{CACHE_PREFIX}-{arch}-{shard}-{identity}", [f"{CACHE_PREFIX}-{arch}-{shard}-", f"{CACHE_PREFIX}-{arch}-"]


def write_outputs(outputs: dict, path: str | None) -> None:
    """Append step outputs to ``$GITHUB_OUTPUT`` and print them.

    A multi-line value is written in the file's heredoc form.
    """
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
    key, restore = cache_keys(args.arch, str(args.shard), cli_output("cache", "--identity").strip())
    write_outputs({"key": key, "restore-keys": "\n".join(restore)}, os.environ.get("GITHUB_OUTPUT"))
    return 0


# ---------------------------------------------------------------- source-date-epoch


def source_date_epoch(root: Path = ROOT) -> str | None:
    """The commit time of the git checkout at ``root``, or None outside one.

    A wheel build stamps every file with it (``SOURCE_DATE_EPOCH``), so two
    builds of one commit give the same sha256.
    """
    try:
        r = subprocess.run(["git", "-C", str(root), "log", "-1", "--format=%ct"], capture_output=True, text=True,
                           timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    t = r.stdout.strip()
    return t if r.returncode == 0 and t.isdigit() else None


def cmd_source_date_epoch(args) -> int:
    """Write the checkout's commit time as the step output ``epoch``."""
    t = source_date_epoch()
    if t is None:
        raise StageError(f"{ROOT} is not a git checkout: no commit time for SOURCE_DATE_EPOCH", 2,
                         fix="run it in a clone of the repository (actions/checkout)")
    write_outputs({"epoch": t}, os.environ.get("GITHUB_OUTPUT"))
    return 0


# ---------------------------------------------------------------- facts


def facts_outputs(doc: dict) -> dict:
    """The step outputs the later jobs' matrices read, from ``facts --json``.

    ``arches`` and ``releases`` (newest last) are JSON lists.
    """
    return {"arches": json.dumps([a["name"] for a in doc["arches"]]),
            "releases": json.dumps([r["version"] for r in doc["releases"]]), "newest": doc["newest"]}


def cmd_facts(args) -> int:
    """Write the facts as step outputs; the checkout on the path, nothing installed."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    doc = json.loads(cli_output("facts", "--json", env=dict(os.environ, PYTHONPATH=path)))
    write_outputs(facts_outputs(doc), os.environ.get("GITHUB_OUTPUT"))
    return 0
