"""Issue 30: elastic training over the torus.

One real job under Horovod's elastic driver (tests/workers/elastic_fit.py through
tests/workers/elastic_driver.py, Gloo, one-slot hosts that are all this machine): it starts on
four workers (a 2 x 2 torus), one is SIGKILLed mid-epoch after a step it had not committed, the
other three roll back to the last commit and go on as a 1 x 3 torus, a fifth host appears and the
job goes on on four again. Its final weights must equal a float64 replay of the committed steps.
The world guard (a step traced for an earlier world refuses to run) is checked in-process.
"""
import json
import os
import re
import sys
import tempfile
from unittest import mock

import numpy as np
import tensorflow as tf

from tests import harness
from tftorus.engines import horovod_elastic_engine
from tftorus.runtime import process_state
from tftorus.torus.grid import GridError, TorusGrid

STEPS, KILL_AT, GROW_AFTER = 16, 4, 2


def run_elastic_job():
    """(workdir, Result) of the elastic job, once per test session."""
    def launch():
        work = tempfile.mkdtemp(prefix="tftorus-elastic-")
        with open(os.path.join(work, "hosts"), "w") as f:
            f.write("".join(f"elastic-host-{i}:1\n" for i in range(4)))
        discover = os.path.join(work, "discover.sh")
        with open(discover, "w") as f:
            f.write(f"#!/bin/sh\ncat {os.path.join(work, 'hosts')}\n")
        os.chmod(discover, 0o755)
        argv = [harness.worker("elastic_driver.py"), "--gloo", "-np", "4", "--min-np", "3",
                "--max-np", "4", "--host-discovery-script", discover,
                sys.executable, harness.worker("elastic_fit.py"), work, str(STEPS), str(KILL_AT),
                str(GROW_AFTER)]
        # Survivors of the killed worker wait for the peers still in a collective with it for
        # Gloo's timeout (30 s unless set) before they reset.
        return work, harness.run(argv, timeout=420, env={"HOROVOD_GLOO_TIMEOUT_SECONDS": "15"})
    return harness.shared("elastic_job", launch)


def float64_replay(initial, steps):
    """The committed steps on one process in float64: SGD with momentum on each step's whole
    global batch, which the workers' averaged gradients equal whatever the world size."""
    from tests.workers import elastic_fit as job
    model = job.build_model("float64")
    model.set_weights([w.astype(np.float64) for w in initial])
    optimizer = tf.keras.optimizers.SGD(job.LR, momentum=job.MOMENTUM)
    for step in steps:
        x, y = job.global_batch(step)
        with tf.GradientTape() as tape:
            loss = job.LOSS(y, model(x.astype(np.float64)))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                      model.trainable_variables))
    return model.get_weights()


class ElasticJobTest(tf.test.TestCase):

    def setUp(self):
        self.work, self.result = run_elastic_job()
        self.assertFalse(self.result.timed_out, harness.describe(self.result))
        self.assertEqual(self.result.returncode, 0, harness.describe(self.result))
        with open(os.path.join(self.work, "committed.jsonl")) as f:
            self.committed = [json.loads(line) for line in f]

    def test_four_then_three_on_a_grid_named_in_the_log_then_four(self):
        worlds = []  # (size, grid) of each run of consecutive committed steps
        for entry in self.committed:
            if not worlds or worlds[-1] != (entry["size"], entry["grid"]):
                worlds.append((entry["size"], entry["grid"]))
        self.assertEqual(worlds, [(4, "2x2"), (3, "1x3"), (4, "2x2")])
        out = self.result.output
        self.assertRegex(out, r"tftorus: world 1 \(elastic\): 4 ranks as a 2x2 torus")
        self.assertRegex(out, r"tftorus: world 2 \(elastic\): 3 ranks as a 1x3 torus .*was 4 "
                              r"ranks as 2x2; 3 is prime, so the torus is one row of 3")
        self.assertRegex(out, r"tftorus: world 3 \(elastic\): 4 ranks as a 2x2 torus .*was 3 "
                              r"ranks as 1x3")
        self.assertEqual(len(re.findall(r"exit with status code 137", out)), 1, out[-3000:])
        self.assertIn(f"elastic_fit: done, {STEPS} steps on 4 workers", out)

    def test_every_step_committed_once_and_weights_equal_a_float64_replay(self):
        steps = [entry["step"] for entry in self.committed]
        self.assertEqual(steps, list(range(STEPS)))  # none lost, none repeated
        with np.load(os.path.join(self.work, "initial.npz")) as f:
            initial = [f[k] for k in sorted(f.files, key=lambda k: int(k.split("_")[1]))]
        with np.load(os.path.join(self.work, "final.npz")) as f:
            final = [f[k] for k in sorted(f.files, key=lambda k: int(k.split("_")[1]))]
        expected = float64_replay(initial, steps)
        for got, want in zip(final, expected):
            self.assertAllClose(got, want, rtol=2e-5, atol=2e-6)
        # a step more or less would not pass: the replay of one step fewer is far off
        fewer = float64_replay(initial, steps[:-1])
        self.assertGreater(max(np.abs(a - b).max() for a, b in zip(fewer, expected)), 1e-3)


