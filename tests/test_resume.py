"""Checkpoints and resume (issue 6): atomic, verified checkpoints; a stopped and resumed run
equals an uninterrupted one; a new world size inside a phase refused (at a phase boundary:
tests/test_paper_scale.py); a foreign model_dir refused.

The multi-process tests run run_scripts/train.py under horovodrun (the current stack: tftorus'
local launcher) on a small generated set."""
import dataclasses
import errno
import json
import os
import shutil
import tempfile
from types import SimpleNamespace
from unittest import mock

import numpy as np
import tensorflow as tf

from flags.config import TrainConfig
from official_resnet.data import embedded_data
from official_resnet.model.keras_generation import KERAS
from official_resnet.run import checkpointing
from tests import harness

TRAIN, FLAGFILE = harness.TRAIN, harness.FLAGFILE
SPEC = embedded_data.EmbeddedSpec(num_train=1024, num_validation=128, train_shards=4,
                                  validation_shards=2)


def final_checkpoint(model_dir):
    found = checkpointing.latest_valid(model_dir)
    assert found, f"no valid checkpoint in {model_dir}"
    return found


def checkpoint_values(path):
    reader = tf.train.load_checkpoint(os.path.join(path, checkpointing.PREFIX))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
            if not name.startswith("_CHECKPOINTABLE_OBJECT_GRAPH")}


def history(model_dir):
    with open(os.path.join(model_dir, "history.jsonl")) as f:
        return [json.loads(line) for line in f]


