#!/usr/bin/env bash
# Run the test suite on both stacks, current then classic (TFTORUS_STACK=classic or =current
# runs one). Each stack is set up first if needed (run_scripts/setup.sh; with both stacks the
# classic set-up runs in the background while the current stack is tested). Classic runs unit tests
# and multi-process tests, which start real `horovodrun --gloo` jobs on this machine (N = 1 to
# 8 local processes); current (TensorFlow 2.21, Keras 3, no Horovod) runs the tests
# tests/conftest.py lists in CURRENT_STACK, in the same tiers.
#
#   bash run_scripts/test.sh                 # the default tier
#   bash run_scripts/test.sh --ci            # what CI runs: both tiers but the slow tests'
#                                            #   bigger siblings (tests/conftest.py's WIDER)
#   bash run_scripts/test.sh --slow          # the slow tier (tests/conftest.py lists it)
#   bash run_scripts/test.sh --all           # both tiers, every test
#   bash run_scripts/test.sh --quick         # the default tier's tests that start no process
#   bash run_scripts/test.sh tests/test_grid.py -k planner   # these tests, whatever their tier
#   TFTORUS_STACK=current bash run_scripts/test.sh --quick  # one stack
#
# Both stacks run even when the first fails; the exit status is non-zero when either failed.
# TFTORUS_VENV names one stack's virtualenv: with both stacks it is classic's, and current
# keeps .venv-current. A current-stack run that collects no test fails; one whose tier holds none
# of its tests (say --slow) passes, saying so.
#
# CI (.ci/run) runs --ci (until 2026-12-02, --all). Measured on 2 cores from a fresh clone
# (2026-11-28, 0e60207, the main job at 482 images/s): --all on both stacks 33.0 min with set-up (current 14.7 min of tests,
# classic 17.3); the default tier 9.1 min with set-up done (987abf4, 442 images/s);
# --quick about a minute per stack. On a slow machine (2026-11-28, 15eea1c, the main job at
# 194-205 images/s) --all took 62.4 min with set-up (current 28.8 min of tests, classic 32.0).
# With Ray's tests (2026-11-29, d204f20, the main job at 202 images/s): 77.5 min with set-up
# (current 41.6 min of tests, 8.8 of them Ray's three slow jobs; classic 33.9). 56e48fc (flags
# checked before TensorFlow loads; srun/mpirun launches on current only), the main job at 182
# images/s: 73.4 min (current 40.8, classic 30.6). At 210d9e8 on a machine whose main job ran at 366
# images/s the current stack's tests took 37.5 min: the main job's speed does not predict the
# tests', which mostly start processes. At 73d88a4 (2026-12-01), the main job at 373 images/s:
# 59.7 min with set-up (current 31.7 min of tests, 5.3 of them idle; classic 26.3).
# 57cc785 (2026-12-02; the current stack without matplotlib), the main job at 347 images/s:
# 59.6 min (current 31.9, 5.2 idle; classic 26.0). 2a57150 (the two lanes below; slow jobs whose
# code is the same on both stacks on current only; Horovod's widest world 8 ranks), the main job
# at 436 images/s: 50.6 min (current 29.1 + 3.3 beside, classic 20.0 + 4.1 beside); cd94cfc
# (Ray's jobs shorter, an unreachable host ends at once): 50.0 min (29.2 + 3.4, 18.9 + 3.7).
# a02ddc9 (tftorus no longer converted by AutoGraph), the main job at 338 images/s: 51.5 min
# (current 30.7 + 6.0 beside, classic 19.0 + 3.5); the tests WIDER leaves out of --ci took 7.6.
# c87a17a, --ci, the same machine: 43.8 min (current 25.2 + 3.1, classic 16.7 + 4.5).
# deafe73, --ci, the main job at 141 images/s: 84.5 min (current 49.2 + 5.4, classic 32.1 + 8.4);
# 992be8e then moved four more bigger siblings to WIDER (about 10 of those minutes). 6edf06d (the
# recipe on Ray on a tenth of the data; the attacked job on Horovod's engine in WIDER), the main job
# at 109-125 images/s: 64.9 min (current 35.7 + 5.5 beside, classic 26.5 + 6.3). c6c6ed3, the main
# job at 305 images/s: 39.0 min (current 20.7 + 3.5 beside, classic 16.4 + 3.8). 28b4f2f
# (2026-12-03), the main job at 238 images/s: 46.5 min (current 26.3 + 4.0, classic 18.0 + 4.0).
# 4750f5e (three more bigger siblings in WIDER: Ray Train's elastic fit, the tf engine's SIGKILLed
# train.py job, a refused world size), the main job at 263-264 images/s: 38.6 min (current 21.9 +
# 3.1, classic 14.8 + 3.6).
# Each stack's summary says how long its cores sat idle.
set -uo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
case "${TFTORUS_STACK:-}" in
  "") stacks=(current classic) ;;  # current first: classic's set-up (a compile) runs meanwhile
  classic | current) stacks=("$TFTORUS_STACK") ;;
  *) echo "[test] TFTORUS_STACK is '$TFTORUS_STACK': it must be classic or current (unset: both)" >&2
     exit 2 ;;
