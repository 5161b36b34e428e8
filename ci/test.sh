#!/usr/bin/env bash
# Set up, then run every test (the slow ones compile, link and install real
# artifacts; tests that need an AMD GPU skip themselves and say why).
set -euo pipefail
cd "$(dirname "$0")/.."
ci/bootstrap.sh
# file order by default (reproducible); DSV41_AOT_TEST_ORDER=shuffle runs a
# pytest-randomly order, whose seed the summary prints for a replay
order=(-p no:randomly)
[ "${DSV41_AOT_TEST_ORDER:-}" = shuffle ] && order=()
exec .venv/bin/python -m pytest -q -ra "${order[@]}" "$@"
