"""Bad input to the all-reduce and the optimizer: a clear error and a non-zero exit, no hang."""
import re

import tensorflow as tf

from tests import harness

# mode -> what the user must see. The classic stack runs its ranks under horovodrun on the Horovod
# engine (Horovod's own message for an op it does not take; a plain hvd.init()), the current
# stack under python -m tftorus.run on the tf engine (its optimizer's message; no Horovod).
# Tensors that differ between ranks go through a 2 x 2 torus (4 ranks: a row and a column phase
# that could hang), and a plain hvd.init() meets a grid that needs process sets there; the other
# cases are refused before any collective, and 2 ranks show it.
CASES = {
    "grid": "grid 3x3 has 9 ranks but the world has 2",
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
ON_A_TORUS = {"shapes", "shapes_in_training", "hvd_init_only"}
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
        # one launch per torus case (each leaves the world broken); the cases refused before any
        # collective run in one 2-rank launch, in turn (tests/workers/bad_input.py), the grid
        # last: it is refused inside init()
        torus = [m for m in CASES if m in ON_A_TORUS]
        before = sorted((m for m in CASES if m not in ON_A_TORUS), key=lambda m: m == "grid")
        argvs = [[harness.worker("bad_input.py"), *modes] for modes in [[m] for m in torus]
                 + [before]]
        results = harness.run_many(argvs, np=[4] * len(torus) + [2], timeout=TIMEOUT)
        results = {**dict(zip(torus, results)), **{m: results[-1] for m in before}}
        for mode, message in CASES.items():
            result = results[mode]
            with self.subTest(mode=mode):
                self.assertFalse(result.timed_out, f"{mode} hung: " + harness.describe(result))
                self.assertNotEqual(result.returncode, 0, harness.describe(result))
                self.assertIn(message, result.output, harness.describe(result))
                self.assertNotIn("NO ERROR RAISED", result.output)
                if mode in before:  # on every rank, in that mode's turn
                    refusals = re.findall(rf"\[{mode}\] refused: .*", result.output)
                    self.assertEqual(len(refusals), 2, harness.describe(result))
                    self.assertTrue(all(message in r for r in refusals), refusals)

    def test_bad_arguments_fail_where_they_are_given(self):
        # one process takes them in turn (tests/workers/bad_input.py)
        result = harness.run([harness.worker("bad_input.py"), *ONE_PROCESS_CASES],
                             timeout=TIMEOUT)
        self.assertEqual(result.returncode, 1, harness.describe(result))
        self.assertNotIn("NO ERROR RAISED", result.output)
        for mode, message in ONE_PROCESS_CASES.items():
            with self.subTest(mode=mode):
                refusals = re.findall(rf"^\[{mode}\] refused: .*", result.output, re.M)
                self.assertLen(refusals, 1, harness.describe(result))
                self.assertIn(message, refusals[0], harness.describe(result))


if __name__ == "__main__":
    tf.test.main()
