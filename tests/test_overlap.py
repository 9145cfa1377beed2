"""Gradient buckets leave while the backward pass still runs, on both engines (real jobs).

tests/workers/overlap.py says how it is seen: two clocks inside the training step's graph, and a
one-bucket control run that must show no overlap, so the check can fail.
"""
import re

import tensorflow as tf

from tests import harness


class OverlapTest(tf.test.TestCase):

    def check_counts(self, result):
        counts = [int(c) for c in re.findall(r"overlap: (\d+) checks, 0 failed", result.output)]
        self.assertEqual(len(counts), 4, harness.describe(result))
        self.assertTrue(min(counts) >= 6, harness.describe(result))

    def test_horovod_engine(self):
        # in the four-rank world other tests share (tests/harness.FOUR_RANK_SUITE)
        result = harness.four_rank_suite()[1]
        failure = harness.suite_report(result, "overlap", 4, harness.FOUR_RANK_SUITE)
        self.assertFalse(failure, failure)
        self.check_counts(result)

    def test_tf_engine(self):
        # in the four-rank tf-engine world other tests share (tests/harness.four_rank_tf_suite)
        _, result = harness.four_rank_tf_suite()
        failure = harness.suite_report(result, "overlap", 4, harness.TF_SUITE)
        self.assertFalse(failure, failure)
        self.check_counts(result)


if __name__ == "__main__":
    tf.test.main()
