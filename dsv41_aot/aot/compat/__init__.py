"""The project's own aiter FlyDSL helpers, used only when real aiter is absent.

vLLM's mono package imports three kernel-building helper modules from
``aiter.ops.flydsl.kernels`` (``buffer_ops``, ``dpp_utils``,
``kernels_common``); aiter with those ops cannot be installed on a CPU-only
build machine. ``install_aiter_shim()`` makes the import names resolve to this
package's modules, and says which helpers a build used: the helpers shape the
generated code, so their identity belongs in every build's manifest.

Importing this package, or calling ``install_aiter_shim()``, imports neither
torch, vLLM nor FlyDSL: the helper modules are registered lazily and run on
first use (inside the mono package's own import, which needs FlyDSL anyway).
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
    """sha256[:16] over the helper modules' file names and contents, in name
    order: what this package feeds into generated code. (The shim plumbing in
    this file is left out: editing it changes no kernel.)"""
    h = hashlib.sha256()
    for name in sorted(f"{m}.py" for m in HELPERS):
        h.update(name.encode() + b"\0")
        h.update((_HERE / name).read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _aiter_version(module) -> str:
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
    """A stand-in package module with no code and no search path."""
    module = types.ModuleType(name)
    module.__path__ = []
    module.__package__ = name
    setattr(module, _MARK, True)
    return module


def _lazy_helper(helper: str) -> types.ModuleType:
    """``dsv41_aot.aot.compat.<helper>``, registered but executed on first
    attribute access (the helpers import FlyDSL, and FlyDSL imports torch)."""
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


def _shimmed() -> bool:
    return getattr(sys.modules.get(KERNELS), _MARK, False)


def install_aiter_shim() -> dict:
    """Make ``aiter.ops.flydsl.kernels.{buffer_ops,dpp_utils,kernels_common}``
    importable, and return the identity of the helpers in use.

    Real aiter wins: when ``aiter.ops.flydsl.kernels`` imports, nothing is
    registered and the result is ``{"impl": "aiter", "version": ...}``.
    Otherwise each missing level of ``aiter.ops.flydsl.kernels`` becomes a bare
    package in ``sys.modules`` (a real ``aiter`` / ``aiter.ops`` that imported
    is kept), the helper names point at this package's modules, and the result
    is ``{"impl": "dsv41_aot.compat", "digest": compat_digest()}``.
    Idempotent. An aiter that fails with anything but ``ImportError`` is left
    to raise: a half-working aiter must not be silently replaced.
    """
    if not _shimmed():
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
