"""The communicator on Horovod process sets (horovod_engine, horovod_elastic_engine) or on TF's
collective ops (tf_engine, with graph_homes and peer_health). Imports torus and cluster."""
