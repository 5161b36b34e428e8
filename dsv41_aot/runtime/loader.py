"""The runtime's public API: prebuilt launch symbols as Launchers, with no JIT.

``load_key("k2@gfx950:s=4,tp=4,r=1")`` finds the key in the running vLLM's
room, checks it (arch, vLLM source digest, link record) and returns a
:class:`Launcher`, a drop-in for what vLLM's ``build_mono_*`` returns.
Nothing is written to disk, and nothing reaches the GPU before a Launcher's
first call or :func:`preload`. See docs/loader.md.

Each other runtime module owns one concern, and the names other code
imports from here are re-exported.
"""

from __future__ import annotations

import os
from pathlib import Path

from . import state
from .. import commands
from .bands import ENV_CACHE, bind_all  # noqa: F401 (ENV_CACHE re-exported)
from .host import ARCH_RE, ENV_ALLOW_SOURCE, ENV_ARCH, check_source, resolve_arch, running_vllm  # noqa: F401
from .launcher import Launcher
from .rooms import index_of, release_of, resolve_root
from ..listing import built_releases
from ..errors import KeyNotPrebuiltError

# keys.py (dataclasses) is imported at first use: ``import
# dsv41_aot.runtime.loader`` stays a few stdlib modules.


def load_key(key, *, release: str | None = None, prebuilt: str | os.PathLike | None = None) -> Launcher:
    """The Launcher of one key: a BuildKey, or its string in vLLM ``release``.

    ``release`` defaults to the running vLLM's (:func:`release_of`). A key
    asked for again is a dict lookup: the directory, the running room and
    the Launcher are each found once per process."""
    root = resolve_root(prebuilt)
    st = state.current()
    if isinstance(key, str):
        text = key
        arch = text.partition("@")[2].partition(":")[0]
        if release is None:
            release = st.picked.get((root, arch))
            if release is None and ARCH_RE.fullmatch(arch):
                release = release_of(root, arch)
    else:
        text, arch, release = str(key), key.arch, key.release
    launcher = st.launchers.get((root, release, text))
    if launcher is not None:
        return launcher
    return _new_launcher(key, text, arch, root, release)


def _new_launcher(key, text: str, arch: str, root: Path, release: str | None) -> Launcher:
    """Find a key in its room, check it and make its Launcher (the first time)."""
    # a canonical key of a room already indexed needs no parsing
    idx = state.current().indexes.get((root, arch, release))
    entry = idx.entries.get(text) if idx is not None else None
    if entry is None:
        from ..keys import BuildKey

        # release is None only for a malformed key: parse names the fault
        bk = BuildKey.parse(text, release) if isinstance(key, str) else key
        text = str(bk)
        idx = index_of(root, bk.arch, release)
        release = idx.room.release
        entry = idx.entries.get(text)
    if entry is None:
        from ..keys import neighbours

        raise KeyNotPrebuiltError(
            f"{text} is not prebuilt for vLLM {release} in {idx.manifest.room} ({len(idx.entries)} keys); "
            f"closest: {', '.join(neighbours(bk, idx.entries)) or 'none'}",
            fix=commands.build(root, release=release, keys=[text], link=True),
        )
    check_source(text, entry)
    if problem := idx.refused.get(text):  # verdict.problems: its link, the room's sources
        raise problem.error()
    lib = idx.room.links().band_of[text]
    with state.current().lock:  # a thread that made it first keeps its Launcher
        launcher = Launcher(text, entry, idx.abi(entry.abi), idx, lib)
        return state.current().launchers.setdefault((root, release, text), launcher)


def prebuilt_dir() -> Path:
    """The prebuilt directory the loader reads by default, absolute (``resolve_root``)."""
    return resolve_root(None)


def load(kind: str, *, tokens: int, tp: int, ratio: int, fold: bool | None = None, index: bool | None = None,
         experts: int | None = None, topk: int | None = None, ug_groups: int | None = None,
         swa_width: int | None = None, timeline: bool | None = None,
         arch: str | None = None, release: str | None = None, prebuilt: str | os.PathLike | None = None) -> Launcher:
    """The Launcher of what ``build_mono_<kind>(MonoBuild(...))`` would build.

    ``arch`` defaults to DSV41_AOT_ARCH, else the current device's; ``release``
    to the running vLLM's. A field left None is that release's MonoBuild
    default (facts/releases.py, filled in by BuildKey)."""
    from ..keys import BuildKey

    arch = resolve_arch(arch)
    root = resolve_root(prebuilt)
    key = BuildKey(kind=kind, arch=arch, tokens=tokens, tp=tp, ratio=ratio, fold=fold, index=index,
                   experts=experts, topk=topk, ug_groups=ug_groups, swa_width=swa_width, timeline=timeline,
                   release=release or release_of(root, arch))
    return load_key(key, prebuilt=root)


def bind(keys, *, release: str | None = None, prebuilt: str | os.PathLike | None = None,
         workers: int | None = None) -> list:
    """Bind the Launchers of ``keys`` now, their bands concurrently; no GPU work.

    ``keys`` are strings, BuildKeys or Launchers. One thread per band, up to
    ``workers`` (default: the CPUs this process may run on)."""
    out = [k if isinstance(k, Launcher) else load_key(k, release=release, prebuilt=prebuilt) for k in keys]
    bind_all(out, workers)
    return out


def preload(keys, *, release: str | None = None, prebuilt: str | os.PathLike | None = None, stream=None) -> list:
    """Bind ``keys`` and load their code objects now: no first call then pays for it."""
    out = bind(keys, release=release, prebuilt=prebuilt)
    for launcher in out:
        launcher.load_module(stream)
    return out


def keys(arch: str | None = None, *, release: str | None = None,
         prebuilt: str | os.PathLike | None = None) -> list[str]:
    """Every prebuilt key of ``arch`` in vLLM ``release`` (defaults as :func:`load`)."""
    root = resolve_root(prebuilt)
    return sorted(index_of(root, resolve_arch(arch), release).entries)


def releases(arch: str | None = None, *, prebuilt: str | os.PathLike | None = None) -> list[str]:
    """The vLLM releases with prebuilt kernels for ``arch``, oldest first."""
    root = resolve_root(prebuilt)
    return built_releases(root / resolve_arch(arch))
