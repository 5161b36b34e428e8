"""The per-arch raw-library layout the benches compare against, rebuilt for
real from git: the tree of ``OLD_REF`` (the last commit that linked raw
``.so`` libraries and packed one deflate wheel per arch) is exported, and its
own ``dsv41-aot link`` links the same stored objects the new bands hold."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OLD_REF = "4b42948"  # main before the compressed bands


def old_tree(ref: str, dest: Path) -> Path:
    """The source tree of ``ref`` (git archive), at ``dest``."""
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref], stdout=subprocess.PIPE, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def old_prebuilt(src: Path, prebuilt: Path, dest: Path) -> Path:
    """A copy of ``prebuilt``'s manifests and objects, linked by the old tree
    (raw .so libraries, libs.json schema 1)."""
    shutil.copytree(prebuilt, dest, ignore=shutil.ignore_patterns("lib", ".build.lock"))
    env = dict(os.environ, PYTHONPATH=str(src))
    r = subprocess.run([sys.executable, "-m", "dsv41_aot.cli", "link", "--dir", str(dest)], cwd=src, env=env,
                       capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"old link failed:\n{r.stdout}{r.stderr}")
    return dest
