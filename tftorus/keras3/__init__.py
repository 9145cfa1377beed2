"""What Keras 3 (the current stack: TensorFlow >= 2.16, no Horovod) needs that Horovod's Keras
module gives on Keras 2: the DistributedOptimizer (optimizer.py) and Horovod's callbacks
(callbacks.py), written for Keras 3 over tftorus' own reduction and the tf engine."""
