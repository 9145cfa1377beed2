"""Horovod 0.28.1's own TensorFlow test suite, run against `import tftorus as hvd`.

    git clone --depth 1 --branch v0.28.1 https://github.com/horovod/horovod /tmp/horovod
    .venv-current/bin/python -m studies.horovod_suite /tmp/horovod -np 2 4     # current stack
    .venv/bin/python -m studies.horovod_suite /tmp/horovod -np 2               # classic stack
    .venv/bin/python -m studies.horovod_suite /tmp/horovod -np 2 --as-shipped  # Horovod itself
    .venv-current/bin/python -m studies.horovod_suite /tmp/horovod -np 2 -k alltoall

What a Horovod user moving to tftorus does: Horovod's test/parallel/test_tensorflow.py with one
line changed, `import horovod.tensorflow as hvd` -> `import tftorus as hvd`. The suite's two
imports of Horovod internals are given here instead of Horovod's (the test file is not changed
otherwise): `_executing_eagerly` (TensorFlow's executing_eagerly, what Horovod's helper returns
under TF 2) and test/utils/common.py's `mpi_env_rank_and_size` and `skip_or_fail_gpu_test`
(written here from their documented behaviour: common.py itself imports Horovod's runner).

The source is a Horovod checkout (or a git directory and --ref; the test files are not in
Horovod's sdist and are not part of this repository). Each world size is one job: on the current
stack `python -m tftorus.run -np N -m pytest ...` (the tf engine), on the classic stack
`horovodrun --gloo -np N -H localhost:N python -m pytest ...` (Horovod's engine under tftorus'
names: Horovod's own behaviour). Per world size it prints rank 0's passed / failed / skipped,
then the failures grouped by their error's first line, and with --list every failed test.
Exits 0 when every world size ran (failures are the output, not the status), 2 on bad input.
"""
import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional, Sequence, Tuple

TEST_FILES = ("test/parallel/test_tensorflow.py", "test/parallel/base_test_tensorflow.py")
IMPORT_HVD = "import horovod.tensorflow as hvd"
IMPORT_EAGER = "from horovod.tensorflow.util import _executing_eagerly"
IMPORT_COMMON = "from common import mpi_env_rank_and_size, skip_or_fail_gpu_test"

#: The two helpers of Horovod's test/utils/common.py the suite calls, from their behaviour:
#: the rank and size an MPI launcher gives (None, None without one), and a skip where a test
#: needs a GPU (a failure when the job says GPUs are there: HOROVOD_TEST_GPU).
COMMON_PY = '''"""Written by studies/horovod_suite.py: what the suite needs of Horovod's common.py."""
import os


def mpi_env_rank_and_size():
    for rank, size in (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                       ("PMI_RANK", "PMI_SIZE"), ("PMIX_RANK", "PMIX_SIZE")):
        if rank in os.environ and size in os.environ:
            return int(os.environ[rank]), int(os.environ[size])
    return None, None


def skip_or_fail_gpu_test(test, message):
    if os.environ.get("HOROVOD_TEST_GPU"):
        test.fail(message)
    else:
        test.skipTest(message)
'''

#: A conftest.py beside the suite: each rank writes its own JUnit XML (outcome and message of
#: every test and subtest), rank from Horovod's or TF_CONFIG's environment.
CONFTEST_PY = '''"""Written by studies/horovod_suite.py: one JUnit XML per rank."""
import json
import os


def pytest_configure(config):
    rank = os.environ.get("HOROVOD_RANK")
    if rank is None:
        rank = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {}).get("index", 0)
    config.option.xmlpath = os.path.join(os.path.dirname(__file__), f"rank{rank}.xml")
'''


def _batch_norm_fused_false():
    import tensorflow as tf
    tf.keras.layers.BatchNormalization(axis=1, fused=False)


def _keras_variable_ref():
    import tensorflow as tf
    layer = tf.keras.layers.Dense(2)
    layer.build((None, 3))
    layer.kernel.ref()


def _float16_product_of_four_ranks():
    """The product tests' check at 4 ranks, given the exact answer (TF's own reduce_prod)."""
    import tensorflow as tf
    tensors = tf.cast(tf.random.stateless_uniform([4, 17], [1, 2], -100, 100), tf.float16)
    reference = tf.math.reduce_prod(tensors, axis=0)
    difference = float(tf.reduce_max(reference - reference))  # a perfect all-reduce's
    if not difference <= 1e-4:  # the tests' `diff <= threshold`
        raise AssertionError(f"max difference {difference} (float16 products overflow to inf, "
                             f"and inf - inf is NaN)")


