#!/usr/bin/env bash
# Set up tftorus on a fresh machine: a virtualenv, TensorFlow 2.15.1, then Horovod 0.28.1 built
# from source against that TensorFlow. Idempotent: a second run only checks and returns.
#
#   bash run_scripts/setup.sh            # CPU (Gloo); GPU/NCCL/MPI picked up when present
#   TFTORUS_VENV=/path bash run_scripts/setup.sh
#
# Environment:
#   TFTORUS_VENV      where the virtualenv lives (default: .venv in the checkout)
#   TFTORUS_GPU=1     force the GPU stack (tensorflow[and-cuda], Horovod with NCCL)
#   TFTORUS_GPU=0     force the CPU stack even where CUDA is visible
set -euo pipefail
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"  # keep TensorFlow's start-up chatter out of the log

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${TFTORUS_VENV:-$repo/.venv}"
py="$venv/bin/python"
stamp="$venv/.tftorus-setup-ok"

log() { echo "[setup] $*"; }
pip_quiet() {
  "$py" -m pip "$@" 2>&1 | { grep -v -e "is ignored: it is neither a file nor a directory" \
                                    -e "DEPRECATION: Legacy editable install" || true; }
  return "${PIPESTATUS[0]}"
}

# GPU when asked, or when a GPU driver *and* NCCL are visible (nvcc alone is not a GPU).
gpu="${TFTORUS_GPU:-auto}"
if [ "$gpu" = auto ]; then
  gpu=0
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 \
     && { ldconfig -p 2>/dev/null | grep -q libnccl || [ -n "${NCCL_HOME:-}" ]; }; then
    gpu=1
  fi
fi

# Everything the checkout asks for, hashed, so an edit of setup.py re-runs the install.
want="$(cat "$repo/setup.py" "$repo/run_scripts/setup.sh" | sha256sum | cut -c1-16)-gpu$gpu"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] \
   && "$venv/bin/horovodrun" --check-build >/dev/null 2>&1; then
  log "already set up in $venv (delete $stamp to force a reinstall)"
  exit 0
fi

if [ ! -x "$py" ]; then
  log "creating virtualenv $venv"
  python3 -m venv "$venv"
fi
pip_quiet install --quiet --upgrade "pip<25" "setuptools<70" wheel packaging

# 1) TensorFlow first: Horovod compiles against the TensorFlow it finds.
if [ "$gpu" = 1 ]; then extra=gpu; else extra=cpu; fi
log "installing tftorus[$extra] (TensorFlow 2.15.1 stack)"
pip_quiet install --quiet -e "$repo[$extra,test]"

# 2) Horovod from source, against that TensorFlow.
need_build=1
if "$py" - <<'PY' 2>/dev/null; then need_build=0; fi
import horovod, horovod.tensorflow as hvd
assert horovod.__version__ == "0.28.1"
assert hvd.gloo_built()
PY
if [ "$gpu" = 1 ] && ! "$py" -c "import horovod.tensorflow as h; assert h.nccl_built()" 2>/dev/null; then
  need_build=1  # a CPU-only Horovod is there, but this machine wants NCCL
fi
if [ "$need_build" = 1 ]; then
  export HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1
  if command -v mpicxx >/dev/null 2>&1; then
    export HOROVOD_WITH_MPI=1; log "OpenMPI found: building Horovod with MPI too"
  else
    export HOROVOD_WITHOUT_MPI=1
  fi
  if [ "$gpu" = 1 ]; then
    export HOROVOD_GPU_OPERATIONS=NCCL; log "GPU stack: building Horovod with NCCL"
  fi
  export PATH="$venv/bin:$PATH"
  if ! command -v cmake >/dev/null 2>&1; then  # Horovod's build needs CMake
    log "no cmake on this machine: installing it from PyPI"; pip_quiet install --quiet cmake
  fi
  export MAKEFLAGS="-j$(nproc)"
  build_log="$venv/horovod-build.log"
  "$py" -m pip uninstall --quiet -y horovod >/dev/null 2>&1 || true
  for attempt in 1 2; do  # a second try covers a registry hiccup during the download
    log "building Horovod 0.28.1 from source, attempt $attempt (about 3 minutes on 2 cores; log: $build_log)"
    if "$py" -m pip install --no-build-isolation --no-cache-dir horovod==0.28.1 >"$build_log" 2>&1; then
      break
    fi
    grep -v "is ignored: it is neither" "$build_log" | tail -25 >&2
    if [ "$attempt" = 2 ]; then
      echo "[setup] Horovod did not build; the full log is $build_log" >&2
      exit 1
    fi
  done
fi

build_info="$("$venv/bin/horovodrun" --check-build 2>/dev/null)"
echo "$build_info"
for need in TensorFlow Gloo; do
  grep -q "\[X\] $need" <<<"$build_info" \
    || { echo "[setup] Horovod was built without $need support: see the build log above" >&2; exit 1; }
done
echo "$want" > "$stamp"
log "done: activate with 'source $venv/bin/activate'"
