"""Issue 15: record counts without every rank reading every record: ImageNet's known split
sizes for its standard layout, a cache of one count keyed by the files, and in the trainer a count
made by rank 0 alone and shared."""
import os
import tempfile
from unittest import mock

import tensorflow as tf

from official_resnet.data import dataset_info
from official_resnet.run import trainer
from official_resnet.run.workers import Workers


def write(path, records):
    with tf.io.TFRecordWriter(path) as writer:
        for r in range(records):
            writer.write(b"x" * 10 + str(r).encode())


class DatasetInfoTest(tf.test.TestCase):

    def test_standard_imagenet_layout_needs_no_count(self):
        d = tempfile.mkdtemp()
        for split, n in dataset_info.IMAGENET_FILES.items():
            for i in range(n):
                open(os.path.join(d, f"{split}-{i:05d}-of-{n:05d}"), "w").close()
        sizes = dataset_info.known_sizes(d)
        self.assertEqual((sizes.train, sizes.validation, sizes.num_classes, sizes.source),
                         (1_281_167, 50_000, 1000, "imagenet"))
        os.remove(os.path.join(d, "train-00007-of-01024"))  # not the standard set any more
        self.assertIsNone(dataset_info.known_sizes(d))

    def test_one_count_is_cached_until_a_file_changes(self):
        d = tempfile.mkdtemp()
        write(os.path.join(d, "train-00000-of-00002"), 5)
        write(os.path.join(d, "train-00001-of-00002"), 7)
        write(os.path.join(d, "validation-00000-of-00001"), 3)
        self.assertIsNone(dataset_info.known_sizes(d))
        counted = dataset_info.count_sizes(d)
        self.assertEqual((counted.train, counted.validation, counted.source), (12, 3, "counted"))
        cached = dataset_info.known_sizes(d)
        self.assertEqual((cached.train, cached.validation, cached.source), (12, 3, "cache"))
        write(os.path.join(d, "train-00001-of-00002"), 8)  # rewritten: other size
        self.assertIsNone(dataset_info.known_sizes(d))
        self.assertEqual(dataset_info.count_sizes(d).train, 13)

    def test_only_rank_0_counts_and_the_others_get_its_numbers(self):
        config = mock.Mock(data_dir=tempfile.mkdtemp(), num_classes=0)
        write(os.path.join(config.data_dir, "train-00000-of-00001"), 4)
        write(os.path.join(config.data_dir, "validation-00000-of-00001"), 2)
        from_rank0 = tf.constant([4, 2], tf.int64)
        other = Workers(rank=1, size=2, allreduce_sum=lambda t: t + from_rank0)
        with mock.patch.object(dataset_info, "count_sizes",
                               side_effect=AssertionError("rank 1 counted")):
            self.assertEqual(trainer.data_info(config, None, other), (4, 2, 1000))
        chief = Workers(rank=0, size=2, allreduce_sum=lambda t: t)  # the others add zeros
        self.assertEqual(trainer.data_info(config, None, chief), (4, 2, 1000))


if __name__ == "__main__":
    tf.test.main()
