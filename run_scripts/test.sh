#!/usr/bin/env bash
# Run the test suite: sets the project up first if needed (run_scripts/setup.sh), then runs
# unit tests and multi-process tests, which start real `horovodrun --gloo` jobs on this machine
# (N = 1 to 12 local processes).
#
#   bash run_scripts/test.sh                 # the default tier
#   bash run_scripts/test.sh --slow          # the slow tier (tests/conftest.py lists it)
#   bash run_scripts/test.sh --all           # both tiers (what CI runs)
#   bash run_scripts/test.sh --quick         # the default tier's tests that start no process
#   bash run_scripts/test.sh tests/test_grid.py -k planner   # these tests, whatever their tier
#
# CI (.ci/run) runs --all. Measured on 2 cores from a fresh clone (2026-11-25, 409d794): --all
# 24.2 min with set-up (17.3 of tests), --quick 47 s; the default tier 7.4 min (57e1ac7).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$repo/run_scripts/setup.sh"
venv="${TFTORUS_VENV:-$repo/.venv}"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
export CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES-}"  # the tests are CPU tests
cd "$repo"
tier=()
case "${1:-}" in
  --slow) tier=(-m slow); shift ;;
  --all) shift ;;
  --quick) tier=(-m "not slow and not launches"); export TFTORUS_TEST_TIER=quick; shift ;;
  *) if [ "$#" -eq 0 ]; then tier=(-m "not slow"); fi ;;
esac
if [ "$#" -eq 0 ]; then set -- tests; fi
exec "$venv/bin/python" -m pytest -p no:cacheprovider -q -rfEs --durations=15 ${tier[@]+"${tier[@]}"} "$@"
