"""`hvd.elastic` of `import tftorus as hvd`: Horovod's elastic API, on each stack its own way.

Classic stack (Horovod installed): tftorus/reliability/elastic_on_horovod.py, Horovod's elastic
training with the torus re-formed on every reset of the world. Current stack (no Horovod):
tftorus/reliability/elastic_on_tf_engine.py, Horovod's states and run() over a world that keeps its
size (a lost worker ends the job, with the last commit kept).
"""
from tftorus.runtime import stack

if stack.HOROVOD:
    from tftorus.reliability.elastic_on_horovod import (HorovodInternalError,  # noqa: F401
                                                        ObjectState, State, TensorFlowKerasState,
                                                        TensorFlowState, run, run_fn)
else:
    from tftorus.reliability.elastic_on_tf_engine import (HorovodInternalError,  # noqa: F401
                                                        ObjectState, State, TensorFlowKerasState,
                                                        TensorFlowState, run, run_fn)
    from tftorus.on_ray import ray_train_keeper
    from tftorus.reliability import commit_keeper
    commit_keeper.add_finder(ray_train_keeper.find)  # commits as Ray Train checkpoints there

del stack
__all__ = ["run", "State", "ObjectState", "TensorFlowKerasState", "TensorFlowState"]
