"""Horovod's API where Horovod is not installed, on the tf engine: collectives, process sets and
hvd.init, object functions, util, Keras 3 callbacks and SyncBatchNorm. Imports runtime and below."""
