"""The engines: the communicator's three collectives carried by Horovod process sets
(horovod_engine; horovod_elastic_engine for elastic jobs, on Horovod's global set) or by
TensorFlow's own collective ops (tf_engine), with what the tf engine needs around them: where
its calls run (graph_homes: eager code or a TF1 graph) and the peer health monitor that turns a
lost peer into an error. Imports torus and cluster."""
