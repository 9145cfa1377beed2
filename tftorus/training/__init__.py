"""What a training step uses: the DistributedOptimizer and DistributedGradientTape over the
torus (optimizer_horovod: Horovod's wrappers on the classic stack; optimizer_keras3: our Keras 3
optimizer on the current one), micro-batch accumulation and the paper's batch-size control, and
the callback that replans the all-reduce from the step. Imports runtime and the rooms below it."""
