"""tftorus on Ray, as `horovod.ray` is Horovod on Ray: change the import and keep the script.

    from tftorus.ray import RayExecutor      # was: from horovod.ray import RayExecutor

Needs Ray (`pip install 'tftorus[ray]'`). docs/guide/ray.md has the fixed and elastic jobs and
Ray Train's TensorflowTrainer.
"""
from tftorus.on_ray.executor import RayExecutor, Settings  # noqa: F401

__all__ = ["RayExecutor"]
