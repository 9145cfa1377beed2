#!/usr/bin/env bash
# The main job on this machine: set up if needed, then train with the paper's Exp. 2 recipe
# (LARS, configuration B, label smoothing, batch-size control, BN statistics recomputed before
# each evaluation) on the embedded data (generated offline on first use), with 4 local workers
# averaging gradients over a 2 x 2 torus. About 3 minutes on 2 cores. Extra flags pass
# through, e.g. `bash run_scripts/demo.sh --exp=3`.
#
# TFTORUS_STACK picks the stack (run_scripts/setup.sh): classic (the default) launches with
# `horovodrun --gloo`; current (TensorFlow 2.21, Keras 3, no Horovod) with tftorus' local
# launcher, `python -m tftorus.run`, on the tf engine.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$repo/run_scripts/setup.sh"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
cd "$repo"
# A fresh run directory each time (a later --model_dir in "$@" wins: pass an existing one to
# continue an interrupted run from its last checkpoint).
if [ "${TFTORUS_STACK:-classic}" = current ]; then
  venv="${TFTORUS_VENV:-$repo/.venv-current}"
  exec "$venv/bin/python" -m tftorus.run -np 4 run_scripts/train.py --exp=2 --grid=2x2 --engine=tf \
    --flagfile=run_scripts/embedded.flags --model_dir="runs/embedded-current-$(date +%Y%m%d-%H%M%S)" "$@"
fi
venv="${TFTORUS_VENV:-$repo/.venv}"
# the job's secret, which horovodrun hands to every rank (tftorus.run makes its own)
if [ -z "${TFTORUS_JOB_SECRET:-}${TFTORUS_JOB_SECRET_FILE:-}" ]; then
  TFTORUS_JOB_SECRET="$("$venv/bin/python" -c 'import secrets; print(secrets.token_hex(32))')"
  export TFTORUS_JOB_SECRET
fi
exec "$venv/bin/horovodrun" --gloo -np 4 -H localhost:4 \
  "$venv/bin/python" run_scripts/train.py --exp=2 --grid=2x2 \
  --flagfile=run_scripts/embedded.flags --model_dir="runs/embedded-$(date +%Y%m%d-%H%M%S)" "$@"
