"""run_scripts/train.py end to end on a small generated data set: real workers, real JPEG
TFRecords, batch-size control, evaluation with recomputed BN statistics; and its bad input."""
import json
import os
import shutil
import tempfile

import tensorflow as tf

from official_resnet.data import embedded_data
from official_resnet.run import checkpointing
from tests import harness
from tests.test_nonfinite import scalars

TRAIN, FLAGFILE = harness.TRAIN, harness.FLAGFILE
SPEC = embedded_data.EmbeddedSpec(num_train=1024, num_validation=128, train_shards=4,
                                  validation_shards=2)


# Mixed precision runs FP16 arithmetic, which these CPUs emulate (about 0.1 s an image at 32 px):
# its test reads 128 images an epoch, in steps of 27 (Exp. 2's batch / 2048).
MIXED_SPEC = embedded_data.EmbeddedSpec(num_train=128, num_validation=32, train_shards=2,
                                        validation_shards=1)


class TrainScriptTest(harness.EmbeddedDataCase, tf.test.TestCase):
    SPEC = SPEC

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.small_data = os.path.join(cls.tmp, "small")
        embedded_data.generate(cls.small_data, MIXED_SPEC, processes=1)

    def argv(self, *flags):
        """train.py's arguments on this class' data, in a new model directory, and that."""
        model_dir = tempfile.mkdtemp(dir=self.tmp)
        return [TRAIN, f"--flagfile={FLAGFILE}", f"--data_dir={self.data}",
                f"--model_dir={model_dir}", "--bn_stat_batches=1", *flags], model_dir

    def train(self, *flags, np_=0, timeout=420):
        """One process, or `np_` workers under the stack's launcher (horovodrun on the classic
        stack, python -m tftorus.run on the current one)."""
        args, model_dir = self.argv(*flags)
        if np_:
            return harness.run_world(args, np_, timeout=timeout), model_dir
        return harness.run(args, timeout=timeout), model_dir

    def test_exp3_on_two_workers_switches_batch_and_momentum(self):
        result, model_dir = self.train("--exp=3", np_=2)
        self.assertEqual(result.returncode, 0, harness.describe(result))
        with open(os.path.join(model_dir, "history.jsonl")) as f:
            history = [json.loads(line) for line in f]
        # Exp. 3: 54K then 64K, divided by 256 -> 216 then 256, from the paper's epoch 30 on
        # (epoch 1 of this 3-epoch run); momentum 1 - 0.1 * 32768 / B keeps the paper's values.
        first, last = history[0], history[-1]
        self.assertEqual((first["total_batch"], first["per_worker_batch"]), (216, 108))
        self.assertEqual((last["total_batch"], last["per_worker_batch"]), (256, 128))
        self.assertAlmostEqual(first["momentum"], 1 - 0.1 * 32768 / 55296, places=4)
        self.assertAlmostEqual(last["momentum"], 0.95, places=4)
        self.assertGreaterEqual(last["epoch"], 3.0)
        self.assertIsNotNone(last["top1"])  # evaluated with recomputed BN statistics
        self.assertIn("Table 5 style | Exp. 3 | workers 2", result.output)
        self.assertIn("Table 6 style | workers 2", result.output)
        for name in ("config.json", "summary.json", "tensorboard", "checkpoints"):
            self.assertTrue(os.path.exists(os.path.join(model_dir, name)), name)
        board = os.path.join(model_dir, "tensorboard")  # the scalars a user looks at
        for tag in ("loss", "train_top1", "top1", "lr", "momentum", "total_batch",
                    "images_per_sec"):
            self.assertTrue(scalars(board, tag), f"no {tag} in TensorBoard")
        self.assertEqual({v for _, v in scalars(board, "total_batch")}, {216, 256})
        steps = [step for step, _ in scalars(board, "loss")]
        self.assertEqual(steps, sorted(steps))  # samples seen: the common axis
        # Every worker out of fit within seconds of the last epoch: the summary waits for all
        # of them, and a tf.data autotuning thread once kept one there up to a minute
        with open(os.path.join(model_dir, "summary.json")) as f:
            tail = json.load(f)["tail_seconds"]
        self.assertLess(tail, 5.0, harness.describe(result))
        self.assertIn(f"run end | {tail:.1f} s from the end of the last epoch", result.output)

    def test_experiments_ref_1_and_4_end_to_end_with_tensorboard(self):
        # One process each, few steps: every phase of each experiment runs through model.fit,
        # and TensorBoard holds the scalars a user looks at.
        runs = (("ref", ["--epochs=1"], {128}),
                ("1", ["--epochs=1"], {136, 272}),
                ("4", ["--epochs=2", "--batch_divisor=1024"], {34, 68, 85, 119}))
        launches = [self.argv(f"--exp={exp}", "--eval_every=10", *flags) for exp, flags, _ in runs]
        results = harness.run_many([argv for argv, _ in launches], timeout=420)
        for (exp, _, totals), (_, model_dir), result in zip(runs, launches, results):
            with self.subTest(exp=exp):
                self.assertEqual(result.returncode, 0, harness.describe(result))
                with open(os.path.join(model_dir, "history.jsonl")) as f:
                    history = [json.loads(line) for line in f]
                self.assertEqual({h["total_batch"] for h in history}, totals)
                self.assertIsNotNone(history[-1]["top1"])
                board = os.path.join(model_dir, "tensorboard")
                for tag in ("loss", "train_top1", "top1", "lr", "momentum", "total_batch",
                            "images_per_sec"):
                    points = scalars(board, tag)
                    self.assertTrue(points, f"no {tag} in TensorBoard")
                self.assertEqual({v for _, v in scalars(board, "total_batch")}, totals)
                steps = [step for step, _ in scalars(board, "loss")]
                self.assertEqual(steps, sorted(steps))  # samples seen: the common axis

    def test_mixed_precision_uses_the_loss_scale_and_resumes(self):
        flags = ["--exp=2", "--epochs=1", "--precision=mixed_float16", "--eval_every=10",
                 f"--data_dir={self.small_data}", "--batch_divisor=2048"]
        result, model_dir = self.train(*flags, "--stop_at_epoch=0.3")
        self.assertEqual(result.returncode, 0, harness.describe(result))
        self.assertIn("dynamic loss scale starting at 32768", result.output)
        path, state = checkpointing.latest_valid(model_dir)
        reader = tf.train.load_checkpoint(os.path.join(path, checkpointing.PREFIX))
        names = list(reader.get_variable_to_shape_map())
        # Keras 2 saves the LossScaleOptimizer's loss_scale, Keras 3 its dynamic_scale
        self.assertTrue([n for n in names if "loss_scale" in n or "dynamic_scale" in n], names)
        self.assertLess(state.epoch, 1.0)
        again = harness.run([TRAIN, f"--flagfile={FLAGFILE}", f"--model_dir={model_dir}",
                             "--bn_stat_batches=1", *flags], np=0, timeout=420)
        self.assertEqual(again.returncode, 0, harness.describe(again))
        self.assertIn("resumed at epoch", again.output)
        with open(os.path.join(model_dir, "summary.json")) as f:
            self.assertGreaterEqual(json.load(f)["epochs"], 0.99)

    def test_tf_engine_trains_on_tf_config_workers(self):
        # Two TF_CONFIG processes, no horovodrun and no Horovod runtime: the tf engine alone.
        model_dir = tempfile.mkdtemp(dir=self.tmp)
        result = harness.run_tf_config(
            [TRAIN, f"--flagfile={FLAGFILE}", f"--data_dir={self.data}", f"--model_dir={model_dir}",
             "--bn_stat_batches=1", "--exp=2", "--engine=tf", "--grid=1x2", "--epochs=1"],
            np=2, timeout=420)
        self.assertEqual(result.returncode, 0, harness.describe(result))
        with open(os.path.join(model_dir, "summary.json")) as f:
            summary = json.load(f)
        self.assertEqual(summary["workers"], 2)
        self.assertIsNotNone(summary["top1_1crop"])

    def test_bad_input_is_a_clear_error(self):
        corrupt = os.path.join(self.tmp, "corrupt")
        shutil.copytree(self.data, corrupt)
        first = sorted(f for f in os.listdir(corrupt) if f.startswith("train-"))[0]
        with open(os.path.join(corrupt, first), "r+b") as f:
            f.seek(40)
            f.write(b"\x00" * 64)  # damage the first record
        cases = [
            (["--exp=7"], "unknown experiment '7'"),
            (["--exp=2", "--data_dir=/nonexistent/imagenet"], "/nonexistent/imagenet"),
            (["--exp=2", f"--data_dir={corrupt}"], first),
            (["--exp=2", "--trust_coefficient=1000", "--lr_scale=1000"],
             "training diverged; lower the learning rate"),
            (["--exp=2", "--grid=3x3"], "grid 3x3 has 9 ranks but the world has 1"),
            (["--exp=2", "--epochs=0"], "--epochs must be positive"),
        ]
        argvs = [self.argv(*flags)[0] for flags, _ in cases]
        for (flags, message), result in zip(cases, harness.run_many(argvs, timeout=300)):
            with self.subTest(flags=flags):
                self.assertEqual(result.returncode, 2, harness.describe(result))
                self.assertIn(message, result.output, harness.describe(result))
                self.assertNotIn("Traceback", result.output)

    def test_world_size_the_experiment_cannot_map(self):
        result, _ = self.train("--exp=3", np_=3, timeout=300)
        self.assertNotEqual(result.returncode, 0, harness.describe(result))
        self.assertIn("does not split over 3 workers", result.output)


if __name__ == "__main__":
    tf.test.main()
