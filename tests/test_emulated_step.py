"""The step benchmark's report and arguments (studies/emulated_step.py), without processes."""
import argparse

import tensorflow as tf

from studies import emulated_step


def row(variant, repeat, step, allreduce=0.0, wire="fp16"):
    return {"hosts": "2", "ranks_per_host": "2", "link_gbit": "0.25", "wire": wire,
            "repeat": str(repeat), "variant": variant, "step_s": str(step),
            "allreduce_s": str(allreduce)}


class EmulatedStepReportTest(tf.test.TestCase):

    def test_ratios_and_hidden_fraction(self):
        rows = [row("compute", 0, 1.0), row("hvd", 0, 4.0, 3.0), row("default", 0, 2.5, 2.0),
                row("compute", 1, 1.0), row("hvd", 1, 4.0, 3.0), row("default", 1, 2.5, 2.0)]
        table = emulated_step.step_table(rows).splitlines()
        self.assertEqual(len(table), 3)  # header, hvd, default: compute is a column
        default = table[2].split()
        self.assertEqual(default[0], "default")
        self.assertEqual(default[1:4], ["2.500", "1.000", "2.000"])
        self.assertEqual(default[4], "0.50")  # (1 + 2 - 2.5) / min(1, 2)
        self.assertEqual(default[5], "0.62")  # 2.5 / 4 (rounded half to even)
        self.assertEqual(default[6], "1.25")  # 2.5 / max(1, 2)
        self.assertEqual(table[1].split()[5], "1.00")

    def test_clusters_are_parsed_with_a_clear_error(self):
        self.assertEqual(emulated_step.topology("2x4"), (2, 4))
        for bad in ("2", "2x", "0x4", "axb"):
            with self.assertRaisesRegex(argparse.ArgumentTypeError, "HOSTSxRANKS_PER_HOST"):
                emulated_step.topology(bad)


if __name__ == "__main__":
    tf.test.main()
