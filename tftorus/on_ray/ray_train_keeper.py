"""hvd.elastic inside Ray Train (TensorflowTrainer): commits become Ray Train checkpoints.

Ray Train restarts the worker group as new processes when a worker or node is lost (up to
FailureConfig.max_failures) and, with ScalingConfig(num_workers=(min, max)), when it resizes the
group; the new group's TF_CONFIG names its workers, and `ray.train.get_checkpoint()` gives the
last checkpoint it registered. So each commit is reported (ray.train.report is a barrier every
rank calls; rank 0 attaches the commit), and a restarted group's hvd.elastic.run takes the
state from it and runs the reset callbacks. Ray Train decides when to grow, so a commit never
asks to. Found without a call of the user's: tftorus/elastic.py registers find() as a finder.
"""
import os
import pickle
import sys
import tempfile
from typing import Optional

FILE = "tftorus_commit.pkl"


def find():
    """A keeper when this process is a Ray Train worker inside its training function."""
    train = sys.modules.get("ray.train")  # a Ray Train worker has imported it; else not one
    if train is None:
        return None
    try:
        train.get_context().get_world_rank()
    except Exception:  # outside a Ray Train worker's training function
        return None
    return RayTrainKeeper(train)


class RayTrainKeeper:
    def __init__(self, train):
        self._train = train
        self._commits = 0
        self.resets = 1 if train.get_checkpoint() is not None else 0

    def load(self) -> Optional[dict]:
        checkpoint = self._train.get_checkpoint()
        if checkpoint is None:
            return None
        with checkpoint.as_directory() as directory:
            path = os.path.join(directory, FILE)
            if not os.path.exists(path):
                raise ValueError(f"Ray Train's checkpoint {checkpoint.path} holds no tftorus "
                                 f"commit ({FILE}): resume from a run that committed with "
                                 f"hvd.elastic, or start with a new RunConfig name")
            with open(path, "rb") as f:
                return pickle.load(f)

    def save(self, commit: Optional[dict]) -> bool:
        self._commits += 1
        metrics = {"tftorus_commit": self._commits}
        if commit is None:
            self._train.report(metrics)
            return False
        metrics.update({k: v for k, v in commit.get("attributes", {}).items()
                        if isinstance(v, (int, float)) and not isinstance(v, bool)})
        with tempfile.TemporaryDirectory() as directory:
            with open(os.path.join(directory, FILE), "wb") as f:
                pickle.dump(commit, f, protocol=pickle.HIGHEST_PROTOCOL)
            self._train.report(metrics,
                               checkpoint=self._train.Checkpoint.from_directory(directory))
        return False
