"""Mixed precision that cannot split the ranks: under `mixed_float16`, one rank's batch
overflows float16 at step BAD_STEP (tests/workers/mixed_precision_overflow.py). Every rank must
finish, skip that same step, halve the loss scale once, and end with the same weights, equal
(to float16's precision) to float64 NumPy of the other steps; the same steps with the bad one
applied are far from them, so a rank going its own way shows. A user's own `model.fit` with
`tftorus.keras.DistributedOptimizer`, a tape loop with `DistributedGradientTape` (both stacks),
and on Keras 3 a tape loop calling the LossScaleOptimizer around ours and `fit` with
backward_passes_per_step=2."""
import os
import tempfile

import numpy as np
import tensorflow as tf

from tests import harness
from tests.workers import mixed_precision_overflow as worker

WORKER = "tests/workers/mixed_precision_overflow.py"
TOLERANCE = 5e-4  # float16 compute against float64; a step applied or not moves 0.09-0.24


class MixedPrecisionOverflowTest(tf.test.TestCase):

    def run_modes(self, workers: int, modes):
        out = tempfile.mkdtemp(prefix="tftorus-mixed-precision-")
        result = harness.run_world([WORKER, out, ",".join(modes)], np=workers, timeout=300)
        self.assertEqual(result.returncode, 0, harness.describe(result))
        for mode in modes:
            passes = worker.PASSES if mode == "fit-accumulate" else 1
            expected = worker.reference(workers, passes=passes)
            every_step = worker.reference(workers, skipped=(), passes=passes)
            first = None
            for rank in range(workers):
                with self.subTest(mode=mode, rank=rank), \
                        np.load(os.path.join(out, f"{mode}-rank{rank}.npz")) as f:
                    weights = [f[f"arr_{i}"] for i in range(len(expected))]
                    self.assertEqual(float(f["scale"]), worker.INITIAL_SCALE / 2)  # halved once
                    if harness.HOROVOD:  # Keras 2 counts the skipped step too
                        self.assertEqual(int(f["steps"]), worker.STEPS // passes)
                    else:
                        self.assertEqual(int(f["steps"]), (worker.STEPS - 1) // passes)
                    for a, b, c in zip(weights, expected, every_step):
                        self.assertAllClose(a, b, atol=TOLERANCE, rtol=0)
                    self.assertGreater(max(np.max(np.abs(b - c))
                                           for b, c in zip(expected, every_step)),
                                       100 * TOLERANCE)
                    if first is None:
                        first = weights
                    for a, b in zip(weights, first):  # bit for bit the same on every rank
                        self.assertAllEqual(a, b)

    def test_two_ranks(self):
        modes = ["fit", "tape"] if harness.HOROVOD else [
            "fit", "tape", "tape-optimizer", "fit-accumulate"]
        self.run_modes(2, modes)

    def test_four_ranks(self):
        self.run_modes(4, ["fit", "tape-optimizer"])


if __name__ == "__main__":
    tf.test.main()
