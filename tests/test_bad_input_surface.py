"""Bad input across run_scripts/train.py's surface: each case exits non-zero with one clear line
naming the fix, no traceback, and leaves what the model directory already held untouched.

Two tests: every case against a model directory holding only a file of the user's (which must
stay the only file when the input is refused before training), and a handful against a copy of
a real earlier run (config.json, checkpoints, history, TensorBoard: every byte must stay).

The table in docs/guide/reliability.md ("Bad input") lists these cases with
tests/test_bad_input.py (tensors and options handed to the optimizer), tests/test_train_script.py
(data, grid, divergence, world size) and tests/test_resume.py (a changed configuration).
"""
import hashlib
import os
import shutil
import tempfile

import tensorflow as tf

from official_resnet.data import embedded_data
from tests import harness

TRAIN, FLAGFILE = harness.TRAIN, harness.FLAGFILE
SPEC = embedded_data.EmbeddedSpec(num_train=512, num_validation=64, train_shards=2,
                                  validation_shards=1)
SENTINEL = "notes.txt"
BAD_TF_CONFIG = '{"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker", "index": 3}}'

# (flags, environment, exit status, what the user must see); {noval}, {badlabels}: data dirs
# made in setUpClass. Refused before training: nothing may be written.
REFUSED = [
    (["--grid=2by2"], {}, 2, ["grid '2by2' is not of the form 'YxX'"]),
    (["--batch_divisor=7"], {}, 2, ["does not divide by batch_divisor 7; use a power of two"]),
    (["--max_micro_batch=0"], {}, 2, ["--max_micro_batch must be >= 1, got 0"]),
    (["--exp=1", "--batch_divisor=2048", "--max_micro_batch=16"], {}, 2,
     ["splits into equal micro-batches of at most 16 only as 17 x 1, far below the cap; set "
      "--max_micro_batch to one of [1, 17]"]),
    (["--image_size=8"], {}, 2, ["--image_size must be >= 16, got 8"]),
    (["--depth=33"], {}, 2, ["depth=33 is not one of [14, 26, 50, 101, 152]"]),
    (["--augment=crop,blur"], {}, 2, ["unknown augmentations ['blur']; choose from crop"]),
    (["--lr_config=C"], {}, 2, ["--lr_config must be A or B, got 'C'"]),
    (["--label_smoothing=1.5"], {}, 2, ["--label_smoothing must be in [0, 1), got 1.5"]),
    (["--max_nonfinite_skips=0"], {}, 2, ["--max_nonfinite_skips must be >= 1, got 0"]),
    (["--precision=fp8"], {}, 1, ["flag --precision=fp8: value should be one of "
                                  "<mixed_float16|float32>"]),
    (["--compression=int8"], {}, 1, ["flag --compression=int8: value should be one of "
                                     "<none|fp16|bf16>"]),
    (["--precison=float32"], {}, 1, ["Unknown command line flag 'precison'. Did you mean: "
                                     "precision ?"]),
    (["--flagfile=/nonexistent/run.flags"], {}, 1, ["Unable to open flagfile"]),
    (["--model_dir=/etc/passwd/run"], {}, 2, ["--model_dir=/etc/passwd/run cannot be written"]),
    (["--num_classes=5"], {}, 2, ["has image/class/label", "outside [0, 5)"]),
    (["--data_dir={noval}"], {}, 2, ["holds no validation records (validation-*)"]),
    (["--engine=tf"], {"TF_CONFIG": '{"cluster": 3}'}, 2, ["TF_CONFIG must look like"]),
    (["--engine=tf"], {"TF_CONFIG": BAD_TF_CONFIG}, 2,
     ["TF_CONFIG task index 3 is outside the 1 workers"]),
    (["--resume=/nonexistent/checkpoint"], {}, 2,
     ["--resume=/nonexistent/checkpoint: no such checkpoint directory"]),
]
# Found only while training: the user's file stays, the run's own files may appear.
FOUND_WHILE_TRAINING = [
    (["--data_dir={badlabels}"], {}, 2,
     ["a record failed the input pipeline's check: Label out of range [0, 10) after "
      "subtracting label_offset=1", "Stored label and file: 101 "]),
    (["--on_nonfinite=stop", "--trust_coefficient=1000", "--lr_scale=1000"], {}, 2,
     ["non-finite gradients or loss (mean loss ", ") at step ",
      "stopping after --on_nonfinite=stop: training diverged; lower the learning rate "
      "(--lr_scale) or the LARS --trust_coefficient. The step was not applied"]),
]
# Against a copy of a real earlier run: every file it saved must keep every byte.
AGAINST_A_SAVED_RUN = [
    (["--data_dir=/nonexistent/imagenet"], {}, 2, ["data directory '/nonexistent/imagenet' "
                                                   "does not exist"]),
    (["--data_dir={damaged}"], {}, 2, ["record 0 of ", "is corrupted"]),
    (["--grid=3x3"], {}, 2, ["grid 3x3 has 9 ranks but the world has 1"]),
    (["--engine=tf"], {"TF_CONFIG": BAD_TF_CONFIG}, 2, ["TF_CONFIG task index 3 is outside"]),
    (["--depth=26"], {}, 2, ["holds a run with a different configuration (--depth=14 there, "
                             "26 now)"]),
    (["--resume=never"], {}, 2, ["holds checkpoints of a run; use another --model_dir, or "
                                 "--resume=auto to continue it"]),
]


