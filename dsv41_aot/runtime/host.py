"""What this process runs on: the GPU arch and the vLLM mono package.

``resolve_arch`` gives the arch; ``running_vllm`` and ``installed_vllm`` the
mono package and its sources digest (without importing vLLM); and
``check_source`` checks a key's build source against that digest.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from . import state
from ..errors import HipUnavailableError, ManifestError, SourceMismatchError, ToolchainError

ENV_ARCH = "DSV41_AOT_ARCH"
ENV_ALLOW_SOURCE = "DSV41_AOT_ALLOW_SOURCE_MISMATCH"

ARCH_RE = re.compile(r"gfx[0-9a-f]+")
FIX_ARCH_NAME = f"name it like gfx950: {ENV_ARCH}=gfx950 (or arch=...)"


# how the plugin's boolean variables read (case and surrounding spaces do not matter)
TRUE_WORDS, FALSE_WORDS = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


def env_flag(env, name: str) -> tuple[bool, str | None]:
    """One boolean variable of the plugin: (its value, the problem with it, if any).

    The one parser of DSV41_AOT_DISABLE and DSV41_AOT_ALLOW_SOURCE_MISMATCH:
    1/true/yes/on and 0/false/no/off (or unset). Any other value reads as
    False, the reading that keeps every check, and is named as a problem."""
    raw = (os.environ if env is None else env).get(name, "")
    word = raw.strip().lower()
    if word in TRUE_WORDS:
        return True, None
    if word in FALSE_WORDS:
        return False, None
    return False, f"{name}={raw!r} is not a yes or no (1/true/yes/on, 0/false/no/off): read as unset"


def arch_name(text: str) -> str:
    """An arch as a user or ROCm spells it, normalized: "GFX950:sramecc+:xnack-" -> "gfx950"."""
    return text.strip().lower().split(":")[0]


def resolve_arch(arch: str | None = None) -> str:
    """``arch``, else DSV41_AOT_ARCH, else the current HIP device's."""
    arch = arch or os.environ.get(ENV_ARCH)
    if arch:
        arch = arch_name(arch)
        if not ARCH_RE.fullmatch(arch):
            raise ManifestError(f"arch {arch!r} (argument or {ENV_ARCH}) is not a GPU arch name",
                                fix=FIX_ARCH_NAME)
        return arch
    found = state.current().device_arch()
    if found is None:
        raise HipUnavailableError(
            "no HIP device to read the GPU architecture from",
            fix=f"run on a ROCm GPU host, or name the arch: {ENV_ARCH}=gfx950 (or arch=...)",
        )
    return found


def mismatch_allowed(env=None) -> bool:
    """Whether ``env`` (default: os.environ) allows a source mismatch (DSV41_AOT_ALLOW_SOURCE_MISMATCH=1, ``env_flag``)."""
    return env_flag(env, ENV_ALLOW_SOURCE)[0]


def running_vllm(mono_dir: Path | None) -> None:
    """Name the vLLM mono package this process runs; None: the installed one.

    The plugin names the package of the runner module it patched. Its digest
    (which differs from the installed vLLM's only when a tree is imported
    from elsewhere) picks the room and is checked against every key loaded."""
    from .. import source

    with state.current().lock:
        state.current().picked.clear()
        if mono_dir is None:
            state.current().installed_digest = None
            return
        src = source.MonoSource(root=Path(mono_dir).parents[len(source.MONO_REL.parts) - 1])
        state.current().installed_digest = (source.mono_digest(Path(mono_dir)), src, str(mono_dir), None)


def installed_vllm() -> tuple:
    """The mono digest, source and mono dir of the vLLM this process would import.

    Found without importing it; (None, None, None) when none is installed
    (or it has no mono package). A digest that fails to compute is not "no
    vLLM": it raises SourceMismatchError, at every load."""
    if state.current().installed_digest is None:
        from .. import source

        try:
            src = source.find()
        except ToolchainError:  # no vLLM, or one without the mono package: nothing to compare
            state.current().installed_digest = (None, None, None, None)
        except Exception as e:  # noqa: BLE001 - finding it failed: that is no answer
            state.current().installed_digest = (None, None, "vllm", e)
        else:
            try:
                state.current().installed_digest = (src.digest, src, str(src.mono_dir), None)
            except Exception as e:  # noqa: BLE001 - unreadable sources: no answer either
                state.current().installed_digest = (None, src, str(src.mono_dir), e)
    digest, src, mono, error = state.current().installed_digest
    if error is not None:
        msg = f"cannot compute the installed vLLM's mono source digest ({mono}): {type(error).__name__}: {error}"
        if not mismatch_allowed():
            raise SourceMismatchError(msg, fix=f"repair the vLLM install (pip install --force-reinstall vllm), or "
                                               f"run without the check: {ENV_ALLOW_SOURCE}=1")
        state.current().warn_once(("digest", mono), f"{msg}; running unchecked ({ENV_ALLOW_SOURCE}=1)")
    return digest, src, mono


def check_source(key: str, entry) -> None:
    """Refuse ``entry`` when built from other mono sources than vLLM's here."""
    digest, src, mono = installed_vllm()
    built = entry.source.mono_sources
    if digest is None or built == digest:
        return
    msg = (f"{key}: installed vLLM {src.version} mono sources ({mono}) digest {digest} differ from the "
           f"{built} the prebuilt kernels were built from (vLLM {entry.source.vllm_version})")
    if mismatch_allowed():
        state.current().warn_once((digest, built), f"{msg}; running them anyway ({ENV_ALLOW_SOURCE}=1)")
        return
    raise SourceMismatchError(
        msg,
        fix=(f"install vllm=={entry.source.vllm_version}, or rebuild the prebuilt kernels against this "
             f"vLLM, or accept the difference with {ENV_ALLOW_SOURCE}=1"),
    )
