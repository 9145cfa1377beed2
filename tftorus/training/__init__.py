"""What a training step uses: DistributedOptimizer and DistributedGradientTape (Horovod's wrappers
or our Keras 3 optimizer), accumulation, batch-size control, replanning. Imports runtime, below."""
