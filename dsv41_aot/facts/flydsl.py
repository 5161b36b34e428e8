"""The FlyDSL releases dsv41-aot compiles and JIT-verifies with, and what
differs between them where dsv41-aot reaches into FlyDSL's internals.

Every command that compiles or JITs (``build``, ``verify --against-jit``,
``cache``) accepts a FlyDSL in :data:`FLYDSL` and refuses any other, naming
this set (``aot/toolchain.py``). How each difference is acted on lives in
one module, ``aot/flydsl_api.py``; this table only says which variant a
release has. Supporting a new FlyDSL release is one entry here, once
``tests/test_flydsl_pin.py`` passes under it (the slow tier runs it under
every release here in its own environment).

The release the project builds and ships with is the one ``pyproject.toml``'s
``build`` extra pins (``ci/bootstrap.sh`` installs it); it must be one of
these.

Standard library only (the runtime reads facts/ too).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ToolchainError


@dataclass(frozen=True)
class FlyDSLRelease:
    """What one FlyDSL release does where dsv41-aot depends on its internals."""

    version: str
    # how the JIT names the artifact it writes to its disk cache, from the
    # compile's cache key (aot/flydsl_api.py DISK_NAMES):
    #   "key_text": JitFunction._cache_key_to_str(cache_key), hashed by the
    #     cache manager's _cache_file
    #   "disk_cache_key": jit_function._disk_cache_key(cache_key), which also
    #     fingerprints the compiler's own files (and ROCm's device bitcode)
    disk_name: str
    # the environment variable that makes FlyDSL's JIT compile without a
    # launch (as vLLM's own compile-only runs set it)
    compile_only_env: str
    # what else differs from the release before it, for a maintainer's eyes
    notes: str = ""


FLYDSL = {
    r.version: r
    for r in (
        FlyDSLRelease("0.4.2", disk_name="key_text", compile_only_env="COMPILE_ONLY"),
        FlyDSLRelease(
            "0.5.0", disk_name="disk_cache_key", compile_only_env="COMPILE_ONLY",
            notes="JitFunction._cache_key_to_str removed; the disk cache key adds a hash of ROCm's "
                  "device bitcode (ocml/ockl), which no mono kernel links; the exported C object's "
                  "metadata names the version (GPU code objects of vLLM 0.33.0 unchanged)",
        ),
    )
}


def supported() -> str:
    """The supported FlyDSL versions, oldest first, as a sentence fragment."""
    return " or ".join(FLYDSL)


def flydsl_facts(version: str) -> FlyDSLRelease:
    """The facts of FlyDSL ``version``; ToolchainError (exit 2) naming the
    supported set when dsv41-aot does not support it."""
    try:
        return FLYDSL[version]
    except KeyError:
        raise ToolchainError(f"FlyDSL {version} is installed; dsv41-aot compiles with FlyDSL {supported()} (dsv41_aot/facts/flydsl.py)",
                       fix=fix_install()) from None


def fix_install() -> str:
    """The command that installs a FlyDSL dsv41-aot supports."""
    return ("pip install -e '.[build]' (the FlyDSL the project builds with), or one of: "
            + ", ".join(f"pip install flydsl=={v}" for v in FLYDSL))
