"""The trainer's phase handling on one worker: BN statistics over the phase's micro-batches, and
one traced step for phases that accumulate alike."""
import os
import tempfile

import tensorflow as tf

from official_resnet.batch_plan import PhasePlan
from official_resnet.bn_statistics import recompute_bn_statistics
from official_resnet.lars import LARS
from official_resnet.schedules import Schedule
from official_resnet.train_step import TrainStep, make_eval_step
from official_resnet.trainer import Trainer, World
from tests import test_nonfinite as one_worker  # its small BN model and batches


def phase(index, start, end, accumulation):
    return PhasePlan(index=index, workers=1, start_epoch=start, end_epoch=end, total_batch=8,
                     per_worker_batch=8, accumulation=accumulation,
                     micro_batch=8 // accumulation, steps_per_epoch=2)


def run(plans, model_dir, recompute=recompute_bn_statistics, train_step_type=TrainStep):
    """Train `plans` (2 steps of 8 per epoch) on the small model; returns the trainer."""
    model = one_worker.small_model()
    lars = LARS(learning_rate=0.0, momentum=0.9)
    batches = [one_worker.batch(i) for i in range(16)]
    data = (tf.stack([b[0] for b in batches]), tf.stack([b[1] for b in batches]))
    trainer = Trainer(
        model=model, optimizer=lars, lars=lars,
        train_step=train_step_type(model, lars, one_worker.identity_reduce, 4, 0.0),
        eval_step=make_eval_step(model), plans=plans,
        schedule=Schedule("B", total_epochs=plans[-1].end_epoch, lr_scale=0.01,
                          reference_batch=8),
        make_train_data=lambda plan: tf.data.Dataset.from_tensor_slices(data),
        make_eval_data=lambda: tf.data.Dataset.from_tensor_slices(one_worker.batch(99)).batch(8),
        recompute_bn=recompute, dataset_size=16, world=World(), model_dir=model_dir,
        bn_stat_batches=1)
    trainer.run()
    return trainer


class TrainerPhasesTest(tf.test.TestCase):

    def test_bn_statistics_are_recomputed_over_the_phases_micro_batches(self):
        """A step of k micro-batches normalises each alone in training; the statistics set
        before an evaluation come from micro-batches of the same size."""
        seen = []

        def recompute(model, batches, allreduce_sum):
            seen.extend(int(b.shape[0]) for b in batches)
            return recompute_bn_statistics(model, batches, allreduce_sum)

        with tempfile.TemporaryDirectory() as tmp:
            run([phase(0, 0.0, 1.0, accumulation=2)], os.path.join(tmp, "run"), recompute)
        self.assertEqual(seen, [4, 4])  # one training batch of 8, as its 2 micro-batches

    def test_phases_that_accumulate_alike_share_one_traced_step(self):
        builds = []

        class CountingStep(TrainStep):
            def build(self, accumulation):
                builds.append(accumulation)
                return super().build(accumulation)

        plans = [phase(0, 0.0, 1.0, 1), phase(1, 1.0, 2.0, 1), phase(2, 2.0, 3.0, 2)]
        with tempfile.TemporaryDirectory() as tmp:
            trainer = run(plans, os.path.join(tmp, "run"), train_step_type=CountingStep)
        self.assertEqual(builds, [1, 2])
        self.assertEqual([h.accumulation for h in trainer.history], [1, 1, 2])


if __name__ == "__main__":
    tf.test.main()
