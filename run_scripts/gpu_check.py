"""Check a GPU machine before a long job: each rank on its own GPU, NCCL all-reduces (and
no /dev/shm transport), a mixed-precision `fit` compiled with jit_compile=False, the same
weights on every rank.

    python -m tftorus.run -np 2 run_scripts/gpu_check.py --require-gpus     # 2 GPUs, one host
    python -m tftorus.run -np 16 -H h1:8,h2:8 run_scripts/gpu_check.py --require-gpus

Written as a Horovod user's script: `hvd.init()`, then Horovod's own GPU-pinning lines, which
run unchanged (tftorus' init already made the same choice). Each rank prints one line with its
host, local rank, the GPU it uses and that GPU's bus id; rank 0 then prints "gpu check passed".
Without GPUs (and without --require-gpus) it runs on the CPU, which checks the script, not the
GPUs. The expected output is in docs/guide/gpus.md. Exit status: 0 passed, 1 a check failed, 2 no
GPU where --require-gpus asked for them.
"""
import socket
import sys

import numpy as np
import tensorflow as tf

import tftorus
import tftorus.keras as hvd
from tftorus.runtime import process_state


def main(argv):
    require_gpus = "--require-gpus" in argv[1:]
    hvd.init()
    # Horovod's pinning lines, as in every Horovod example: no-ops after tftorus' own choice.
    gpus = tf.config.experimental.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

    rank, size = hvd.rank(), hvd.size()
    visible = tf.config.get_visible_devices("GPU")
    failures = []
    if require_gpus and not visible:
        print(f"[rank {rank}] no GPU visible on {socket.gethostname()}: this check needs one "
              f"GPU per rank", flush=True)
        return 2
    if visible:
        details = tf.config.experimental.get_device_details(visible[0])
        bus = details.get("pci_bus_id", "?")
        where = f"GPU {gpus.index(visible[0])} of {len(gpus)} ({details.get('device_name', '?')}, " \
                f"bus {bus})"
        if len(visible) != 1:
            failures.append(f"sees {len(visible)} GPUs, not one")
    else:
        bus, where = "cpu", "no GPU: the CPU"
    print(f"[rank {rank}] host {socket.gethostname()}, local rank {hvd.local_rank()} of "
          f"{hvd.local_size()}: {where}", flush=True)

    # On GPUs the tf engine's bytes go through NCCL, never through /dev/shm segments.
    comm = process_state.communicator()
    if visible and getattr(comm, "shared_memory", None) is not None:
        failures.append("the tf engine took its rows through /dev/shm on a GPU")

    # No two ranks of a host on one GPU (NCCL refuses that).
    hosts = tftorus.allgather_object((socket.gethostname(), bus))
    if visible and len(set(hosts)) != len(hosts):
        failures.append(f"ranks share a GPU: {hosts}")

    # An all-reduce placed on the GPU (NCCL there) with the exact sum.
    value = tf.fill([1 << 20], float(rank + 1))
    total = hvd.allreduce(value, op=hvd.Sum)
    if visible and "GPU" not in total.device:
        failures.append(f"the all-reduce ran on {total.device}")
    if not np.all(total.numpy() == size * (size + 1) / 2):
        failures.append("the all-reduce's sum is wrong")

    # A mixed-precision fit, compiled without XLA.
    tf.keras.mixed_precision.set_global_policy("mixed_float16")
    tf.keras.utils.set_random_seed(1)
    model = tf.keras.Sequential([tf.keras.Input((32,)),
                                 tf.keras.layers.Dense(64, activation="relu"),
                                 tf.keras.layers.Dense(10, dtype="float32")])
    model.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.01 * size)),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=False)
    rng = np.random.RandomState(rank)
    x = rng.standard_normal((256, 32)).astype(np.float32)
    y = rng.randint(0, 10, 256)
    model.fit(x, y, batch_size=32, epochs=1, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    mine = tf.concat([tf.reshape(tf.cast(v, tf.float32), [-1]) for v in model.weights], 0)
    every = hvd.allgather(tf.reshape(mine, [1, -1]))
    if float(tf.reduce_max(tf.abs(every - every[:1]))) != 0.0:
        failures.append("the ranks' weights differ after fit")

    for failure in failures:
        print(f"[rank {rank}] FAILED: {failure}", flush=True)
    verdicts = tftorus.allgather_object(len(failures))
    if rank == 0:
        print("gpu check passed" if not any(verdicts) else
              f"gpu check failed on ranks {[r for r, n in enumerate(verdicts) if n]}", flush=True)
    hvd.shutdown()
    return 1 if any(verdicts) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
