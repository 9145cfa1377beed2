"""Horovod's small helpers that `horovod.tensorflow`, `horovod.tensorflow.keras` and its
`callbacks` module export (they come from horovod.common.util and mpi_ops), for the facades
where Horovod is not installed: pure Python, the same arguments, results and errors."""
import warnings

from tftorus.runtime import stack


def split_list(l, n):
    """`l` cut into `n` consecutive pieces whose lengths differ by at most one (the first
    len(l) % n pieces are the longer ones)."""
    short, longer = divmod(len(l), n)
    pieces, start = [], 0
    for i in range(n):
        end = start + short + (1 if i < longer else 0)
        pieces.append(l[start:end])
        start = end
    return pieces


def check_num_rank_power_of_2(num_rank) -> bool:
    """Whether `num_rank` is a power of two (1, 2, 4, ...); Horovod's Adasum asks it."""
    return num_rank > 0 and num_rank & (num_rank - 1) == 0


def handle_average_backwards_compatibility(op, average):
    """The reduction op from op= and the deprecated average=: op if given (not both), else
    Average or Sum as average says (with Horovod's DeprecationWarning), else Average."""
    if op is not None:
        if average is not None:
            raise ValueError("The op parameter supersedes average. Please provide only one of "
                             "them.")
        return op
    if average is None:
        return stack.Average
    warnings.warn("Parameter `average` has been replaced with `op` and will be removed in v1.0",
                  DeprecationWarning)
    return stack.Average if average else stack.Sum


def is_version_greater_equal_than(ver, target) -> bool:
    """Whether version string `ver` >= `target` ('major.minor.patch'), as packaging orders them."""
    from packaging import version
    if not (isinstance(ver, str) and isinstance(target, str)):
        raise ValueError(f"This function only accepts string arguments; got ver={ver!r} "
                         f"({type(ver).__name__}), target={target!r} ({type(target).__name__})")
    if len(target.split(".")) != 3:
        raise ValueError(f"We only accepts target version values in the form of: "
                         f"major.minor.patch. Received: {target}")
    return version.parse(ver) >= version.parse(target)


def gpu_available(ext_base_name, verbose=False) -> bool:
    """Whether Horovod's extension `ext_base_name` runs with a GPU: False, as there is no
    Horovod extension here (TensorFlow's own devices: tf.config.list_physical_devices('GPU'))."""
    del ext_base_name, verbose
    return False
