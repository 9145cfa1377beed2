"""Issue 15, input at the paper's scale: with F record files and W workers, no worker opens more
than ceil(F / W) files, and the workers' records together are every record exactly once.

The files are opened by TensorFlow's C++ reader, so the test counts opens the way the kernel
sees them: an inotify watch on the data directory (IN_OPEN events name the file)."""
import ctypes
import os
import struct
import tempfile

import tensorflow as tf

from official_resnet.data import embedded_data
from official_resnet.data import input_pipeline as ip
from official_resnet.data.sharding import FileShard, shard_files

IN_OPEN = 0x20
RECORDS_PER_FILE = 30  # not a multiple of the readers per file: the shards differ in size


class OpenedFiles:
    """Names of the files opened in `directory` (by any thread) while the block ran."""

    def __init__(self, directory):
        self.directory, self.names = directory, set()
        self.libc = ctypes.CDLL("libc.so.6", use_errno=True)

    def __enter__(self):
        self.fd = self.libc.inotify_init1(os.O_NONBLOCK)
        if self.fd < 0 or self.libc.inotify_add_watch(
                self.fd, self.directory.encode(), IN_OPEN) < 0:
            raise OSError(ctypes.get_errno(), "inotify is not available")
        return self

    def __exit__(self, *exc):
        try:
            while True:
                try:
                    data = os.read(self.fd, 1 << 16)
                except BlockingIOError:
                    break
                at = 0
                while at < len(data):  # struct inotify_event: wd, mask, cookie, len, name
                    _, mask, _, size = struct.unpack_from("iIII", data, at)
                    name = data[at + 16:at + 16 + size].rstrip(b"\0").decode()
                    if mask & IN_OPEN and name:
                        self.names.add(name)
                    at += 16 + size
        finally:
            os.close(self.fd)


def write_files(directory, split, num_files):
    """num_files files in ImageNet's naming; record r of file f holds the bytes b'f:r'."""
    for f in range(num_files):
        with tf.io.TFRecordWriter(os.path.join(
                directory, f"{split}-{f:05d}-of-{num_files:05d}")) as writer:
            for r in range(RECORDS_PER_FILE):
                writer.write(f"{f}:{r}".encode())


class ShardingTest(tf.test.TestCase):
    F = 6

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp()
        write_files(cls.dir, "train", cls.F)
        write_files(cls.dir, "validation", 2)

    def read_all_workers(self, split, workers):
        """Per worker: (file names opened, records read), one pass, in worker order."""
        out = []
        for w in range(workers):
            with OpenedFiles(self.dir) as opened:
                records = [r.decode() for r, _ in ip.worker_records(
                    self.dir, split, workers, w, shuffle=(split == "train"), seed=3).as_numpy_iterator()]
            out.append((opened.names, records))
        return out

    def check(self, split, num_files, workers):
        everything = [f"{f}:{r}" for f in range(num_files) for r in range(RECORDS_PER_FILE)]
        per_worker = self.read_all_workers(split, workers)
        limit = -(-num_files // workers)  # ceil(F / W)
        for w, (opened, records) in enumerate(per_worker):
            self.assertTrue(opened, f"worker {w} opened no file")
            self.assertLessEqual(len(opened), limit, f"worker {w} opened {sorted(opened)}")
            self.assertTrue(records, f"worker {w} read no record")
            self.assertEqual({f"{split}-{int(r.split(':')[0]):05d}-of-{num_files:05d}"
                              for r in records}, opened, "records of a file it did not open")
        union = [r for _, records in per_worker for r in records]
        self.assertCountEqual(union, everything)  # every record once: disjoint and complete
        return per_worker

    def test_three_workers_per_file(self):  # W = 3F: one file each, every third record
        per_worker = self.check("train", self.F, 3 * self.F)
        self.assertTrue(all(len(records) == RECORDS_PER_FILE // 3 for _, records in per_worker))

    def test_two_files_per_worker(self):  # W = F / 2: whole files
        per_worker = self.check("train", self.F, self.F // 2)
        self.assertTrue(all(len(opened) == 2 for opened, _ in per_worker))

    def test_workers_not_a_multiple_of_files(self):  # W = 8, F = 6: 2 or 1 readers per file
        per_worker = self.check("train", self.F, 8)
        self.assertEqual(sorted({len(records) for _, records in per_worker}),
                         [RECORDS_PER_FILE // 2, RECORDS_PER_FILE])

    def test_evaluation_shards_the_same_way(self):  # validation: 2 files, 5 workers
        self.check("validation", 2, 5)

    def test_resume_skips_to_the_same_batches_when_files_are_shared(self):
        """Deterministic resume (skip_batches) with more workers than files."""
        data = tempfile.mkdtemp()
        embedded_data.generate(data, embedded_data.EmbeddedSpec(
            image_size=16, num_train=96, num_validation=8, train_shards=2,
            validation_shards=1), processes=1)

        def batches(skip):
            ds = ip.make_dataset(data, "train", 4, image_size=16, num_workers=6, worker_index=3,
                                 seed=5, deterministic=True, skip_batches=skip,
                                 validate_records=0)
            return [(x.numpy(), y.numpy()) for x, y in ds.take(8 - skip)]

        whole, resumed = batches(0), batches(3)
        self.assertLen(resumed, 5)
        for (x0, y0), (x1, y1) in zip(whole[3:], resumed):
            self.assertAllEqual(y0, y1)
            self.assertAllClose(x0, x1)

    def test_assignment(self):
        files = [f"f{i}" for i in range(4)]
        self.assertEqual(shard_files(files, 2, 1), [FileShard("f1"), FileShard("f3")])
        self.assertEqual(shard_files(files, 12, 5), [FileShard("f1", 3, 1)])
        self.assertEqual(shard_files(files, 6, 1), [FileShard("f1", 2, 0)])
        self.assertEqual(shard_files(files, 6, 3), [FileShard("f3", 1, 0)])
        with self.assertRaisesRegex(ValueError, "worker_index"):
            shard_files(files, 4, 4)


if __name__ == "__main__":
    tf.test.main()
