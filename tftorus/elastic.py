"""`hvd.elastic` of `import tftorus as hvd`: Horovod's elastic API, on each stack its own way.

Classic stack (Horovod installed): tftorus/elastic_horovod.py, Horovod's elastic training with
the torus re-formed on every reset of the world. Current stack (no Horovod):
tftorus/elastic_fixed_world.py, Horovod's states and run() over a world that keeps its size
(a lost worker ends the job, with the last commit kept).
"""
from tftorus import stack

if stack.HOROVOD:
    from tftorus.elastic_horovod import (  # noqa: F401
        HorovodInternalError, ObjectState, State, TensorFlowKerasState, TensorFlowState, run,
        run_fn)
else:
    from tftorus.elastic_fixed_world import (  # noqa: F401
        HorovodInternalError, ObjectState, State, TensorFlowKerasState, TensorFlowState, run,
        run_fn)

del stack
__all__ = ["run", "State", "ObjectState", "TensorFlowKerasState", "TensorFlowState"]
