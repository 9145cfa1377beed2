"""Write the offline ImageNet stand-in (official_resnet/data/embedded_data.py) in ImageNet's layout.

    python run_scripts/make_embedded_data.py                     # data/embedded, default spec
    python run_scripts/make_embedded_data.py --out_dir /tmp/e --num_train 2000 --num_validation 500
    python run_scripts/make_embedded_data.py --measure           # + learnability check

Idempotent: a complete set with the same parameters is left as it is (--force rewrites it).
--measure trains a tiny CNN for a few epochs at two batch sizes with the same naive SGD settings
and prints validation accuracy for each: the set should be learnable (well above chance), not
solved (well below 100%), and the larger batch should do worse at the same epoch count.
"""
import argparse
import dataclasses
import json
import os
import sys
import time

# Importable from a checkout without installing; TensorFlow is imported only where needed,
# because the drawing processes (spawned) re-import this file.
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from official_resnet.data import embedded_data  # noqa: E402


def parse_args(argv=None):
    defaults = embedded_data.EmbeddedSpec()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out_dir", default=os.path.join(REPO, "data", "embedded"),
                   help="output directory (default: data/embedded in the checkout, gitignored)")
    p.add_argument("--force", action="store_true", help="rewrite even if complete")
    p.add_argument("--processes", type=int, default=None, help="drawing processes (default: CPUs)")
    for field in dataclasses.fields(embedded_data.EmbeddedSpec):
        value = getattr(defaults, field.name)
        if isinstance(value, tuple):
            p.add_argument(f"--{field.name}", type=type(value[0]), nargs=2, default=value,
                           help=f"default: {value[0]} {value[1]}")
        else:
            p.add_argument(f"--{field.name}", type=type(value), default=value,
                           help=f"default: {value}")
    p.add_argument("--measure", action="store_true", help="train a tiny CNN: accuracy vs batch")
    p.add_argument("--measure_epochs", type=int, default=3)
    p.add_argument("--measure_batches", type=int, nargs="+", default=[32, 512])
    p.add_argument("--measure_lr", type=float, default=0.02, help="SGD LR, same for every batch")
    return p.parse_args(argv)


def measure(data_dir, num_classes, image_size, epochs, batch_sizes, lr, seed=0):
    """Validation accuracy of a tiny CNN after `epochs` epochs, per batch size (same settings)."""
    import tensorflow as tf

    from official_resnet.data import input_pipeline

    results = {}
    for batch in batch_sizes:
        tf.keras.utils.set_random_seed(seed)  # same initial weights for every batch size
        train = input_pipeline.make_dataset(
            data_dir, "train", batch, image_size=image_size, num_classes=num_classes,
            seed=seed, augment="flip", cache=True, repeat=False, drop_remainder=False)
        val = input_pipeline.make_dataset(data_dir, "validation", 256, image_size=image_size,
                                          num_classes=num_classes, cache=True)
        model = tf.keras.Sequential([tf.keras.Input((image_size, image_size, 3))] + [
            layer for filters in (16, 32, 64) for layer in (
                tf.keras.layers.Conv2D(filters, 3, padding="same", use_bias=False),
                tf.keras.layers.BatchNormalization(), tf.keras.layers.ReLU(),
                tf.keras.layers.MaxPool2D())] + [
            tf.keras.layers.GlobalAveragePooling2D(), tf.keras.layers.Dense(num_classes)])
        model.compile(tf.keras.optimizers.SGD(lr, momentum=0.9),
                      tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
        start = time.monotonic()
        history = model.fit(train, epochs=epochs, verbose=0)
        _, accuracy = model.evaluate(val, verbose=0)
        results[batch] = {"val_accuracy": round(100 * accuracy, 1),
                          "train_accuracy": round(100 * history.history["accuracy"][-1], 1),
                          "seconds": round(time.monotonic() - start, 1)}
        print(f"batch {batch:5d}: validation accuracy {100 * accuracy:5.1f}% after {epochs} "
              f"epochs (train {100 * history.history['accuracy'][-1]:5.1f}%, "
              f"{time.monotonic() - start:.0f} s)", flush=True)
    return results


def main(argv=None):
    args = parse_args(argv)
    spec = embedded_data.EmbeddedSpec(**{
        f.name: tuple(getattr(args, f.name)) if isinstance(getattr(args, f.name), list)
        else getattr(args, f.name) for f in dataclasses.fields(embedded_data.EmbeddedSpec)})
    result = embedded_data.generate(args.out_dir, spec, processes=args.processes, force=args.force)
    splits = result.manifest["splits"]
    verb = "wrote" if result.generated else "already complete, kept"
    print(f"{verb} {result.data_dir}: {splits['train']['records']} train records in "
          f"{len(splits['train']['files'])} files, {splits['validation']['records']} validation "
          f"in {len(splits['validation']['files'])}, {spec.num_classes} classes "
          f"({result.seconds:.1f} s, {args.processes or os.cpu_count()} processes)", flush=True)
    if args.measure:
        results = measure(result.data_dir, spec.num_classes, spec.image_size, args.measure_epochs,
                          args.measure_batches, args.measure_lr, seed=spec.seed)
        print(json.dumps({"chance": round(100 / spec.num_classes, 1), "results": results}))


if __name__ == "__main__":
    main()
