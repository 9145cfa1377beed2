"""Which Python and TensorFlow tftorus runs on, said once (pyproject.toml's requires-python and
extras agree; the docs quote SUPPORTED). Standard library only: `import tftorus` checks Python
before anything else, and tftorus/runtime/stack.py checks TensorFlow once it is imported."""
import sys
import warnings

SUPPORTED = ("Python 3.9-3.13 with TensorFlow 2.15 (Keras 2; with Horovod 0.28.1: the classic "
             "stack) or TensorFlow 2.16-2.21 (Keras 3, no Horovod: the current stack, tested "
             "on 2.21.0)")
PYTHON_RANGE = ((3, 9), (3, 13))
TENSORFLOW_RANGE = ((2, 15), (2, 21))


def check_python(version=None) -> None:
    """Raise ImportError naming what is supported, outside PYTHON_RANGE."""
    version = tuple(version or sys.version_info[:3])
    if not PYTHON_RANGE[0] <= version[:2] <= PYTHON_RANGE[1]:
        raise ImportError(f"tftorus supports {SUPPORTED}; this is Python "
                          f"{'.'.join(str(v) for v in version)}")


def check_tensorflow(version: str) -> None:
    """Raise ImportError below TENSORFLOW_RANGE; warn above it (not tested there)."""
    try:
        found = tuple(int(x) for x in version.split(".")[:2])
    except ValueError:  # a nightly or local build: let it run
        return
    if found < TENSORFLOW_RANGE[0]:
        raise ImportError(f"tftorus supports {SUPPORTED}; this is TensorFlow {version}")
    if found > TENSORFLOW_RANGE[1]:
        warnings.warn(f"tftorus is tested up to TensorFlow 2.21; this is {version} "
                      f"(supported: {SUPPORTED})", stacklevel=3)
