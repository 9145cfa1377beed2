"""The ImageNet input pipeline on JPEG photos (on the classic stack matplotlib's sample photo and
its sample PNG photo encoded as JPEG; on the current stack two drawn by Pillow: sample_photos),
written in the layout of TensorFlow's ImageNet conversion; and the embedded set read through it."""
import io
import os
import shutil
import tempfile
import unittest
from unittest import mock

import numpy as np
import tensorflow as tf
from PIL import Image

from official_resnet.data import embedded_data
from official_resnet.data import input_pipeline as ip
from tftorus.runtime import stack


def sample_photos():
    """Two JPEGs of different sizes, as bytes. Where matplotlib is installed (the classic stack),
    real photos: the one it ships, and its PNG photo encoded as JPEG by Pillow. The current stack
    leaves matplotlib out (pyproject.toml says why); there Pillow draws two of the photos' sizes."""
    try:
        import matplotlib
    except ImportError:
        return [drawn_photo(600, 512, seed=0), drawn_photo(128, 128, seed=1)]
    data = os.path.join(matplotlib.get_data_path(), "sample_data")
    with open(os.path.join(data, "grace_hopper.jpg"), "rb") as f:
        photos = [f.read()]
    out = io.BytesIO()
    Image.open(os.path.join(data, "Minduka_Present_Blue_Pack.png")).convert("RGB").save(
        out, "JPEG", quality=90)
    return photos + [out.getvalue()]


def drawn_photo(height: int, width: int, seed: int) -> bytes:
    """A photo-like JPEG: smooth colour gradients under sensor-like noise."""
    rng = np.random.RandomState(seed)
    y, x = np.mgrid[0:height, 0:width] / max(height, width)
    channels = [np.sin(2 * np.pi * (a * x + b * y) + c) for a, b, c in rng.uniform(0, 2, (3, 3))]
    image = 127.5 * (1 + np.stack(channels, -1)) + rng.normal(0, 8, (height, width, 3))
    out = io.BytesIO()
    Image.fromarray(np.clip(image, 0, 255).astype(np.uint8)).save(out, "JPEG", quality=90)
    return out.getvalue()


PHOTOS = sample_photos()
SIZE = 32  # output pixels: small keeps the tests fast


