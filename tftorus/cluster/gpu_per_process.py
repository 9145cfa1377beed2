"""One GPU per process on the tf engine, chosen before TensorFlow's runtime starts.

The tf engine starts TensorFlow's runtime inside `init()` (its collectives must be configured
before the first tensor), and from then on TensorFlow refuses to change which GPUs a process
sees. So `init()` makes the choice Horovod's pinning lines make, just before the runtime starts:

    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus: tf.config.experimental.set_memory_growth(gpu, True)
    tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")

A user's own copy of those lines after `hvd.init()` then asks for what is already set, which
TensorFlow accepts as a no-op, so a Horovod script runs unchanged. The rule (`choose`):

- TFTORUS_GPU_PER_PROCESS=0: devices left alone (the launchers forward the variable);
- a process started alone (a world of one): left alone, as without tftorus;
- no GPU visible (a CPU host): nothing to do;
- the process already narrowed its GPUs (tf.config.set_visible_devices before init): kept;
- one GPU visible (a launcher or the user set CUDA_VISIBLE_DEVICES per rank): that one;
- at least as many GPUs as ranks on the host: the local rank's (CUDA_VISIBLE_DEVICES, if set,
  lists which; the local rank indexes that list, as in Horovod's lines);
- fewer GPUs than ranks on the host: refused in one line, as NCCL cannot put two ranks of one
  group on one GPU.
"""
import dataclasses
import logging
import os
from typing import Optional

logger = logging.getLogger(__name__)

ENV = "TFTORUS_GPU_PER_PROCESS"
_OFF = ("0", "false", "no", "off")


@dataclasses.dataclass(frozen=True)
class Choice:
    gpu: Optional[int]  # index into the GPUs this process sees; None: leave devices alone
    why: str


def enabled() -> bool:
    """TFTORUS_GPU_PER_PROCESS (default on)."""
    raw = os.environ.get(ENV, "").strip().lower()
    if raw and raw not in _OFF + ("1", "true", "yes", "on"):
        raise ValueError(f"{ENV}={os.environ[ENV]!r}: use 1 (a GPU per process, the default) "
                         f"or 0 (leave the devices as they are)")
    return raw not in _OFF


def choose(local_rank: int, local_size: int, world_size: int, gpus: int,
           narrowed: bool = False, on: bool = True,
           cuda_visible_devices: Optional[str] = None) -> Choice:
    """Which of the `gpus` GPUs this process sees it should use (module docstring)."""
    if not on:
        return Choice(None, f"{ENV}=0: devices left as they are")
    if world_size <= 1:
        return Choice(None, "a process alone: devices left as they are")
    if gpus == 0:
        return Choice(None, "no GPU visible")
    if narrowed:
        return Choice(None, "the process chose its GPUs before init: kept")
    if gpus == 1:
        return Choice(0, "the one GPU this process sees")
    if local_rank < 0 or local_rank >= local_size:
        raise ValueError(f"local rank {local_rank} is outside the host's {local_size} ranks")
    if gpus < local_size:
        seen = (f"CUDA_VISIBLE_DEVICES={cuda_visible_devices}" if cuda_visible_devices is not None
                else "all of the host's")
        raise ValueError(
            f"{local_size} ranks on this host but each sees only {gpus} GPUs ({seen}): start at "
            f"most {gpus} ranks per host (-H host:{gpus}), give each rank its own "
            f"CUDA_VISIBLE_DEVICES, or set {ENV}=0 to place them yourself")
    return Choice(local_rank, f"local rank {local_rank} of {local_size} takes GPU {local_rank} "
                              f"of the {gpus} it sees")


def pin(local_rank: int, local_size: int, world_size: int, config=None) -> Choice:
    """Choose (above) and apply: memory growth on every GPU, then only the chosen one visible.
    Must run before TensorFlow's runtime starts. `config`: tf.config (a stand-in in tests)."""
    if config is None:
        import tensorflow as tf
        config = tf.config
    on = enabled()
    physical = config.list_physical_devices("GPU") if on else []
    narrowed = bool(physical) and len(config.get_visible_devices("GPU")) < len(physical)
    choice = choose(local_rank, local_size, world_size, len(physical), narrowed, on,
                    os.environ.get("CUDA_VISIBLE_DEVICES"))
    if choice.gpu is not None:
        for gpu in physical:  # as Horovod's lines do; a no-op for them afterwards
            config.experimental.set_memory_growth(gpu, True)
        config.set_visible_devices(physical[choice.gpu], "GPU")
    logger.info("tftorus: %s", choice.why)
    return choice
