"""Worker: several checking workers in one launch, one after another in the same processes.

    horovodrun --gloo -np 4 -H localhost:4 python tests/workers/suite.py allreduce_check overlap
    TFTORUS_ENGINE=tf horovodrun ... suite.py tf_engine_check overlap:tf train_equivalence:tape:OUT

Starting a world (processes that import TensorFlow and Horovod and join) costs about 10 s on
two cores; checks that need the same world and engine share it. Each named worker's main()
runs as if launched alone (with sys.argv = [its name, its arguments], from NAME:ARG:ARG...; the
first worker's tftorus.init() starts the world, so it names the engine and every grid needed),
and its report.finish prints its lines
with the worker's name in front and returns here instead of exiting. The suite leaves Horovod
once, after the last, and exits 1 if any check failed. A worker that raises ends the job (the
other ranks may be inside a collective): the checks after it never report, which their tests
see as missing lines.
"""
import importlib
import os
import sys
import time
import traceback

import report  # tests/workers, the script's own folder, as the workers import it
import tftorus

sys.modules.setdefault("tests.workers.report", report)  # one module, however a worker names it


def main(specs):
    failed = 0
    for spec in specs:
        name, *args = spec.split(":")
        sys.argv = [name, *args]  # as if launched alone, before a worker reads its arguments
        report.suite_check = name
        started = time.monotonic()
        try:
            importlib.import_module(name).main()
        except report.Finished as done:
            failed += done.failures
        except BaseException:
            print(f"[rank {report.rank_of_this_process()}] SUITE {name} raised:\n"
                  f"{traceback.format_exc()}", flush=True)
            os._exit(1)
        # which check a slow suite spends its time on (tests/conftest.py's SLOW is per test)
        print(f"[rank {report.rank_of_this_process()}] SUITE {name} took "
              f"{time.monotonic() - started:.1f} s", flush=True)
    report.suite_check = None
    tftorus.shutdown()  # every rank is past its last collective before any exits
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main(sys.argv[1:])
