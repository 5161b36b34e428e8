#!/usr/bin/env bash
# Build and check THE kernels wheel of a merged, linked prebuilt dir.
#
#   ci/wheels.sh [PREBUILT_DIR] [OUT_DIR]        (defaults: kernels_prebuilt wheelhouse)
#
# One wheel holds every room of PREBUILT_DIR (<arch>/vllm-<release>/:
# manifest.json + libs.json, and verified.json when the room was proven) and
# the xz bands of <arch>/lib/ they name (what `dsv41-aot link` wrote), named
# dsv41_aot-<version>-py3-none-manylinux_2_28_x86_64.whl. It is
# `ci/release.py wheel`: the wheel job's steps of .github/workflows/wheels.yml
# with this machine's build in place of cibuildwheel (which needs Docker):
#   prewheel     every room checked (ci/prebuilt.py: its release is one of
#                build_matrix.yaml's, built from that release's mono sources),
#                auditwheel on the raw libraries the bands unpack to;
#   build-wheel  built from a copy of the source files (never this checkout's
#                build/ folder), --no-build-isolation: no index is asked for
#                setuptools; then cibuildwheel's repair-step audit;
#   checkwheel   ci/check_wheel.py (name, tag, metadata, bands against the
#                prebuilt dir, auditwheel), twine check.
# Nothing is compiled. PYTHON (default: python3) runs it;
# DSV41_AOT_WHEEL_FRONTEND=build uses `python -m build --wheel --no-isolation`
# (cibuildwheel's frontend) instead of `pip wheel`.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
prebuilt="$(realpath -m "${1:-$here/kernels_prebuilt}")"
out="$(realpath -m "${2:-$here/wheelhouse}")"
exec "${PYTHON:-python3}" "$here/ci/release.py" wheel "$prebuilt" "$out" --frontend "${DSV41_AOT_WHEEL_FRONTEND:-pip}"
