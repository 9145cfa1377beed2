#!/usr/bin/env bash
# The main job on this machine: set up if needed, then 4 local workers on a 2 x 2 torus time
# the torus, ring and hierarchical all-reduce against Horovod's own on ResNet-50's gradients
# (FP32 and FP16 on the wire) and a 16 MiB buffer, and print the ratios. A few minutes on
# 2 cores; no data or weights are downloaded.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$repo/run_scripts/setup.sh"
venv="${TFTORUS_VENV:-$repo/.venv}"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
cd "$repo"
exec "$venv/bin/python" run_scripts/benchmark_allreduce.py --np 4 --grids 4=2x2 \
  --sizes 16M --resnet fp32 fp16 --repeats 3 --warmup 1 --no-phases \
  --csv "${TMPDIR:-/tmp}/tftorus_demo/allreduce.csv" "$@"
