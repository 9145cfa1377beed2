"""How the checking workers end: every mismatch on its own line, a count, a clean shutdown."""
import sys

import tftorus


def finish(rank: int, checks: int, failures, what: str = "") -> None:
    """Print the result, leave Horovod only when every rank is done, exit 1 on any mismatch."""
    for failure in failures:
        print(f"[rank {rank}] MISMATCH {failure}", flush=True)
    print(f"[rank {rank}] {what}{checks} checks, {len(failures)} failed", flush=True)
    tftorus.shutdown()  # every rank is past its last collective before any exits
    sys.exit(1 if failures else 0)
