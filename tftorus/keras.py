"""`import tftorus.keras as hvd` in place of `import horovod.tensorflow.keras as hvd`.

Horovod's Keras API as it is (callbacks for broadcast, metric averaging and LR warm-up,
rank(), size(), ...), with the optimizer, load_model and init reducing over the 2D torus.
"""
from horovod.tensorflow.keras import *  # noqa: F401,F403
from horovod.tensorflow.keras import callbacks, elastic  # noqa: F401  Horovod's own, they fit

from tftorus.compression import Compression  # noqa: F401
from tftorus.context import init, shutdown  # noqa: F401
from tftorus.optimizer import DistributedOptimizer, load_model  # noqa: F401
