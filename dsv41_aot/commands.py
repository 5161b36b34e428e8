"""The dsv41-aot commands printed fixes name, each written in this one place.

A fix that says "build these keys", "list what a profile builds" or "relink
this room" is made here, so it is quoted for a shell and carries the failing
command's own options (``options``: its argv words, e.g. ``--matrix M
--vllm-src T``) and runs word for word.

Shared core: standard library only.
"""

from __future__ import annotations

import shlex

TOOL = "dsv41-aot"


def _flags(*pairs) -> list:
    """The words ``flag value`` of each (flag, value) pair whose value is not None, in order."""
    return [word for flag, value in pairs if value is not None for word in (flag, str(value))]


def build(out=None, *, release: str | None = None, arch: str | None = None, keys=(), profile: str | None = None,
          options=(), link: bool = False) -> str:
    """The build command of ``keys`` (or ``profile``) of ``release`` on ``arch`` into ``out``.

    With ``link``, the link of ``out`` follows it (a build links by itself
    unless given --no-link; the loader's fixes name the link all the same)."""
    words = [TOOL, "build", *_flags(("--release", release), ("--arch", arch), ("--profile", profile), ("--out", out))]
    if keys:
        words += ["--key", *sorted(map(str, keys))]
    cmd = shlex.join([*words, *options])
    return f"{cmd} && {relink(out)}" if link else cmd


def listing(profile: str | None = None, *, release: str | None = None, matrix=None) -> str:
    """The command that lists the keys ``profile`` (default: the matrix's own) of ``matrix`` selects."""
    flags = _flags(("--profile", profile), ("--release", release), ("--matrix", matrix))
    return shlex.join([TOOL, "build", "--list", *flags])


def relink(out, *, arch=None, release: str | None = None) -> str:
    """The command that links the prebuilt directory ``out`` (its ``arch`` / ``release`` only, when given).

    ``arch`` is one arch or a list of them."""
    words = [TOOL, "link", "--dir", str(out)]
    for a in [arch] if isinstance(arch, str) else arch or []:
        words += ["--arch", a]
    return shlex.join([*words, *_flags(("--release", release))])
