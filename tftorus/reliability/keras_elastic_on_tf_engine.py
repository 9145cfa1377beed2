"""`hvd.elastic` of `import tftorus.keras as hvd` on the current stack (Keras 3): KerasState and
Horovod's three Keras callbacks, used as with Horovod (docs/guide/reliability.md#elastic-training),
over a world that keeps its size (tftorus/reliability/elastic_on_tf_engine.py says why and what
happens when a worker is lost). Give fit the epochs still to run, `epochs=total - state.epoch`.
"""
import keras

from tftorus.reliability.elastic_on_tf_engine import TensorFlowKerasState, run  # noqa: F401


class KerasState(TensorFlowKerasState):
    """A Keras 3 model and its optimizer (the compiled one unless given), plus keyword
    attributes, committed in memory and synced from rank 0."""

    def __init__(self, model, optimizer=None, **kwargs):
        super().__init__(model, optimizer=optimizer, **kwargs)


class CommitStateCallback(keras.callbacks.Callback):
    """Commit the state every `batches_per_commit` batches and at every epoch's end."""

    def __init__(self, state, batches_per_commit: int = 1):
        super().__init__()
        if batches_per_commit < 1:
            raise ValueError(f"batches_per_commit must be >= 1, got {batches_per_commit}")
        self.state = state
        self.batches_per_commit = batches_per_commit
        self.batches_remaining = batches_per_commit

    def on_train_begin(self, logs=None):
        self.batches_remaining = self.batches_per_commit  # the same count on every rank

    def on_train_batch_end(self, batch, logs=None):
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.state.commit()
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch, logs=None):
        self.state.commit()


class UpdateBatchStateCallback(keras.callbacks.Callback):
    """Keep `state.batch` at the last finished batch of the epoch; 0 at an epoch's end."""

    def __init__(self, state):
        super().__init__()
        self.state = state

    def on_train_batch_end(self, batch, logs=None):
        self.state.batch = batch

    def on_epoch_end(self, epoch, logs=None):
        self.state.batch = 0


class UpdateEpochStateCallback(keras.callbacks.Callback):
    """Keep `state.epoch` at the number of epochs done across fit calls: the state's epoch when
    fit began plus Keras' epoch + 1. So give fit the epochs still to run (epochs=total -
    state.epoch) and no initial_epoch, which Keras would add again."""

    def __init__(self, state):
        super().__init__()
        self.state = state
        self.initial_epoch = state.epoch

    def on_train_begin(self, logs=None):
        self.initial_epoch = self.state.epoch

    def on_epoch_end(self, epoch, logs=None):
        self.state.epoch = self.initial_epoch + epoch + 1


__all__ = ["KerasState", "CommitStateCallback", "UpdateBatchStateCallback",
           "UpdateEpochStateCallback", "run"]
