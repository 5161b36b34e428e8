"""dsv41-aot: vLLM's DeepSeek-V4.1 mono decode launches, compiled ahead of time.

The public runtime API (``__all__``) lives in :mod:`dsv41_aot.runtime.loader`
and is imported on first use, so ``import dsv41_aot`` never imports the build
half. The vLLM plugin is :mod:`dsv41_aot.vllm`. See docs/architecture.md.
"""

from __future__ import annotations

import sys
import types

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


class _Package(types.ModuleType):
    """This package's module type: its public ``keys()`` shares its name with the submodule ``dsv41_aot.keys``.

    Importing a submodule sets the package's attribute of that name, which
    would replace the function by the module whenever something imports
    ``dsv41_aot.keys`` (as ``load`` does); this property keeps the name the
    public function. The submodule is in ``sys.modules``, where every
    ``from .keys import ...`` finds it."""

    @property
    def keys(self):
        from .runtime.loader import keys

        return keys

    @keys.setter
    def keys(self, module) -> None:  # the import system naming the submodule: nothing to keep
        pass


sys.modules[__name__].__class__ = _Package
