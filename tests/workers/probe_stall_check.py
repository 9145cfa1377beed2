"""Worker: the link probe with one rank stalled over and over, against the probe without.

    # the tf engine: one TF_CONFIG per rank naming 127.0.0.1 and 127.0.0.2 (tests/test_plan_guard.py)

Four ranks as two hosts of two. init() probes on a quiet world; then every rank probes again
while a child of rank 1 stops it (SIGSTOP) for STOP_S of every PERIOD_S, as a CPU quota or a
noisy neighbour stalls a process: every call the stall hits reads rank 1's in-host link (and
whatever else it takes part in) as slow. Checked on every rank:
- the stalls hit the probe (rank 1 was stopped at least MIN_STOPS times while it ran)
- the plan of a ResNet-50-sized gradient set made from the stalled links costs, judged by the
  quiet links, at most TOLERANCE over the quiet links' own plan
- the stalled probe's in-host bandwidth is at least a third of the quiet one's
"""
import os
import signal
import subprocess
import sys

import report  # noqa: E402  (tests/workers)

import tftorus
from tftorus.planning import link_probe, planner
from tftorus.runtime import process_state

PERIOD_S, STOP_S = 0.08, 0.02
MIN_STOPS = 3
TOLERANCE = 0.10
STOPPER = """
import os, signal, sys, time
target, period, stop = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
stops = 0
def done(*_):
    os.kill(target, signal.SIGCONT)
    print(stops, flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, done)
while True:
    time.sleep(period - stop)
    os.kill(target, signal.SIGSTOP)
    stops += 1
    time.sleep(stop)
    os.kill(target, signal.SIGCONT)
"""


def _gradient_sizes():
    """Bytes of ResNet-50's 161 FP32 gradients, by layer shape (no model built)."""
    sizes = [(7 * 7 * 3 * 64 + 128) * 4]
    channels = 64
    for width, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for b in range(blocks):
            sizes += [channels * width * 4, 2 * width * 4, 9 * width * width * 4,
                      2 * width * 4, width * 4 * width * 4, 2 * 4 * width * 4]
            if b == 0:
                sizes += [channels * 4 * width * 4, 2 * 4 * width * 4]
            channels = 4 * width
    sizes += [2048 * 1000 * 4, 1000 * 4]
    return [(n, "float32") for n in sizes]


def _engine(comm) -> planner.Engine:
    return planner.Engine(concurrent_groups=comm.concurrent_groups,
                          max_bucket_bytes=comm.max_bucket_bytes,
                          max_chunk_bytes=comm.max_chunk_bytes,
                          columns_in_turn=comm.columns_in_turn)


def main():
    tftorus.init(engine=os.environ.get("TFTORUS_ENGINE") or None)
    comm = process_state.communicator()
    rank, size, local = comm.rank, comm.size, comm.local_size
    failures = []
    quiet = process_state.links()
    if quiet is None or local >= size:
        failures.append(f"init() left no measured links on {size // local} host(s)")
        report.finish(rank, 1, failures, what="probe stall: ")
    stopper = None
    if rank == 1:
        stopper = subprocess.Popen([sys.executable, "-c", STOPPER, str(os.getpid()),
                                    str(PERIOD_S), str(STOP_S)], stdout=subprocess.PIPE,
                                   text=True)
    stalled = link_probe.probe(comm, local)
    if stopper is not None:
        stopper.send_signal(signal.SIGTERM)
        stops = int(stopper.communicate(timeout=30)[0].strip() or 0)
        print(f"[rank {rank}] stopped {stops} times during the probe", flush=True)
        if stops < MIN_STOPS:
            failures.append(f"the stalls missed the probe: {stops} stops (< {MIN_STOPS})")
    sizes, engine = _gradient_sizes(), _engine(comm)
    grid = process_state.default_grid()
    from_quiet = planner.plan(size, local, sizes, quiet, engine, grid=grid)
    from_stalled = planner.plan(size, local, sizes, stalled, engine, grid=grid)
    costs = planner.ModelCosts(quiet.cost_model(local), local)
    judged = planner.evaluate(from_stalled, costs, engine)[0]
    print(f"[rank {rank}] quiet {quiet.describe()}\n[rank {rank}] stalled {stalled.describe()}\n"
          f"[rank {rank}] plan from the stalled links {judged * 1e3:.4g} ms on the quiet ones, "
          f"their own plan {from_quiet.seconds * 1e3:.4g} ms", flush=True)
    if judged > from_quiet.seconds * (1 + TOLERANCE):
        failures.append(f"the stalled probe's plan ({from_stalled.describe()}) costs "
                        f"{judged / from_quiet.seconds:.2f}x the quiet plan on the quiet links")
    if stalled.intra.bandwidth < quiet.intra.bandwidth / 3:
        failures.append(f"the stalled probe read the in-host link at "
                        f"{stalled.intra.bandwidth / 1e9:.3g} GB/s, the quiet one at "
                        f"{quiet.intra.bandwidth / 1e9:.3g}")
    report.finish(rank, 3, failures, what="probe stall: ")


if __name__ == "__main__":
    main()
