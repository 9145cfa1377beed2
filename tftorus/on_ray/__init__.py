"""tftorus on a Ray cluster: worker groups of Ray actors, one rank each, that run the tf engine
over TF_CONFIG (executor.py, Horovod's RayExecutor), and the driver side of elastic training,
which restarts the world as new processes and keeps its commits (elastic_driver.py,
commit_store.py). Ray is optional (`pip install 'tftorus[ray]'`); ray_module.py imports it.
Imports reliability and below; the public face is tftorus/ray/."""
