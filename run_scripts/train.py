"""Train ResNet-50 on ImageNet with the recipe of Mikami et al. (arXiv 1811.05233).

    horovodrun -np 3456 -H ... python run_scripts/train.py --exp=2 --data_dir=/imagenet
    horovodrun --gloo -np 4 -H localhost:4 python run_scripts/train.py --exp=2 \
        --flagfile=run_scripts/embedded.flags          # the small run on the embedded data
    python run_scripts/train.py --exp=2 --flagfile=run_scripts/embedded.flags   # one process

`--exp` picks a row of the paper's Table 3 (batch-size control per epoch range, LR
configuration, label smoothing); flags override any part of it. Gradients are averaged with
tftorus' 2D-torus all-reduce; LARS updates in FP32; BN statistics are recomputed from training
batches before each evaluation. The run itself is official_resnet/run/trainer.py; this is its
command line: flags, the plan (--plan_only), and errors as one line with an exit status.
"""
import logging
import os
import sys

from absl import app
from absl import flags as absl_flags
from absl import logging as absl_logging

if __name__ == "__main__":  # before TensorFlow's threads start, so they inherit the mask
    import signal  # noqa: E402

    # The launcher's SIGTERM reaches tftorus.reliability.watchdog.handle_termination's thread (a
    # Python handler never runs while the main thread is blocked in a TF op).
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    if any(a in ("--plan_only", "--plan_only=true", "--plan_only=True") for a in sys.argv[1:]):
        # A plan is for reading: without TensorFlow's start-up notices (oneDNN, CPU features),
        # which its C++ logging prints as TensorFlow loads, before any flag is parsed.
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# A script of the checkout: its flags/ package (the absl flags) is not installed with tftorus
# (pyproject.toml installs tftorus and official_resnet alone), so the checkout goes on the path.
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)
from flags.config import define_flags, resolve_run  # noqa: E402  (plain Python: no TensorFlow)

define_flags()
FLAGS = absl_flags.FLAGS


def main(spec):
    from official_resnet.run import trainer  # TensorFlow: loaded by then (resolve_run's engine)

    # absl (app.run) owns the log handler: a short format, so the log reads
    # "21:29:06 epoch 1.00 | ..." rather than absl's thread id and source line.
    absl_logging.get_absl_handler().setFormatter(
        logging.Formatter("%(asctime)s %(message)s", datefmt="%H:%M:%S"))
    if FLAGS.plan_only:
        print(trainer.plan_text(spec, FLAGS.num_workers, read_data_dir=FLAGS["data_dir"].present),
              flush=True)
        return
    trainer.train(spec)


def user_error(error):
    print(f"error: {error}", file=sys.stderr, flush=True)
    sys.exit(2)


def run(argv):
    del argv
    # Flags are checked before TensorFlow loads (seconds per process): a mistyped value fails
    # in a second, as an unknown flag does (absl parsed them already).
    try:
        spec = resolve_run(FLAGS)
    except ValueError as error:
        user_error(error)
    import tftorus
    from official_resnet.data import input_pipeline
    from official_resnet.run.run_state import NonFiniteLossError
    from tftorus.engines.tf_engine import CollectiveError, translate_errors
    from tftorus.reliability import watchdog

    # Errors that mean "the input is wrong": one clear line and exit status 2, no traceback.
    user_errors = (ValueError, FileNotFoundError, tftorus.GridError, NonFiniteLossError)
    watchdog.handle_termination()  # the launcher's SIGTERM: one line saying what this rank did
    try:
        # the tf engine's failed collectives, and records failing a check mid-run, in words
        with translate_errors(), input_pipeline.data_errors_in_words():
            main(spec)
    except user_errors as error:
        user_error(error)
    except CollectiveError as error:  # a peer died or stalled: nothing to wait for
        # who was lost, if the heartbeats know (or learn within their timeout); a lost or
        # stalled worker is then why the run stops, with the watchdog's status on every rank,
        # whether its verdict or a peer's closed connection reached this rank first
        verdict = watchdog.verdict_after_failure()
        print(f"error: {error}" + (f" Watchdog: {verdict}." if verdict else ""), file=sys.stderr,
              flush=True)
        os._exit(watchdog.EXIT_STATUS if verdict else 3)


if __name__ == "__main__":
    app.run(run)
