"""Bad input to the all-reduce and the optimizer: a clear error and a non-zero exit, no hang."""
import tensorflow as tf

from tests import harness

# mode -> what the user must see
CASES = {
    "grid": "grid 3x3 has 9 ranks but the world has 4",
    "algorithm": "unknown all-reduce algorithm 'tree'",
    "op": "op currently only supports Average and Sum",
    "shapes": "ranks handed different tensors to the all-reduce",
    "shapes_in_training": "ranks handed different tensors to the all-reduce",
    "dtype": "dtype string, which the all-reduce cannot sum",
    "complex": "dtype complex64, which the all-reduce cannot sum",
    "hvd_init_only": "Call tftorus.init() in place of hvd.init()",
}
TIMEOUT = 150  # seconds; a hang would hit this


class BadInputTest(tf.test.TestCase):

    def test_every_bad_input_fails_clearly(self):
        for mode, message in CASES.items():
            with self.subTest(mode=mode):
                result = harness.run([harness.worker("bad_input.py"), mode], np=4, timeout=TIMEOUT)
                self.assertFalse(result.timed_out, f"{mode} hung: " + harness.describe(result))
                self.assertNotEqual(result.returncode, 0, harness.describe(result))
                self.assertIn(message, result.output, harness.describe(result))
                self.assertNotIn("NO ERROR RAISED", result.output)


if __name__ == "__main__":
    tf.test.main()
