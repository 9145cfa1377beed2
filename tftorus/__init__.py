"""tftorus: the 2D-torus all-reduce of Mikami et al. (arXiv 1811.05233) as a Horovod drop-in.

    import tftorus as hvd            # in place of: import horovod.tensorflow as hvd
    import tftorus.keras as hvd      # in place of: import horovod.tensorflow.keras as hvd

Everything Horovod offers stays available under the same names; `init`,
`DistributedOptimizer`, `DistributedGradientTape` and `Compression` are tftorus' own.
`tftorus.world` has rank(), size(), barrier() and broadcast_variables() that also work on the
tf engine without a Horovod runtime (TF_CONFIG clusters).
"""
from horovod.tensorflow import *  # noqa: F401,F403  rank(), size(), broadcast_variables(), ...

from tftorus import world  # noqa: F401
from tftorus.compression import Compression  # noqa: F401  adds bf16 to Horovod's choices
from tftorus.context import init, shutdown  # noqa: F401
from tftorus.grid import PAPER_GRIDS, GridError, TorusGrid, plan_grid, resolve_grid  # noqa: F401
from tftorus.optimizer import DistributedGradientTape, torus_gradient_reduction  # noqa: F401
from tftorus.reduction import (SUPPORTED_DTYPES, TorusOptions, fused_allreduce,  # noqa: F401
                               gradient_reducer)
import horovod.tensorflow as _hvd_tf
from tftorus.optimizer import torus_gradient_reduction as _reduction


def DistributedOptimizer(optimizer, *args, algorithm="torus", grid=None,
                         fusion_threshold_bytes=128 * 1024 * 1024, check_consistency=True,
                         engine=None, **kwargs):
    """`horovod.tensorflow.DistributedOptimizer` (legacy TF optimizers and Keras ones),
    reducing over the torus. Torus options as in `tftorus.keras.DistributedOptimizer`."""
    with _reduction(TorusOptions(algorithm, grid, fusion_threshold_bytes, check_consistency,
                                 engine)):
        return _hvd_tf.DistributedOptimizer(optimizer, *args, **kwargs)


__version__ = "0.1.0"
