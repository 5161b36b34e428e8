"""Wheels of dsv41-aot: one per GPU arch, packed from an existing prebuilt dir.

    DSV41_AOT_ARCH=gfx950 DSV41_AOT_PREBUILT=DIR pip wheel --no-deps -w dist .
    DSV41_AOT_ARCH=gfx950 DSV41_AOT_PREBUILT=DIR python -m build --wheel

packs ``DIR/gfx950/`` (manifest.json and the linked lib/) into the package as
``dsv41_aot/kernels_prebuilt/gfx950/``, where the loader looks by default.
Nothing is compiled or linked here: a kernel build takes hours of CPU
(``dsv41-aot build``, ``dsv41-aot link``, or the CI matrix in ci/).

- Name and version: the distribution stays ``dsv41-aot`` (PEP 621 keeps a
  name static); the arch and the vLLM version the kernels were built from go
  in the local version, ``0.1.0+gfx950.vllm0.33.0``. Install the one matching
  the GPU by pinning it or from that arch's wheelhouse (README).
- Tag: ``py3-none-manylinux_2_28_x86_64``: host shared libraries, no Python
  extension module (no CPython ABI). The libraries need nothing from the build
  machine (no DT_NEEDED; HIP comes from the host's ROCm, whose supported
  distributions all have glibc >= 2.28). DSV41_AOT_PLAT overrides the tag.
- Without DSV41_AOT_ARCH: a pure-Python ``py3-none-any`` wheel with no
  kernels (the runtime and the build commands: ``pip install .[build]``,
  editable installs). It never looks at a prebuilt dir.
- The build refuses an empty, partial or mixed-source prebuilt dir
  (ci/prebuilt.py), naming the folder or key and the command that fixes it.
- The stored objects the libraries were linked from stay out of the wheel
  (the loader opens only lib/; libs.json keeps each object's sha256):
  DSV41_AOT_WHEEL_OBJECTS=1 packs them too.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py as _build_py

try:
    from setuptools.command.bdist_wheel import bdist_wheel as _bdist_wheel
except ImportError:  # setuptools < 70.1
    from wheel.bdist_wheel import bdist_wheel as _bdist_wheel

HERE = Path(__file__).resolve().parent
PACKAGE_DIR = "dsv41_aot/kernels_prebuilt"
DEFAULT_PLAT = "manylinux_2_28_x86_64"

ARCH = os.environ.get("DSV41_AOT_ARCH", "").strip()
PLAT = os.environ.get("DSV41_AOT_PLAT", DEFAULT_PLAT).strip()
WITH_OBJECTS = os.environ.get("DSV41_AOT_WHEEL_OBJECTS") == "1"


def _base_version() -> str:
    text = (HERE / "dsv41_aot" / "__init__.py").read_text()
    return re.search(r'^__version__ = "([^"]+)"', text, re.M).group(1)


def _prebuilt_root() -> Path:
    """DSV41_AOT_PREBUILT (relative paths against this folder), default kernels_prebuilt/."""
    root = Path(os.environ.get("DSV41_AOT_PREBUILT") or "kernels_prebuilt")
    return root if root.is_absolute() else HERE / root


def _fail(message: str, code: int = 2):
    print(f"\ndsv41-aot wheel: error: {message}\n", file=sys.stderr)
    raise SystemExit(code)


def _checked_contents():
    """The arch folder's files after ci/prebuilt.py's checks (or exit nonzero)."""
    if not re.fullmatch(r"gfx[0-9a-f]+", ARCH):
        _fail(f"DSV41_AOT_ARCH={ARCH!r} is not a GPU arch\n  fix: DSV41_AOT_ARCH=gfx950 (or gfx942)")
    if not (HERE / "ci" / "prebuilt.py").is_file():
        _fail("per-arch wheels are built from a source checkout (ci/prebuilt.py is missing here)\n"
              "  fix: DSV41_AOT_ARCH=... DSV41_AOT_PREBUILT=... python -m build --wheel  (from the checkout)")
    sys.path.insert(0, str(HERE))
    from ci.prebuilt import check_arch
    from dsv41_aot.errors import AotError

    try:
        return check_arch(_prebuilt_root(), ARCH)
    except AotError as e:
        _fail(str(e), e.exit_code)


CONTENTS = _checked_contents() if ARCH else None


def _version() -> str:
    base = _base_version()
    if CONTENTS is None:
        return base
    vllm = re.sub(r"[^A-Za-z0-9.]+", ".", CONTENTS.vllm_version).strip(".").lower()
    return f"{base}+{ARCH}.vllm{vllm}"


class build_py(_build_py):
    """Copy the checked arch folder into the package (and drop any other
    arch a previous build left in the reused build/ folder)."""

    def run(self):
        super().run()
        dest = Path(self.build_lib) / PACKAGE_DIR
        shutil.rmtree(dest, ignore_errors=True)
        if CONTENTS is None:
            return
        for rel in CONTENTS.files:
            if rel.startswith("objects/") and not WITH_OBJECTS:
                continue
            target = dest / ARCH / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(CONTENTS.dir / rel, target)
            os.chmod(target, 0o755 if target.suffix == ".so" else 0o644)


class KernelsDistribution(Distribution):
    """A kernels wheel holds host shared libraries: platlib, not purelib
    (auditwheel inspects platlib only), though no extension module."""

    def has_ext_modules(self):
        return CONTENTS is not None


class bdist_wheel(_bdist_wheel):
    """py3-none-<manylinux> for a kernels wheel, py3-none-any without."""

    def get_tag(self):
        if CONTENTS is None:
            return super().get_tag()
        return "py3", "none", PLAT


setup(version=_version(), distclass=KernelsDistribution, cmdclass={"build_py": build_py, "bdist_wheel": bdist_wheel})
