"""Driver (current stack): tftorus.ray.RayExecutor against NumPy on a local Ray instance of 4
logical CPUs, on 2 and 4 workers: run, execute with an executable_cls, run_remote and
execute_single; then the one-line refusals (a function that does not pickle, resources the
cluster never has). Prints "N checks, M failed" and each failure.
"""
import os
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report  # noqa: E402  (tests/workers)

check = report.Checks()


def summed(scale):
    """Every rank's all-reduce of rank-dependent data, with its rank and size."""
    import tftorus as hvd
    hvd.init()
    x = np.arange(6, dtype=np.float32) * (hvd.rank() + 1) * scale
    return hvd.rank(), hvd.size(), hvd.allreduce(x, op=hvd.Sum).numpy()


class Accumulator:
    """An executable_cls: made once on every worker by start(), used by execute()."""

    def __init__(self, base):
        import tftorus as hvd
        hvd.init()
        self.hvd, self.base = hvd, base

    def total(self):
        return self.hvd.allreduce(np.full(3, self.base + self.hvd.rank(), np.float64),
                                  op=self.hvd.Sum).numpy()


def main():
    import ray
    from tftorus.ray import RayExecutor
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        for n in (2, 4):
            settings = RayExecutor.create_settings(timeout_s=30)
            executor = RayExecutor(settings, num_workers=n, cpus_per_worker=1)
            executor.start(executable_cls=Accumulator, executable_args=[10.0])
            want = np.arange(6) * sum(range(1, n + 1)) * 2.0
            got = executor.run(summed, kwargs={"scale": 2.0})
            check(f"run on {n}: ranks in order", [g[:2] for g in got] == [(r, n) for r in
                                                                         range(n)])
            check(f"run on {n}: the all-reduce", all(np.allclose(g[2], want) for g in got))
            refs = executor.run_remote(summed, args=[3.0])
            check(f"run_remote on {n}: ObjectRefs", all(isinstance(r, ray.ObjectRef)
                                                        for r in refs))
            check(f"run_remote on {n}: the all-reduce",
                  all(np.allclose(g[2], want * 1.5) for g in ray.get(refs)))
            want_total = np.full(3, sum(10.0 + r for r in range(n)))
            totals = executor.execute(lambda acc: acc.total())
            check(f"execute on {n}", len(totals) == n and
                  all(np.allclose(t, want_total) for t in totals))
            check(f"execute_single on {n}: rank 0's value alone",
                  executor.execute_single(lambda acc: (acc.hvd.rank(), acc.base)) == (0, 10.0))
            executor.shutdown()
        # refusals, each one line
        executor = RayExecutor(RayExecutor.create_settings(), num_workers=2)
        executor.start()
        lock = threading.Lock()
        try:
            executor.run(lambda: lock.locked())
            check("an unpicklable function is refused", False)
        except TypeError as e:
            print(f"REFUSED: {e}")
            check("an unpicklable function: one line naming the fix",
                  "cannot be sent to the workers" in str(e) and "\n" not in str(e))
        executor.shutdown()
        start = time.time()
        try:
            RayExecutor(RayExecutor.create_settings(placement_group_timeout_s=3),
                        num_workers=8).start()
            check("8 workers on 4 CPUs are refused", False)
        except TimeoutError as e:
            print(f"REFUSED: {e}")
            check("resources never met: one line after the bounded wait",
                  "placement_group_timeout_s" in str(e) and time.time() - start < 30)
        for kwargs in ({"min_workers": 3, "max_workers": 2}, {"max_workers": 2},
                       {"num_workers": 2, "min_workers": 2}):
            try:
                RayExecutor(RayExecutor.create_settings(), **kwargs)
                check(f"{kwargs} refused", False)
            except ValueError as e:
                print(f"REFUSED: {e}")
    finally:
        ray.shutdown()
    print(f"{check.count} checks, {len(check.failures)} failed", flush=True)


if __name__ == "__main__":
    main()
