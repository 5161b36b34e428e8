#!/usr/bin/env bash
# The main job: set up, then build the build matrix's default profile into
# kernels_prebuilt/ (extra arguments go to `dsv41-aot build`).
set -euo pipefail
cd "$(dirname "$0")/.."
ci/bootstrap.sh
exec .venv/bin/dsv41-aot build "$@"
