"""Worker for tests/test_launchers.py: find the cluster however it was launched, run one real TF
all-reduce, check it.

  (default)        tftorus.cluster.tf_runtime.bootstrap(), then an all-reduce over every rank of
                   [r + 1, 10 (r + 1)] through TFCollectiveCommunicator; prints
                   "rank R of N (source) local L of LS sum [..] ok" and exits 1 if the sum is wrong.
  --fail-rank R    after that all-reduce rank R exits with --code; the others start a second one,
                   which R never joins, and wait in it until the launcher ends them (or the
                   collective timeout does).
  --sleep S        no TensorFlow: print "pid P", sleep S seconds (the launcher's signals).
LAUNCH_CHECK_DELAY=S in a rank's environment: it starts S seconds late.
"""
import argparse
import os
import sys
import time

args = argparse.ArgumentParser()
args.add_argument("--fail-rank", type=int, default=None)
args.add_argument("--code", type=int, default=3)
args.add_argument("--sleep", type=float, default=None)
opts = args.parse_args()


if opts.sleep is not None:
    print(f"pid {os.getpid()}", flush=True)
    time.sleep(opts.sleep)
    sys.exit(0)

time.sleep(float(os.environ.get("LAUNCH_CHECK_DELAY", "0")))  # a rank that starts late
from tftorus.cluster import tf_runtime  # noqa: E402

cluster = tf_runtime.bootstrap()  # before any other TensorFlow call

import tensorflow as tf  # noqa: E402

from tftorus.engines.tf_engine import TFCollectiveCommunicator  # noqa: E402

comm = TFCollectiveCommunicator(cluster)
mine = tf.constant([cluster.rank + 1.0, 10.0 * (cluster.rank + 1)], tf.float32)
total = comm.all_reduce(mine, comm.all_ranks(), "sum").numpy().tolist()
n = cluster.size
want = [n * (n + 1) / 2, 10 * n * (n + 1) / 2]
print(f"rank {cluster.rank} of {n} ({cluster.source}) local {cluster.local_rank} of "
      f"{cluster.local_size} workers {','.join(cluster.workers)} sum {total} "
      f"{'ok' if total == want else f'MISMATCH want {want}'}", flush=True)
if total != want:
    sys.exit(1)
if opts.fail_rank == cluster.rank:
    print(f"failing on purpose with status {opts.code}", file=sys.stderr, flush=True)
    sys.exit(opts.code)
if opts.fail_rank is not None:
    print(f"rank {cluster.rank} waits in a second all-reduce", flush=True)
    comm.all_reduce(mine, comm.all_ranks(), "sum")
    print(f"rank {cluster.rank}: the second all-reduce returned", flush=True)
