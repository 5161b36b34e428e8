"""The wheel build of dsv41-aot: one kernels wheel for every arch of a prebuilt dir.

    DSV41_AOT_PREBUILT=DIR pip wheel --no-deps -w dist .
    DSV41_AOT_PREBUILT=DIR python -m build --wheel

With ``DSV41_AOT_PREBUILT`` set, building a wheel first runs the wheel gate
(``ci/prebuilt.py``: every room of ``DIR`` complete, of one source identity,
of a release the build matrix builds, and admitted by the ``vllm`` extra) and
then copies into ``dsv41_aot/kernels_prebuilt/<arch>/``, where the loader
looks by default, exactly what the loader reads: each room's manifest.json
and libs.json (``<arch>/vllm-<release>/``), its verified.json, and the
compressed shared library bands (``<arch>/lib/*.so.xz``) some room's
libs.json names; never a room's timings.json. Nothing is compiled, linked or
compressed here. The gate runs only when a wheel is built: importing this
file (metadata preparation, an sdist, an editable install) checks nothing.

- Name: ``dsv41_aot-<version>-py3-none-manylinux_2_28_x86_64.whl``, with no
  local version label, so that an index can serve it. Every arch is inside;
  the loader picks the device's at run time. ``DSV41_AOT_PLAT`` overrides the
  platform tag.
- The tag says "host shared libraries, no Python extension module". The
  libraries need nothing from the build machine (no DT_NEEDED: HIP comes from
  the host's ROCm, whose distributions all have glibc 2.28 or newer).
- Without ``DSV41_AOT_PREBUILT``: a pure-Python ``py3-none-any`` wheel with
  no kernels (the runtime and the build commands). It never looks at a
  prebuilt dir.
- The objects the bands were linked from stay out of the wheel (libs.json
  keeps each one's sha256); ``DSV41_AOT_WHEEL_OBJECTS=1`` packs them too.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.bdist_wheel import bdist_wheel as _bdist_wheel
from setuptools.command.build_py import build_py as _build_py

HERE = Path(__file__).resolve().parent
PACKAGE_DIR = "dsv41_aot/kernels_prebuilt"

PREBUILT = os.environ.get("DSV41_AOT_PREBUILT", "").strip()
PLAT = os.environ.get("DSV41_AOT_PLAT", "manylinux_2_28_x86_64").strip()
WITH_OBJECTS = os.environ.get("DSV41_AOT_WHEEL_OBJECTS") == "1"

# A reproducible wheel: bdist_wheel stamps every file with SOURCE_DATE_EPOCH;
# unset, a build in a git checkout takes the commit's time (ci/stages.py), so
# two builds of one commit give the same sha256 (docs/releases.md)
if not os.environ.get("SOURCE_DATE_EPOCH") and (HERE / "ci" / "stages.py").is_file():
    sys.path.insert(0, str(HERE))
    from ci.stages import source_date_epoch

    _epoch = source_date_epoch(HERE)
    if _epoch:
        os.environ["SOURCE_DATE_EPOCH"] = _epoch


def _fail(message: str, code: int = 2):
    print(f"\ndsv41-aot wheel: error: {message}\n", file=sys.stderr)
    raise SystemExit(code)


def checked_contents() -> list:
    """The wheel gate: every arch folder of the prebuilt dir, checked, or exit nonzero.

    ci/prebuilt.py checks each room; then every room's release must be one
    the ``vllm`` extra of pyproject.toml admits.
    """
    if not (HERE / "ci" / "prebuilt.py").is_file():
        _fail("kernels wheels are built from a source checkout (ci/prebuilt.py is missing here)\n"
              "  fix: DSV41_AOT_PREBUILT=... python -m build --wheel  (from the checkout)")
    root = Path(PREBUILT)
    root = root if root.is_absolute() else HERE / root
    sys.path.insert(0, str(HERE))
    from ci.prebuilt import check_dir, vllm_extra
    from dsv41_aot.aot.wheel import admits
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


class bdist_wheel(_bdist_wheel):
    """The wheel command: runs the gate first for a kernels wheel, and tags it for its platform."""

    def run(self):
        # build_py (run inside super().run()) copies what the gate checked
        self.distribution.kernels = checked_contents() if PREBUILT else []
        super().run()

    def get_tag(self):
        return ("py3", "none", PLAT) if PREBUILT else super().get_tag()


class build_py(_build_py):
    """Copies the package, then the arch folders the wheel gate checked (none outside a wheel build)."""

    def run(self):
        super().run()
        dest = Path(self.build_lib) / PACKAGE_DIR
        shutil.rmtree(dest, ignore_errors=True)  # whatever an earlier build left in the reused build/ folder
        for c in getattr(self.distribution, "kernels", []):
            for rel in c.files:
                if rel.startswith("objects/") and not WITH_OBJECTS:
                    continue
                target = dest / c.arch / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(c.dir / rel, target)
                os.chmod(target, 0o644)  # data: bands are loaded from memory, never from here


class KernelsDistribution(Distribution):
    """The distribution, which is platform-specific when it holds kernels.

    A kernels wheel holds host shared libraries (compressed), so it belongs
    in platlib, though it has no extension module.
    """

    def has_ext_modules(self):
        return bool(PREBUILT)


setup(distclass=KernelsDistribution, cmdclass={"build_py": build_py, "bdist_wheel": bdist_wheel})
