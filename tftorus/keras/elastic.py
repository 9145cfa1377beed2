"""`hvd.elastic` of `import tftorus.keras as hvd`: Horovod's Keras elastic API, on each stack its
own way: tftorus/keras/elastic_horovod.py on the classic stack (the torus re-formed on every
reset), tftorus/keras3/elastic.py on the current one (a world that keeps its size)."""
from tftorus import stack

if stack.HOROVOD:
    from tftorus.keras.elastic_horovod import (  # noqa: F401
        CommitStateCallback, KerasState, TensorFlowKerasState, UpdateBatchStateCallback,
        UpdateEpochStateCallback, run)
else:
    from tftorus.keras3.elastic import (  # noqa: F401
        CommitStateCallback, KerasState, TensorFlowKerasState, UpdateBatchStateCallback,
        UpdateEpochStateCallback, run)

del stack
__all__ = ["KerasState", "CommitStateCallback", "UpdateBatchStateCallback",
           "UpdateEpochStateCallback", "run"]
