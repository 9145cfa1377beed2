"""tftorus: the 2D-torus all-reduce of Mikami et al. (arXiv 1811.05233) as a Horovod drop-in.

    import tftorus as hvd            # in place of: import horovod.tensorflow as hvd
    import tftorus.keras as hvd      # in place of: import horovod.tensorflow.keras as hvd

What this module exports is listed in __all__: tftorus' own (init, the optimizer and tape
wrappers, Compression, the grid, TorusOptions), and Horovod's other public names.

Where Horovod is installed (the classic stack: TF 2.15, Keras 2) those are Horovod's own,
unchanged (collectives, process sets, queries and their *_op graph ops, its submodules such as
util and mpi_ops, its helpers), plus `_executing_eagerly`, which Horovod's own test suite calls
on `hvd`; `elastic` is tftorus.elastic: Horovod's elastic API, with the torus re-formed on every
reset. Where it is not (the current stack: TF >= 2.16, Keras 3), the same names that have a
meaning on the tf engine come from tftorus.horovod_api.current_stack (`elastic` from
tftorus.reliability.elastic_on_tf_engine: Horovod's states over a world of fixed size), and the
others raise one line naming the classic stack (tftorus.stack.HorovodRequired).
`tftorus.world` has rank(), size(), barrier() and broadcast_variables() for either engine.
The names are defined in tftorus/_facade.py; this file only keeps them out of the local launcher.
Everything else lives in rooms, subpackages that import only downward (docs/architecture.md).
"""
import sys as _sys


def _launching_only() -> bool:
    """`python -m tftorus.run ...`: Python imports this package before the launcher, which needs
    only the standard library. Importing TensorFlow there cost each launch 2.5-3.8 s of CPU
    and a TensorFlow runtime held in the launcher for the whole job; its ranks import it."""
    if _sys.argv[:1] != ["-m"]:  # Python's placeholder while it locates a -m module
        import os  # else `python path/to/tftorus/run.py`: the launcher run by its path
        here = os.path.dirname(os.path.realpath(__file__))
        return bool(_sys.argv[:1]) and os.path.realpath(_sys.argv[0]) == os.path.join(here,
                                                                                      "run.py")
    argv = getattr(_sys, "orig_argv", [])
    return "-m" in argv and argv[argv.index("-m") + 1:argv.index("-m") + 2] == ["tftorus.run"]


from tftorus.runtime import supported as _supported  # noqa: E402  (standard library only)

_supported.check_python()  # before TensorFlow, whose own error would hide why
del _supported

if _launching_only():
    __version__ = "0.1.0"
    __all__ = []
else:  # everything tftorus/_facade.py defines, as this package's own names
    from tftorus import _facade
    globals().update({k: v for k, v in vars(_facade).items()
                      if not k.startswith("__") or k in ("__all__", "__version__", "__getattr__")})
    del _facade