class ResumeRunsTest(harness.EmbeddedDataCase, tf.test.TestCase):
    SPEC = SPEC
    """Real processes under horovodrun (the current stack: python -m tftorus.run)."""


    def train(self, model_dir, *flags, np_=2, timeout=420, bit_exact=False):
        args = [TRAIN, f"--flagfile={FLAGFILE}", f"--data_dir={self.data}",
                f"--model_dir={model_dir}", "--bn_stat_batches=1", *flags]
        # TensorFlow 2.21 on 2 workers: two identical runs differed in the last bits of a few
        # early-layer weights in 2 of 3 tries (a run alone, or two alone at once, never did;
        # with one intra-op thread per worker never): its CPU kernels' threading, with the
        # collectives overlapping the backward pass. Bit-for-bit comparisons take one thread.
        env = {"TF_NUM_INTRAOP_THREADS": "1"} if bit_exact and not harness.HOROVOD else None
        return harness.run_world(args, np_, timeout=timeout, env=env)  # horovodrun, tftorus.run

    FLAGS = ["--exp=2", "--epochs=2"]

    def stopped_copy(self, name):
        """A copy of one run of FLAGS stopped after epoch 1 (inside phase 2) on 2 workers, made
        once for the tests that resume it (each resumes its own copy)."""
        def stop():
            model_dir = os.path.join(self.tmp, "stopped-at-1")
            result = self.train(model_dir, *self.FLAGS, "--stop_at_epoch=1", bit_exact=True)
            return model_dir, result
        model_dir, result = harness.shared(("test_resume", self.tmp, "stopped at 1"), stop)
        self.assertEqual(result.returncode, 0, harness.describe(result))
        self.assertIn("stopping after epoch", result.output)
        copy = os.path.join(self.tmp, name)
        shutil.copytree(model_dir, copy)
        return copy

    def test_ranks_that_see_different_model_dirs_stop_before_restoring(self):
        """Issue 61: rank 0's model_dir holds the stopped run, rank 1's (per-host scratch) is
        empty. Before, rank 0 resumed at epoch 1 and rank 1 started afresh; now both stop
        before anything is restored or written, rank 1 naming what it sees."""
        shared = self.stopped_copy("seen-by-rank-0")
        scratch = os.path.join(self.tmp, "seen-by-rank-1")
        before = sorted(os.listdir(os.path.join(shared, "checkpoints")))
        with open(os.path.join(shared, "history.jsonl")) as f:
            history = f.read()
        workers = [f"127.0.0.1:{p}" for p in harness.free_ports(2)]
        result = harness.run_ranks(
            [harness.worker("train_with_env_model_dir.py"), f"--flagfile={FLAGFILE}",
             f"--data_dir={self.data}", "--bn_stat_batches=1", "--engine=tf", *self.FLAGS],
            2, lambda i: {"TFTORUS_TEST_MODEL_DIR": shared if i == 0 else scratch,
                          "TF_CONFIG": json.dumps({"cluster": {"worker": workers},
                                                   "task": {"type": "worker", "index": i}})},
            timeout=300)
        self.assertEqual(list(result.returncodes), [2, 2], harness.describe(result))
        self.assertRegex(result.output, r"error: rank 1 sees another run than rank 0: the "
                                        r"checkpoint to resume from: rank 0 epoch-0*1\.\d+ "
                                        r"\(epoch 1\.\d+, manifest [0-9a-f]+\), rank 1 none\. "
                                        r"Every worker must see the same --model_dir")
        self.assertIn("error: 1 worker(s) see another --model_dir or --data_dir than rank 0",
                      result.output)
        self.assertNotIn("resumed at epoch", result.output)
        self.assertEqual(sorted(os.listdir(os.path.join(shared, "checkpoints"))), before)
        with open(os.path.join(shared, "history.jsonl")) as f:
            self.assertEqual(f.read(), history)
        self.assertFalse(os.path.exists(os.path.join(scratch, "checkpoints")))

    def test_stop_and_resume_equals_uninterrupted(self):
        straight = os.path.join(self.tmp, "straight")
        result = self.train(straight, *self.FLAGS, bit_exact=True)
        self.assertEqual(result.returncode, 0, harness.describe(result))
        stopped = self.stopped_copy("stopped")
        _, state = final_checkpoint(stopped)
        self.assertLess(state.epoch, 1.1)
        self.assertEqual(state.phase, 1)  # inside phase 2: the input position matters
        self.assertFalse(state.phase_boundary)
        self.assertGreater(state.input_batches_in_phase, 0)
        with open(os.path.join(stopped, "config.json")) as f:
            config_before = f.read()
        result = self.train(stopped, *self.FLAGS, bit_exact=True)  # --resume=auto: the default
        self.assertEqual(result.returncode, 0, harness.describe(result))
        self.assertIn("resumed at epoch", result.output)
        with open(os.path.join(stopped, "config.json")) as f:  # a resume keeps the run's own
            self.assertEqual(f.read(), config_before)
        a_path, a_state = final_checkpoint(straight)
        b_path, b_state = final_checkpoint(stopped)
        for key in ("epoch", "samples_seen", "steps", "input_batches_in_phase"):
            self.assertEqual(getattr(a_state, key), getattr(b_state, key), key)
        a, b = checkpoint_values(a_path), checkpoint_values(b_path)
        self.assertEqual(sorted(a), sorted(b))
        differing = [n for n in a if not np.array_equal(a[n], b[n])]
        self.assertEqual(differing, [], "resumed weights differ from the uninterrupted run")
        self.assertEqual([h["epoch"] for h in history(straight)],
                         [h["epoch"] for h in history(stopped)])
        self.assertEqual([h["loss"] for h in history(straight)],
                         [h["loss"] for h in history(stopped)])

    # A new world size at a phase boundary: tests/test_paper_scale.py's PerPhaseWorkersTest
    # (each phase of Exp. 2 on its own count, the second resuming the first's boundary
    # checkpoint on 2 workers instead of 4: batch plan, momentum and LR checked per epoch).

    def test_new_world_size_inside_a_phase_is_refused(self):
        model_dir = self.stopped_copy("inside")
        listing = sorted(os.listdir(os.path.join(model_dir, "checkpoints")))
        result = self.train(model_dir, *self.FLAGS, np_=4, timeout=300)
        self.assertNotEqual(result.returncode, 0, harness.describe(result))  # the launcher's
        self.assertIn("error: checkpoint", result.output)
        self.assertNotIn("Traceback (most recent call last):\n  File \"" + TRAIN, result.output)
        self.assertIn("the world size may change only at a phase boundary", result.output)
        self.assertIn("phase-boundary checkpoint at epoch", result.output)
        self.assertIn("use 2 workers", result.output)
        self.assertEqual(sorted(os.listdir(os.path.join(model_dir, "checkpoints"))), listing)


