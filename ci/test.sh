#!/usr/bin/env bash
# Set up, then run every test (the slow ones compile, link and install real
# artifacts; tests that need an AMD GPU skip themselves and say why), and
# print the 15 slowest. The session builds into one fresh build cache
# (tests/conftest.py), so each key compiles once however many tests use it.
#   ci/test.sh --fast   only the tests that compile nothing (not marked slow)
# Other arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
# Python may keep the bytecode it compiles (an environment that sets
# PYTHONDONTWRITEBYTECODE otherwise has each of the suite's thousand-odd
# Python processes compile every module it imports from source again)
unset PYTHONDONTWRITEBYTECODE
ci/bootstrap.sh
select=()
if [ "${1:-}" = --fast ]; then
  shift
  select=(-m "not slow")
  export DSV41_AOT_TEST_FAST=1
fi
# file order by default (reproducible); DSV41_AOT_TEST_ORDER=shuffle runs a
# pytest-randomly order, whose seed the summary prints for a replay
order=(-p no:randomly)
[ "${DSV41_AOT_TEST_ORDER:-}" = shuffle ] && order=()
start=$SECONDS
rc=0
# one pytest-xdist worker per core, each test file whole on one worker (its
# module fixtures built once), files in the order tests/conftest.py gives
# them (FIRST); DSV41_AOT_TEST_WORKERS=0 runs in this process
workers=(-n "${DSV41_AOT_TEST_WORKERS:-auto}" --dist loadfile --no-loadscope-reorder)
.venv/bin/python -m pytest -q -ra --durations=15 "${order[@]}" "${workers[@]}" "${select[@]}" "$@" || rc=$?
echo "ci/test.sh${select:+ --fast}: pytest took $((SECONDS - start)) s (exit $rc)"
exit $rc
