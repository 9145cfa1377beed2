"""Worker: one rank is SIGKILLed; the others must fail with a clear error, not hang.

Every rank runs torus all-reduces in a tf.function loop. The victim kills itself with SIGKILL
(from a timer thread, so mid-collective) `--kill_after` seconds into the loop, or before its first
collective with --kill_before_first (its peers then wait in a collective nobody else joins).
A survivor prints "[rank r] FAILED after <s>s (<i>s since init): <message>" (seconds since the
loop began, or since the first collective when that failed, or since before tftorus.init() when
init's wait for every peer failed; and since before tftorus.init(), where the peer health
monitor's clock starts) and exits 3; one that finishes the loop exits 0 (a test
failure: it should have noticed).
"""
import argparse
import json
import os
import signal
import sys
import threading
import time

import tftorus
from tftorus.runtime import process_state

parser = argparse.ArgumentParser()
parser.add_argument("--timeout", type=float, required=True)
parser.add_argument("--victim", type=int, default=1)
parser.add_argument("--kill_after", type=float, default=2.0)
parser.add_argument("--kill_before_first", action="store_true")
parser.add_argument("--stop", action="store_true",
                    help="SIGSTOP the victim instead: alive, its sockets open, answering nothing")
parser.add_argument("--loop_seconds", type=float, default=120.0)
opts = parser.parse_args()

from tftorus.engines.tf_engine import CollectiveError, translate_errors  # noqa: E402

began = time.monotonic()  # the peer health monitor starts inside init() and counts from there
try:
    tftorus.init(engine="tf", collective_timeout=opts.timeout)
except CollectiveError as e:  # init waits for every peer's first answer: a victim killed right
    # after its own init may be gone before this rank's probe reached it
    index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    print(f"[rank {index}] FAILED after {time.monotonic() - began:.1f}s "
          f"({time.monotonic() - began:.1f}s since init, in init): {e}", flush=True)
    os._exit(3)

import tensorflow as tf  # noqa: E402

rank = process_state.communicator().rank


def die():
    how = signal.SIGSTOP if opts.stop else signal.SIGKILL
    print(f"[rank {rank}] victim: {how.name} now", flush=True)
    os.kill(os.getpid(), how)


def main():
    if rank == opts.victim and opts.kill_before_first:
        die()
    step = tf.function(lambda t: tftorus.fused_allreduce([t], "sum")[0])
    x = tf.ones([1 << 18])
    steps, start = 0, None
    try:
        traced = time.monotonic()
        with translate_errors(opts.timeout):
            step(x).numpy()  # traced and run once everywhere before the kill
        # the clock starts where the victim's timer does: tracing took 7 s here, 20 s on a
        # slower machine, and is no part of how long a survivor takes to notice
        start = time.monotonic()
        print(f"[rank {rank}] looping (traced in {start - traced:.1f} s)", flush=True)
        if rank == opts.victim:
            threading.Timer(opts.kill_after, die).start()
        while time.monotonic() - start < opts.loop_seconds:
            with translate_errors(opts.timeout):
                step(x).numpy()
            steps += 1
    except CollectiveError as e:
        since = time.monotonic() - (traced if start is None else start)
        print(f"[rank {rank}] FAILED after {since:.1f}s ({time.monotonic() - began:.1f}s since "
              f"init, {steps} steps): {e}",
              flush=True)
        sys.stdout.flush()
        os._exit(3)  # not sys.exit: nothing left to clean up that could wait for the dead peer
    print(f"[rank {rank}] finished {steps} steps without noticing the dead peer", flush=True)


if __name__ == "__main__":
    main()
