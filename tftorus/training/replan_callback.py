"""`ReplanCallback`: plan the gradients' all-reduce for the training step, from the step itself.

    import tftorus.keras as hvd
    model.fit(data, callbacks=[hvd.ReplanCallback(), ...])

After `after_steps` steps of the first epoch the callback calls tftorus.replan() on every rank
(the steps so far have clocked when each gradient was ready: tftorus/runtime/gradient_readiness.py)
and, where a gradient set got a profile, traces the train step again, now planned for the step:
buckets whose collectives the backward pass hides. Once per fit; nothing on one host, where nothing
is planned. A custom training loop does the same by hand: `tftorus.replan()`, then trace its
tf.function again.
"""
import tensorflow as tf

from tftorus.runtime import reduction


class ReplanCallback(tf.keras.callbacks.Callback):
    """Re-plans the all-reduce for the step once, after `after_steps` training steps."""

    def __init__(self, after_steps: int = 3):
        super().__init__()
        if not isinstance(after_steps, int) or isinstance(after_steps, bool) or after_steps < 2:
            raise ValueError(f"after_steps must be a whole number >= 2 (the first step traces "
                             f"and warms up), got {after_steps!r}")
        self.after_steps = after_steps
        self._seen = 0
        self.replanned = False

    def on_train_batch_end(self, batch, logs=None):
        self._seen += 1
        if self._seen != self.after_steps:
            return
        if reduction.replan():
            self.replanned = True
            self.model.make_train_function(force=True)  # the next step traces the new plan
