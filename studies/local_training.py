"""One run of run_scripts/train.py on local processes, in its own model_dir, once: under
`horovodrun --gloo` where Horovod is installed (the classic stack), else under tftorus' local
launcher, `python -m tftorus.run`, on the tf engine (the current stack).

The studies (accuracy_band.py, convergence_study.py) are many such runs; a run whose
summary.json exists finished earlier and is not repeated, so an interrupted study continues
where it stopped.
"""
import json
import os
import subprocess
import sys
import time
from typing import Dict, List, Optional, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV_BIN = os.path.dirname(sys.executable)


def launcher(workers: int) -> List[str]:
    """What goes before `script args...` to run it on `workers` local processes."""
    horovodrun = os.path.join(VENV_BIN, "horovodrun")
    if os.path.exists(horovodrun):
        return [horovodrun, "--gloo", "-np", str(workers), "-H", f"localhost:{workers}",
                sys.executable]
    return [sys.executable, "-m", "tftorus.run", "-np", str(workers)]


def train_once(model_dir: str, workers: int, train_flags: List[str], timeout: float,
               label: str, env: Optional[Dict[str, str]] = None) -> Tuple[Dict, Optional[float]]:
    """train.py with `train_flags` (plus --model_dir) on `workers` local processes, with `env`
    added to the environment; its output goes to model_dir/log.txt. Returns (summary.json,
    wall-clock seconds, None if it had finished before). A failed run stops the study with the
    log's path."""
    summary_path = os.path.join(model_dir, "summary.json")
    seconds = None
    if not os.path.exists(summary_path):
        os.makedirs(model_dir, exist_ok=True)
        cmd = [*launcher(workers), "run_scripts/train.py", *train_flags,
               f"--model_dir={model_dir}"]
        start = time.time()
        with open(os.path.join(model_dir, "log.txt"), "w") as log:
            proc = subprocess.run(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=timeout, env={**os.environ, **(env or {})})
        if proc.returncode != 0 or not os.path.exists(summary_path):
            raise SystemExit(f"{label} failed (exit {proc.returncode}); see "
                             f"{os.path.join(model_dir, 'log.txt')}")
        seconds = time.time() - start
    with open(summary_path) as f:
        return json.load(f), seconds
