"""Worker: a rank of a job across (emulated) hosts says where it runs, then works.

    python -m tftorus.run -np 4 -H h1:2,h2:2 tests/workers/across_hosts.py fit OUT
    python -m tftorus.run -np 4 -H h1:2,h2:2 tests/workers/across_hosts.py wait PIDS

Each rank first prints "rank R/N on HOST: local rank L of M, GPU G" (G: the GPU tftorus would
give it on a host with one GPU per local rank; tftorus/cluster/gpu_per_process.py). Then `fit`
runs tests/workers/user_fit_accumulation.py's Keras fit, writing to OUT (the test compares it
with NumPy); `wait` writes its pid to PIDS/rank{R}.pid and runs an all-reduce a second until it
is killed, so the test can kill one rank and watch the job end everywhere.
"""
import os
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main(mode: str, out: str) -> None:
    import tensorflow as tf

    import tftorus
    import tftorus.keras as hvd
    from tftorus.cluster import gpu_per_process

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    local_rank, local_size = hvd.local_rank(), hvd.local_size()
    gpu = gpu_per_process.choose(local_rank, local_size, size, gpus=local_size).gpu
    print(f"rank {rank}/{size} on {socket.gethostname()}: local rank {local_rank} of "
          f"{local_size}, GPU {gpu}", flush=True)
    if mode == "fit":
        import user_fit_accumulation
        user_fit_accumulation.main(out)
        return
    with open(os.path.join(out, f"rank{rank}.pid"), "w") as f:
        f.write(str(os.getpid()))
    while True:
        tftorus.allreduce(tf.ones([4]), op=tftorus.Sum)
        time.sleep(1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
