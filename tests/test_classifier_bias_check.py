"""run_scripts/classifier_bias_check.py evaluates a run's checkpoints as saved and with the
classifier bias zeroed: a bias that forces one class gives that class' share of the validation
set as saved, and the features' own top-1 with the bias at 0."""
import contextlib
import importlib.util
import io
import json
import os
import re

import numpy as np
import tensorflow as tf

from official_resnet import embedded_data, input_pipeline
from official_resnet.model import resnet
from tests import harness

spec = importlib.util.spec_from_file_location(
    "classifier_bias_check", os.path.join(harness.ROOT, "run_scripts", "classifier_bias_check.py"))
check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check)

CONFIG = {"depth": 14, "width": 8, "image_size": 32, "small_inputs": True, "label_offset": 1,
          "num_classes": 0}


class ClassifierBiasCheckTest(harness.EmbeddedDataCase, tf.test.TestCase):
    SPEC = embedded_data.EmbeddedSpec(image_size=32, num_train=40, num_validation=60,
                                      train_shards=1, validation_shards=1)

    def make_run(self, bias_class0: float) -> str:
        model_dir = os.path.join(self.tmp, f"run-{bias_class0:g}")
        os.makedirs(model_dir)
        with open(os.path.join(model_dir, "config.json"), "w") as f:
            json.dump(dict(CONFIG, data_dir=self.data), f)
        tf.keras.utils.set_random_seed(0)
        model = resnet(depth=14, num_classes=10, width=8, input_shape=(32, 32, 3),
                       small_inputs=True)
        bias = np.zeros(10, np.float32)
        bias[0] = bias_class0
        model.layers[-1].bias.assign(bias)
        tf.train.Checkpoint(model=model).write(
            os.path.join(model_dir, "checkpoints", "epoch-0001.000", "ckpt"))
        return model_dir

    def class0_share(self) -> float:
        labels = np.concatenate([y.numpy() for _, y in input_pipeline.make_dataset(
            self.data, "validation", 30, image_size=32, training=False, num_classes=10)])
        return 100.0 * np.mean(labels == 0)

    def run_check(self, model_dir):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            check.main([model_dir])
        found = re.findall(r"top-1 ([\d.]+)% as saved, ([\d.]+)% with the classifier bias set "
                           r"to 0 \(bias ([-+\d.]+) to ([-+\d.]+)\)", out.getvalue())
        self.assertLen(found, 1, out.getvalue())
        return [float(v) for v in found[0]]

    def test_a_forcing_bias_is_measured_and_removed(self):
        forced = self.make_run(1e4)
        neutral = self.make_run(0.0)
        as_saved, zeroed, low, high = self.run_check(forced)
        self.assertAllClose(as_saved, self.class0_share(), atol=0.01)
        self.assertEqual((low, high), (0.0, 1e4))
        neutral_saved, neutral_zeroed, _, _ = self.run_check(neutral)
        self.assertEqual(zeroed, neutral_saved)  # same weights, bias 0: the same predictions
        self.assertEqual(neutral_saved, neutral_zeroed)

    def test_a_directory_without_a_run_is_an_error(self):
        with self.assertRaisesRegex(SystemExit, "no config.json"):
            check.main([self.tmp])


if __name__ == "__main__":
    tf.test.main()
