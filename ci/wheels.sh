#!/usr/bin/env bash
# Build and check THE kernels wheel of a merged, linked prebuilt dir.
#
#   ci/wheels.sh [PREBUILT_DIR] [OUT_DIR]        (defaults: kernels_prebuilt wheelhouse)
#
# One wheel holds every room of PREBUILT_DIR (<arch>/vllm-<release>/:
# manifest.json + libs.json) and the xz bands of <arch>/lib/ they name (what
# `dsv41-aot link` wrote), named
# dsv41_aot-<version>-py3-none-manylinux_2_28_x86_64.whl. Before packing,
# every room is checked (ci/prebuilt.py: its release is one of
# build_matrix.yaml's, built from that release's mono sources) and auditwheel runs on the raw
# libraries the bands unpack to; after, ci/check_wheel.py checks name, tag,
# metadata, bands against the prebuilt dir, and auditwheel again on what the
# wheel holds. Nothing is compiled. Builds run in this environment
# (--no-build-isolation): no index is asked for setuptools.
# PYTHON (default: python3) runs pip; DSV41_AOT_WHEEL_FRONTEND=build uses
# `python -m build --wheel --no-isolation` instead of `pip wheel`.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
prebuilt="$(realpath -m "${1:-$here/kernels_prebuilt}")"
out="$(realpath -m "${2:-$here/wheelhouse}")"
py="${PYTHON:-python3}"

"$py" "$here/ci/prebuilt.py" "$prebuilt"
"$py" "$here/ci/check_wheel.py" --audit-prebuilt "$prebuilt"
rm -rf "$out" && mkdir -p "$out"
if [ "${DSV41_AOT_WHEEL_FRONTEND:-pip}" = build ]; then
    DSV41_AOT_PREBUILT="$prebuilt" "$py" -m build --wheel --no-isolation --outdir "$out" "$here"
else
    DSV41_AOT_PREBUILT="$prebuilt" "$py" -m pip wheel --no-deps --no-build-isolation -w "$out" "$here"
fi
"$py" "$here/ci/check_wheel.py" --prebuilt "$prebuilt" "$out"/*.whl
