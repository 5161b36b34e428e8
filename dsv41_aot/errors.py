"""The errors dsv41-aot raises for everything it refuses.

Every message says what was wrong, where (key, file, line) and the command
that fixes it. ``exit_code`` is the CLI's exit status: 2 for bad input, 1 for
a check that failed on artifacts that exist.

Shared core: standard library only.
"""

from __future__ import annotations


class AotError(Exception):
    """The base of every dsv41-aot error: a message and the command that fixes it.

    ``str()`` prints both; ``message`` and ``fix`` keep them apart."""

    exit_code = 2

    def __init__(self, message: str, *, fix: str | None = None):
        self.message = message
        self.fix = fix
        super().__init__(f"{message}\n  fix: {fix}" if fix else message)


# ---------------------------------------------------------------- build side


class KeyFormatError(AotError, ValueError):
    """A key string or key field that is not a mono build key."""


class UnknownArchError(KeyFormatError):
    """An arch that ``dsv41_aot.facts.arches`` does not know."""


class MatrixError(AotError):
    """build_matrix.yaml cannot be turned into keys (names file and line)."""


class ToolchainError(AotError):
    """A build tool is missing or the wrong version (linker, FlyDSL, vLLM)."""


class OutputDirError(AotError):
    """The output directory cannot be written."""


class CompileError(AotError):
    """One key failed to compile; the build goes on with the others."""

    exit_code = 1


class ResidencyError(CompileError):
    """A symbol whose CTA cannot be resident one per CU, or that spills."""


# ---------------------------------------------------------------- runtime side


class LoadError(AotError):
    """Base of every refusal at load time."""

    exit_code = 1


class ManifestError(LoadError):
    """A room's record (manifest, libs.json, verified.json) missing or malformed."""


class KeyNotPrebuiltError(LoadError, KeyError):
    """The key asked for is not in the prebuilt directory."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return Exception.__str__(self)


class ArchMismatchError(LoadError):
    """The device's architecture is not the one the objects were built for."""


class SourceMismatchError(LoadError):
    """The installed vLLM's mono sources differ from those the objects were built from."""


class ReleaseMismatchError(SourceMismatchError):
    """No room serves the running vLLM: its mono sources digest is none of the rooms'."""


class IntegrityError(LoadError):
    """A stored object or band whose bytes differ from what its record says."""


class HipUnavailableError(LoadError):
    """libamdhip64 cannot be loaded."""


class HipVersionError(HipUnavailableError):
    """The host's HIP runtime is a version the kernels were not built for."""


class CaptureError(LoadError):
    """A first load inside HIP/CUDA graph stream capture."""


class LaunchError(LoadError):
    """A launch returned a nonzero HIP status, or got the wrong arguments."""


class ForkError(LaunchError):
    """A first load in a process forked after its parent used HIP (HIP does not survive fork)."""


def message_of(e: BaseException) -> str:
    """An exception's text without a fix: ``AotError.message``, else ``str(e)``.

    For the places that catch AotError together with other exceptions."""
    return e.message if isinstance(e, AotError) else str(e)
