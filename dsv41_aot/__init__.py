"""dsv41-aot: vLLM's DeepSeek-V4.1 mono decode launches, compiled ahead of time.

The public runtime API (``load``, ``load_key``, ``bind``, ``preload``,
``keys``, ``releases``, ``release_of``, ``Launcher``) lives in
:mod:`dsv41_aot.runtime.loader`, imported on first use: ``import dsv41_aot``
costs nothing and never imports the build half (:mod:`dsv41_aot.aot`:
FlyDSL, torch, vLLM). The vLLM plugin is :mod:`dsv41_aot.vllm`.
``docs/architecture.md`` draws the two halves.
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["load", "load_key", "bind", "preload", "keys", "releases", "release_of", "Launcher", "prebuilt_dir"]


def __getattr__(name: str):
    """The runtime's public names, imported at the first use of one: each is
    then a plain attribute of this module, so ``dsv41_aot.load_key`` in a loop
    no longer comes here (and through the import system) a call."""
    if name in __all__:
        from .runtime import loader

        g = globals()
        for public in __all__:
            g[public] = getattr(loader, public)
        return g[name]
    raise AttributeError(f"module 'dsv41_aot' has no attribute {name!r}")
