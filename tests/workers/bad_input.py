"""Worker: kinds of bad input; each must raise a clear error on every rank, never hang.

    horovodrun --gloo -np 4 -H localhost:4 python tests/workers/bad_input.py MODE [MODE...]
    python -m tftorus.run -np 4 tests/workers/bad_input.py MODE      # the current stack

Several modes run one after another only where each is refused before any collective (so the
ranks stay in step): each refusal is printed as "[MODE] refused: ...", and the last is raised
again, so the run ends non-zero as a script with that bad input would.
"""
import sys

import tensorflow as tf

import tftorus
import tftorus.keras


def main(modes):
    last = None
    for mode in modes:
        try:
            run(mode)
        except Exception as e:  # noqa: BLE001  (what the user would see, printed per mode)
            print(f"[{mode}] refused: {type(e).__name__}: {e}", flush=True)
            last = e
        else:
            print(f"NO ERROR RAISED by {mode}", flush=True)
    if last is not None:
        raise last


def run(mode):
    if mode == "hvd_init_only":  # plain hvd.init(): Horovod has no row/column process sets
        import horovod.tensorflow as horovod  # the classic stack's alone
        horovod.init()
        tftorus.keras.DistributedOptimizer(tf.keras.optimizers.SGD())
        return
    tftorus.init(grid="3x3" if mode == "grid" else None)
    rank = tftorus.rank()
    if mode == "algorithm":
        tftorus.keras.DistributedOptimizer(tf.keras.optimizers.SGD(), algorithm="tree")
    elif mode == "op":
        tftorus.keras.DistributedOptimizer(tf.keras.optimizers.SGD(), op=tftorus.Adasum)
    elif mode == "shapes":  # rank 0 hands in 5 elements, the others 6
        tftorus.fused_allreduce([tf.ones([5 if rank == 0 else 6])], "sum")
    elif mode == "shapes_in_training":  # ranks built different models
        model = tf.keras.Sequential([tf.keras.layers.Dense(3 + (rank == 1), input_shape=(4,)),
                                     tf.keras.layers.Dense(1)])
        model.compile(optimizer=tftorus.keras.DistributedOptimizer(tf.keras.optimizers.SGD()),
                      loss="mse")
        model.fit(tf.ones([8, 4]), tf.ones([8, 1]), batch_size=4, verbose=0)
    elif mode == "dtype":
        tftorus.fused_allreduce([tf.constant(["a", "b"])], "sum")
    elif mode == "complex":
        tftorus.fused_allreduce([tf.constant([1 + 2j], tf.complex64)], "sum")
    elif mode == "none_tensor":  # a variable without a gradient, handed on as is
        tftorus.fused_allreduce([tf.ones([2]), None], "sum")
    elif mode == "grid_syntax":
        tftorus.keras.DistributedOptimizer(tf.keras.optimizers.SGD(), grid="2by2")
    elif mode == "fusion_threshold":
        tftorus.keras.DistributedOptimizer(tf.keras.optimizers.SGD(), fusion_threshold_bytes=-1)
    elif mode == "engine":
        tftorus.keras.DistributedOptimizer(tf.keras.optimizers.SGD(), engine="nccl")
    elif mode == "compression_name":  # a name where Horovod takes a compressor class
        tftorus.keras.DistributedOptimizer(tf.keras.optimizers.SGD(), compression="fp16")
    elif mode == "optimizer_name":  # model.compile() takes 'sgd'; the wrapper needs an instance
        tftorus.keras.DistributedOptimizer("sgd")
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main(sys.argv[1:])
