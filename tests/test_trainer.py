"""The trainer as a library (official_resnet/run/trainer.py), in one process without horovodrun:
its plan of the job, its data, its callbacks and their order, and a fit that checkpoints and
a restore that gets back every variable and the run's clock."""
import os
import shutil
import tempfile

import numpy as np
import tensorflow as tf
from absl import flags as absl_flags
from absl.testing import flagsaver

from flags import config as flag_config
from official_resnet.data import embedded_data
from official_resnet.model.keras_generation import KERAS
from official_resnet.plan import batch_plan
from official_resnet.run import checkpointing, trainer
from official_resnet.run.callbacks import Evaluation, LRMomentumSchedule
from official_resnet.run.run_callbacks import (CheckpointSaver, EpochLogger, NonFiniteSteps,
                                               RunProgress, StopAtEpoch)
from official_resnet.run.workers import Workers
from tests import harness

SPEC = embedded_data.EmbeddedSpec(num_train=1024, num_validation=128, train_shards=4,
                                  validation_shards=2)


class TrainerTest(harness.EmbeddedDataCase, tf.test.TestCase):
    SPEC = SPEC

    def spec(self, *flags, model_dir=None):
        """The run specification train.py resolves from embedded.flags and `flags`."""
        flag_config.define_flags()
        absl_flags.FLAGS.mark_as_parsed()
        model_dir = model_dir or tempfile.mkdtemp(dir=self.tmp)
        with flagsaver.flagsaver():
            absl_flags.FLAGS(["train.py", f"--flagfile={harness.FLAGFILE}",
                              f"--data_dir={self.data}", f"--model_dir={model_dir}",
                              "--bn_stat_batches=1", *flags])
            return flag_config.resolve_run()

    def plan_job(self, spec):
        """The job on one worker, with the data's sizes read once beforehand, as train does."""
        return trainer.plan_job(spec, Workers(), trainer.sizes_without_reading(spec.config))

    def test_plan_of_a_job_on_one_worker(self):
        job = self.plan_job(self.spec("--exp=3", "--stop_at_epoch=2"))
        self.assertEqual(job.info, (1024, 128, 10))
        self.assertEqual([(p.workers, p.total_batch, p.steps_per_epoch) for p in job.plans],
                         [(1, 216, 4), (1, 256, 4)])
        self.assertEqual((job.resume_from, job.relaunch, job.stop_at_epoch), (None, None, 2.0))
        run = job.spec.to_dict(world_size=1)
        self.assertEqual([p["total_batch"] for p in run["phases"]], [216, 256])
        self.assertEqual((run["lr_scale"], run["momentum_reference_batch"]), (1 / 256, 128))

    def test_phases_on_other_world_sizes_are_for_a_relaunch(self):
        job = self.plan_job(self.spec("--exp=3", "--gpus_per_phase=1,2"))
        self.assertEqual((job.relaunch.index, job.relaunch.workers, job.stop_at_epoch),
                         (1, 2, 1.0))
        with self.assertRaisesRegex(batch_plan.PlanError,
                                    r"phase 1 of Exp. 3 runs on 2 workers \(--gpus_per_phase="
                                    r"2,1\); this job has 1: launch it with -np 2"):
            self.plan_job(self.spec("--exp=3", "--gpus_per_phase=2,1"))

    def test_resume_never_refuses_a_directory_with_checkpoints(self):
        model_dir = tempfile.mkdtemp(dir=self.tmp)
        os.makedirs(os.path.join(model_dir, "checkpoints", "epoch-0001.000"))
        with self.assertRaisesRegex(checkpointing.CheckpointError, "--resume=never but"):
            self.plan_job(self.spec("--resume=never", model_dir=model_dir))

    def test_data_is_deterministic_and_starts_at_its_position(self):
        job = self.plan_job(self.spec("--exp=2"))
        data = trainer.make_data(job)
        [segment] = batch_plan.fit_segments(job.plans, job.info.train_examples, 1.0)
        first = [x.numpy() for x, _ in data.train(segment, 0).take(3)]
        self.assertEqual(first[0].shape, (216, 32, 32, 3))
        resumed, _ = next(iter(data.train(segment, 2)))  # a resume two micro-batches in
        self.assertAllEqual(resumed, first[2])
        self.assertLen(list(data.bn_batches(216, 2, 0)), 2)
        images, labels = next(iter(data.validation()))
        self.assertEqual((images.shape[0], labels.shape[0]), (64, 64))

    def test_callbacks_run_in_the_order_their_data_flows(self):
        job = self.plan_job(self.spec("--exp=2"))
        state = trainer.new_run_state(job)
        [segment] = batch_plan.fit_segments(job.plans, job.info.train_examples,
                                            state.epoch_fraction)
        callbacks = trainer.make_callbacks(job, state, segment, 0, job.spec.schedule(),
                                           trainer.make_data(job), None, None)
        kinds = [type(c) for c in callbacks]
        at = kinds.index
        self.assertIs(kinds[0], RunProgress)  # the clock the others read
        self.assertLess(at(LRMomentumSchedule), at(EpochLogger))  # logs['lr'], ['momentum']
        self.assertLess(at(Evaluation), at(EpochLogger))  # logs['val_top1']
        self.assertLess(at(NonFiniteSteps), at(EpochLogger))  # the epoch's skipped steps
        self.assertLess(at(EpochLogger), at(CheckpointSaver))  # the epoch's clock
        self.assertIs(kinds[-1], StopAtEpoch)

    def test_fit_checkpoints_and_restore_gets_it_all_back(self):
        import tftorus
        tftorus.init()
        model_dir = tempfile.mkdtemp(dir=self.tmp)
        spec = self.spec("--exp=2", "--max_steps=2", "--depth=14", "--width=4",
                         model_dir=model_dir)
        job = self.plan_job(spec)
        tf.keras.utils.set_random_seed(0)
        model = trainer.build_model(spec.config, job.info)
        model.compile(optimizer=trainer.build_optimizer(spec.config))
        state = trainer.new_run_state(job)
        checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer,
                                         samples_seen=state.samples_seen, steps=state.steps)
        saver = checkpointing.CheckpointWriter(checkpoint, model_dir)
        complete = trainer.fit(job, model, state, spec.schedule(), trainer.make_data(job),
                               None, saver)
        self.assertTrue(complete)  # --max_steps ends the run
        self.assertEqual((int(state.steps.numpy()), int(state.samples_seen.numpy())), (2, 432))
        [epoch] = state.history
        self.assertIsNotNone(epoch.top1)  # the last epoch is evaluated

        resumed = self.plan_job(self.spec("--exp=2", "--depth=14", "--width=4",
                                          model_dir=model_dir))
        path, saved = resumed.resume_from
        self.assertEqual((saved.steps, saved.samples_seen, saved.phase), (2, 432, 0))
        self.assertAlmostEqual(saved.epoch, 2 / 4 * 216 / 216)  # 2 of 4 steps of epoch 1
        tf.keras.utils.set_random_seed(1)  # other initial weights: the restore must replace them
        model2 = trainer.build_model(spec.config, resumed.info)
        model2.compile(optimizer=trainer.build_optimizer(spec.config))
        state2 = trainer.new_run_state(resumed)
        self.assertEqual(state2.elapsed_before, saved.elapsed)
        trainer.restore(resumed, model2, tf.train.Checkpoint(
            model=model2, optimizer=model2.optimizer, samples_seen=state2.samples_seen,
            steps=state2.steps))
        self.assertEqual(int(state2.samples_seen.numpy()), 432)
        for a, b in zip(model.variables, model2.variables):
            self.assertAllEqual(a, b)
        # the optimizer's too, bit for bit: LARS' velocities, LR, momentum and iterations
        self.assertLen(model2.optimizer.variables, len(model.optimizer.variables))
        for a, b in zip(model.optimizer.variables, model2.optimizer.variables):
            self.assertAllEqual(a, b)
        self.assertEqual(int(model2.optimizer.iterations.numpy()), 2)
        self.assertEqual(saved.keras, KERAS.generation)


if __name__ == "__main__":
    tf.test.main()
