#!/usr/bin/env bash
# Set up, then run every test (the slow ones compile, link and install real
# artifacts; tests that need an AMD GPU skip themselves and say why).
set -euo pipefail
cd "$(dirname "$0")/.."
ci/bootstrap.sh
exec .venv/bin/python -m pytest -q -ra "$@"
