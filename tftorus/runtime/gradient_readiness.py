"""When a training step's gradients are ready: clocks inside the step, for the planner.

The planner (tftorus/planning/planner.py) can judge buckets by the step only if it knows when the
backward pass makes each gradient: a bucket whose collectives run while later layers still
differentiate costs nothing, and small buckets that start early win over one large buffer that
waits for the whole backward pass. Nothing at trace time says when that is, so the step measures
it: while a gradient set has no measured profile, its reduction carries one clock per tensor,
a TensorFlow timestamp taken once the tensor exists, written into a variable of this process.
`tftorus.replan()` (every rank at the same point, after a few steps: tftorus.keras.ReplanCallback
does it in `fit`) averages the clocks over the ranks and hands the profile to the planner; the
next trace of the step is planned for it, and carries no clocks.

Each clock is a call of a small tf.function that takes the clock variable: a call with a
resource input is ordered only against other uses of that variable, whereas a bare timestamp op
is stateful with no resource and would be chained by tf.function's automatic control
dependencies after every other such op of the step (asserts included), which could hold the
buckets back. The clock takes one element of its tensor as data, so on a GPU it reads the time
when the gradient has been computed, not when its kernel was queued (untested here: no GPU).
"""
from typing import Dict, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from tftorus.engines import graph_homes


@tf.function(autograph=False)
def _stamp(clock, index, probe):
    # the time once the tensor exists (on a GPU: is computed); an argument the function did
    # not use would be pruned when TF inlines the call, and the clock would run at once
    with tf.control_dependencies([probe]):
        now = tf.timestamp()
    clock.scatter_nd_update(tf.reshape(index, [1, 1]), tf.reshape(now, [1]))
    return now


class Clock:
    """One gradient set's clocks: when each of its `count` tensors was last ready (seconds)."""

    def __init__(self, count: int):
        with tf.init_scope():  # made once, eagerly, even when first asked for inside a trace
            self.stamps = tf.Variable(tf.zeros([count], tf.float64), trainable=False,
                                      name="tftorus_gradient_clock")
            self.steps = tf.Variable(0, dtype=tf.int64, trainable=False,
                                     name="tftorus_gradient_clock_steps")
        self.count = count

    def instrument(self, tensors: Sequence[tf.Tensor]) -> None:
        """Add the clocks to the graph being traced, in the order a backward pass makes the
        tensors (the last first); then count the step."""
        last = None
        for i in reversed(range(len(tensors))):
            probe = tf.reshape(tensors[i], [-1])[:1]
            last = _stamp(self.stamps, tf.constant(i, tf.int64), probe)
        if last is not None:
            with tf.control_dependencies([last]):
                self.steps.assign_add(1)

    def read(self) -> Tuple[np.ndarray, int]:
        """(each tensor's ready time less the first one's, steps clocked so far)."""
        stamps, steps = self.stamps.numpy(), int(self.steps.numpy())
        return (stamps - stamps.min() if steps else np.zeros_like(stamps)), steps


class _Unclocked:
    """A TF1 graph's step (tftorus/engines/graph_homes.py): its session could not use the clocks'
    eager variables, and replan() reads them eagerly; it keeps the first plan."""

    def instrument(self, tensors: Sequence[tf.Tensor]) -> None:
        del tensors


_clocks: Dict[tuple, Clock] = {}


def clock_for(key: tuple, count: int):
    """The gradient set's Clock (made once, eagerly), or one that clocks nothing in a TF1
    graph."""
    if graph_homes.lifted_graph() is not None:
        return _Unclocked()
    if key not in _clocks:
        _clocks[key] = Clock(count)
    return _clocks[key]


def measured(comm, min_steps: int = 1) -> Dict[tuple, Tuple[np.ndarray, float]]:
    """Every clocked gradient set's profile, averaged over the ranks: key -> (ready seconds
    after the first gradient, per tensor; the backward pass' span, first to last). Collective:
    every rank calls it at the same point, with the same gradient sets traced (same model)."""
    out = {}
    for key in sorted(_clocks, key=repr):
        ready, steps = _clocks[key].read()
        mine = np.append(ready, [float(steps >= min_steps)])
        summed = comm.all_reduce(tf.constant(mine), comm.all_ranks()).numpy()
        if summed[-1] < comm.size:  # some rank has not clocked enough steps yet
            continue
        mean = summed[:-1] / comm.size
        out[key] = (mean, float(mean.max()))
    return out


def forget(key: Optional[tuple] = None) -> None:
    """Drop one gradient set's clocks (all of them with None)."""
    if key is None:
        _clocks.clear()
    else:
        _clocks.pop(key, None)
