"""`hvd.util` where Horovod is not installed: the helpers of horovod.tensorflow.util that
Horovod's own tests and users' scripts call."""
import tensorflow as tf


def _executing_eagerly() -> bool:
    """Whether TensorFlow runs eagerly here (False in a tf.function and in a TF1 graph)."""
    return tf.executing_eagerly()


def _make_subgraph(function):
    """`function` as a tf.function (Horovod runs eager broadcasts so)."""
    return tf.function(function)


def _cache(function):
    """`function(*args)` computed once per arguments and execution mode."""
    results = {}

    def cached(*args):
        key = (args, tf.executing_eagerly())
        if key not in results:
            results[key] = function(*args)
        return results[key]
    return cached


def vars_to_refs(variables):
    """Variables (nested lists) as hashable references (tf.Variable.ref())."""
    if isinstance(variables, list):
        return tuple(vars_to_refs(v) for v in variables)
    return variables.ref()


def refs_to_vars(refs):
    """vars_to_refs' references back to the variables."""
    if isinstance(refs, tuple):
        return [refs_to_vars(r) for r in refs]
    return refs.deref()
