"""The project's own aiter FlyDSL helpers, used only when real aiter is absent.

vLLM's mono package imports three helper modules from
``aiter.ops.flydsl.kernels``, which cannot be installed on a CPU-only build
machine. ``install_aiter_shim()`` points those names at this package's
modules and says which helpers a build used: they shape the generated code,
so their identity belongs in every manifest entry.

Neither importing this package nor installing the shim imports torch, vLLM
or FlyDSL: the helper modules are registered lazily and run on first use.
"""

import hashlib
import importlib
import importlib.util
import sys
import types
from pathlib import Path

__all__ = ["install_aiter_shim", "compat_digest", "HELPERS", "PACKAGES"]

_HERE = Path(__file__).resolve().parent

# aiter's kernel-helper package, and the helper modules the mono package imports
KERNELS = "aiter.ops.flydsl.kernels"
HELPERS = ("buffer_ops", "dpp_utils", "kernels_common")
PACKAGES = ("aiter", "aiter.ops", "aiter.ops.flydsl", KERNELS)

# the helpers' identity label in every manifest entry's source (kept as it
# was when this package was dsv41_aot.compat: a new label would rebuild every key)
IMPL = "dsv41_aot.compat"

# marks the modules this shim registered, so a second call recognises them
_MARK = "__dsv41_aot_compat__"


def compat_digest() -> str:
    """sha256[:16] over the helper modules' file names and contents, in name order.

    This file, the shim's plumbing, is left out: editing it changes no kernel."""
    h = hashlib.sha256()
    for name in sorted(f"{m}.py" for m in HELPERS):
        h.update(name.encode() + b"\0")
        h.update((_HERE / name).read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _aiter_version(module) -> str:
    """The installed aiter's version: its ``__version__``, else its distribution's."""
    version = getattr(module, "__version__", None)
    if version:
        return str(version)
    from importlib import metadata

    for dist in ("amd-aiter", "aiter"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "unknown"


def _bare_package(name: str) -> types.ModuleType:
    """An empty package module with no search path, marked as the shim's."""
    module = types.ModuleType(name)
    module.__path__ = []
    module.__package__ = name
    setattr(module, _MARK, True)
    return module


def _lazy_helper(helper: str) -> types.ModuleType:
    """``dsv41_aot.aot.compat.<helper>``, run on first use (it imports FlyDSL, hence torch)."""
    name = f"{__name__}.{helper}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
    return module


def install_aiter_shim() -> dict:
    """Make aiter's three helper modules importable; return the helpers' identity.

    Real aiter wins: when ``aiter.ops.flydsl.kernels`` imports, nothing is
    registered and the result is ``{"impl": "aiter", "version": ...}``.
    Otherwise each missing package level becomes an empty package (a real
    ``aiter`` or ``aiter.ops`` is kept), the helper names point at this
    package's modules, and the result is ``{"impl": "dsv41_aot.compat",
    "digest": compat_digest()}``. Idempotent. An aiter that fails with
    anything but ``ImportError`` is left to raise: a half-working aiter must
    not be silently replaced."""
    if not getattr(sys.modules.get(KERNELS), _MARK, False):  # not yet installed
        try:
            importlib.import_module(KERNELS)
        except ImportError:
            pass
        else:
            return {"impl": "aiter", "version": _aiter_version(sys.modules["aiter"])}
        parent = None
        for name in PACKAGES:
            module = sys.modules.get(name)
            if module is None or name == KERNELS:
                module = sys.modules[name] = _bare_package(name)
            if parent is not None:
                setattr(parent, name.rsplit(".", 1)[1], module)
            parent = module
        for helper in HELPERS:
            module = _lazy_helper(helper)
            sys.modules[f"{KERNELS}.{helper}"] = module
            setattr(parent, helper, module)
    return {"impl": IMPL, "digest": compat_digest()}
