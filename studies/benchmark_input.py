"""Input-pipeline throughput: images/s of the training and evaluation pipelines per CPU core.

    python -m studies.benchmark_input                      # the embedded data, 64 -> 224 px
    python -m studies.benchmark_input --data_dir=/imagenet --image_size=224

tf.data's thread pool is capped at 1 and then at each larger count up to --max_threads, so
the images/s of one core can be read directly (decode, the paper's augmentations, batching).
Each measurement skips --warmup batches (start-up, file opening) and times --batches more.
"""
import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

from official_resnet.data import embedded_data, input_pipeline  # noqa: E402


def images_per_second(dataset, batches: int, warmup: int, batch_size: int) -> float:
    iterator = iter(dataset)
    for _ in range(warmup):
        next(iterator)
    start = time.perf_counter()
    for _ in range(batches):
        next(iterator)
    return batches * batch_size / (time.perf_counter() - start)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data_dir", default=embedded_data.DEFAULT_DATA_DIR)
    p.add_argument("--image_size", type=int, default=224)
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--batches", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--max_threads", type=int, default=os.cpu_count() or 1)
    args = p.parse_args()
    if args.data_dir == embedded_data.DEFAULT_DATA_DIR:
        embedded_data.generate(args.data_dir)
    num_classes = input_pipeline.describe(args.data_dir, count=False)["num_classes"] or 1000
    print(f"{args.data_dir}: batch {args.batch_size}, {args.image_size} px, "
          f"{args.batches} timed batches after {args.warmup}")
    print(f"{'pipeline':<10} {'threads':>7} {'images/s':>10} {'per thread':>11}")
    for split, training in (("train", True), ("validation", False)):
        for threads in range(1, args.max_threads + 1):
            ds = input_pipeline.make_dataset(args.data_dir, split, args.batch_size,
                                             image_size=args.image_size, training=training,
                                             repeat=True, num_classes=num_classes)
            options = tf.data.Options()
            options.threading.private_threadpool_size = threads
            options.threading.max_intra_op_parallelism = 1
            rate = images_per_second(ds.with_options(options), args.batches, args.warmup,
                                     args.batch_size)
            print(f"{split:<10} {threads:>7} {rate:>10.1f} {rate / threads:>11.1f}")


if __name__ == "__main__":
    main()
