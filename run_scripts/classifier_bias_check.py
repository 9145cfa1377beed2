"""How much of a run's validation top-1 rides on its classifier bias.

    .venv/bin/python run_scripts/classifier_bias_check.py runs/convergence/c_seed0 runs/convergence/d_seed1

For every checkpoint a run kept, evaluates the 1-crop validation top-1 twice on one process:
as saved (the BN statistics the run recomputed before saving), and with the last layer's bias
set to 0. A diagnostic for the convergence study (docs/convergence.md): LARS leaves biases
unadapted, so under LR configuration B they take plain SGD steps at LRs of tens, and a swing of
the 10 logits' offsets can move top-1 by many points while the features stay the same.
"""
import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import tensorflow as tf  # noqa: E402

from official_resnet import checkpointing, input_pipeline  # noqa: E402
from official_resnet.model import resnet  # noqa: E402
from official_resnet.train_step import make_eval_step  # noqa: E402


def top1(model: tf.keras.Model, config: dict) -> float:
    evaluate, correct, count = make_eval_step(model), 0.0, 0.0
    for images, labels in input_pipeline.make_dataset(
            config["data_dir"], "validation", 250, image_size=config["image_size"],
            training=False, label_offset=config["label_offset"],
            num_classes=config["num_classes"]):
        c, n = evaluate(images, labels)
        correct, count = correct + float(c), count + float(n)
    return 100.0 * correct / count


def check_run(model_dir: str) -> None:
    config_path = os.path.join(model_dir, "config.json")
    if not os.path.exists(config_path):
        raise SystemExit(f"{model_dir} has no config.json: pass the --model_dir of a train.py run")
    with open(config_path) as f:
        config = json.load(f)
    paths = checkpointing.list_checkpoints(model_dir)
    if not paths:
        raise SystemExit(f"{model_dir} has no checkpoints")
    num_classes = (config["num_classes"]  # as train.py decides it: flag, manifest, ImageNet
                   or input_pipeline.describe(config["data_dir"], count=False)["num_classes"]
                   or 1000)
    config["num_classes"] = num_classes
    for path in paths:
        model = resnet(depth=config["depth"], num_classes=num_classes, width=config["width"],
                       input_shape=(config["image_size"], config["image_size"], 3),
                       small_inputs=config["small_inputs"])
        tf.train.Checkpoint(model=model).restore(
            os.path.join(path, "ckpt")).expect_partial()  # the model only, not the optimizer
        bias = model.layers[-1].bias
        as_saved = top1(model, config)
        offsets = bias.numpy()
        bias.assign(tf.zeros_like(bias))
        print(f"{model_dir} {os.path.basename(path)}: top-1 {as_saved:.2f}% as saved, "
              f"{top1(model, config):.2f}% with the classifier bias set to 0 (bias "
              f"{offsets.min():+.2f} to {offsets.max():+.2f})", flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model_dirs", nargs="+", help="--model_dir of finished train.py runs")
    for model_dir in p.parse_args(argv).model_dirs:
        check_run(model_dir)


if __name__ == "__main__":
    main()
