#!/usr/bin/env bash
# Set up tftorus on a fresh machine, for one of two stacks. Idempotent: a second run only checks
# and returns.
#
#   classic (the default): a virtualenv (.venv), TensorFlow 2.15.1 (Keras 2), then Horovod 0.28.1
#           built from source against that TensorFlow
#   current: a Python 3.12 virtualenv (.venv-current), TensorFlow 2.21.0 (Keras 3), no Horovod
#
#   bash run_scripts/setup.sh            # CPU (Gloo); GPU/NCCL/MPI picked up when present
#   TFTORUS_STACK=current bash run_scripts/setup.sh
#   TFTORUS_VENV=/path bash run_scripts/setup.sh
#
# Environment:
#   TFTORUS_STACK     classic (default) or current
#   TFTORUS_VENV      where the stack's virtualenv lives (default: .venv, or .venv-current for
#                     the current stack, in the checkout)
#   TFTORUS_GPU=1     force the GPU stack (tensorflow[and-cuda]; classic: Horovod with NCCL)
#   TFTORUS_GPU=0     force the CPU stack even where CUDA is visible
set -euo pipefail
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"  # keep TensorFlow's start-up chatter out of the log

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
stack="${TFTORUS_STACK:-classic}"
case "$stack" in
  classic) venv="${TFTORUS_VENV:-$repo/.venv}" ;;
  current) venv="${TFTORUS_VENV:-$repo/.venv-current}" ;;
  *) echo "[setup] TFTORUS_STACK is '$stack': it must be classic or current" >&2; exit 2 ;;
esac
py="$venv/bin/python"
stamp="$venv/.tftorus-setup-ok"
marker="$venv/.tftorus-stack"  # which stack the virtualenv holds

log() { echo "[setup] $*"; }
pip_quiet() {
  "$py" -m pip "$@" 2>&1 | { grep -v -e "is ignored: it is neither a file nor a directory" || true; }
  return "${PIPESTATUS[0]}"
}

# A virtualenv holds one stack: never install one stack over the other's. A virtualenv made
# before there were two stacks has no marker; its Python tells (classic needs 3.11 or older).
if [ -x "$py" ]; then
  pyver="$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
  have="$(cat "$marker" 2>/dev/null || true)"
  if [ -z "$have" ]; then
    if "$py" -c 'import sys; sys.exit(sys.version_info < (3, 12))'; then have=current; else have=classic; fi
  fi
  if [ "$have" != "$stack" ]; then
    echo "[setup] $venv holds the $have stack (Python $pyver), not the $stack one: set TFTORUS_VENV to another directory, or delete it" >&2
    exit 1
  fi
fi

# GPU when asked, or when a GPU driver *and* NCCL are visible (nvcc alone is not a GPU).
gpu="${TFTORUS_GPU:-auto}"
if [ "$gpu" = auto ]; then
  gpu=0
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 \
     && { ldconfig -p 2>/dev/null | grep -q libnccl || [ -n "${NCCL_HOME:-}" ]; }; then
    gpu=1
  fi
fi

# Everything the checkout asks for, hashed, so an edit of pyproject.toml re-runs the install.
want="$(cat "$repo/pyproject.toml" "$repo/run_scripts/setup.sh" | sha256sum | cut -c1-16)-gpu$gpu"