esac
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
export CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES-}"  # the tests are CPU tests
cd "$repo"
tier=()
lanes=0  # the default tier and --all: two lanes at once (run_stack)
case "${1:-}" in
  --slow) tier=(-m slow); shift ;;
  --ci) tier=(-m "not wider"); lanes=1; shift ;;
  --all) lanes=1; shift ;;
  --quick) tier=(-m "not slow and not launches"); export TFTORUS_TEST_TIER=quick; shift ;;
  *) if [ "$#" -eq 0 ]; then tier=(-m "not slow"); lanes=1; fi ;;
esac
tier_run=0
if [ "$#" -eq 0 ]; then set -- tests; tier_run=1; fi
trap 'exit 130' INT  # Ctrl-C stops here, not only the stack under way

run_stack() {  # run_stack STACK PYTEST-ARGS...
  local stack="$1" venv
  shift
  if [ "$stack" = current ]; then
    if [ "${#stacks[@]}" -gt 1 ] && [ -n "${TFTORUS_VENV:-}" ]; then
      echo "[test] TFTORUS_VENV is the classic stack's here; the current stack uses $repo/.venv-current"
      unset TFTORUS_VENV
    fi
    venv="${TFTORUS_VENV:-$repo/.venv-current}"
  else
    venv="${TFTORUS_VENV:-$repo/.venv}"
  fi
  if [ "$stack" != classic ] || [ -z "$classic_setup_pid" ]; then  # else set up already
    TFTORUS_STACK="$stack" bash "$repo/run_scripts/setup.sh" || return
  fi
  # The checkout's bytecode, once: where PYTHONDONTWRITEBYTECODE is set (as on the CI machines)
  # every process the tests start would compile tftorus and official_resnet again: `import
  # tftorus.keras, official_resnet.run.trainer` after TensorFlow's took 0.31-0.46 CPU-s without
  # their bytecode, 0.15-0.17 with it (time.process_time around it; 2026-12-02, the main job at
  # 125 images/s). A syntax error is the tests' to report.
  "$venv/bin/python" -m compileall -q -j 0 tftorus official_resnet flags tests run_scripts \
    studies >/dev/null 2>&1 || true
  local rc=0
  if [ "$lanes" = 1 ]; then
    # Two lanes at once. The tests that start processes keep the cores busy only in bursts (a
    # world importing TensorFlow, then ranks waiting on each other), and they run as before,
    # with those that time themselves in one process (conftest.py's ALONE). The tests that
    # start no process (3.3 min on current, 4.1 on classic, 2026-12-02) run beside them, in one
    # process that the harness refuses any launch, mostly on the core the others leave idle.
    local beside beside_pid beside_rc=0 tier_expr="${tier[1]:-}"
    beside="$(mktemp "${TMPDIR:-/tmp}/tftorus-in-process-tests.XXXXXX")"
    # a background job ignores Ctrl-C in a script: end it here (run_stack runs in a subshell)
    trap 'kill "$beside_pid" 2>/dev/null; rm -f "$beside"; exit 130' INT
    TFTORUS_TEST_TIER=quick "$venv/bin/python" -m pytest -p no:cacheprovider -q -rfEs \
      --durations=20 -m "${tier_expr:+($tier_expr) and }not launches and not alone" "$@" \
      >"$beside" 2>&1 &
    beside_pid=$!
    "$venv/bin/python" -m pytest -p no:cacheprovider -q -rfEs --durations=60 \
      -m "${tier_expr:+($tier_expr) and }(launches or alone)" "$@" || rc=$?
    wait "$beside_pid" || beside_rc=$?
    echo "[test] $stack stack, beside the tests above: the tests that start no process"
    cat "$beside"
    rm -f "$beside"
    if [ "$rc" = 0 ]; then rc="$beside_rc"; fi
  else
    "$venv/bin/python" -m pytest -p no:cacheprovider -q -rfEs --durations=60 \
      ${tier[@]+"${tier[@]}"} "$@" || rc=$?
  fi
  if [ "$stack" = current ] && [ "$rc" = 5 ] && [ "$tier_run" = 1 ]; then
    # conftest.py fails a run that collects none of CURRENT_STACK, so this is the tier: empty here
    echo "[test] current stack: none of its tests (tests/conftest.py's CURRENT_STACK) is in this tier"
    rc=0
  fi
  return "$rc"
}

