"""Worker (2+ ranks, TF_CONFIG): rank --late starts --delay seconds after the others, as ranks
of a real job do (another host's slower start, a queue); then every rank runs collectives at
once. Prints "[rank R] gathered [...]"; a rank whose first collective fails exits non-zero."""
import argparse
import json
import os
import time

parser = argparse.ArgumentParser()
parser.add_argument("--late", type=int, default=1)
parser.add_argument("--delay", type=float, default=3.0)
args = parser.parse_args()
if json.loads(os.environ["TF_CONFIG"])["task"]["index"] == args.late:
    time.sleep(args.delay)  # before TensorFlow's import: the server comes up that much later

import tensorflow as tf  # noqa: E402

import tftorus  # noqa: E402
from tftorus.runtime import process_state  # noqa: E402

tftorus.init(engine="tf")
comm = process_state.communicator()  # the tf engine's, on both stacks
for _ in range(5):
    out = comm.all_gather(tf.constant([float(comm.rank)]), comm.all_ranks())
print(f"[rank {comm.rank}] gathered {out.numpy().tolist()}", flush=True)
