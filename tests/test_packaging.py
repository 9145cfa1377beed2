"""tftorus installs like a library: `pip wheel .` builds a wheel of tftorus and official_resnet
alone (the LICENSE in it; no `flags`, run_scripts, studies or tests), which, installed outside
the checkout, runs a 2-rank mixed-precision `fit` from a directory of its own; and importing it
on an unsupported Python or TensorFlow says which are supported."""
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

import tensorflow as tf

from tests import harness
from tftorus.runtime import supported


class SupportedVersionsTest(tf.test.TestCase):

    def test_python_and_tensorflow_outside_the_range_are_named(self):
        supported.check_python((3, 12, 1))
        supported.check_tensorflow("2.21.0")
        supported.check_tensorflow("2.15.1")
        with self.assertRaisesRegex(ImportError, r"tftorus supports Python 3.9-3.13 with "
                                                 r"TensorFlow 2.15 .*; this is Python 3.8.10"):
            supported.check_python((3, 8, 10))
        with self.assertRaisesRegex(ImportError, "; this is Python 3.14.0"):
            supported.check_python((3, 14, 0))
        with self.assertRaisesRegex(ImportError, "; this is TensorFlow 2.14.1"):
            supported.check_tensorflow("2.14.1")
        with self.assertWarnsRegex(UserWarning, "tested up to TensorFlow 2.21; this is 2.22.0"):
            supported.check_tensorflow("2.22.0")

    def test_the_project_metadata_says_the_same(self):
        with open(os.path.join(harness.ROOT, "pyproject.toml")) as f:
            text = f.read()
        self.assertIn('requires-python = ">=3.9,<3.14"', text)
        self.assertIn('"tensorflow-cpu==2.15.1"', text)
        self.assertIn('"tensorflow-cpu==2.21.0"', text)


class WheelTest(tf.test.TestCase):

    def test_a_wheel_runs_a_fit_outside_the_checkout(self):
        harness.refuse_in_quick_tier()
        work = tempfile.mkdtemp(prefix="tftorus-wheel-")
        built = subprocess.run([sys.executable, "-m", "pip", "wheel", harness.ROOT, "--no-deps",
                                "-q", "-w", os.path.join(work, "dist")],
                               capture_output=True, text=True, timeout=600)
        self.assertEqual(built.returncode, 0, built.stdout + built.stderr)
        wheel, = os.listdir(os.path.join(work, "dist"))
        with zipfile.ZipFile(os.path.join(work, "dist", wheel)) as z:
            tops = {name.split("/")[0] for name in z.namelist()}
            self.assertTrue(any(n.endswith("licenses/LICENSE") for n in z.namelist()))
        self.assertEqual(tops, {"tftorus", "official_resnet", "tftorus-0.1.0.dist-info"})
        target = os.path.join(work, "site")
        installed = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                                    "--target", target, os.path.join(work, "dist", wheel)],
                                   capture_output=True, text=True, timeout=300)
        self.assertEqual(installed.returncode, 0, installed.stdout + installed.stderr)
        project = os.path.join(work, "my_project")  # the user's directory, not the checkout
        os.makedirs(os.path.join(project, "out"))
        shutil.copy(os.path.join(harness.ROOT, "tests", "workers", "mixed_precision_overflow.py"),
                    os.path.join(project, "train.py"))
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env.update(PYTHONPATH=target, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
        where = subprocess.run([sys.executable, "-c", "import tftorus, official_resnet; "
                                "print(tftorus.__file__, official_resnet.__file__)"],
                               cwd=project, env=env, capture_output=True, text=True, timeout=120)
        self.assertEqual(where.returncode, 0, where.stderr[-2000:])
        for path in where.stdout.split():
            self.assertTrue(path.startswith(target), where.stdout)
        fit = subprocess.run([sys.executable, "-m", "tftorus.run", "-np", "2", "train.py", "out",
                              "fit"], cwd=project, env=env, capture_output=True, text=True,
                             timeout=300)
        self.assertEqual(fit.returncode, 0, (fit.stdout + fit.stderr)[-3000:])
        for rank in range(2):
            self.assertIn(f"[rank {rank}] fit: steps 4, loss scale 512.0", fit.stdout)


if __name__ == "__main__":
    tf.test.main()
