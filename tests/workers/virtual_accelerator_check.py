"""Worker: the virtual accelerator's gradients, all-reduced in model.fit by
tftorus.keras.DistributedOptimizer (op Average, Horovod's default), against NumPy
(tests/test_virtual_accelerator.py; python -m tftorus.run -np 2, the current stack's tf engine).

Every rank trains studies/virtual_accelerator.py's VirtualResNet50 of its own rank (zeros at
the start, so no broadcast) with SGD at learning rate 1 for STEPS steps of model.fit. After
each step every variable must have moved by exactly minus the mean over the ranks of
`expected_gradients(rank, step)` (the values are exact in float32 for two ranks), the ranks'
gradients differ (so a sum left local fails), and the step counter counts the steps. Prints
"virtual_accelerator_check: N checks, M failed"; exits 1 on any failure.
"""
import numpy as np

import tftorus.keras as hvd

hvd.init()
import keras  # noqa: E402  (after init: TF joins its cluster when its runtime starts)

import report  # noqa: E402
from studies import virtual_accelerator as va  # noqa: E402

RANK, N = hvd.rank(), hvd.size()
STEPS, BATCH = 3, 2
checks, failures = 0, []

model = va.VirtualResNet50(rank=RANK, step_seconds=0.05)
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(learning_rate=1.0)),
              loss="mse")


class CheckEachStep(keras.callbacks.Callback):
    """Each step's change of every variable against minus the ranks' mean gradient."""

    def __init__(self):
        super().__init__()
        self.before = [v.numpy() for v in model.trainable_variables]

    def on_train_batch_end(self, batch, logs=None):
        global checks
        after = [v.numpy() for v in model.trainable_variables]
        ranks = [va.expected_gradients(r, batch) for r in range(N)]
        for i, (b, a) in enumerate(zip(self.before, after)):
            checks += 1
            want = np.mean([g[i] for g in ranks], axis=0, dtype=np.float32)
            if not np.array_equal(b - a, want):
                failures.append(f"step {batch}: {model.trainable_variables[i].path} moved by "
                                f"{np.ravel(b - a)[:2]}, want {np.ravel(want)[:2]}")
        checks += 1
        if np.array_equal(ranks[0][0], ranks[-1][0]):
            failures.append("the ranks' gradients are equal: the check could not tell")
        self.before = after


model.fit(np.ones((STEPS * BATCH, 1), np.float32), np.zeros((STEPS * BATCH, 1), np.float32),
          batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[CheckEachStep()])
checks += 1
if model.steps_taken != STEPS:
    failures.append(f"the step counter is {model.steps_taken}, want {STEPS}")
report.finish(RANK, checks, failures, "virtual_accelerator_check: ")