def relabel(source: str, target: str, label: int):
    """Copy a TFRecord file of examples; every record but the first gets `label` (the check
    before training reads the first record of each file, so only training meets the others)."""
    with tf.io.TFRecordWriter(target) as writer:
        for i, record in enumerate(tf.data.TFRecordDataset(source)):
            example = tf.train.Example.FromString(record.numpy())
            if i:
                example.features.feature["image/class/label"].int64_list.value[:] = [label]
            writer.write(example.SerializeToString())


def fingerprint(directory: str):
    """Relative path -> sha256 of every file under `directory`."""
    found = {}
    for root, _, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                found[os.path.relpath(path, directory)] = hashlib.sha256(f.read()).hexdigest()
    return found


class BadInputSurfaceTest(harness.EmbeddedDataCase, tf.test.TestCase):
    SPEC = SPEC

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        train_files = sorted(n for n in os.listdir(cls.data) if n.startswith("train-"))
        cls.dirs = {name: os.path.join(cls.tmp, name)
                    for name in ("noval", "badlabels", "damaged")}
        for name, path in cls.dirs.items():
            shutil.copytree(cls.data, path)
        for name in os.listdir(cls.dirs["noval"]):  # no manifest either, as ImageNet's
            if name.startswith("validation-") or name == embedded_data.MANIFEST_NAME:
                os.remove(os.path.join(cls.dirs["noval"], name))
        for name in train_files:
            relabel(os.path.join(cls.data, name), os.path.join(cls.dirs["badlabels"], name), 101)
        with open(os.path.join(cls.dirs["damaged"], train_files[0]), "r+b") as f:
            f.seek(40)
            f.write(b"\x00" * 64)  # the first record's bytes

    def run_cases(self, cases, model_dirs):
        """train.py once per case (flags, env, status, messages) on its model directory, two at
        a time (tests/harness.run_many); the results in case order."""
        argvs = [[TRAIN, f"--flagfile={FLAGFILE}", f"--data_dir={self.data}",
                  f"--model_dir={model_dir}", "--bn_stat_batches=1", "--max_steps=20",
                  *[f.format(**self.dirs) for f in flags]]
                 for (flags, _, _, _), model_dir in zip(cases, model_dirs)]
        return harness.run_many(argvs, timeout=240, envs=[env for _, env, _, _ in cases])

    def check_case(self, case, result):
        _, _, status, messages = case
        self.assertEqual(result.returncode, status, harness.describe(result))
        for message in messages:
            self.assertIn(message, result.output, harness.describe(result))
        self.assertNotIn("Traceback", result.output, harness.describe(result))

    def test_every_case_fails_clearly_and_keeps_what_was_there(self):
        cases = REFUSED + FOUND_WHILE_TRAINING
        model_dirs = [tempfile.mkdtemp(dir=self.tmp) for _ in cases]
        for model_dir in model_dirs:
            with open(os.path.join(model_dir, SENTINEL), "w") as f:
                f.write("saved before")
        for case, model_dir, result in zip(cases, model_dirs, self.run_cases(cases, model_dirs)):
            with self.subTest(flags=case[0], env=case[1]):
                self.check_case(case, result)
                with open(os.path.join(model_dir, SENTINEL)) as f:
                    self.assertEqual(f.read(), "saved before")
                if case in REFUSED:
                    self.assertEqual(os.listdir(model_dir), [SENTINEL])

    def test_a_saved_run_keeps_every_byte(self):
        saved = os.path.join(self.tmp, "saved-run")
        result = harness.run([TRAIN, f"--flagfile={FLAGFILE}", f"--data_dir={self.data}",
                              f"--model_dir={saved}", "--bn_stat_batches=1", "--max_steps=1"],
                             timeout=300)
        self.assertEqual(result.returncode, 0, harness.describe(result))
        before = fingerprint(saved)
        for name in ("config.json", "history.jsonl", "summary.json", "checkpoints/latest"):
            self.assertIn(name, before)
        model_dirs = []
        for i, _ in enumerate(AGAINST_A_SAVED_RUN):
            model_dirs.append(os.path.join(self.tmp, f"copy-{i}"))
            shutil.copytree(saved, model_dirs[-1])
        results = self.run_cases(AGAINST_A_SAVED_RUN, model_dirs)
        for case, model_dir, result in zip(AGAINST_A_SAVED_RUN, model_dirs, results):
            with self.subTest(flags=case[0], env=case[1]):
                self.check_case(case, result)
                self.assertEqual(fingerprint(model_dir), before)


if __name__ == "__main__":
    tf.test.main()
