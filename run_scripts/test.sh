#!/usr/bin/env bash
# Run the test suite: sets the project up first if needed (run_scripts/setup.sh), then runs
# unit tests and the multi-process tests, which start real `horovodrun --gloo` jobs on this
# machine (N = 1 to 12 local processes). About 25 minutes on 2 cores (27.5 min from a fresh
# clone, set-up included: 196 tests in 24.3 min).
#
#   bash run_scripts/test.sh                 # everything
#   bash run_scripts/test.sh tests/test_grid.py -k planner   # pytest arguments pass through
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$repo/run_scripts/setup.sh"
venv="${TFTORUS_VENV:-$repo/.venv}"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
export CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES-}"  # the tests are CPU tests
cd "$repo"
if [ "$#" -eq 0 ]; then set -- tests; fi
exec "$venv/bin/python" -m pytest -p no:cacheprovider -q -rfEs --durations=15 "$@"
