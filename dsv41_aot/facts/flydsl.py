"""The FlyDSL releases dsv41-aot compiles and verifies with, and how their internals differ.

Every command that compiles or JITs refuses a FlyDSL not in :data:`FLYDSL`
(``aot/toolchain.py``). ``aot/flydsl_api.py`` acts on each difference; this
table only says which variant a release has. Supporting a new release is one
entry here, once ``tests/test_flydsl_pin.py`` passes under it. The release
the project ships with is the one ``pyproject.toml``'s ``build`` extra pins.

Standard library only (the runtime reads facts/ too).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ToolchainError


@dataclass(frozen=True)
class FlyDSLRelease:
    """What one FlyDSL release does where dsv41-aot depends on its internals."""

    version: str
    # how the JIT names its disk cache artifact from the cache key (aot/flydsl_api.py DISK_NAMES):
    #   "key_text": JitFunction._cache_key_to_str(cache_key), hashed by the
    #     cache manager's _cache_file
    #   "disk_cache_key": jit_function._disk_cache_key(cache_key), which also
    #     fingerprints the compiler's own files (and ROCm's device bitcode)
    disk_name: str
    # what else differs from the release before it, for a maintainer's eyes
    notes: str = ""


FLYDSL = {
    r.version: r
    for r in (
        FlyDSLRelease("0.4.2", disk_name="key_text"),
        FlyDSLRelease(
            "0.5.0", disk_name="disk_cache_key",
            notes="JitFunction._cache_key_to_str removed; the disk cache key adds a hash of ROCm's "
                  "device bitcode (ocml/ockl), which no mono kernel links; the exported C object's "
                  "metadata names the version (GPU code objects of vLLM 0.33.0 unchanged)",
        ),
    )
}


def pinned() -> str | None:
    """The FlyDSL release the project builds and ships with, as its installed metadata says.

    That is the one pin of ``pyproject.toml``'s ``build`` extra; None when
    dsv41-aot runs from a tree without installed metadata."""
    import re
    from importlib import metadata

    try:
        requires = metadata.requires("dsv41-aot") or []
    except metadata.PackageNotFoundError:
        return None
    return next((m.group(1) for r in requires if (m := re.match(r"flydsl\s*==\s*([\w.]+)", r))), None)


def supported() -> str:
    """The supported FlyDSL versions, oldest first, as a sentence fragment."""
    return " or ".join(FLYDSL)


def flydsl_facts(version: str) -> FlyDSLRelease:
    """The facts of FlyDSL ``version``; ToolchainError naming the supported set otherwise."""
    try:
        return FLYDSL[version]
    except KeyError:
        raise ToolchainError(f"FlyDSL {version} is installed; dsv41-aot compiles with FlyDSL {supported()} (dsv41_aot/facts/flydsl.py)",
                       fix=fix_install()) from None


def installed_version() -> str | None:
    """The installed FlyDSL's version, from its package metadata (None: not installed); never imports it."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("flydsl")
    except PackageNotFoundError:
        return None


def installed() -> FlyDSLRelease:
    """The facts of the installed FlyDSL: how the builder, its workers and the JIT all read it.

    ToolchainError (exit 2) when none is installed or it is not supported."""
    have = installed_version()
    if have is None:
        raise ToolchainError("FlyDSL is not installed", fix=fix_install())
    return flydsl_facts(have)


def fix_install() -> str:
    """The command that installs a FlyDSL dsv41-aot supports."""
    return ("pip install -e '.[build]' (the FlyDSL the project builds with), or one of: "
            + ", ".join(f"pip install flydsl=={v}" for v in FLYDSL))
