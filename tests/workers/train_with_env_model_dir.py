"""run_scripts/train.py with --model_dir from TFTORUS_TEST_MODEL_DIR, which the test sets per rank:
ranks that see different model_dirs, as ranks on per-host scratch disks do.

    TFTORUS_TEST_MODEL_DIR=/scratch/run python tests/workers/train_with_env_model_dir.py [train.py flags]
"""
import os
import runpy
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = os.path.join(ROOT, "run_scripts", "train.py")

if __name__ == "__main__":
    sys.argv = [TRAIN, *[a for a in sys.argv[1:] if not a.startswith("--model_dir=")],
                f"--model_dir={os.environ['TFTORUS_TEST_MODEL_DIR']}"]
    sys.path.insert(0, os.path.dirname(TRAIN))
    runpy.run_path(TRAIN, run_name="__main__")