def example(image_bytes: bytes, label: int) -> bytes:
    feature = {
        "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image_bytes])),
        "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def write_split(directory, split, num_files, per_file, photos, first_label=1, records=None):
    """num_files x per_file records; record k of the split has stored label first_label + k,
    so labels identify records."""
    os.makedirs(directory, exist_ok=True)
    k = 0
    for f in range(num_files):
        path = os.path.join(directory, f"{split}-{f:05d}-of-{num_files:05d}")
        with tf.io.TFRecordWriter(path) as writer:
            for _ in range(per_file):
                writer.write(records[k] if records else
                             example(photos[k % len(photos)], first_label + k))
                k += 1
    return k


def jpeg(array, quality=100) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue()


def labels_of(ds):
    return [int(v) for _, labels in ds for v in labels.numpy()]


class InputPipelineTest(tf.test.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.photos = list(PHOTOS)
        cls.root = tempfile.mkdtemp(prefix="input_pipeline_test_")
        cls.many = os.path.join(cls.root, "many")  # 8 files: enough to shard by file
        cls.few = os.path.join(cls.root, "few")  # 3 files: fewer than 4 workers
        cls.n_many = write_split(cls.many, "train", 8, 3, cls.photos)
        write_split(cls.many, "validation", 8, 3, cls.photos)
        cls.n_few = write_split(cls.few, "train", 3, 5, cls.photos)
        write_split(cls.few, "validation", 3, 5, cls.photos)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.root, ignore_errors=True)
        super().tearDownClass()

    def bad_dir(self, name, records):
        path = os.path.join(self.root, name)
        write_split(path, "train", 1, len(records), None, records=records)
        return path

    # --- shapes, labels, geometry -------------------------------------------------------------
    def test_batches_shapes_dtypes_and_label_offset(self):
        ds = ip.make_dataset(self.many, "validation", 5, image_size=SIZE)
        images, labels = next(iter(ds))
        self.assertEqual(images.shape, (5, SIZE, SIZE, 3))
        self.assertEqual((images.dtype, labels.dtype), (tf.float32, tf.int32))
        self.assertTrue(np.all(np.isfinite(images)))
        self.assertBetween(float(tf.reduce_mean(images)), -2.0, 2.0)  # normalised
        self.assertCountEqual(labels_of(ds), range(self.n_many))  # stored 1..n, label_offset=1
        ds0 = ip.make_dataset(self.many, "validation", 5, image_size=SIZE, label_offset=0)
        self.assertCountEqual(labels_of(ds0), range(1, self.n_many + 1))
        train_images, _ = next(iter(ip.make_dataset(self.many, "train", 4, image_size=SIZE)))
        self.assertEqual(train_images.shape, (4, SIZE, SIZE, 3))

    def test_no_autotuning_thread(self):
        # TF 2.15's autotuning thread can sleep through its iterator's deletion, up to a
        # minute at the end of model.fit (ip.pipeline_options says how)
        for split in ("train", "validation"):
            ds = ip.make_dataset(self.many, split, 4, image_size=SIZE, deterministic=True)
            self.assertFalse(ds.options().autotune.enabled, split)
            self.assertTrue(ds.options().deterministic, split)

    def test_eval_is_the_centre_crop_of_the_shorter_side(self):
        photo = self.photos[0]
        full = tf.io.decode_jpeg(photo, channels=3).numpy()
        h, w = full.shape[:2]
        side = int(0.875 * min(h, w))
        y, x = (h - side + 1) // 2, (w - side + 1) // 2
        expected = tf.image.resize(full[y:y + side, x:x + side], [SIZE, SIZE]) / 255.0
        got = ip.preprocess_for_eval(tf.constant(photo), SIZE)
        self.assertEqual(got.shape, (SIZE, SIZE, 3))
        self.assertAllClose(got, expected, atol=0.03)

        # A green square exactly where the crop falls, red around it: no red may come in.
        h, w = 120, 200
        side = int(0.875 * h)
        y, x = (h - side + 1) // 2, (w - side + 1) // 2
        canvas = np.zeros((h, w, 3), np.uint8)
        canvas[..., 0] = 255
        canvas[y:y + side, x:x + side] = (0, 255, 0)
        crop = ip.preprocess_for_eval(tf.constant(jpeg(canvas)), SIZE).numpy()
        self.assertLess(crop[1:-1, 1:-1, 0].max(), 0.3)  # JPEG smears the one-pixel edge
        self.assertGreater(crop[..., 1].min(), 0.7)
        wider = ip.preprocess_for_eval(tf.constant(jpeg(canvas)), SIZE, crop_fraction=1.0).numpy()
        self.assertGreater(wider[:, 0, 0].min(), 0.7)  # a wider crop does reach the red

    def test_each_augmentation_changes_images_keeps_shape_and_finite(self):
        photo = tf.constant(self.photos[1])
        plain = ip.preprocess_for_train(photo, SIZE, [0, 0], ip.AugmentConfig.none())
        self.assertAllClose(plain, ip.preprocess_for_eval(photo, SIZE))  # off = evaluation
        for name in ip.AugmentConfig.NAMES:
            with self.subTest(augmentation=name):
                config = ip.AugmentConfig.from_names(name)
                changed = False
                for seed in range(6):  # a flip happens with p = 1/2
                    out = ip.preprocess_for_train(photo, SIZE, [seed, 1], config)
                    self.assertEqual(out.shape, (SIZE, SIZE, 3))
                    self.assertTrue(np.all(np.isfinite(out)))
                    changed |= float(tf.reduce_max(tf.abs(out - plain))) > 1e-3
                self.assertTrue(changed, f"{name} never changed the image")
        everything = ip.preprocess_for_train(photo, SIZE, [7, 7], ip.AugmentConfig())
        self.assertTrue(np.all(np.isfinite(everything)))
        with self.assertRaisesRegex(ValueError, "unknown augmentations"):
            ip.AugmentConfig.from_names("crop,blur")

    def test_training_batches_are_deterministic_with_a_seed(self):
        def batches(seed):
            ds = ip.make_dataset(self.many, "train", 4, image_size=SIZE, seed=seed,
                                 deterministic=True)
            return [(i.numpy(), l.numpy()) for i, l in ds.take(3)]

        first, again, other = batches(3), batches(3), batches(4)
        for (i1, l1), (i2, l2) in zip(first, again):
            self.assertAllEqual(l1, l2)
            self.assertAllEqual(i1, i2)
        self.assertFalse(all(np.array_equal(a[1], b[1]) and np.allclose(a[0], b[0])
                             for a, b in zip(first, other)))

    def test_workers_cover_every_record_exactly_once(self):
        for data_dir, n in ((self.many, self.n_many), (self.few, self.n_few)):
            for workers in (2, 4):
                for training in (False, True):
                    with self.subTest(data=os.path.basename(data_dir), workers=workers,
                                      training=training):
                        seen = []
                        for w in range(workers):
                            ds = ip.make_dataset(
                                data_dir, "train", 4, image_size=8, num_workers=workers,
                                worker_index=w, training=training, repeat=False,
                                drop_remainder=False, augment=False,
                                validate_records=0)  # validation has its own tests
                            mine = labels_of(ds)
                            self.assertNotEmpty(mine)
                            seen += mine
                        self.assertCountEqual(seen, range(n))  # disjoint and complete

    def test_count_and_describe(self):
        files = ip.list_files(self.few, "train")
        self.assertLen(files, 3)
        self.assertEqual(ip.count_records(files), self.n_few)
        info = ip.describe(self.many)
        self.assertEqual(info["splits"]["train"], {"files": 8, "records": self.n_many})
        self.assertEqual(info["splits"]["validation"]["records"], self.n_many)
        self.assertIsNone(info["num_classes"])  # no manifest in converted ImageNet

    # --- errors --------------------------------------------------------------------------------
    def test_missing_directory_and_missing_files_say_what_to_do(self):
        with self.assertRaisesRegex(ip.DataError, "does not exist.*make_embedded_data.py"):
            ip.make_dataset(os.path.join(self.root, "nowhere"), "train", 2)
        empty = os.path.join(self.root, "empty")
        os.makedirs(empty, exist_ok=True)
        with self.assertRaisesRegex(ip.DataError, "no train files matching .*train-"):
            ip.make_dataset(empty, "train", 2)
        with self.assertRaisesRegex(ValueError, "split must be one of"):
            ip.make_dataset(self.many, "test", 2)

    def test_corrupted_records_name_the_file(self):
        good = example(self.photos[0], 1)
        cases = {
            "not_an_example": b"\x00garbage that is not a protobuf\xff" * 3,
            "not_a_jpeg": example(b"GIF89a not a jpeg at all", 1),
            "truncated_jpeg": example(self.photos[0][:300], 1),
        }
        for name, bad in cases.items():
            with self.subTest(case=name):
                d = self.bad_dir(name, [bad, good])
                with self.assertRaisesRegex(ip.DataError, f"record 0 of .*{name}.*re-create"):
                    ip.make_dataset(d, "train", 2)
        # A file that is not TFRecord framing at all (bit rot, a stray file).
        d = os.path.join(self.root, "not_tfrecord")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "train-00000-of-00001"), "wb") as f:
            f.write(b"this is not a TFRecord file" * 10)
        with self.assertRaisesRegex(ip.DataError, "not_tfrecord.*is corrupted"):
            ip.make_dataset(d, "train", 2)
        with self.assertRaisesRegex(ip.DataError, "not_tfrecord"):
            ip.count_records(ip.list_files(d, "train"))

    def test_a_record_damaged_mid_epoch_stops_in_words_naming_the_file(self):
        """Issue 61: a file whose later record's bytes rotted (its CRC fails) passes the eager
        check of the first record; reading on, the job stops with one line naming the file."""
        good = example(self.photos[0], 1)
        d = self.bad_dir("rotted_later", [good] * 4)
        path = ip.list_files(d, "train")[0]
        with open(path, "r+b") as f:  # a byte in the third record's payload
            size = os.path.getsize(path)
            f.seek(size - size // 4)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0xFF]))
        ds = ip.make_dataset(d, "train", 1, repeat=False, image_size=8)
        with self.assertRaisesRegex(ip.DataError, r"a record file is damaged \(.*\): "
                                                  r".*rotted_later/train-00000-of-00001; "
                                                  r"re-create .*--resume=auto"):
            with ip.data_errors_in_words():
                list(ds)

    def test_labels_out_of_range(self):
        d = self.bad_dir("label_1001", [example(self.photos[0], 1001)])
        with self.assertRaisesRegex(ip.DataError, "label 1001.*label_offset"):
            ip.make_dataset(d, "train", 2)  # 1000 after the offset: one past the last class
        d0 = self.bad_dir("label_zero", [example(self.photos[0], 0)])
        with self.assertRaisesRegex(ip.DataError, "label 0, which is -1"):
            ip.make_dataset(d0, "train", 2)  # 0-based data read with the 1-based default
        self.assertLen(list(ip.make_dataset(d0, "train", 1, label_offset=0, repeat=False)), 1)
        # Past the eagerly checked records, the graph check stops with the file named.
        ds = ip.make_dataset(self.few, "validation", 4, num_classes=3, validate_records=0,
                             image_size=8)
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError,
                                    "(?s)Label out of range.*validation-0000"):
            list(ds)

    # --- the embedded set ----------------------------------------------------------------------
    def test_tiny_embedded_set_reads_through_the_pipeline(self):
        out = os.path.join(self.root, "embedded")
        spec = embedded_data.EmbeddedSpec(image_size=32, num_train=24, num_validation=10,
                                          train_shards=3, validation_shards=2, seed=5)
        result = embedded_data.generate(out, spec, processes=1)
        self.assertTrue(result.generated)
        self.assertEqual(ip.describe(out), {
            "data_dir": out, "num_classes": 10,
            "splits": {"train": {"files": 3, "records": 24},
                       "validation": {"files": 2, "records": 10}}})
        self.assertEqual(ip.num_examples(out, "train"), 24)
        ds = ip.make_dataset(out, "validation", 4, image_size=32, num_classes=10)
        labels = labels_of(ds)
        self.assertLen(labels, 10)
        self.assertTrue(all(0 <= v < 10 for v in labels))
        images, _ = next(iter(ip.make_dataset(out, "train", 8, image_size=32, num_classes=10)))
        self.assertEqual(images.shape, (8, 32, 32, 3))
        raw = next(iter(tf.data.TFRecordDataset(ip.list_files(out, "train")[0])))
        parsed = tf.train.Example.FromString(raw.numpy()).features.feature
        self.assertEqual(parsed["image/height"].int64_list.value[0], 32)
        self.assertIn(b" ", parsed["image/class/text"].bytes_list.value[0])

        # Idempotent: same spec, nothing rewritten; same seed, same bytes.
        path = ip.list_files(out, "train")[0]
        before = (os.path.getmtime(path), open(path, "rb").read())
        again = embedded_data.generate(out, spec, processes=1)
        self.assertFalse(again.generated)
        self.assertEqual(os.path.getmtime(path), before[0])
        embedded_data.generate(out, spec, processes=1, force=True)
        self.assertEqual(open(path, "rb").read(), before[1])
        # Never overwrite record files it did not write.
        with self.assertRaisesRegex(embedded_data.EmbeddedDataError, "did not write"):
            embedded_data.generate(self.few, spec, processes=1)


