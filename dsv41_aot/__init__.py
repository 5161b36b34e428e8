"""dsv41-aot: vLLM's DeepSeek-V4.1 mono decode launches, compiled ahead of time.

The public runtime API (``__all__``) lives in :mod:`dsv41_aot.runtime.loader`
and is imported on first use, so ``import dsv41_aot`` never imports the build
half. The vLLM plugin is :mod:`dsv41_aot.vllm`. See docs/architecture.md.
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["load", "load_key", "bind", "preload", "keys", "releases", "release_of", "Launcher", "prebuilt_dir"]


def __getattr__(name: str):
    """Import the runtime's public names on the first use of one.

    Each then becomes a plain attribute of this module, so later uses skip
    this function and the import system."""
    if name in __all__:
        from .runtime import loader

        g = globals()
        for public in __all__:
            g[public] = getattr(loader, public)
        return g[name]
    raise AttributeError(f"module 'dsv41_aot' has no attribute {name!r}")
