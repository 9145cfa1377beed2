"""N = 4 workers at per-worker batch b train to the same weights as one process at batch 4b.

The model has no batch statistics and the loss is a batch mean, so averaging the four
workers' gradients must give the one-process gradient; 20 steps of SGD with momentum then
agree to float32 round-off. Covered: model.fit with Keras 2.15's new and legacy optimizers,
a custom loop with DistributedGradientTape, backward_passes_per_step=2, and mixed precision
(LossScaleOptimizer around ours), plus save and reload of a model with the optimizer. The same
checks run on the tf engine (TensorFlow's collective ops), as TF_CONFIG processes without any
Horovod runtime and under horovodrun, and the two engines must agree with each other.

One launch trains every mode (one process; four workers inside the four-rank world that other
checks share, tests/harness.four_rank_suite): the tests read their own mode's
weights and lines from it.
"""
import os
import tempfile

import numpy as np
import tensorflow as tf

from tests import harness

RTOL = 1e-5  # per variable: max |difference| / max |weight|


MODES = harness.EQUIVALENCE_MODES  # every mode, one launch per world and engine


def load(directory, rank):
    with np.load(os.path.join(directory, f"rank{rank}.npz")) as f:
        return [f[k] for k in sorted(f.files, key=lambda k: int(k.split("_")[1]))]


def launch(modes, np_, engine="horovod", launcher="horovodrun", algorithm=""):
    """One job training every mode in `modes`: (its output directory, its result). Shared by the
    tests that read the same job (tests/harness.shared). algorithm: '' for the default."""
    # Two of these jobs run inside the four-rank worlds that other checks share
    if (modes, np_, engine, launcher, algorithm) == (MODES, 4, "horovod", "horovodrun", ""):
        return harness.four_rank_suite()
    if (modes, np_, engine, launcher, algorithm) == ("tape", 4, "tf", "horovodrun", ""):
        return harness.four_rank_tf_suite()

    def start():
        out = tempfile.mkdtemp(prefix=f"tftorus-eq-{np_}-{engine}-{launcher}-")
        argv = [harness.worker("train_equivalence.py"), modes, out]
        env = {"TFTORUS_ENGINE": engine, "TFTORUS_ALGORITHM": algorithm}
        if launcher == "tf_config":
            return out, harness.run_tf_config(argv, np=np_, timeout=400, env=env)
        return out, harness.run(argv, np=np_, timeout=400, env=env)
    return harness.shared(("train_equivalence", modes, np_, engine, launcher, algorithm), start)


class TrainingEquivalenceTest(tf.test.TestCase):

    def job(self, mode, modes, np_, engine="horovod", launcher="horovodrun", algorithm=""):
        """The shared job's directory and result, once `mode` finished on every rank (so a
        failure names the mode that failed; test_fit_... checks that the whole job ended
        cleanly)."""
        out, result = launch(modes, np_, engine, launcher, algorithm)
        for rank in range(max(np_, 1)):
            self.assertIn(f"[{mode}] rank {rank}/{max(np_, 1)} done", result.output,
                          f"mode {mode}, {np_ or 1} process(es): " + harness.describe(result))
        return out, result

    def run_both(self, mode, engine="horovod", launcher="horovodrun", modes=MODES, algorithm=""):
        """The one-process reference (no reduction at all, so either engine's) and rank 0 of
        four workers; every worker must hold exactly rank 0's weights."""
        single, _ = self.job(mode, MODES, 0)
        multi, result = self.job(mode, modes, 4, engine, launcher, algorithm)
        reference = load(os.path.join(single, mode), 0)
        ranks = [load(os.path.join(multi, mode), r) for r in range(4)]
        for r in range(1, 4):
            for a, b in zip(ranks[0], ranks[r]):
                self.assertAllEqual(a, b, msg=f"{mode}: rank {r} diverged from rank 0")
        return reference, ranks[0], result

    def assert_equivalent(self, reference, got):
        self.assertEqual(len(reference), len(got))
        for i, (a, b) in enumerate(zip(reference, got)):
            rel = np.max(np.abs(a - b)) / np.max(np.abs(a))
            self.assertLess(rel, RTOL, f"variable {i}: relative difference {rel:.2e}")
        moved = max(np.max(np.abs(a)) for a in reference)
        self.assertGreater(moved, 0.0)

    def test_fit_new_keras_optimizer_and_reload(self):
        reference, got, result = self.run_both("fit")
        self.assert_equivalent(reference, got)
        for modes, np_ in ((MODES, 0), (MODES, 4)):  # every mode's job ended cleanly
            result_of_job = launch(modes, np_)[1]
            self.assertEqual(result_of_job.returncode, 0, harness.describe(result_of_job))
        self.assertIn("[fit] optimizer class: SGD", result.output)  # class name kept for saving
        self.assertIn("[fit] reloaded optimizer: SGD, torus: True", result.output)

    def test_fit_legacy_optimizer(self):
        self.assert_equivalent(*self.run_both("fit_legacy")[:2])

    def test_custom_loop_gradient_tape(self):
        self.assert_equivalent(*self.run_both("tape")[:2])

    def test_backward_passes_per_step(self):
        self.assert_equivalent(*self.run_both("accumulate")[:2])

    def test_mixed_precision_loss_scale_optimizer(self):
        # FP16 arithmetic at batch 8 and at batch 32 differs (one process in mixed precision is
        # 0.07 away from FP32 here), so only agreement between workers is exact; the distance to
        # the one-process run must stay within that FP16 band.
        reference, got, result = self.run_both("mixed")
        self.assertIn("[mixed] optimizer class: LossScaleOptimizerV3/SGD", result.output)
        for a, b in zip(reference, got):
            self.assertAllClose(a, b, atol=0.15, rtol=0)

    def test_tf_engine_fit_without_horovod_and_engines_agree(self):
        # TF_CONFIG processes: no Horovod runtime at all, Horovod's wrapper around our reduction.
        # The same algorithm on both (the torus): 'auto' would take each engine's own all-reduce
        # on this one host, whose sums round differently.
        reference, tf_engine, result = self.run_both("fit", engine="tf", launcher="tf_config",
                                                     modes="fit", algorithm="torus")
        self.assert_equivalent(reference, tf_engine)
        self.assertIn("[fit] optimizer class: SGD", result.output)
        _, horovod_engine, _ = self.run_both("fit", modes="fit", algorithm="torus")
        for i, (a, b) in enumerate(zip(horovod_engine, tf_engine)):
            rel = np.max(np.abs(a - b)) / np.max(np.abs(a))
            self.assertLess(rel, 1e-6, f"variable {i}: engines differ by {rel:.2e}")

    def test_tf_engine_tape_under_horovodrun(self):
        self.assert_equivalent(*self.run_both("tape", engine="tf", modes="tape")[:2])


if __name__ == "__main__":
    tf.test.main()
