"""Atomic, verified checkpoints and resuming (issue 6).

Layout under `model_dir/checkpoints/`:

    epoch-0001.000/          one checkpoint: written as .tmp-epoch-0001.000-<pid>, renamed when whole
        ckpt.index, ckpt.data-*      tf.train.Checkpoint(model, optimizer, samples_seen, steps)
        state.json           a CheckpointState: where the run stands (epoch, samples, steps,
                             phase, world size, batches, seed, input position, clock), versioned
        manifest.json        size and sha256 of every other file; written last
    latest                   name of the newest checkpoint (replaced atomically)

Rank 0 writes; every file is fsynced before the manifest, the manifest before the rename, the
rename before `latest` moves. A directory without a manifest that matches its files (an
interrupted write, a truncated or altered file) is never loaded: loading falls back to the
previous valid checkpoint with a warning. The last `keep` checkpoints are kept, plus every one
that ends a phase of the batch plan (where the world size may change).
"""
import dataclasses
import errno
import hashlib
import json
import logging
import os
import shutil
import socket
import tempfile
import time
from typing import Collection, Dict, Iterable, List, Optional, Tuple

import numpy as np
import tensorflow as tf

from official_resnet.model.keras_generation import KERAS

logger = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
LATEST = "latest"
MANIFEST = "manifest.json"
STATE = "state.json"
PREFIX = "ckpt"
TMP_PREFIX = ".tmp-"
PREVIOUS = ".previous"  # an epoch's older copy while a re-save replaces it
FORMAT_VERSION = 1  # of state.json and manifest.json; a newer one is refused by name


class CheckpointError(ValueError):
    """A checkpoint or model directory that cannot be used as asked (message names the fix)."""


@dataclasses.dataclass(frozen=True)
class CheckpointState:
    """Where a run stands at a checkpoint (its state.json). The variables (weights, optimizer
    slots, samples seen, steps) are in the TensorFlow checkpoint beside it; this says how to go
    on: which phase, on how many workers, at which input position, with which clock."""

    epoch: float  # data epochs done (samples seen / data-set size)
    phase: int  # index of the phase the epoch is in (its last epoch at a boundary)
    world_size: int
    total_batch: int  # the phase's total batch when saved
    phase_boundary: bool = False  # the epoch ends its phase: the world size may change here
    keras_epoch: int = 0  # Keras epochs done
    samples_seen: int = 0
    steps: int = 0  # optimizer updates, skipped ones included
    per_worker_batch: int = 0
    accumulation: int = 1
    micro_batch: int = 0
    input_batches_in_phase: int = 0  # micro-batches taken from the running fit's dataset
    seed: int = 0
    exp: str = ""
    epochs: float = 0.0  # the run's length
    bn_stat_batches: int = 0
    elapsed: float = 0.0  # training seconds so far (the run's clock)
    nonfinite_skips_in_a_row: int = 0  # skipped updates just before this epoch's end
    # the workers it trained as (--logical_workers; absent or None: its world size): a world
    # that divides the same number reads the same input and may resume anywhere
    logical_workers: Optional[int] = None
    # Keras' generation that wrote it (official_resnet.model.keras_generation: 2 on the classic
    # stack, 3 on the current one); absent: 2, which wrote every checkpoint before Keras 3 trained
    keras: int = 2
    format: int = FORMAT_VERSION

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, saved: Dict, where: str = "state.json") -> "CheckpointState":
        if not isinstance(saved, dict):
            raise CheckpointError(f"{where} is not a checkpoint state (a JSON object)")
        version = saved.get("format", FORMAT_VERSION)
        if not isinstance(version, int) or version > FORMAT_VERSION:
            raise CheckpointError(f"{where} has format {version!r}, newer than this code's "
                                  f"{FORMAT_VERSION}: resume with the version that wrote it")
        names = {f.name for f in dataclasses.fields(cls)}
        try:
            return cls(**{k: v for k, v in saved.items() if k in names})
        except TypeError as error:  # a field missing
            raise CheckpointError(f"{where} is not a checkpoint state: {error}") from None


