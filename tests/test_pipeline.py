"""When the torus cuts a buffer into chunks, and how a wrong setting is refused.

That the chunks change no bit of the result is checked on real jobs of both engines
(tests/workers/pipeline_and_wire.py, from test_allreduce_multiprocess and test_tf_engine).
"""
import tensorflow as tf

import tftorus
from tftorus.torus import algorithms
from tftorus.torus.communicator import Communicator
from tftorus.torus.grid import parse_grid

MIB = 1 << 20


class FakeWorld(Communicator):
    """Only the shape of a world (rank, size, hosts) and whether groups overlap: the policy
    reads nothing else, and runs no collective."""

    def __init__(self, size, local_size, concurrent=True, reduce_scatter_impl="alltoall"):
        self._size, self._local = size, local_size
        self.concurrent_groups = concurrent
        self.reduce_scatter_impl = reduce_scatter_impl

    rank = property(lambda self: 0)
    size = property(lambda self: self._size)
    local_size = property(lambda self: self._local)

    def _reduce_scatter(self, tensor, group):
        raise AssertionError("the policy must not communicate")

    _all_reduce = _all_gather = _reduce_scatter


class ChunkPolicyTest(tf.test.TestCase):

    def chunks(self, grid, size, local, nbytes, concurrent=True, requested=None,
               algorithm="torus", dtype=tf.float32, reduce_scatter_impl="alltoall"):
        return algorithms.pipeline_chunks(
            algorithm, parse_grid(grid, size),
            FakeWorld(size, local, concurrent, reduce_scatter_impl), nbytes, requested, dtype)

    def test_one_chunk_per_min_chunk_bytes_up_to_the_maximum(self):
        self.assertEqual(algorithms.MIN_CHUNK_BYTES, MIB)
        self.assertEqual(self.chunks("2x2", 4, 2, MIB // 2), 1)
        self.assertEqual(self.chunks("2x2", 4, 2, 4 * MIB), 4)
        self.assertEqual(self.chunks("2x2", 4, 2, 16 * MIB), 16)
        self.assertEqual(self.chunks("2x4", 8, 4, 64 * MIB), algorithms.MAX_CHUNKS)
        self.assertEqual(self.chunks("2x4", 8, 4, 1 << 30), algorithms.MAX_CHUNKS)

    def test_off_where_nothing_can_overlap(self):
        self.assertEqual(self.chunks("2x2", 4, 4, 64 * MIB), 1)  # one host
        self.assertEqual(self.chunks("1x4", 4, 2, 64 * MIB), 1)  # no column phase
        self.assertEqual(self.chunks("4x1", 4, 1, 64 * MIB), 1)  # no row phase
        self.assertEqual(self.chunks("2x2", 4, 2, 64 * MIB, concurrent=False), 1)  # Horovod
        self.assertEqual(self.chunks("2x2", 4, 2, 64 * MIB, algorithm="ring"), 1)
        self.assertEqual(self.chunks("2x2", 4, 2, 64 * MIB, algorithm="hierarchical"), 1)

    def test_columns_of_three_or_more_are_summed_in_rank_order_where_chunks_run(self):
        # An engine's ring sums an FP32/FP64 column of 3+ ranks in an order set by the element's
        # place in the buffer; the torus sums such a column in rank order where it pipelines
        # (all-to-all reduce-scatter), so the chunks keep every bit and are picked as usual.
        for grid, size, local in (("3x2", 6, 2), ("4x2", 8, 2), ("4x4", 16, 4)):
            for dtype in (tf.float32, tf.float64, tf.float16, tf.bfloat16, tf.int32):
                self.assertEqual(self.chunks(grid, size, local, 64 * MIB, dtype=dtype), 16)
            world = FakeWorld(size, local)
            self.assertTrue(algorithms.ordered_column(parse_grid(grid, size), world, tf.float32))
            for exact in (tf.float16, tf.int32):  # summed in rank order / exactly anyway
                self.assertFalse(algorithms.ordered_column(parse_grid(grid, size), world, exact))
        for grid, size in (("2x4", 8), ("1x8", 8)):  # columns of 1-2: a + b == b + a
            self.assertFalse(algorithms.ordered_column(parse_grid(grid, size), FakeWorld(size, 4),
                                                       tf.float32))
        # Horovod (one collective at a time): its own all-reduce, and no chunks by default
        self.assertFalse(algorithms.ordered_column(parse_grid("4x2", 8),
                                                   FakeWorld(8, 2, concurrent=False), tf.float32))

    def test_off_where_chunks_would_change_the_last_bit(self):
        # With a native (NCCL) reduce-scatter the column cannot be summed in rank order: an FP32
        # column of 3+ ranks then gets no chunks unless they are asked for.
        for grid, size, local in (("3x2", 6, 2), ("4x2", 8, 2), ("4x4", 16, 4)):
            native = dict(reduce_scatter_impl="native")
            self.assertFalse(algorithms.ordered_column(parse_grid(grid, size),
                                                       FakeWorld(size, local, **native),
                                                       tf.float32))
            self.assertEqual(self.chunks(grid, size, local, 64 * MIB, **native), 1)
            self.assertEqual(self.chunks(grid, size, local, 64 * MIB, dtype=tf.float64, **native),
                             1)
            for exact in (tf.float16, tf.bfloat16, tf.int32):
                self.assertEqual(self.chunks(grid, size, local, 64 * MIB, dtype=exact, **native),
                                 16)
            self.assertEqual(self.chunks(grid, size, local, 64 * MIB, requested=4, **native), 4)
        self.assertEqual(self.chunks("2x4", 8, 4, 64 * MIB, dtype=tf.float64,
                                     reduce_scatter_impl="native"), 16)

    def test_a_requested_count_wins(self):
        self.assertEqual(self.chunks("2x2", 4, 4, 1024, requested=3), 3)
        self.assertEqual(self.chunks("2x2", 4, 2, 64 * MIB, requested=1), 1)

    def test_padding_makes_every_chunk_split_evenly_over_the_row(self):
        grid = parse_grid("3x4", 12)
        self.assertEqual(algorithms.alignment("torus", grid, 3), 12)
        self.assertEqual(algorithms.alignment("ring", grid, 3), 1)

    def test_the_engines_say_whether_groups_overlap(self):
        from tftorus.engines.horovod_engine import HorovodCommunicator
        from tftorus.engines.tf_engine import TFCollectiveCommunicator
        self.assertFalse(HorovodCommunicator.concurrent_groups)
        self.assertTrue(TFCollectiveCommunicator.concurrent_groups)

    def test_bad_chunk_counts_say_what_to_give(self):
        for bad in (0, -2, 2.5, "4", True):
            with self.assertRaisesRegex(ValueError, "pipeline_chunks must be None .* or a whole "
                                                    "number >= 1"):
                tftorus.TorusOptions(pipeline_chunks=bad)
        with self.assertRaisesRegex(ValueError, "pipeline_chunks must be"):
            tftorus.fused_allreduce([tf.ones([4])], pipeline_chunks=0)


if __name__ == "__main__":
    tf.test.main()


class AutoAlgorithmTest(tf.test.TestCase):
    """`algorithm='auto'`: what each world and buffer size gets (algorithms.choose)."""

    def choose(self, grid, size, local, nbytes):
        return algorithms.choose("auto", parse_grid(grid, size), FakeWorld(size, local), nbytes)

    def test_one_host_gets_the_engines_own_all_reduce(self):
        self.assertEqual(self.choose("2x2", 4, 4, 64 * MIB), "ring")
        self.assertEqual(self.choose("2x4", 8, 8, 64 * MIB), "ring")

    def test_across_hosts_large_buffers_take_the_torus_small_ones_one_all_reduce(self):
        self.assertEqual(self.choose("2x2", 4, 2, 16 * MIB), "torus")
        self.assertEqual(self.choose("2x4", 8, 4, algorithms.SMALL_BUFFER_BYTES), "torus")
        self.assertEqual(self.choose("2x4", 8, 4, algorithms.SMALL_BUFFER_BYTES - 1), "ring")
        self.assertEqual(self.choose("1x8", 8, 4, 64 * MIB), "ring")  # the torus is a ring there
        self.assertEqual(self.choose("8x1", 8, 4, 64 * MIB), "ring")

    def test_a_named_algorithm_is_taken_as_given(self):
        for name in ("torus", "ring", "hierarchical"):
            self.assertEqual(algorithms.choose(name, parse_grid("2x2", 4), FakeWorld(4, 4), 1), name)
        with self.assertRaisesRegex(ValueError, "unknown all-reduce algorithm 'tree'.*'auto'"):
            tftorus.TorusOptions(algorithm="tree")
        self.assertEqual(tftorus.TorusOptions().algorithm, "auto")