class InputPositionTest(tf.test.TestCase):
    """skip_batches resumes a deterministic training dataset exactly where it was."""

    def test_skip_batches_continues_the_same_stream(self):
        from official_resnet.data import input_pipeline
        tmp = tempfile.mkdtemp(prefix="tftorus-skip-")
        try:
            spec = embedded_data.EmbeddedSpec(num_train=96, num_validation=16, train_shards=4,
                                              validation_shards=1)
            embedded_data.generate(tmp, spec, processes=1)

            def batches(skip, n):
                ds = input_pipeline.make_dataset(
                    tmp, "train", 16, image_size=32, num_workers=2, worker_index=1,
                    training=True, seed=3, num_classes=10, deterministic=True,
                    skip_batches=skip)
                return [b for b in ds.take(n).as_numpy_iterator()]

            tf.keras.utils.set_random_seed(0)
            full = batches(0, 7)  # past one pass over this worker's 48 records
            tf.keras.utils.set_random_seed(0)
            rest = batches(4, 3)
            for (xa, ya), (xb, yb) in zip(full[4:], rest):
                self.assertAllEqual(ya, yb)
                self.assertAllEqual(xa, xb)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


class CheckpointFilesTest(tf.test.TestCase):
    """One process, no training: the writer, the verifier and the start-up checks."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="tftorus-ckpt-")
        self.v = tf.Variable([1.0, 2.0, 3.0])
        self.ckpt = tf.train.Checkpoint(v=self.v)
        self.writer = checkpointing.CheckpointWriter(self.ckpt, self.dir, keep=2)

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def save(self, epoch, boundary=False):
        self.v.assign([epoch] * 3)
        return self.writer.save(checkpointing.CheckpointState(
            epoch=float(epoch), phase=0, phase_boundary=boundary, world_size=1, total_batch=8))

    def load_value(self, path):
        v = tf.Variable([0.0, 0.0, 0.0])
        checkpointing.restore(tf.train.Checkpoint(v=v), path)
        return v.numpy()[0]

    def test_latest_and_restore(self):
        self.save(1)
        path = self.save(2)
        found, state = checkpointing.latest_valid(self.dir)
        self.assertEqual((found, state.epoch), (path, 2.0))
        self.assertEqual(self.load_value(found), 2.0)
        with open(os.path.join(self.dir, "checkpoints", "latest")) as f:
            self.assertEqual(f.read().strip(), os.path.basename(path))

    def test_temporary_directory_is_never_loaded(self):
        good = self.save(1)
        tmp = os.path.join(self.dir, "checkpoints", ".tmp-epoch-0002.000-123")
        shutil.copytree(good, tmp)  # even a complete-looking one: it was never renamed
        self.assertEqual(checkpointing.latest_valid(self.dir)[0], good)
        with self.assertRaises(checkpointing.CheckpointError):
            checkpointing.verify(tmp)

    def test_truncated_file_falls_back_with_a_warning(self):
        good = self.save(1)
        bad = self.save(2)
        data = [n for n in os.listdir(bad) if n.startswith("ckpt.data")][0]
        with open(os.path.join(bad, data), "r+b") as f:
            f.truncate(4)
        with self.assertLogs(checkpointing.logger, "WARNING") as logs:
            found, state = checkpointing.latest_valid(self.dir)
        self.assertEqual((found, state.epoch), (good, 1.0))
        self.assertIn("truncated", "\n".join(logs.output))
        self.assertEqual(self.load_value(found), 1.0)

    def test_missing_or_bad_manifest_is_never_loaded(self):
        good = self.save(1)
        no_manifest = self.save(2)
        os.remove(os.path.join(no_manifest, "manifest.json"))
        bad_manifest = self.save(3)
        with open(os.path.join(bad_manifest, "manifest.json"), "w") as f:
            f.write('{"files": ')
        altered = self.save(4)
        with open(os.path.join(altered, "state.json"), "r+b") as f:
            f.seek(2)
            f.write(b"X")  # same size, different bytes
        with self.assertLogs(checkpointing.logger, "WARNING"):
            self.assertEqual(checkpointing.latest_valid(self.dir)[0], good)
        for path in (no_manifest, bad_manifest, altered):
            with self.assertRaises(checkpointing.CheckpointError):
                checkpointing.find_resume(path, self.dir)

    def test_state_has_a_version_and_a_newer_one_is_refused(self):
        path = self.save(1)
        with open(os.path.join(path, "state.json")) as f:
            saved = json.load(f)
        self.assertEqual(saved["format"], checkpointing.FORMAT_VERSION)
        self.assertEqual(checkpointing.CheckpointState.from_dict(saved),
                         checkpointing.verify(path))
        with self.assertRaisesRegex(checkpointing.CheckpointError,
                                    r"has format 2, newer than this code's 1: resume with the "
                                    r"version that wrote it"):
            checkpointing.CheckpointState.from_dict(dict(saved, format=2))
        with self.assertRaisesRegex(checkpointing.CheckpointError, "not a checkpoint state"):
            checkpointing.CheckpointState.from_dict({"epoch": 1.0})

    # Issue 61: retention and writes that cannot lose the last good checkpoint.
    def test_an_io_error_while_pruning_deletes_nothing(self):
        """A transient error reading an old phase boundary (EIO on NFS) kept it; before, any
        error reading its state.json deleted it."""
        boundary = self.save(1, boundary=True)
        self.save(2)
        real_open = open

        def flaky_open(path, *args, **kwargs):
            if str(path).startswith(boundary):
                raise OSError(errno.EIO, "Input/output error")
            return real_open(path, *args, **kwargs)
        with mock.patch("builtins.open", flaky_open), \
                self.assertLogs(checkpointing.logger, "WARNING") as logs:
            self.save(3)
            self.save(4)
        self.assertTrue(os.path.isdir(boundary))
        self.assertIn("cannot be read now", "\n".join(logs.output))

    def test_non_finite_weights_never_count_as_good(self):
        """--keep_checkpoints=1 and a NaN in the newest: the last finite one stays, and a
        resume takes it."""
        writer = checkpointing.CheckpointWriter(self.ckpt, self.dir, keep=1)
        self.v.assign([1.0, 1.0, 1.0])
        finite = writer.save(checkpointing.CheckpointState(epoch=1.0, phase=0, world_size=1,
                                                           total_batch=8))
        self.v.assign([float("nan"), 2.0, 2.0])
        with self.assertLogs(checkpointing.logger, "WARNING"):
            nan = writer.save(checkpointing.CheckpointState(epoch=2.0, phase=0, world_size=1,
                                                            total_batch=8))
            found = checkpointing.latest_valid(self.dir)
        self.assertTrue(os.path.isdir(finite) and os.path.isdir(nan))
        self.assertFalse(checkpointing.is_finite(nan))
        self.assertEqual(found[0], finite)

    def test_a_crash_between_the_two_renames_keeps_the_epoch(self):
        """A re-save of an epoch (after a fallback) that dies after moving the old copy aside
        and before the new one is in place: the old copy still resumes."""
        self.save(1)
        self.save(2)
        real_rename = os.rename

        def dies_on_the_second(src, dst):
            if os.path.basename(src).startswith(checkpointing.TMP_PREFIX):
                raise KeyboardInterrupt  # the process ends here
            return real_rename(src, dst)
        with mock.patch("os.rename", dies_on_the_second), self.assertRaises(KeyboardInterrupt):
            self.save(2)
        found, state = checkpointing.latest_valid(self.dir)
        self.assertEqual(state.epoch, 2.0)
        self.assertEqual(self.load_value(found), 2.0)
        path = self.save(2)  # the next save puts it back in place and clears the old copy
        self.assertEqual(checkpointing.latest_valid(self.dir)[0], path)
        self.assertEqual([os.path.basename(p) for p in checkpointing.list_checkpoints(self.dir)],
                         ["epoch-0001.000", "epoch-0002.000"])

    def test_a_second_job_on_the_model_dir_is_refused(self):
        """Rank 0 of a running job holds model_dir's lock (another process: a fork here); a
        second job's rank 0 is refused in one line naming the first."""
        ready_r, ready_w = os.pipe()
        done_r, done_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the first job
            try:
                held = checkpointing.ModelDirLock(self.dir)  # noqa: F841  (held till the exit)
                os.write(ready_w, b"x")
                os.read(done_r, 1)
            finally:
                os._exit(0)
        try:
            os.read(ready_r, 1)
            with self.assertRaisesRegex(checkpointing.CheckpointError,
                                        rf"in use by another job \(pid {pid} on .*\); give this "
                                        rf"one another --model_dir"):
                checkpointing.ModelDirLock(self.dir)
        finally:
            os.write(done_w, b"x")
            os.waitpid(pid, 0)
        checkpointing.ModelDirLock(self.dir).release()  # the first ended: free again

    def test_a_released_lock_leaves_the_model_dir_as_it_was(self):
        before = sorted(os.listdir(self.dir))
        checkpointing.ModelDirLock(self.dir).release()
        self.assertEqual(sorted(os.listdir(self.dir)), before)  # made by the job: gone again
        with open(os.path.join(self.dir, ".lock"), "w"):  # a crashed job's, say: kept, emptied
            pass
        lock = checkpointing.ModelDirLock(self.dir)
        with open(lock.path) as f:
            self.assertIn(f"pid {os.getpid()} on ", f.read())
        lock.release()
        self.assertEqual(os.path.getsize(os.path.join(self.dir, ".lock")), 0)

    def test_wrong_shaped_manifests_are_refused_not_crashed_on(self):
        good = self.save(1)
        for manifest in ('[]', '{"files": []}', '{"files": {"state.json": 3}}',
                         '{"files": {"../../etc/passwd": {"size": 1, "sha256": "x"}}}',
                         '{"files": {}, "finite": "yes"}', '[' * 5000 + ']' * 5000):
            with self.subTest(manifest=manifest[:40]):
                bad = self.save(2)
                with open(os.path.join(bad, "manifest.json"), "w") as f:
                    f.write(manifest)
                with self.assertRaises(checkpointing.CheckpointError):
                    checkpointing.verify(bad)
                with self.assertLogs(checkpointing.logger, "WARNING"):
                    self.assertEqual(checkpointing.latest_valid(self.dir)[0], good)
                shutil.rmtree(bad)

    def test_json_writes_leave_no_temporary_file(self):
        path = os.path.join(self.dir, "config.json")
        checkpointing.write_json_atomic(path, {"a": 1})
        self.assertEqual(os.listdir(self.dir), ["config.json"])

    def test_trim_history_after_a_fallback(self):
        path = os.path.join(self.dir, "history.jsonl")
        with open(path, "w") as f:
            f.write('{"epoch": 1.0}\n{"epoch": 2.0}\n{"epoch": 3.0}\n{"epo')
        self.assertEqual(checkpointing.trim_history(self.dir, 2.0), 2)
        with open(path) as f:
            self.assertEqual(f.read(), '{"epoch": 1.0}\n{"epoch": 2.0}\n')
        self.assertEqual(checkpointing.trim_history(self.dir, 2.0), 0)

    def test_resuming_an_older_checkpoint_sets_the_newer_ones_aside(self):
        old, newer = self.save(1), self.save(2)
        moved = checkpointing.set_aside_newer(self.dir, old)
        self.assertEqual(moved, [os.path.join(self.dir, "superseded", os.path.basename(newer))])
        self.assertEqual(checkpointing.latest_valid(self.dir)[0], old)  # auto never picks it
        self.assertEqual(self.load_value(moved[0]), 2.0)  # kept, still loadable by path
        self.assertEqual(checkpointing.set_aside_newer(self.dir, old), [])

    def test_a_new_world_size_only_at_a_phase_boundary(self):
        """check_world, as train.py calls it before restoring (ResumeRunsTest's refused launch
        runs it end to end): inside a phase another world size is refused, naming the last
        phase-boundary checkpoint and the old size; at the boundary, or as the same logical
        workers, it is taken."""
        phases = [SimpleNamespace(index=0, start_epoch=0, end_epoch=1, total_batch=8),
                  SimpleNamespace(index=1, start_epoch=1, end_epoch=3, total_batch=8)]

        def save(epoch, phase, boundary, **extra):
            return self.writer.save(checkpointing.CheckpointState(
                epoch=epoch, phase=phase, phase_boundary=boundary, world_size=2,
                total_batch=8, **extra))
        at_boundary = save(1.0, 0, True)
        inside = save(1.5, 1, False)
        state = checkpointing.verify(inside)
        checkpointing.check_world(state, inside, phases, 2, self.dir)  # the same size
        with self.assertRaises(checkpointing.CheckpointError) as refused:
            checkpointing.check_world(state, inside, phases, 4, self.dir)
        said = str(refused.exception)
        self.assertIn("is inside phase 2 (epochs 1-3) of a run on 2 workers", said)
        self.assertIn("the world size may change only at a phase boundary", said)
        self.assertIn(f"phase-boundary checkpoint at epoch 1.000 (--resume={at_boundary}) "
                      f"with 4 workers, or use 2 workers", said)
        boundary_state = checkpointing.verify(at_boundary)
        checkpointing.check_world(boundary_state, at_boundary, phases, 4, self.dir)
        logical = save(2.0, 1, False, logical_workers=4)
        checkpointing.check_world(checkpointing.verify(logical), logical, phases, 4, self.dir,
                                  logical_workers=4)  # each reads the same input as before

    def test_keeps_the_last_few_and_phase_boundaries(self):
        paths = [self.save(1), self.save(2, boundary=True), self.save(3), self.save(4),
                 self.save(5)]
        left = checkpointing.list_checkpoints(self.dir)
        self.assertEqual(left, [paths[1], paths[3], paths[4]])

    def test_optimizer_slots_and_loss_scale_round_trip(self):
        from official_resnet.optimizers.lars import LARS

        def make():
            model = tf.keras.Sequential([tf.keras.layers.Dense(3, input_shape=(4,))])
            lars = LARS(learning_rate=0.1, momentum=0.9, weight_decay=1e-4)
            opt = tf.keras.mixed_precision.LossScaleOptimizer(lars)
            steps = tf.Variable(0, dtype=tf.int64)
            return model, lars, opt, steps, tf.train.Checkpoint(model=model, optimizer=opt,
                                                                steps=steps)

        model, lars, opt, steps, ckpt = make()
        for _ in range(3):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(model(tf.ones([2, 4])) ** 2)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
        steps.assign(3)
        scale = opt.dynamic_scale if hasattr(opt, "dynamic_scale") else opt.loss_scale  # 3, 2
        scale.assign(1024.0) if hasattr(scale, "assign") else None
        path = checkpointing.CheckpointWriter(ckpt, self.dir).save(
            checkpointing.CheckpointState(epoch=1.0, phase=0, world_size=1, total_batch=2))
        model2, lars2, opt2, steps2, ckpt2 = make()
        checkpointing.restore(ckpt2, path, optimizers=[opt2],
                              variables=model2.trainable_variables)
        self.assertEqual(int(steps2.numpy()), 3)
        self.assertEqual(int(lars2.iterations.numpy()), int(lars.iterations.numpy()))
        self.assertEqual(KERAS.loss_scale(opt2), KERAS.loss_scale(opt))
        for v, v2 in zip(model.trainable_variables, model2.trainable_variables):
            self.assertAllEqual(v, v2)
            self.assertAllEqual(lars.velocity(v), lars2.velocity(v2))
            self.assertGreater(float(tf.reduce_sum(tf.abs(lars2.velocity(v2)))), 0.0)
        for a, b in zip(opt.variables, opt2.variables):  # every slot, the scale, iterations
            self.assertAllEqual(a, b)

    def test_a_checkpoint_of_the_other_keras_generation_is_refused(self):
        path = self.save(1)
        state = checkpointing.verify(path)
        with open(os.path.join(path, "state.json")) as f:
            saved = json.load(f)
        del saved["keras"]  # a checkpoint from before the field: Keras 2 wrote it
        self.assertEqual(checkpointing.CheckpointState.from_dict(saved).keras, 2)
        mine = dataclasses.replace(state, keras=KERAS.generation)
        checkpointing.check_generation(mine, path)  # its own: no error
        other = dataclasses.replace(state, keras=5 - KERAS.generation)
        with self.assertRaisesRegex(checkpointing.CheckpointError,
                                    f"checkpoint {path} was written by Keras {other.keras} .*"
                                    f"this is {KERAS.name} .*resume it on the stack that wrote "
                                    f"it \\(TFTORUS_STACK\\), or start a new run"):
            checkpointing.check_generation(other, path)

    def test_config_mismatch_names_the_flags_and_overwrites_nothing(self):
        config = {"exp": "2", "epochs": 3.0, "seed": 0, "depth": 14, "grid": "auto",
                  "engine": "horovod", "collective_timeout": 300.0, "model_dir": self.dir}
        path = os.path.join(self.dir, "config.json")
        checkpointing.write_json_atomic(path, config)
        self.save(1)
        with open(path, "rb") as f:
            before = f.read()
        listing = os.listdir(os.path.join(self.dir, "checkpoints"))
        may_differ = TrainConfig.may_differ_on_resume()
        self.assertTrue(checkpointing.check_config(self.dir, dict(config), may_differ))
        # communication settings and timeouts may differ
        self.assertTrue(checkpointing.check_config(
            self.dir, dict(config, grid="1x2", engine="tf", collective_timeout=5.0), may_differ))
        with self.assertRaises(checkpointing.CheckpointError) as error:
            checkpointing.check_config(self.dir, dict(config, epochs=2.0, seed=1, grid="1x2"),
                                       may_differ)
        message = str(error.exception)
        self.assertIn("--epochs=3.0 there, 2.0 now", message)
        self.assertIn("--seed", message)
        self.assertNotIn("--grid", message)
        with open(path, "rb") as f:
            self.assertEqual(f.read(), before)
        self.assertEqual(os.listdir(os.path.join(self.dir, "checkpoints")), listing)

    def test_another_runs_checkpoint_is_checked_against_its_configuration(self):
        """Issue 61: --resume=PATH of another run skipped the configuration check."""
        config = {"exp": "2", "epochs": 3.0, "seed": 0, "grid": "auto"}
        checkpointing.write_json_atomic(os.path.join(self.dir, "config.json"), config)
        theirs = self.save(1)
        here = tempfile.mkdtemp(prefix="tftorus-here-")
        self.addCleanup(shutil.rmtree, here, ignore_errors=True)
        may_differ = TrainConfig.may_differ_on_resume()
        checkpointing.check_resume_path(theirs, here, dict(config), may_differ)  # same: taken
        with self.assertRaisesRegex(checkpointing.CheckpointError,
                                    r"--resume=.*epoch-0001.000: --model_dir=.* holds a run "
                                    r"with a different configuration \(--seed=0 there, 1 now"):
            checkpointing.check_resume_path(theirs, here, dict(config, seed=1), may_differ)
        lone = os.path.join(here, "lone-copy")
        shutil.copytree(theirs, os.path.join(lone, "checkpoints", "epoch-0001.000"))
        with self.assertRaisesRegex(checkpointing.CheckpointError, "cannot be checked"):
            checkpointing.check_resume_path(os.path.join(lone, "checkpoints", "epoch-0001.000"),
                                            here, dict(config), may_differ)
        for text in ("[1, 2]", "[" * 5000):
            with open(os.path.join(self.dir, "config.json"), "w") as f:
                f.write(text)
            with self.assertRaises(checkpointing.CheckpointError):
                checkpointing.check_config(self.dir, dict(config), may_differ)