# ------------------------------------------------------------------------------------------------
# Files
# ------------------------------------------------------------------------------------------------
def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fsync_file(path: str):
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _fsync_dir(path: str):
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_json_atomic(path: str, obj, indent=2):
    """Write temp + fsync + os.replace: readers see the old file or the new one, never half."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{os.path.basename(path)}-", dir=folder)
    mask = os.umask(0o022)
    os.umask(mask)
    os.fchmod(fd, 0o666 & ~mask)  # mkstemp's 0600: the mode a plain open gives
    try:
        with os.fdopen(fd, "w") as f:
            f.write(obj if isinstance(obj, str) else json.dumps(obj, indent=indent,
                                                                sort_keys=True))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    _fsync_dir(os.path.dirname(os.path.abspath(path)))


def checkpoints_dir(model_dir: str) -> str:
    return os.path.join(model_dir, CHECKPOINTS)


def checkpoint_name(epoch: float) -> str:
    return f"epoch-{epoch:08.3f}"


def verify(path: str) -> CheckpointState:
    """The state of a complete checkpoint directory; raises CheckpointError when it is not one."""
    manifest_path = os.path.join(path, MANIFEST)
    if os.path.basename(os.path.normpath(path)).startswith(TMP_PREFIX):
        raise CheckpointError(f"{path} is an unfinished write (temporary directory)")
    if not os.path.isfile(manifest_path):
        raise CheckpointError(f"{path} has no {MANIFEST} (an interrupted write)")
    files = _manifest(manifest_path)["files"]
    if STATE not in files or not any(n.startswith(PREFIX + ".index") for n in files):
        raise CheckpointError(f"{manifest_path} does not list {STATE} and the checkpoint index")
    for name, entry in files.items():
        file_path = os.path.join(path, name)
        if not os.path.isfile(file_path):
            raise CheckpointError(f"{path}: {name} is missing")
        size = os.path.getsize(file_path)
        if size != entry["size"]:
            raise CheckpointError(f"{path}: {name} has {size} bytes, the manifest says "
                                  f"{entry['size']} (truncated or altered)")
        if _sha256(file_path) != entry["sha256"]:
            raise CheckpointError(f"{path}: {name} does not match its sha256 in the manifest")
    with open(os.path.join(path, STATE)) as f:
        return CheckpointState.from_dict(json.load(f), os.path.join(path, STATE))


def _manifest(path: str) -> Dict:
    """A manifest as save() writes it; CheckpointError for anything else (valid JSON of another
    shape included). OSError (the disk) passes: that proves nothing about the checkpoint."""
    try:
        with open(path) as f:
            manifest = json.load(f)
    except (ValueError, RecursionError) as error:
        raise CheckpointError(f"{path} is not a valid manifest: {error}") from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not all(
            isinstance(name, str) and name == os.path.basename(name) and name not in ("", ".", "..")
            and isinstance(entry, dict) and isinstance(entry.get("size"), int)
            and isinstance(entry.get("sha256"), str) for name, entry in files.items()):
        raise CheckpointError(f"{path} is not a valid manifest (files: name -> size, sha256)")
    if not isinstance(manifest.get("finite", True), bool):
        raise CheckpointError(f"{path} is not a valid manifest (finite: true or false)")
    return manifest


def is_finite(path: str) -> bool:
    """False when the checkpoint's manifest says its weights or statistics hold a NaN or an
    infinity (such a one is never resumed from nor counted among those kept)."""
    return _manifest(os.path.join(path, MANIFEST)).get("finite", True)


def all_finite(prefix: str) -> bool:
    """Whether every floating-point value saved under a TF checkpoint `prefix` is finite."""
    reader = tf.train.load_checkpoint(prefix)
    for name, dtype in reader.get_variable_to_dtype_map().items():
        if dtype.is_floating:
            value = reader.get_tensor(name)
            if hasattr(value, "dtype") and not np.isfinite(value).all():
                return False
    return True


def list_checkpoints(model_dir: str) -> List[str]:
    """Final (non-temporary) checkpoint directories, oldest first (by name: zero-padded epoch)."""
    root = checkpoints_dir(model_dir)
    if not os.path.isdir(root):
        return []
    return [os.path.join(root, n) for n in sorted(os.listdir(root))
            if not n.startswith(TMP_PREFIX) and os.path.isdir(os.path.join(root, n))]


def latest_valid(model_dir: str, warn: bool = True
                 ) -> Optional[Tuple[str, CheckpointState]]:
    """(path, state) of the newest checkpoint that verifies, or None. Invalid newer ones are
    skipped with a warning. The `latest` pointer is for people and tools; the verified
    directories decide (a pointer could name one whose files were damaged since)."""
    for path in reversed(list_checkpoints(model_dir)):
        try:
            state = verify(path)
            if not is_finite(path):
                raise CheckpointError(f"{path} holds non-finite weights or statistics")
            return path, state
        except (CheckpointError, OSError) as error:
            if warn:
                logger.warning("skipping checkpoint %s: %s; falling back to the previous one",
                               path, error)
    return None


def phase_to_run(state: Optional[CheckpointState]) -> int:
    """Index of the phase a run continues with from a checkpoint's state.json: 0 when there is
    none, its phase when it is inside one, the next at a phase boundary (past the last: done)."""
    if state is None:
        return 0
    return state.phase + (1 if state.phase_boundary else 0)


def find_resume(resume: str, model_dir: str) -> Optional[Tuple[str, CheckpointState]]:
    """--resume: 'never' -> None; 'auto' -> the newest valid checkpoint in model_dir (or None);
    anything else: that checkpoint directory, which must verify."""
    if resume == "never":
        return None
    if resume == "auto":
        return latest_valid(model_dir)
    path = resume
    if not os.path.isdir(path) and os.path.isdir(os.path.join(checkpoints_dir(model_dir), path)):
        path = os.path.join(checkpoints_dir(model_dir), path)
    if not os.path.isdir(path):
        raise CheckpointError(f"--resume={resume}: no such checkpoint directory")
    return path, verify(path)


# ------------------------------------------------------------------------------------------------
# Writing
# ------------------------------------------------------------------------------------------------
class CheckpointWriter:
    """Rank 0's writer: `save(state, phase_boundary)` after each epoch."""

    def __init__(self, checkpoint: tf.train.Checkpoint, model_dir: str, keep: int = 3):
        self.checkpoint, self.model_dir, self.keep = checkpoint, model_dir, max(1, keep)
        self.root = checkpoints_dir(model_dir)

    def save(self, state: CheckpointState) -> str:
        os.makedirs(self.root, exist_ok=True)
        name = checkpoint_name(state.epoch)
        final = os.path.join(self.root, name)
        tmp = tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{name}-", dir=self.root)
        self.checkpoint.write(os.path.join(tmp, PREFIX))
        with open(os.path.join(tmp, STATE), "w") as f:
            f.write(state.to_json())
        files = {}
        for n in sorted(os.listdir(tmp)):
            p = os.path.join(tmp, n)
            _fsync_file(p)
            files[n] = {"size": os.path.getsize(p), "sha256": _sha256(p)}
        finite = all_finite(os.path.join(tmp, PREFIX))
        if not finite:
            logger.warning("checkpoint %s holds non-finite weights or statistics: kept, but "
                           "never resumed from nor counted among the %d kept", name, self.keep)
        with open(os.path.join(tmp, MANIFEST), "w") as f:
            json.dump({"format": FORMAT_VERSION, "files": files, "finite": finite}, f,
                      indent=2, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(tmp)
        previous = final + PREVIOUS
        if os.path.exists(final):  # a re-run of the same epoch (resumed from an older one):
            # the old copy stays a loadable checkpoint until the new one is in place
            shutil.rmtree(previous, ignore_errors=True)
            os.rename(final, previous)
        os.rename(tmp, final)
        _fsync_dir(self.root)
        shutil.rmtree(previous, ignore_errors=True)
        write_json_atomic(os.path.join(self.root, LATEST), name + "\n")
        self._prune()
        return final

    def _prune(self):
        """Keep the newest `keep` good checkpoints (verified, finite) and anything newer than
        them (even invalid, for inspection), and every phase-boundary one; delete only what is
        proven stale: older and good, or older and proven invalid. One that cannot be read now
        (an I/O error) is kept. Temporary directories are other writes' leftovers (model_dir
        is locked: no other job writes here)."""
        good = 0
        for path in reversed(list_checkpoints(self.model_dir)):
            if path.endswith(PREVIOUS):
                if os.path.isdir(path[:-len(PREVIOUS)]):  # its replacement is in place
                    shutil.rmtree(path, ignore_errors=True)
                continue
            try:
                state = verify(path)
                finite = is_finite(path)
            except CheckpointError:
                state, finite = None, False  # proven invalid
            except OSError as error:
                logger.warning("keeping checkpoint %s: it cannot be read now (%s)", path, error)
                continue
            if good < self.keep:
                good += state is not None and finite
                continue
            if state is not None and state.phase_boundary:
                continue
            shutil.rmtree(path, ignore_errors=True)
        for n in os.listdir(self.root):
            if n.startswith(TMP_PREFIX):
                target = os.path.join(self.root, n)
                if os.path.isdir(target):
                    shutil.rmtree(target, ignore_errors=True)
                else:
                    try:
                        os.unlink(target)
                    except OSError:
                        pass


class ModelDirLock:
    """One job per model_dir: rank 0 holds a POSIX lock on model_dir/.lock (fcntl.lockf, which
    NFSv4 carries across hosts) for the job's life; a second job is refused in one line naming
    the first. Released, the file is gone again if this job made it, else emptied: a job that
    ended, or stopped on bad input, leaves the directory's bytes as they were."""

    NAME = ".lock"

    def __init__(self, model_dir: str):
        os.makedirs(model_dir, exist_ok=True)
        self.model_dir = model_dir
        self.path = os.path.join(model_dir, self.NAME)
        while True:
            self.made = not os.path.exists(self.path)
            self.file = open(self.path, "a+")
            self._lock_or_refuse()
            try:  # the file locked is still the one at the path (a job ending unlinks it)
                if os.path.samestat(os.fstat(self.file.fileno()), os.stat(self.path)):
                    break
            except FileNotFoundError:
                pass
            self.file.close()
        self.file.seek(0)
        self.file.truncate()
        self.file.write(f"pid {os.getpid()} on {socket.gethostname()} since "
                        f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        self.file.flush()

    def _lock_or_refuse(self) -> None:
        import fcntl
        try:
            fcntl.lockf(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            if error.errno not in (errno.EACCES, errno.EAGAIN):
                self.file.close()
                raise
            self.file.seek(0)
            holder = self.file.read().strip() or "another process"
            self.file.close()
            raise CheckpointError(f"{self.model_dir} is in use by another job ({holder}); give "
                                  f"this one another --model_dir, or wait for that one to end"
                                  ) from None

    def release(self) -> None:
        if self.file.closed:
            return
        try:  # while still locked: no other job holds the file meanwhile
            if self.made:
                os.unlink(self.path)
            else:
                self.file.seek(0)
                self.file.truncate()
        except OSError:
            pass  # a lock file left behind holds no work and blocks nothing
        finally:
            self.file.close()  # closing drops the lock


# ------------------------------------------------------------------------------------------------
# Restoring
# ------------------------------------------------------------------------------------------------
def restore(checkpoint: tf.train.Checkpoint, path: str, optimizers: Iterable = (),
            variables: Iterable = ()) -> None:
    """Restore a verified checkpoint in place. Optimizers are built first (their slots exist, so
    they are restored now and not lazily; a LossScaleOptimizer builds its scale and its inner
    optimizer); every saved value must find its variable."""
    variables = list(variables)
    for optimizer in optimizers:
        if hasattr(optimizer, "build"):
            KERAS.build_optimizer(optimizer, variables)  # once, a loss scale's too
    status = checkpoint.read(os.path.join(path, PREFIX))
    status.assert_existing_objects_matched()


def trim_history(model_dir: str, epoch: float) -> int:
    """Drop history.jsonl lines past `epoch` (epochs that a resumed run will train again after
    falling back to an older checkpoint); rewritten atomically, untouched when nothing is past
    it. Returns the number of lines dropped."""
    path = os.path.join(model_dir, "history.jsonl")
    if not os.path.isfile(path):
        return 0
    with open(path) as f:
        lines = f.readlines()
    keep = []
    for line in lines:
        try:
            if json.loads(line)["epoch"] > epoch + 1e-9:
                continue
        except (ValueError, KeyError, TypeError):
            continue  # a torn last line
        keep.append(line if line.endswith("\n") else line + "\n")
    if len(keep) == len(lines) and all(l.endswith("\n") for l in lines):
        return 0
    write_json_atomic(path, "".join(keep))
    return len(lines) - len(keep)


def set_aside_newer(model_dir: str, resumed: str) -> List[str]:
    """After resuming from an older checkpoint, move the newer ones (a branch of the run that
    is now trained again) to model_dir/superseded/, so that --resume=auto after a crash never
    picks them; moved, not deleted. Returns their new paths."""
    moved = []
    resumed = os.path.realpath(resumed)
    names = [os.path.realpath(p) for p in list_checkpoints(model_dir)]
    if resumed not in names:
        return moved
    for path in names[names.index(resumed) + 1:]:
        target = os.path.join(model_dir, "superseded", os.path.basename(path))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if os.path.exists(target):
            target += f"-{os.getpid()}"
        os.rename(path, target)
        moved.append(target)
    return moved


# ------------------------------------------------------------------------------------------------
# Start-up checks (every rank runs them before anything is written)
# ------------------------------------------------------------------------------------------------
def check_config(model_dir: str, config: Dict, may_differ: Collection[str] = ()) -> bool:
    """Compare with the config.json of a run already in model_dir, except the keys in
    `may_differ` (flags.config.TrainConfig.may_differ_on_resume()). Returns True when one exists
    (and matches); raises CheckpointError naming the differing flags otherwise."""
    path = os.path.join(model_dir, "config.json")
    if not os.path.isfile(path):
        if list_checkpoints(model_dir):
            raise CheckpointError(f"{model_dir} holds checkpoints but no config.json; use another "
                                  f"--model_dir")
        return False
    with open(path) as f:
        try:
            saved = json.load(f)
        except (ValueError, RecursionError) as error:
            raise CheckpointError(f"{path} is not valid JSON ({error}); use another --model_dir")
    if not isinstance(saved, dict):
        raise CheckpointError(f"{path} is not a run's configuration (a JSON object); use another "
                              f"--model_dir")
    differing = sorted(k for k in set(saved) & set(config)
                       if k not in may_differ and saved[k] != config[k])
    if differing:
        details = ", ".join(f"--{k}={saved[k]!r} there, {config[k]!r} now" for k in differing)
        raise CheckpointError(
            f"--model_dir={model_dir} holds a run with a different configuration ({details}); "
            f"use another --model_dir, or the flags of that run to resume it")
    return True


def check_resume_path(path: str, model_dir: str, config: Dict,
                      may_differ: Collection[str] = ()) -> None:
    """--resume=PATH outside model_dir's checkpoints/: that run's config.json (beside its
    checkpoints/) must match this configuration as model_dir's would; one without is refused."""
    own = os.path.realpath(checkpoints_dir(model_dir))
    if os.path.dirname(os.path.realpath(path)) == own:
        return
    run_dir = os.path.dirname(os.path.dirname(os.path.realpath(path)))
    if not os.path.isfile(os.path.join(run_dir, "config.json")):
        raise CheckpointError(
            f"--resume={path} is not in a run's checkpoints/ beside its config.json, so its "
            f"configuration cannot be checked; resume it with --model_dir={run_dir} if it is "
            f"that run's, or copy that run's config.json into {run_dir}")
    try:
        check_config(run_dir, config, may_differ)
    except CheckpointError as error:
        raise CheckpointError(f"--resume={path}: {error}") from None


def check_generation(state: CheckpointState, path: str) -> None:
    """A checkpoint is resumed by the Keras generation that wrote it: Keras 2 and Keras 3 save
    the same model and optimizer as other objects (official_resnet.model.keras_generation)."""
    if state.keras != KERAS.generation:
        written = {2: "Keras 2 (the classic stack: TensorFlow 2.15, Horovod)",
                   3: "Keras 3 (the current stack: TensorFlow >= 2.16)"}.get(
                       state.keras, f"Keras {state.keras}")
        raise CheckpointError(
            f"checkpoint {path} was written by {written}, and this is {KERAS.name} "
            f"({KERAS.stack}), whose model and optimizer save other variables: resume it on "
            f"the stack that wrote it (TFTORUS_STACK), or start a new run in another "
            f"--model_dir")


def check_world(state: CheckpointState, path: str, plans, world_size: int,
                model_dir: str, logical_workers: Optional[int] = None) -> None:
    """A new world size is fine at a phase boundary (the batch plan re-derives per-worker
    batch and accumulation from it), and anywhere when both worlds train as the same logical
    workers (each reads their input, so the position carries over); otherwise, inside a phase,
    the input position would not carry over."""
    same_logical = logical_workers is not None and state.logical_workers == logical_workers
    if state.world_size != world_size and not state.phase_boundary and not same_logical:
        boundary = None
        for p, s in reversed([c for c in ((c, _state_or_none(c)) for c in
                                          list_checkpoints(model_dir)) if c[1]]):
            if s.phase_boundary and s.epoch <= state.epoch + 1e-9:
                boundary = (p, s)
                break
        plan = plans[state.phase]
        fix = (f"resume from the phase-boundary checkpoint at epoch {boundary[1].epoch:.3f} "
               f"(--resume={boundary[0]}) with {world_size} workers, or "
               if boundary else "")
        raise CheckpointError(
            f"checkpoint {path} (epoch {state.epoch:.3f}) is inside phase {plan.index + 1} "
            f"(epochs {plan.start_epoch:g}-{plan.end_epoch:g}) of a run on "
            f"{state.world_size} workers; the world size may change only at a phase "
            f"boundary: {fix}use {state.world_size} workers")
    if state.phase < len(plans) and not state.phase_boundary:
        plan = plans[state.phase]
        if plan.total_batch != state.total_batch:
            raise CheckpointError(f"checkpoint {path}: phase {plan.index + 1} has total batch "
                                  f"{plan.total_batch} now, {state.total_batch} when saved")


def _state_or_none(path):
    try:
        return verify(path)
    except (CheckpointError, OSError):
        return None