class AffineTransformTest(tf.test.TestCase):
    """ip.affine_transform: the rotation and shear without tensorflow-addons (the current
    stack's path, ImageProjectiveTransformV3 called directly) against tfa.image.transform."""

    def images(self):
        """Random and photo content, several dtypes, odd and non-square sizes, one channel."""
        rng = np.random.RandomState(0)
        photo = tf.io.decode_jpeg(PHOTOS[0], channels=3)
        photo = tf.cast(tf.image.resize(photo, [37, 29]), tf.uint8).numpy()
        return {
            "photo uint8 37x29": photo,
            "photo float32 37x29": photo.astype(np.float32) / 255.0,
            "uint8 33x33": rng.randint(0, 256, (33, 33, 3)).astype(np.uint8),
            "float32 7x11": rng.uniform(-1, 2, (7, 11, 3)).astype(np.float32),
            "float64 9x5x1": rng.normal(size=(9, 5, 1)),
            "float16 15x15": rng.uniform(0, 1, (15, 15, 3)).astype(np.float16),
            "int32 5x1x2": rng.randint(-1000, 1000, (5, 1, 2)).astype(np.int32),
        }

    @staticmethod
    def matrices(size):
        degrees = np.pi / 180
        cases = [(0, 0, 0), (10 * degrees, 0, 0), (-10 * degrees, 0.1, -0.1),
                 (3 * degrees, -0.07, 0.02), (45 * degrees, 0.3, 0.0), (90 * degrees, 0, 0),
                 (180 * degrees, 0, 0.5), (1.0, -0.5, 0.25)]
        out = [ip._affine_matrix(tf.constant(a, tf.float32), tf.constant(x, tf.float32),
                                 tf.constant(y, tf.float32), size) for a, x, y in cases]
        out.append(tf.constant([1.1, 0.2, -3.5, -0.1, 0.9, 2.25, 0.01, -0.02]))  # projective
        return out

    def assertSameBits(self, got, want, msg=None):
        got, want = np.asarray(got), np.asarray(want)
        self.assertEqual((got.dtype, got.shape), (want.dtype, want.shape), msg)
        self.assertAllEqual(got, want, msg)
        self.assertEqual(got.tobytes(), want.tobytes(), msg)  # also -0.0 against 0.0

    # --- both stacks ---------------------------------------------------------------------------
    def test_op_path_geometry(self):
        image = np.random.RandomState(1).uniform(0, 1, (9, 13, 3)).astype(np.float32)
        same = ip.affine_transform(image, ip._affine_matrix(0.0, 0.0, 0.0, 9), use_addons=False)
        self.assertSameBits(same, image)
        # output (x, y) reads input (x + 3, y - 2): beyond the edges, reflected about the last
        # pixel (d c b a | a b c d | d c b a), numpy's 'symmetric'
        shifted = ip.affine_transform(image, [1, 0, 3, 0, 1, -2, 0, 0], use_addons=False)
        padded = np.pad(image, [(2, 0), (0, 3), (0, 0)], mode="symmetric")
        self.assertAllEqual(shifted, padded[:9, 3:])
        # half a turn about the centre of an odd-sized square: both axes reversed (up to
        # float32's cos(pi) and sin(pi), which put the samples a hair off the pixels)
        square = image[:9, :9]
        turned = ip.affine_transform(square, ip._affine_matrix(np.pi, 0.0, 0.0, 9),
                                     use_addons=False)
        self.assertAllClose(turned, square[::-1, ::-1], atol=1e-5)
        square = (square * 255).astype(np.uint8)
        uint8 = ip.affine_transform(square, [1, 0, 3, 0, 1, -2, 0, 0], use_addons=False)
        self.assertEqual((uint8.dtype, uint8.shape), (tf.uint8, (9, 9, 3)))
        self.assertAllEqual(uint8, np.pad(square, [(2, 0), (0, 3), (0, 0)], "symmetric")[:9, 3:])
        # the stack's own choice (tensorflow-addons on the classic stack, the op on the current
        # one) gives the same pixels
        matrix = ip._affine_matrix(0.1, 0.05, -0.08, 9)
        self.assertSameBits(ip.affine_transform(image, matrix),
                            ip.affine_transform(image, matrix, use_addons=False))

    # --- tensorflow-addons against the op --------------------------------------------------------
    @unittest.skipIf(stack.KERAS_3, "tensorflow-addons is not on the current stack (its last "
                     "release, 0.23, supports TensorFlow < 2.16): the classic stack compares")
    def test_same_pixels_as_tensorflow_addons(self):
        for name, image in self.images().items():
            for k, matrix in enumerate(self.matrices(image.shape[0])):
                with self.subTest(image=name, matrix=k):
                    want = ip.affine_transform(image, matrix, use_addons=True)
                    got = ip.affine_transform(image, matrix, use_addons=False)
                    self.assertSameBits(got, want)
                    self.assertFalse(k and np.array_equal(got, image) and image.shape[1] > 1,
                                     "the transform did nothing")

    @unittest.skipIf(stack.KERAS_3, "tensorflow-addons is not on the current stack (its last "
                     "release, 0.23, supports TensorFlow < 2.16): the classic stack compares")
    def test_training_images_are_the_same_with_either_path(self):
        # preprocess_for_train with its own seeded matrices, traced in a tf.data map as in
        # make_dataset, once through tensorflow-addons and once through the op
        photos = tf.constant(PHOTOS)
        configs = {"rotate": ip.AugmentConfig.from_names("rotate"),
                   "strong rotate,distort": ip.AugmentConfig.from_names(
                       "rotate,distort", max_rotation_degrees=30.0, max_shear=0.3),
                   "all": ip.AugmentConfig()}

        def train_images(config, use_addons):
            transform = ip.affine_transform
            with mock.patch.object(ip, "affine_transform",
                                   lambda i, m: transform(i, m, use_addons=use_addons)):
                ds = tf.data.Dataset.range(8).map(lambda i: ip.preprocess_for_train(
                    photos[i % len(PHOTOS)], 29, tf.stack([i, 3]), config))
            return np.stack(list(ds.as_numpy_iterator()))

        for name, config in configs.items():
            with self.subTest(config=name):
                self.assertSameBits(train_images(config, False), train_images(config, True))


if __name__ == "__main__":
    tf.test.main()
