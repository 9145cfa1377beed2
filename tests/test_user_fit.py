"""A user's own Keras model on 3 workers, compiled with `tftorus.keras.DistributedOptimizer(SGD)`
and its own loss and metric, fit with Horovod's broadcast and metric-averaging callbacks and
`hvd.BatchSizeControl` (tests/workers/user_fit_accumulation.py), launched every way a user
would: under horovodrun (the classic stack), and without Horovod on the tf engine by TF_CONFIG,
tftorus' local launcher, Slurm's srun and Open MPI's mpirun (their variables set here as those
launchers set them). Each run's weights equal float64 NumPy of the same updates; fit logs the
user's metric; a saved model loads with Keras alone; a second fit starting inside a range keeps
its count; and the gradients are reduced after a LossScaleOptimizer's division and before
clipping."""
import json
import os
import sys
import tempfile

import numpy as np
import tensorflow as tf

from tests import harness
from tests.workers import user_fit_accumulation as user_fit

WORKERS = 3


def load(directory, rank):
    with np.load(os.path.join(directory, f"rank{rank}.npz")) as f:
        return [f[k] for k in sorted(f.files, key=lambda k: int(k.split("_")[1]))]


class UserFitCase(tf.test.TestCase):

    def check(self, result, out):
        self.assertEqual(result.returncode, 0, harness.describe(result))
        reference = user_fit.reference(WORKERS)
        order = user_fit.order_reference(WORKERS)
        logs = []
        for rank in range(WORKERS):
            got = load(out, rank)
            for i, (a, b) in enumerate(zip(reference, got)):
                rel = np.max(np.abs(a - b)) / np.max(np.abs(a))
                self.assertLess(rel, 1e-5, f"rank {rank}, variable {i}: {rel:.2e}")
            with open(os.path.join(out, f"rank{rank}.json")) as f:
                report = json.load(f)
            # updates per epoch: 8 of 1 micro-batch twice, 4 of 2, 2 of 4
            self.assertEqual([log["updates"] for log in report["logs"]], [8, 16, 20, 22])
            self.assertEqual([sorted(log) for log in report["logs"]],
                             [["epoch", "hit_rate", "loss", "updates"]] * 4)
            self.assertEqual((report["reloaded"], report["reloaded_weights_equal"]),
                             ("SGD", True))
            # reduced after the loss scale's division (else the FP16 wire overflows to inf)
            # and before clipping (else the mean would be of clipped gradients)
            self.assertAllClose(report["order_check"], order, rtol=1e-3)
            # traced as it is, not rewritten by AutoGraph (tftorus/runtime/plain_python.py);
            # the user's own step that calls tftorus still is (the hook's control)
            self.assertEqual(report["tftorus_converted"], [])
            self.assertEqual(report["user_converted"], ["__main__.main.<locals>.user_step"])
            self.assertAlmostEqual(report["user_step"], (WORKERS + 1) / 2)
            if report["averaged_metrics"]:
                logs.append([(log["loss"], log["hit_rate"]) for log in report["logs"]])
        for other in logs[1:]:  # MetricAverageCallback: every rank logs the world's metrics
            self.assertAllClose(other, logs[0], rtol=1e-6)


class HorovodLaunchTest(UserFitCase):
    """The classic stack: horovodrun, Horovod's engine and callbacks."""

    def test_horovodrun(self):
        out = tempfile.mkdtemp(prefix="tftorus-user-fit-")
        self.check(harness.run([harness.worker("user_fit_accumulation.py"), out], np=WORKERS,
                               timeout=300), out)


class LaunchWithoutHorovodTest(UserFitCase):
    """The tf engine, no Horovod runtime: both stacks (the current one has no other); srun's and
    mpirun's variables on the current one (tests/conftest.py's CURRENT_ONLY)."""

    def argv(self, out):
        return [harness.worker("user_fit_accumulation.py"), out]

    def test_tf_config(self):
        out = tempfile.mkdtemp(prefix="tftorus-user-fit-tf-")
        self.check(harness.run_tf_config(self.argv(out), np=WORKERS, timeout=300,
                                         env={"TFTORUS_ENGINE": "tf"}), out)

    def test_local_launcher(self):
        out = tempfile.mkdtemp(prefix="tftorus-user-fit-run-")
        result = harness.run(["-m", "tftorus.run", "-np", str(WORKERS), *self.argv(out)],
                             timeout=300, env={"TFTORUS_ENGINE": "tf"})
        self.check(result, out)
        for rank in range(WORKERS):  # each line prefixed with its rank
            self.assertIn(f"[{rank}] rank {rank}/{WORKERS} done", result.output)

    def test_slurm_srun_environment(self):
        out = tempfile.mkdtemp(prefix="tftorus-user-fit-slurm-")
        base = harness.free_port_base(WORKERS)  # ranks listen on base + local rank
        self.check(harness.run_ranks(self.argv(out), WORKERS, lambda rank: {
            "TFTORUS_ENGINE": "tf", "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank),
            "SLURM_NTASKS": str(WORKERS), "SLURM_STEP_NODELIST": "localhost",
            "SLURM_STEP_TASKS_PER_NODE": str(WORKERS), "TFTORUS_TF_PORT": str(base)},
            timeout=300), out)

    def test_open_mpi_mpirun_environment(self):
        out = tempfile.mkdtemp(prefix="tftorus-user-fit-mpirun-")
        base = harness.free_port_base(WORKERS)
        self.check(harness.run_ranks(self.argv(out), WORKERS, lambda rank: {
            "TFTORUS_ENGINE": "tf", "OMPI_COMM_WORLD_RANK": str(rank),
            "OMPI_COMM_WORLD_SIZE": str(WORKERS), "OMPI_COMM_WORLD_LOCAL_RANK": str(rank),
            "OMPI_COMM_WORLD_LOCAL_SIZE": str(WORKERS), "TFTORUS_TF_PORT": str(base)},
            timeout=300), out)


if __name__ == "__main__":
    sys.exit(tf.test.main())
