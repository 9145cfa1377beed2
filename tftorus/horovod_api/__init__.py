"""Horovod 0.28.1's API where Horovod is not installed, answered by the tf engine: its
collectives (mpi_ops) and object collectives (functions) over process sets, the members'
agreement before each call, hvd.util and Horovod's small helpers, Keras 3's callbacks and
SyncBatchNormalization, the names the facades gather (current_stack), and hvd.init with its
process sets. Imports runtime and the rooms below it."""