# With both stacks, the classic stack's set-up (mostly Horovod's compile) runs at the lowest CPU
# (and disk) priority while the current stack is set up and tested: the compile takes the cores the tests
# leave idle, and the tests' timings stay their own. Its lines come before the classic tests.
classic_setup_pid=""
classic_setup_log=""
if [ "${#stacks[@]}" -gt 1 ]; then
  classic_setup_log="$(mktemp "${TMPDIR:-/tmp}/tftorus-classic-setup.XXXXXX")"
  idle_io=(); if command -v ionice >/dev/null 2>&1; then idle_io=(ionice -c 3); fi
  TFTORUS_STACK=classic nice -n 19 ${idle_io[@]+"${idle_io[@]}"} \
    bash "$repo/run_scripts/setup.sh" >"$classic_setup_log" 2>&1 &
  classic_setup_pid=$!
  trap 'kill "$classic_setup_pid" 2>/dev/null; rm -f "$classic_setup_log"; exit 130' INT
  echo "[test] the classic stack's set-up runs in the background (lowest priority) while the current stack is tested"
fi

# The multi-node launcher's tests start a real OpenSSH server on each emulated host
# (tests/emulated_hosts.py): Debian's openssh-server, where apt-get exists and we are root or
# have passwordless sudo. Quiet and never fatal (those tests then skip, saying why); already
# there: a file test, no apt call. Its service is not started: the tests run their own sshd.
sshd_for_tests() {
  [ -x /usr/sbin/sshd ] && return 0
  command -v apt-get >/dev/null 2>&1 || return 0
  local sudo=""
  if [ "$(id -u)" != 0 ]; then
    sudo -n true 2>/dev/null || return 0
    sudo="sudo -n"
  fi
  local log_file
  log_file="$(mktemp "${TMPDIR:-/tmp}/tftorus-sshd-apt.XXXXXX")"
  if $sudo env DEBIAN_FRONTEND=noninteractive timeout 300 apt-get install -y -qq \
       --no-install-recommends openssh-server openssh-client >"$log_file" 2>&1 \
       && [ -x /usr/sbin/sshd ]; then
    echo "[test] OpenSSH server installed for the multi-node launcher's tests"
  else
    echo "[test] OpenSSH server not installed (the multi-node launcher's tests will skip; log: $log_file)"
  fi
}
if [ "${TFTORUS_TEST_TIER:-}" != quick ] && { [ "$tier_run" = 1 ] || [[ " $* " == *test_multi_node* ]]; }; then
  sshd_for_tests
fi

status=0
summary=()
for stack in "${stacks[@]}"; do
  if [ "${#stacks[@]}" -gt 1 ]; then
    echo "[test] ===== $stack stack ====="
  fi
  rc=0
  if [ "$stack" = classic ] && [ -n "$classic_setup_pid" ]; then
    wait "$classic_setup_pid" || rc=$?
    cat "$classic_setup_log"
    rm -f "$classic_setup_log"
  fi
  [ "$rc" != 0 ] || ( run_stack "$stack" "$@" ) || rc=$?
  summary+=("$stack: $([ "$rc" = 0 ] && echo passed || echo "failed (exit $rc)")")
  if [ "$status" = 0 ]; then status="$rc"; fi
done
if [ "${#stacks[@]}" -gt 1 ]; then
  echo "[test] ${summary[0]}; ${summary[1]}"
fi
exit "$status"
