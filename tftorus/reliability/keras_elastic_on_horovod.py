"""`hvd.elastic` of `import tftorus.keras as hvd` on the classic stack (tftorus/keras/elastic.py
chooses): Horovod's Keras elastic API over the torus.

KerasState is tftorus.elastic.TensorFlowKerasState for tf.keras (the optimizer's slots made on
every rank, the model's traced functions dropped on reset, so fit retraces for each world);
run() re-forms the torus on every reset. The callbacks are Horovod's own: they commit and count
batches and epochs, and touch no collective.

    state = hvd.elastic.KerasState(model, batch=0, epoch=0)

    @hvd.elastic.run
    def train(state):
        model.fit(..., epochs=total_epochs - state.epoch, callbacks=[
            hvd.elastic.CommitStateCallback(state), hvd.elastic.UpdateBatchStateCallback(state),
            hvd.elastic.UpdateEpochStateCallback(state)])
"""
import tensorflow as tf
from horovod.tensorflow.keras.elastic import (  # noqa: F401  Horovod's own, unchanged
    CommitStateCallback, UpdateBatchStateCallback, UpdateEpochStateCallback)

from tftorus.reliability.elastic_on_horovod import TensorFlowKerasState, run


class KerasState(TensorFlowKerasState):
    """`horovod.tensorflow.keras.elastic.KerasState`: a tf.keras model and its optimizer (the
    compiled one unless given), plus `kwargs` as attributes, committed and broadcast."""

    def __init__(self, model, optimizer=None, **kwargs):
        super().__init__(model, optimizer=optimizer, backend=tf.keras.backend, **kwargs)


__all__ = ["KerasState", "CommitStateCallback", "UpdateBatchStateCallback",
           "UpdateEpochStateCallback", "run"]
