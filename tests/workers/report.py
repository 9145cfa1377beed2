"""How the checking workers end: every mismatch on its own line, a count, a clean shutdown.

Inside tests/workers/suite.py (several workers in one launch) `suite_check` names the worker
running: its lines carry that name and finish() returns to the suite by raising Finished.
"""
import os
import sys

import tftorus

suite_check = None


class Finished(Exception):
    """A worker's checks are reported; the suite goes on with the next worker."""

    def __init__(self, failures: int):
        super().__init__(failures)
        self.failures = failures


def rank_of_this_process() -> int:
    return int(os.environ.get("HOROVOD_RANK", "0"))


def finish(rank: int, checks: int, failures, what: str = "") -> None:
    """Print the result, leave Horovod only when every rank is done, exit 1 on any mismatch."""
    name = f"{suite_check}: " if suite_check else ""
    for failure in failures:
        print(f"[rank {rank}] MISMATCH {name}{failure}", flush=True)
    print(f"[rank {rank}] {name}{what}{checks} checks, {len(failures)} failed", flush=True)
    if suite_check:
        raise Finished(len(failures))
    tftorus.shutdown()  # every rank is past its last collective before any exits
    sys.exit(1 if failures else 0)


class Checks:
    """A worker's tally: `check(what, ok)` counts a check and keeps what failed."""

    def __init__(self):
        self.count, self.failures = 0, []

    def __call__(self, what: str, ok) -> None:
        self.count += 1
        if not ok:
            self.failures.append(what)
            print(f"FAILED: {what}", flush=True)
