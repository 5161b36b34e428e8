"""Wheels of dsv41-aot: ONE kernels wheel for every arch of a prebuilt dir.

    DSV41_AOT_PREBUILT=DIR pip wheel --no-deps -w dist .
    DSV41_AOT_PREBUILT=DIR python -m build --wheel

packs every room of ``DIR`` (``<arch>/vllm-<release>/``: its manifest.json and
libs.json) and each arch's shared library bands (``<arch>/lib/*.so.xz``, the
xz-compressed bands ``dsv41-aot link`` writes, only those some room's
libs.json names) into the package as ``dsv41_aot/kernels_prebuilt/<arch>/``,
where the loader looks by default; never a room's timings.json.
Nothing is compiled, linked or compressed here: the prebuilt dir already holds
what the loader reads (one load path for a build dir and an installed wheel).

- Name and version: ``dsv41_aot-<version>-py3-none-manylinux_2_28_x86_64.whl``,
  no local version label, so an index can serve it and pip cannot pick the
  wrong arch: every arch is inside, the loader picks the device's at run time.
  The vLLM releases the kernels serve are the rooms inside (one a release of
  ``build_matrix.yaml``); the ``vllm`` extra (``pip install dsv41-aot[vllm]``)
  admits them all (a range, not a pin) and the README names them. The build
  refuses a room of a release the matrix does not build, or one whose mono
  sources are not that release's digest (the loader picks the room of the
  running vLLM by that digest).
- Tag: ``py3-none-manylinux_2_28_x86_64``: host shared libraries (stored
  compressed), no Python extension module. The libraries need nothing from the
  build machine (no DT_NEEDED; HIP is the host's ROCm, whose distributions all
  have glibc >= 2.28); ci/check_wheel.py runs auditwheel on the raw libraries.
  DSV41_AOT_PLAT overrides the tag.
- Without DSV41_AOT_PREBUILT: a pure-Python ``py3-none-any`` wheel with no
  kernels (the runtime and the build commands: ``pip install .[build]``,
  editable installs). It never looks at a prebuilt dir.
- The build refuses an empty, partial or mixed-source room, and a band no
  room names (ci/prebuilt.py), naming the room, folder or key and the command
  that fixes it.
- The stored objects the libraries were linked from stay out of the wheel
  (the loader opens only lib/; libs.json keeps each object's sha256):
  DSV41_AOT_WHEEL_OBJECTS=1 packs them too.
"""

from __future__ import annotations

import os
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

PREBUILT = os.environ.get("DSV41_AOT_PREBUILT", "").strip()
PLAT = os.environ.get("DSV41_AOT_PLAT", DEFAULT_PLAT).strip()
WITH_OBJECTS = os.environ.get("DSV41_AOT_WHEEL_OBJECTS") == "1"


def _fail(message: str, code: int = 2):
    print(f"\ndsv41-aot wheel: error: {message}\n", file=sys.stderr)
    raise SystemExit(code)


def _checked_contents() -> list:
    """Every arch folder of the prebuilt dir after ci/prebuilt.py's checks
    (every room of a release of the build matrix, with that release's mono
    sources digest), each release admitted by the ``vllm`` extra (or exit
    nonzero)."""
    if not (HERE / "ci" / "prebuilt.py").is_file():
        _fail("kernels wheels are built from a source checkout (ci/prebuilt.py is missing here)\n"
              "  fix: DSV41_AOT_PREBUILT=... python -m build --wheel  (from the checkout)")
    root = Path(PREBUILT)
    root = root if root.is_absolute() else HERE / root
    sys.path.insert(0, str(HERE))
    from ci.prebuilt import admits, check_dir, vllm_extra
    from dsv41_aot.errors import AotError

    try:
        contents = check_dir(root)
        spec = vllm_extra((HERE / "pyproject.toml").read_text())
    except AotError as e:
        _fail(str(e), e.exit_code)
    for c in contents:
        for r in c.rooms:
            if not admits(spec, r.release):
                _fail(f"room {r.name} of {root} serves vLLM {r.release}, which the vllm extra (vllm{spec}, "
                      f"pyproject.toml) does not admit\n  fix: widen the vllm extra to admit vLLM {r.release}, "
                      f"or remove {root / r.name}")
    return contents


CONTENTS = _checked_contents() if PREBUILT else None


class build_py(_build_py):
    """Copy the checked arch folders into the package (and drop whatever a
    previous build left in the reused build/ folder)."""

    def run(self):
        super().run()
        dest = Path(self.build_lib) / PACKAGE_DIR
        shutil.rmtree(dest, ignore_errors=True)
        for c in CONTENTS or ():
            for rel in c.files:  # rooms' manifest + libs.json, the bands they name (never timings.json)
                if rel.startswith("objects/") and not WITH_OBJECTS:
                    continue
                target = dest / c.arch / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(c.dir / rel, target)
                os.chmod(target, 0o644)  # data: bands are dlopened from memory, never from here


class KernelsDistribution(Distribution):
    """A kernels wheel holds host shared libraries (compressed): platlib, not
    purelib, though no extension module."""

    def has_ext_modules(self):
        return CONTENTS is not None


class bdist_wheel(_bdist_wheel):
    """py3-none-<manylinux> for a kernels wheel, py3-none-any without."""

    def get_tag(self):
        if CONTENTS is None:
            return super().get_tag()
        return "py3", "none", PLAT


setup(distclass=KernelsDistribution, cmdclass={"build_py": build_py, "bdist_wheel": bdist_wheel})
