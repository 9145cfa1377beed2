"""Values a worker's function sends to the driver, where an elastic RayExecutor.run(fn,
callbacks=[...]) calls every callback with each, in the order they came: Horovod's
`horovod.ray.ray_logger.log`, for progress reports (say, to Ray Tune) from inside the job.

As in Horovod, only the elastic executor has callbacks; elsewhere log() warns once and drops the
value. The values travel through the job's commit store (commit_store.py), which outlives every
world, so what a lost world logged before it was lost still arrives.
"""
import warnings

from tftorus.on_ray.ray_module import ray

_store = None
_warned = False


def configure(store) -> None:
    """Called in each worker of an elastic run before the user's function starts."""
    global _store
    _store = store


def log(info_dict) -> None:
    """Send `info_dict` (anything Ray can serialize) to the driver's callbacks."""
    global _warned
    if _store is not None:
        ray().get(_store.log.remote(info_dict))
    elif not _warned:
        _warned = True
        warnings.warn("tftorus.ray.ray_logger.log: no callbacks receive this: only an elastic "
                      "RayExecutor's run(fn, callbacks=[...]) has them (as in Horovod)")
