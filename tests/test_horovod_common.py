"""tftorus.horovod_api.helpers (Horovod's small helpers for the current stack's facades) against
Horovod's own, on the classic stack, where both exist."""
import unittest
import warnings

from tftorus.runtime import stack


@unittest.skipUnless(stack.HOROVOD, "the classic stack: Horovod's helpers to compare with")
class HorovodCommonTest(unittest.TestCase):

    def test_the_helpers_answer_as_horovods(self):
        import horovod.tensorflow as hvd
        import horovod.tensorflow.keras as hvd_keras

        from tftorus.horovod_api import helpers as mine
        for n in range(1, 6):
            for length in range(0, 12):
                items = list(range(length))
                self.assertEqual(mine.split_list(items, n), hvd.split_list(items, n))
        for ranks in range(0, 70):
            self.assertEqual(mine.check_num_rank_power_of_2(ranks),
                             hvd.check_num_rank_power_of_2(ranks), ranks)
        for op, average in [(None, None), (None, True), (None, False), (hvd.Sum, None),
                            (hvd.Max, None), (hvd.Sum, True)]:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                answers = []
                for f in (mine.handle_average_backwards_compatibility,
                          hvd.handle_average_backwards_compatibility):
                    try:
                        answers.append(f(op, average))
                    except ValueError as e:
                        answers.append(str(e))
            self.assertEqual(answers[0], answers[1], (op, average))
        with self.assertWarns(DeprecationWarning):  # average= is Horovod's deprecated way
            mine.handle_average_backwards_compatibility(None, True)
        for ver, target in [("2.15.1", "2.15.0"), ("2.9.0", "2.10.0"), ("3.0.0rc1", "3.0.0"),
                            ("1.0", "1.0.0")]:
            self.assertEqual(mine.is_version_greater_equal_than(ver, target),
                             hvd_keras.is_version_greater_equal_than(ver, target), (ver, target))
        for bad in [(2, "1.0.0"), ("1.0.0", "1.0")]:
            with self.assertRaises(ValueError):
                mine.is_version_greater_equal_than(*bad)
            with self.assertRaises(ValueError):
                hvd_keras.is_version_greater_equal_than(*bad)


if __name__ == "__main__":
    unittest.main()
