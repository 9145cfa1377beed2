"""The studies' output folders: made private, and refused where they are not this user's.

The defaults sit in the shared temporary directory (/tmp/tftorus_emulated, ...), and the emulated
studies run as root: a folder another user made there beforehand, or a symlink at that name,
would have root write into (or follow to) a place of that user's choosing.
"""
import os
import stat


def own_dir(path: str) -> str:
    """`path`, made (mode 0700) if missing; SystemExit in one line if it is a symlink or
    belongs to another user."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode) \
            or info.st_uid != os.geteuid():
        raise SystemExit(f"error: {path} is not a folder of this user's own (a symlink, or made "
                         f"by another user): pass --out with a folder of yours")
    return path
