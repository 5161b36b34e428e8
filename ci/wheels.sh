#!/usr/bin/env bash
# Build and check one kernels wheel per arch of a merged, linked prebuilt dir.
#
#   ci/wheels.sh [PREBUILT_DIR] [OUT_DIR]        (defaults: kernels_prebuilt wheelhouse)
#
# Each arch's wheel lands in OUT_DIR/<arch>/ (a per-arch wheelhouse, so that
# `pip install --find-links OUT_DIR/gfx942 dsv41-aot` cannot pick another
# arch's wheel), then ci/check_wheel.py checks tag, version, metadata,
# contents against the prebuilt dir, and auditwheel. Nothing is compiled:
# setup.py refuses an empty, partial or mixed-source prebuilt dir.
# PYTHON (default: python3) runs pip; DSV41_AOT_WHEEL_FRONTEND=build uses
# `python -m build --wheel` instead of `pip wheel`.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
prebuilt="$(realpath -m "${1:-$here/kernels_prebuilt}")"
out="$(realpath -m "${2:-$here/wheelhouse}")"
py="${PYTHON:-python3}"

"$py" "$here/ci/prebuilt.py" "$prebuilt"
arches=$(cd "$prebuilt" && ls -d */manifest.json 2>/dev/null | cut -d/ -f1)
[ -n "$arches" ] || { echo "ci/wheels.sh: $prebuilt holds no arch" >&2; exit 2; }
for arch in $arches; do
    dest="$out/$arch"
    rm -rf "$dest" && mkdir -p "$dest"
    if [ "${DSV41_AOT_WHEEL_FRONTEND:-pip}" = build ]; then
        DSV41_AOT_ARCH="$arch" DSV41_AOT_PREBUILT="$prebuilt" "$py" -m build --wheel --outdir "$dest" "$here"
    else
        DSV41_AOT_ARCH="$arch" DSV41_AOT_PREBUILT="$prebuilt" "$py" -m pip wheel --no-deps -w "$dest" "$here"
    fi
    "$py" "$here/ci/check_wheel.py" --prebuilt "$prebuilt" "$dest"/*.whl
done