#: Tests of the suite whose own code fails, whatever the all-reduce: name -> (why, the failing
#: line run with TensorFlow and Keras alone, the smallest world size where it fails). On the
#: current stack (TensorFlow 2.21, Keras 3) `invalid_here()` runs each line and keeps the tests
#: whose line does fail there; tests/test_horovod_compatibility.py checks the lines;
#: docs/guide/horovod_compatibility.md lists them.
INVALID_ON_KERAS_3 = {
    "test_horovod_syncbn_cpu": (
        "builds its reference as tf.keras.layers.BatchNormalization(axis=1, fused=False); Keras "
        "3's BatchNormalization has no `fused` argument", _batch_norm_fused_false, 1),
    "test_partial_distributed_gradient_tape": (
        "keys its gradients by var.ref() of a Keras model's weights; Keras 3 variables have no "
        "ref()", _keras_variable_ref, 2),
    "test_horovod_allreduce_product_cpu": (
        "from 4 ranks its float16 products of values up to 100 overflow to inf in its reference "
        "and in any all-reduce, and inf - inf is NaN, which fails its `diff <= threshold` "
        "(Horovod's own engine fails it alike)", _float16_product_of_four_ranks, 4),
    "test_horovod_grouped_allreduce_product_cpu": (
        "as test_horovod_allreduce_product_cpu", _float16_product_of_four_ranks, 4),
}


def plain_tensorflow_error(line) -> Optional[str]:
    """What TensorFlow and Keras alone raise for a test's failing line (None: it runs)."""
    try:
        line()
    except Exception as e:  # noqa: BLE001  any error of theirs is the answer
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return None


def invalid_here(np: int) -> Dict[str, Tuple[str, str]]:
    """On the current stack, the listed tests whose line fails here on np ranks:
    name -> (why, error)."""
    if horovod_installed():
        return {}
    out = {}
    for name, (why, line, min_ranks) in INVALID_ON_KERAS_3.items():
        error = plain_tensorflow_error(line) if np >= min_ranks else None
        if error:
            out[name] = (why, error)
    return out


def read_sources(source: str, ref: str) -> Dict[str, str]:
    """The suite's files from a checkout, or from a git directory at `ref`."""
    out = {}
    for path in TEST_FILES:
        on_disk = os.path.join(source, path)
        if os.path.isfile(on_disk):
            with open(on_disk) as f:
                out[path] = f.read()
            continue
        shown = subprocess.run(["git", f"--git-dir={source}", "show", f"{ref}:{path}"],
                               capture_output=True, text=True)
        if shown.returncode != 0:
            raise SystemExit(f"horovod_suite: {path} is neither in {source!r} nor in it as a git "
                             f"directory at {ref!r}: give a Horovod 0.28.1 checkout (git clone "
                             f"--branch v0.28.1 https://github.com/horovod/horovod)")
        out[path] = shown.stdout
    return out


def adapt(text: str, path: str, as_shipped: bool = False) -> str:
    """The one line a user changes, and the internals given here (see the module docstring);
    as_shipped: Horovod's own import kept (the classic stack's reference)."""
    if as_shipped:
        return text
    if os.path.basename(path) == "test_tensorflow.py":
        if IMPORT_HVD not in text:
            raise SystemExit(f"horovod_suite: {path} has no {IMPORT_HVD!r}: is it Horovod 0.28.1's?")
        text = text.replace(IMPORT_HVD, "import tftorus as hvd", 1)
    return text.replace(IMPORT_EAGER, "_executing_eagerly = tf.executing_eagerly")


def prepare(sources: Dict[str, str], workdir: str, as_shipped: bool = False) -> str:
    for path, text in sources.items():
        with open(os.path.join(workdir, os.path.basename(path)), "w") as f:
            f.write(adapt(text, path, as_shipped))
    for name, text in (("common.py", COMMON_PY), ("conftest.py", CONFTEST_PY)):
        with open(os.path.join(workdir, name), "w") as f:
            f.write(text)
    return os.path.join(workdir, "test_tensorflow.py")


def horovod_installed() -> bool:
    import importlib.util
    return importlib.util.find_spec("horovod") is not None


def command(np: int, pytest_args: Sequence[str]) -> List[str]:
    pytest = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE", "--no-header",
              "test_tensorflow.py", *pytest_args]
    if horovod_installed():
        runner = os.path.join(os.path.dirname(sys.executable), "horovodrun")
        return [runner, "--gloo", "-np", str(np), "-H", f"localhost:{np}", sys.executable,
                *pytest]
    return [sys.executable, "-m", "tftorus.run", "-np", str(np), *pytest]


def outcomes(xml_path: str) -> Tuple[Dict[str, int], List[Tuple[str, str]]]:
    """Counts per outcome and the failed tests with their error line, from a rank's JUnit XML
    (a subtest -- graph or eager mode -- is its own entry)."""
    import xml.etree.ElementTree as ET
    counts: Dict[str, int] = collections.Counter()
    failed = []
    if not os.path.exists(xml_path):
        return counts, failed
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        bad = case.find("failure")
        bad = bad if bad is not None else case.find("error")
        if bad is not None:
            counts["failed"] += 1
            failed.append((case.get("name", "?"), error_line(bad)))
        elif case.find("skipped") is not None:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return counts, failed


def terminal_counts(output: str) -> Dict[str, int]:
    """Rank 0's pytest summary line ("3 failed, 5 passed, 2 skipped, 4 subtests passed in 9s"):
    the counts a user reads (a test whose graph and eager subtests both fail is one failure)."""
    counts = {}
    for line in output.splitlines():
        m = re.match(r"^\[(?:1,)?0\](?:<stdout>:)? ?(?:=+ )?((?:\d+ [a-z ]+, )*\d+ [a-z ]+) in "
                     r"[\d.]+s", line)
        if m:
            counts = {}
            for part in m.group(1).split(", "):
                n, what = part.split(" ", 1)
                counts[what] = int(n)
    return counts


