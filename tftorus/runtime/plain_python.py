"""tftorus' code runs inside a traced step as it is: AutoGraph is told not to convert it.

AutoGraph rewrites each Python function a tf.function calls, from its source, so that `if` and
`for` over tensors become graph control flow. tftorus builds the all-reduce from Python values
alone (grids, buckets, plans; its code also runs in TF1 graphs, which have no AutoGraph), so the
rewrite changes nothing and costs: the first step of a Keras 3 fit with DistributedOptimizer on
the tf engine converted 99 of tftorus' functions, 4.4-5.3 s of each rank's CPU, three quarters
of what the rank did after importing TensorFlow (tests/workers/user_fit_accumulation.py, 3
ranks on 2 cores: 16.5 s against 9.0 s for the job, 2026-12-02).

Your own functions stay converted where AutoGraph meets them: a tf.function of yours, and what
it calls. One that tftorus itself calls while a step is traced (a Compression class of your own)
runs as it is, as it would in a TF1 graph: branch on tensors there with tf.cond.

TensorFlow keeps the modules it never converts in a list of rules (autograph.core.config, as
for `tensorflow` itself); tftorus adds its own package there. That list is not public API: where
a TensorFlow lacks it, functions that say so one by one (tf.autograph.experimental.
do_not_convert, the tf.functions tftorus makes with autograph=False) still hold, and the rest is
converted as before, only slower.
"""
PACKAGE = __name__.split(".")[0]  # "tftorus"


def exempt_from_autograph() -> bool:
    """Add tftorus to AutoGraph's modules not to convert (once); False where TensorFlow has no
    such list."""
    try:
        from tensorflow.python.autograph.core import config
        rules, rule = config.CONVERSION_RULES, config.DoNotConvert(PACKAGE)
    except (ImportError, AttributeError):
        return False
    if not any(isinstance(r, config.DoNotConvert) and r.matches(PACKAGE) for r in rules):
        config.CONVERSION_RULES = (rule, *rules)
    return True
