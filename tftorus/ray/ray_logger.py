"""`from tftorus.ray import ray_logger; ray_logger.log({...})` inside an elastic RayExecutor's
function, as with `horovod.ray.ray_logger`: each value reaches run()'s callbacks on the driver."""
from tftorus.on_ray.ray_logger import log  # noqa: F401

__all__ = ["log"]
