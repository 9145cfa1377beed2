"""Worker: 1000 collectives in traced steps, then 1000 eager ones, with the default 300 s
collective timeout; prints how many threads the process grew by over each. TF's own per-op
timeout holds 2 threads per op for the whole timeout: traced collectives get none, eager ones
at most tf_engine.EAGER_TIMED_LIMIT at a time."""
import os

import tensorflow as tf

import tftorus
from tftorus.runtime import process_state

tftorus.init(engine="tf")
comm = process_state.communicator()


def threads() -> int:
    return len(os.listdir(f"/proc/{os.getpid()}/task"))


@tf.function
def step(x):
    return tf.add_n([comm.all_reduce(x + float(i), comm.all_ranks()) for i in range(50)])


x = tf.ones([256])
step(x).numpy()  # traced, every key resolved
before = threads()
for _ in range(20):
    out = step(x).numpy()
assert out[0] == comm.size * 50 + comm.size * sum(range(50)), out[0]
print(f"rank {comm.rank}: threads grew by {threads() - before} over 1000 collectives", flush=True)

before = threads()
for i in range(1000):  # as an eager loop of hvd.allreduce calls runs on the current stack
    out = comm.all_reduce(x + float(i), comm.all_ranks())
assert out.numpy()[0] == comm.size * 1000, out.numpy()[0]
print(f"rank {comm.rank}: threads grew by {threads() - before} over 1000 eager collectives",
      flush=True)
tftorus.shutdown()