def error_line(element) -> str:
    """The exception pytest marks 'E' (its first line), else the failure's message."""
    for line in (element.text or "").splitlines():
        if line.startswith("E ") and line[1:].strip():
            return line[1:].strip()
    return (element.get("message") or "").splitlines()[0] if element.get("message") else ""


def reason_of(message: str) -> str:
    """A failure's kind: its error line without module paths, numbers or node names."""
    text = re.sub(r"\b(?:[a-z_]+\.)+(?=[A-Z])", "", message)  # tensorflow.python...X -> X
    text = re.sub(r"\{\{.*", "", text)
    return re.sub(r"\s+", " ", text).strip()[:120] or "(no message)"


def run(source_files: Dict[str, str], np: int, pytest_args: Sequence[str], timeout: float,
        keep: Optional[str], as_shipped: bool = False
        ) -> Tuple[Dict[str, int], List[Tuple[str, str]], str]:
    workdir = keep or tempfile.mkdtemp(prefix="horovod_suite_")
    os.makedirs(workdir, exist_ok=True)
    prepare(source_files, workdir, as_shipped)
    env = dict(os.environ)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo, env.get("PYTHONPATH")) if p)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.setdefault("CUDA_VISIBLE_DEVICES", "")
    # a test that leaves a peer waiting (an error raised on one rank only) ends in a timeout;
    # TF then aborts every later collective of the job, so it should come soon
    env.setdefault("TFTORUS_TF_TIMEOUT", "60")
    try:
        done = subprocess.run(command(np, pytest_args), cwd=workdir, env=env, timeout=timeout,
                              capture_output=True, text=True)
        output = done.stdout + done.stderr
    except subprocess.TimeoutExpired as e:
        output = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) \
            else (e.stdout or "")
        output += f"\nhorovod_suite: timed out after {timeout:.0f} s"
    counts, failed = outcomes(os.path.join(workdir, "rank0.xml"))
    counts = terminal_counts(output) or counts
    if keep is None:
        shutil.rmtree(workdir, ignore_errors=True)
    return counts, failed, output


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("source", help="a Horovod 0.28.1 checkout (or a git directory, with --ref)")
    p.add_argument("--ref", default="v0.28.1", help="the git ref where source is a git directory")
    p.add_argument("-np", nargs="+", type=int, default=[2], help="world sizes, one job each")
    p.add_argument("-k", default=None, help="pytest's -k: only the tests it selects")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per world size")
    p.add_argument("--list", action="store_true", help="print every failed test")
    p.add_argument("--log", default=None, help="write each job's whole output to LOG.np<N>")
    p.add_argument("--keep", default=None, help="prepare and run in this folder, kept")
    p.add_argument("--as-shipped", action="store_true",
                   help="the suite unchanged, `import horovod.tensorflow as hvd` (classic stack "
                        "only): Horovod's own results, to set beside tftorus'")
    args = p.parse_args(argv)
    if args.as_shipped and not horovod_installed():
        p.error("--as-shipped runs Horovod itself: use the classic stack (.venv/bin/python)")
    if any(n < 1 for n in args.np):
        p.error("-np: world sizes must be >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    files = read_sources(args.source, args.ref)
    stack = "classic (Horovod's engine)" if horovod_installed() else "current (the tf engine)"
    stack += ", Horovod's own import" if args.as_shipped else ", import tftorus as hvd"
    pytest_args = ["-k", args.k] if args.k else []
    for np in args.np:
        counts, failed, output = run(files, np, pytest_args, args.timeout, args.keep,
                                     args.as_shipped)
        if args.log:
            with open(f"{args.log}.np{np}", "w") as f:
                f.write(output)
        total = ", ".join(f"{v} {k}" for k, v in sorted(counts.items())) or "no summary"
        print(f"## {np} ranks, {stack}: {total}")
        if not counts:
            print("\n".join(output.splitlines()[-30:]))
        invalid = invalid_here(np)
        own_code = [(n, m) for n, m in failed if _test_name(n) in invalid]
        failed = [(n, m) for n, m in failed if _test_name(n) not in invalid]
        for name in sorted({_test_name(n) for n, _ in own_code}):
            why, error = invalid[name]
            print(f"  invalid here: {name}: {why} (TensorFlow alone: {error})")
        print(f"  {len(failed)} failed entries left (graph and eager mode apart)")
        by_reason = collections.Counter(reason_of(m) for _, m in failed)
        for reason, n in by_reason.most_common():
            print(f"  {n:4d}  {reason}")
        if args.list:
            for name, message in failed:
                print(f"  FAILED {name}: {reason_of(message)}")
    return 0


def _test_name(entry: str) -> str:
    """A JUnit entry's test (a subtest's entry carries its mode after the name)."""
    return re.split(r"[\s\[(]", entry, 1)[0]


if __name__ == "__main__":
    sys.exit(main())