class GlobalSetCollectivesTest(tf.test.TestCase):
    """The collectives an elastic job runs on (no process sets) sum as over process sets."""

    def test_every_algorithm_and_grid_over_the_global_set_of_four_ranks(self):
        # in the four-rank world other tests share (tests/harness.FOUR_RANK_SUITE)
        failure = harness.suite_report(harness.four_rank_suite()[1], "global_set_check", 4,
                                       harness.FOUR_RANK_SUITE)
        self.assertFalse(failure, failure)


class GridOfANewWorldTest(tf.test.TestCase):
    """The grid each elastic world gets, and the log line that names it and says why."""

    def new_world(self, size, asked_grid=None, extra=(), homogeneous=True, before=None,
                  local_size=1):
        class Comm:
            rank = 0

        asked = process_state._Asked(asked_grid, list(extra), "alltoall")
        with mock.patch.object(process_state.hvd, "size", return_value=size), \
                mock.patch.object(process_state.hvd, "local_size", return_value=local_size), \
                mock.patch.object(process_state.hvd, "is_homogeneous", return_value=homogeneous), \
                mock.patch.object(horovod_elastic_engine, "GlobalSetCommunicator", Comm), \
                mock.patch.object(process_state, "_state", None), \
                self.assertLogs(process_state.logger, "INFO") as logs:
            state = process_state._start_elastic(asked, before)
        return state.grid, logs.output[-1]

    def test_grids_and_reasons(self):
        grid, line = self.new_world(4)
        self.assertEqual(str(grid), "2x2")
        self.assertRegex(line, r"world \d+ \(elastic\): 4 ranks as a 2x2 torus \(2 rows of 2\)")
        before = process_state._State(None, grid)
        grid, line = self.new_world(3, before=before)
        self.assertEqual(str(grid), "1x3")
        self.assertRegex(line, r"3 ranks as a 1x3 torus .*was 4 ranks as 2x2; 3 is prime, so "
                               r"the torus is one row of 3 \(a ring\)$")
        grid, line = self.new_world(6, asked_grid="2x2", extra=["4x1", "3x2"], before=before)
        self.assertEqual(str(grid), "2x3")
        self.assertRegex(line, r"the grid asked for does not fit \(.*\), so one was planned; "
                               r"extra grid '4x1' left out \(it does not fit 6 ranks\)$")
        grid, line = self.new_world(6, homogeneous=False, before=before, local_size=2)
        self.assertEqual(str(grid), "2x3")  # not 1x6, the grid of whole hosts of 2
        self.assertRegex(line, r"the hosts have unequal numbers of ranks, so rows are not "
                               r"fitted to hosts")

    def test_a_grid_that_does_not_fit_the_first_world_is_an_error(self):
        with self.assertRaisesRegex(GridError, "2x2"):
            self.new_world(6, asked_grid="2x2")

    def test_native_reduce_scatter_is_refused_with_the_reason(self):
        with self.assertRaisesRegex(ValueError, "'native' needs process sets"):
            process_state._start_elastic(process_state._Asked(None, [], "native"))


class WorldGuardTest(tf.test.TestCase):
    """A step traced for one world refuses to run in the next, with what to do instead."""

    def test_a_step_traced_before_a_reset_refuses_to_run_after_it(self):
        grid = TorusGrid(size=4, x=2)
        with mock.patch.object(process_state, "is_elastic", return_value=True), \
                mock.patch.object(process_state, "_generation", 7):

            @tf.function
            def step(x):
                with tf.control_dependencies([process_state.world_guard(4, grid)]):
                    return x + 1.0

            self.assertEqual(float(step(tf.constant(1.0))), 2.0)  # the world it was traced for
            process_state._new_generation()  # what reform() does when the world re-forms
            with self.assertRaisesRegex(tf.errors.InvalidArgumentError,
                                        r"traced for world 7 \(4 ranks, a 2x2 torus\), but the "
                                        r"world has re-formed since.*inside the function given "
                                        r"to hvd.elastic.run"):
                step(tf.constant(1.0))
        process_state._generation_variable = None

    def test_no_guard_outside_elastic_jobs(self):
        with mock.patch.dict(os.environ, {"HOROVOD_ELASTIC": "0"}):
            self.assertIsNone(process_state.world_guard(4, TorusGrid(size=4, x=2)))


if __name__ == "__main__":
    tf.test.main()
