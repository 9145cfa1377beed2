"""Which stack this process runs on: the one place that looks for Horovod and Keras' generation.

    classic   Python 3.11, TensorFlow 2.15, Keras 2, Horovod 0.28.1: both engines, Horovod's
              own optimizer and tape wrappers carry the torus
              (tftorus/training/optimizer_horovod.py).
    current   Python 3.12, TensorFlow >= 2.16 with Keras 3, no Horovod (0.28.1 neither builds
              against these TensorFlows nor runs on Keras 3): the tf engine only, and tftorus'
              own Keras 3 optimizer and callbacks (tftorus/horovod_api/).

Everything else in the package asks this module, so no other file branches on versions. A
name that needs Horovod's runtime raises `HorovodRequired`, one line naming the stack that
has it.
"""
import os

import tensorflow as tf

from tftorus.runtime import supported

supported.check_tensorflow(tf.__version__)

try:
    import horovod.tensorflow as hvd
except ImportError:  # the current stack: the tf engine alone
    hvd = None

HOROVOD = hvd is not None
KERAS_VERSION = getattr(tf.keras, "__version__", None) or tf.keras.__name__
KERAS_3 = str(KERAS_VERSION).startswith("3.")
NAME = "classic" if not KERAS_3 else "current"
DEFAULT_ENGINE = "horovod" if HOROVOD else "tf"

# Horovod's reduce-op constants (horovod.common.basics) where Horovod is, else equal values of
# our own, so `hvd.Average` / `hvd.Sum` mean the same on both stacks.
if HOROVOD:
    Average, Sum, Adasum, Min, Max, Product = (hvd.Average, hvd.Sum, hvd.Adasum, hvd.Min,
                                               hvd.Max, hvd.Product)
else:
    Average, Sum, Adasum, Min, Max, Product = 0, 1, 2, 3, 4, 5

def variable_key(variable):
    """A hashable identity of a variable: tf.Variable.ref() on Keras 2; a Keras 3 variable has
    no ref() (horovod#4290's error) and is hashed by identity."""
    return variable.ref() if hasattr(variable, "ref") else id(variable)


def variable_name(variable) -> str:
    """A variable's unique name: Keras 3's `path` ('dense/kernel'; its `name` is 'kernel' in
    every Dense layer), else tf.Variable's `name` ('dense/kernel:0')."""
    return getattr(variable, "path", None) or variable.name


CLASSIC_STACK = ("the classic stack (Python 3.11, TensorFlow 2.15.1, Keras 2, Horovod 0.28.1: "
                 "bash run_scripts/setup.sh)")


class HorovodRequired(RuntimeError):
    """A Horovod name was used where Horovod's runtime is not installed."""


def horovod_required(name: str, instead: str = "") -> HorovodRequired:
    """The one-line error for `name` on a stack without Horovod."""
    return HorovodRequired(
        f"{name} needs Horovod's runtime, which only {CLASSIC_STACK} has; this is TensorFlow "
        f"{tf.__version__} with Keras {KERAS_VERSION} and no Horovod"
        + (f": {instead}" if instead else ""))


def check_supported() -> None:
    """Refuse, in one line, a TensorFlow/Keras pairing tftorus was not built for."""
    major_minor = tuple(int(p) for p in tf.__version__.split(".")[:2])
    if major_minor < (2, 15):
        raise ImportError(f"tftorus needs TensorFlow 2.15 (classic stack) or >= 2.16 with "
                          f"Keras 3 (current stack); this is {tf.__version__}: "
                          f"pip install tensorflow-cpu==2.15.1 or a current tensorflow-cpu")
    if major_minor >= (2, 16) and not KERAS_3:
        legacy = os.environ.get("TF_USE_LEGACY_KERAS", "")
        raise ImportError(
            f"tftorus on TensorFlow {tf.__version__} works with Keras 3, but tf.keras is "
            f"{KERAS_VERSION}" + (f" (TF_USE_LEGACY_KERAS={legacy})" if legacy else "") +
            ": unset TF_USE_LEGACY_KERAS, or use the classic stack (TensorFlow 2.15.1) for "
            "Keras 2")
    if KERAS_3 and HOROVOD:
        # Horovod 0.28.1's Keras code fails on Keras 3 variables (horovod#4290): keep out of it.
        raise ImportError(
            f"Horovod is installed beside Keras {KERAS_VERSION}; Horovod 0.28.1 does not work "
            f"with Keras 3. Uninstall horovod in this environment (tftorus runs on TensorFlow's "
            f"own collectives there), or use {CLASSIC_STACK}")


check_supported()