class ConfigMismatchScriptTest(tf.test.TestCase):
    """train.py itself: a foreign model_dir fails at start and nothing there changes."""

    def test_train_script_refuses_a_different_configuration(self):
        model_dir = tempfile.mkdtemp(prefix="tftorus-mismatch-")
        try:
            config = {"exp": "2", "epochs": 5.0, "seed": 7, "depth": 14}
            checkpointing.write_json_atomic(os.path.join(model_dir, "config.json"), config)
            with open(os.path.join(model_dir, "config.json"), "rb") as f:
                before = f.read()
            result = harness.run([TRAIN, f"--flagfile={FLAGFILE}", f"--model_dir={model_dir}",
                                  "--exp=2", "--data_dir=/nonexistent"], timeout=120)
            self.assertEqual(result.returncode, 2, harness.describe(result))
            self.assertIn("holds a run with a different configuration", result.output)
            self.assertIn("--epochs=5.0 there, 3.0 now", result.output)
            self.assertIn("--seed=7 there, 0 now", result.output)
            with open(os.path.join(model_dir, "config.json"), "rb") as f:
                self.assertEqual(f.read(), before)
            self.assertEqual(os.listdir(model_dir), ["config.json"])
        finally:
            shutil.rmtree(model_dir, ignore_errors=True)


if __name__ == "__main__":
    tf.test.main()
