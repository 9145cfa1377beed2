"""`hvd.elastic` of `import tftorus.keras as hvd`: Horovod's Keras elastic API, on each stack its
own way: tftorus/reliability/keras_elastic_on_horovod.py on the classic stack (the torus re-formed
on every
reset), tftorus/reliability/keras_elastic_on_tf_engine.py on the current one (a world that keeps
its size)."""
from tftorus.runtime import stack

if stack.HOROVOD:
    from tftorus.reliability.keras_elastic_on_horovod import (CommitStateCallback,  # noqa: F401
                                                              KerasState, TensorFlowKerasState,
                                                              UpdateBatchStateCallback,
                                                              UpdateEpochStateCallback, run)
else:
    from tftorus.reliability.keras_elastic_on_tf_engine import (CommitStateCallback,  # noqa: F401
                                                              KerasState, TensorFlowKerasState,
                                                              UpdateBatchStateCallback,
                                                              UpdateEpochStateCallback, run)
    from tftorus.on_ray import ray_train_keeper
    from tftorus.reliability import commit_keeper
    commit_keeper.add_finder(ray_train_keeper.find)  # commits as Ray Train checkpoints there

del stack
__all__ = ["KerasState", "CommitStateCallback", "UpdateBatchStateCallback",
           "UpdateEpochStateCallback", "run"]
