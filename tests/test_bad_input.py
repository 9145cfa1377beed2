"""Bad input to the all-reduce and the optimizer: a clear error and a non-zero exit, no hang."""
import tensorflow as tf

from tests import harness

# mode -> what the user must see. The classic stack runs 4 ranks under horovodrun on the Horovod
# engine (Horovod's own message for an op it does not take; a plain hvd.init()), the current
# stack under python -m tftorus.run on the tf engine (its optimizer's message; no Horovod).
CASES = {
    "grid": "grid 3x3 has 9 ranks but the world has 4",
    "algorithm": "unknown all-reduce algorithm 'tree'",
    "op": "op currently only supports Average and Sum" if harness.HOROVOD else
          "op must be tftorus.Average or tftorus.Sum on the tf engine",
    "shapes": "ranks handed different tensors to the all-reduce",
    "shapes_in_training": "ranks handed different tensors to the all-reduce",
    "dtype": "dtype string, which the all-reduce cannot sum",
    "complex": "dtype complex64, which the all-reduce cannot sum",
    **({"hvd_init_only": "Call tftorus.init() in place of hvd.init()"} if harness.HOROVOD
       else {}),
}
# Caught where the optimizer is built or the tensors are handed in, before any collective: one
# plain process shows them.
ONE_PROCESS_CASES = {
    "none_tensor": "tensor #1 is None: hand the all-reduce tensors only",
    "grid_syntax": "grid '2by2' is not of the form 'YxX'",
    "fusion_threshold": "fusion_threshold_bytes must be a whole number >= 0, got -1",
    "engine": "unknown engine 'nccl'; choose 'horovod'",
    "compression_name": "compression must be tftorus.Compression.none, .fp16 or .bf16",
    "optimizer_name": "DistributedOptimizer wraps an optimizer instance, e.g. "
                      "tf.keras.optimizers.SGD(0.1); got 'sgd'" if harness.HOROVOD else
                      "DistributedOptimizer wraps a Keras optimizer instance, e.g. "
                      "keras.optimizers.SGD(0.1); got 'sgd'",
}
TIMEOUT = 150  # seconds; a hang would hit this


class BadInputTest(tf.test.TestCase):

    def test_every_bad_input_fails_clearly(self):
        results = harness.run_many([[harness.worker("bad_input.py"), mode] for mode in CASES],
                                   np=4, timeout=TIMEOUT)
        for (mode, message), result in zip(CASES.items(), results):
            with self.subTest(mode=mode):
                self.assertFalse(result.timed_out, f"{mode} hung: " + harness.describe(result))
                self.assertNotEqual(result.returncode, 0, harness.describe(result))
                self.assertIn(message, result.output, harness.describe(result))
                self.assertNotIn("NO ERROR RAISED", result.output)

    def test_bad_arguments_fail_where_they_are_given(self):
        results = harness.run_many([[harness.worker("bad_input.py"), mode]
                                    for mode in ONE_PROCESS_CASES], timeout=TIMEOUT)
        for (mode, message), result in zip(ONE_PROCESS_CASES.items(), results):
            with self.subTest(mode=mode):
                self.assertEqual(result.returncode, 1, harness.describe(result))
                self.assertIn(message, result.output, harness.describe(result))
                self.assertNotIn("NO ERROR RAISED", result.output)


if __name__ == "__main__":
    tf.test.main()
