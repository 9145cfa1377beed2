"""`python -m tftorus.run -np 4 train.py`: start a tf-engine job of N processes on this machine.

The launcher itself is tftorus/launch/local.py (what it starts, with which TF_CONFIG and
HOROVOD_* variables, and how it ends a job). Standard library only, so launching starts no
TensorFlow: `python path/to/tftorus/run.py ...` works too.
"""
import os
import sys

if not __package__:  # run by path: the package's parent is not on sys.path yet
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tftorus.launch.command_line import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