if [ "$stack" = current ]; then
  # The current stack: TensorFlow as pyproject.toml's current-cpu / current-gpu extras pin it, then
  # this package, which names no TensorFlow and so keeps that one; no Horovod.
  tf_version="$(sed -n 's/^current-cpu = \["tensorflow-cpu==\([^"]*\)".*/\1/p' "$repo/pyproject.toml")"
  if [ "$gpu" = 1 ]; then tf_req="tensorflow[and-cuda]==$tf_version"; tf_dist=tensorflow; extra=current-gpu
  else tf_req="tensorflow-cpu==$tf_version"; tf_dist=tensorflow-cpu; extra=current-cpu; fi
  want="$want-current"
  installed() {  # the stamped install is still there (no TensorFlow import: this is the quick path)
    "$py" - "$tf_dist" "$tf_version" <<'PY' 2>/dev/null
import importlib.metadata as md, importlib.util, sys
assert md.version(sys.argv[1]) == sys.argv[2] and md.version("tftorus") and md.version("tensorboard") and md.version("ray")
assert importlib.util.find_spec("horovod") is None
PY
  }
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && installed; then
    log "already set up in $venv (delete $stamp to force a reinstall)"
    exit 0
  fi

  if [ ! -x "$py" ]; then
    # Python 3.12: python3.12 on PATH (a pyenv shim counts only if it runs), else pyenv's
    python312=""
    for cand in python3.12 \
                "$(pyenv prefix 3.12 2>/dev/null | head -1)/bin/python3.12" \
                $(ls -d "$(pyenv root 2>/dev/null || echo "${PYENV_ROOT:-$HOME/.pyenv}")"/versions/3.12.*/bin/python3.12 2>/dev/null | sort -rV); do
      if python312="$("$cand" -c 'import sys; assert sys.version_info[:2] == (3, 12); print(sys.executable)' 2>/dev/null)"; then
        break
      fi
      python312=""
    done
    if [ -z "$python312" ]; then
      echo "[setup] the current stack needs Python 3.12 and none was found (no working python3.12 on PATH, none in pyenv): install it (e.g. 'pyenv install 3.12', or your system's python3.12 and python3.12-venv packages), then run this again" >&2
      exit 1
    fi
    log "creating virtualenv $venv (Python 3.12: $python312)"
    "$python312" -m venv "$venv"
    echo current > "$marker"
  fi
  pip_quiet install --quiet --upgrade pip setuptools wheel packaging
  log "installing $tf_req (the current stack: Keras 3, no Horovod)"
  pip_quiet install --quiet "$tf_req"
  log "installing tftorus[$extra,ray,test] (the TensorFlow above, TensorBoard, Ray)"
  pip_quiet install --quiet -e "$repo[$extra,ray,test]"
  # TensorFlow's start-up lines go to stderr, shown only when the check fails
  if ! check="$("$py" - "$tf_version" 2>&1 <<'PY'
import importlib.util, sys
import keras
import tensorflow as tf
if tf.__version__ != sys.argv[1] or not keras.__version__.startswith("3."):
    sys.exit(f"[setup] expected TensorFlow {sys.argv[1]} with Keras 3, found TensorFlow "
             f"{tf.__version__} with Keras {keras.__version__}")
if importlib.util.find_spec("horovod") is not None:
    sys.exit("[setup] Horovod is installed in the current stack's virtualenv: it has none")
print(f"[setup] Python {sys.version.split()[0]}, TensorFlow {tf.__version__}, "
      f"Keras {keras.__version__}, no Horovod")
PY
  )"; then
    echo "$check" >&2
    exit 1
  fi
  grep "^\[setup\]" <<<"$check"
  installed || { echo "[setup] the install did not take: see pip's messages above" >&2; exit 1; }
  echo current > "$marker"
  echo "$want" > "$stamp"
  log "done: activate with 'source $venv/bin/activate'"
  exit 0
fi
# SimGrid for the studies only (studies/simulated_cluster.py; no test or product code needs
# it): Debian's python3-simgrid, where apt-get exists and we are root or have passwordless sudo.
# Quiet and never fatal: a failure prints one line. Already there: a file test, no apt call.
simgrid_for_studies() {
  local so
  so="/usr/lib/python3/dist-packages/simgrid$("$py" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))' 2>/dev/null)"
  [ -e "$so" ] && return 0
  command -v apt-get >/dev/null 2>&1 || return 0
  local sudo=""
  if [ "$(id -u)" != 0 ]; then
    sudo -n true 2>/dev/null || return 0
    sudo="sudo -n"
  fi
  if $sudo env DEBIAN_FRONTEND=noninteractive timeout 300 apt-get install -y -qq python3-simgrid \
       >"$venv/simgrid-apt.log" 2>&1 && [ -e "$so" ]; then
    log "SimGrid installed for the studies (python3-simgrid)"
  else
    log "SimGrid not installed (studies/simulated_cluster.py will skip; log: $venv/simgrid-apt.log)"
  fi
  return 0
}

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] \
   && "$venv/bin/horovodrun" --check-build >/dev/null 2>&1; then
  simgrid_for_studies
  log "already set up in $venv (delete $stamp to force a reinstall)"
  exit 0
fi

if [ ! -x "$py" ]; then
  if ! python3 -c 'import sys; sys.exit(sys.version_info >= (3, 12))' 2>/dev/null; then
    echo "[setup] the classic stack (TensorFlow 2.15.1) needs Python 3.9-3.11 as python3, found $(python3 -V 2>&1); on Python 3.12 use TFTORUS_STACK=current" >&2
    exit 1
  fi
  log "creating virtualenv $venv"
  python3 -m venv "$venv"
  echo classic > "$marker"
fi
# Horovod 0.28.1 is compiled below without build isolation, with the venv's own setuptools and
# pip: the versions its build is known to work with here (its setup.py predates setuptools 70).
pip_quiet install --quiet --upgrade "pip<25" "setuptools<70" wheel packaging

# 1) TensorFlow first: Horovod compiles against the TensorFlow it finds.
if [ "$gpu" = 1 ]; then extra=gpu; else extra=cpu; fi
log "installing tftorus[$extra] (TensorFlow 2.15.1 stack)"
pip_quiet install --quiet -e "$repo[$extra,test,figures]"

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
echo classic > "$marker"
echo "$want" > "$stamp"
simgrid_for_studies
log "done: activate with 'source $venv/bin/activate'"
