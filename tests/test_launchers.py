"""Launching the tf engine without Horovod: the local launcher (tftorus/run.py), and the cluster
found from srun's and mpirun's variables (tftorus/cluster/discovery.py).

Unit tests (no process): Slurm host lists and tasks per node, srun and mpirun discovery from set
environments, every bad input's one-line message, mpirun's TCP rendezvous between threads, the
launcher's argument split. Real jobs (3 local processes each, tests/workers/launch_check.py, one
TF all-reduce checked): under `python -m tftorus.run`; one rank exiting 3 (the launcher ends the
others long before the collective timeout and exits 3); Ctrl-C to the launcher; plain processes
given srun's variables, and mpirun's (one host with fixed ports, and "across hosts" through the
rendezvous).
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from unittest import mock

import tensorflow as tf

from tests import harness
from tftorus.cluster import discovery, rendezvous, tf_runtime
from tftorus.launch import job_secret
from tftorus.launch import command_line
from tftorus.launch import local as launcher
from tftorus.launch import rank_layout

WORKER = harness.worker("launch_check.py")
RUN_PY = os.path.join(harness.ROOT, "tftorus", "run.py")
_OURS = ("SLURM_", "SLURMD_", "OMPI_", "HOROVOD_", "TFTORUS_TF_", "TFTORUS_RENDEZVOUS")


def _environment(values):
    """os.environ without any launcher's variables, plus `values`."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(_OURS) and k != "TF_CONFIG"}
    return mock.patch.dict(os.environ, {**clean, **values}, clear=True)


def discover(**values) -> discovery.Cluster:
    with _environment({k: str(v) for k, v in values.items()}):
        return discovery._discover(None, None, None, 5.0)


def srun(rank, **extra):
    """srun's variables for rank `rank` of node[01-02] (4 tasks each) and gpu-a3 (2 tasks)."""
    local = rank if rank < 4 else rank - 4 if rank < 8 else rank - 8
    return dict(SLURM_PROCID=rank, SLURM_LOCALID=local, SLURM_STEP_NUM_TASKS=10,
                SLURM_STEP_NODELIST="node[01-02],gpu-a3", SLURM_STEP_TASKS_PER_NODE="4(x2),2",
                **extra)


def mpirun(rank, size, local_rank, local_size, **extra):
    return dict(OMPI_COMM_WORLD_RANK=rank, OMPI_COMM_WORLD_SIZE=size,
                OMPI_COMM_WORLD_LOCAL_RANK=local_rank, OMPI_COMM_WORLD_LOCAL_SIZE=local_size,
                **extra)


class SlurmListsTest(tf.test.TestCase):

    def test_hostlist(self):
        self.assertEqual(discovery.expand_hostlist("node[01-04,07],gpu-a3"),
                         ["node01", "node02", "node03", "node04", "node07", "gpu-a3"])
        self.assertEqual(discovery.expand_hostlist("n[1-2],m5,o[3-4,6,7-9]"),  # TF's example
                         ["n1", "n2", "m5", "o3", "o4", "o6", "o7", "o8", "o9"])
        self.assertEqual(discovery.expand_hostlist("c[8-10]"), ["c8", "c9", "c10"])
        self.assertEqual(discovery.expand_hostlist("a[009-011]"), ["a009", "a010", "a011"])
        self.assertEqual(discovery.expand_hostlist("localhost"), ["localhost"])
        self.assertEqual(discovery.expand_hostlist("r[1-2]n[1-2]-ib"),
                         ["r1n1-ib", "r1n2-ib", "r2n1-ib", "r2n2-ib"])

    def test_tasks_per_node(self):
        self.assertEqual(discovery.expand_tasks_per_node("4(x2),2"), [4, 4, 2])
        self.assertEqual(discovery.expand_tasks_per_node("3"), [3])
        self.assertEqual(discovery.expand_tasks_per_node("1(x3),2(x2)"), [1, 1, 1, 2, 2])

    def test_bad_lists(self):
        for bad, why in [("node[01-04", "unbalanced brackets"), ("a]b", "unbalanced"),
                         ("a,,b", "an empty name"), ("n[x-3]", "not a list of numbers"),
                         ("n[5-3]", "runs backwards"), ("n[[1]]", "unbalanced")]:
            with self.assertRaisesRegex(ValueError, rf"^X={re.escape(repr(bad))} is not a Slurm "
                                                    rf"host list: .*{why}"):
                discovery.expand_hostlist(bad, "X")
        for bad in ("4(x)", "0", "two", "4(x0)", "", "4,,2"):
            with self.assertRaisesRegex(ValueError, r"is not Slurm's tasks per node \(counts "
                                                    r"like '4\(x2\),2'"):
                discovery.expand_tasks_per_node(bad)


class SlurmDiscoveryTest(tf.test.TestCase):

    def test_block_layout_over_nodes(self):
        c = discover(**srun(5))
        self.assertEqual((c.source, c.rank, c.size, c.local_rank, c.local_size),
                         ("slurm", 5, 10, 1, 4))
        self.assertEqual(c.workers, ("node01:8888", "node01:8889", "node01:8890", "node01:8891",
                                     "node02:8888", "node02:8889", "node02:8890", "node02:8891",
                                     "gpu-a3:8888", "gpu-a3:8889"))
        self.assertEqual(discovery.DEFAULT_PORT, 8888)
        c = discover(**srun(9, TFTORUS_TF_PORT=9000, SLURMD_NODENAME="gpu-a3"))
        self.assertEqual((c.local_rank, c.local_size, c.workers[9], c.workers[0]),
                         (1, 2, "gpu-a3:9001", "node01:9000"))

    def test_step_variables_first_then_the_job_ones(self):
        job = dict(SLURM_NTASKS=99, SLURM_JOB_NODELIST="other[1-9]", SLURM_TASKS_PER_NODE="11(x9)")
        self.assertEqual(discover(**srun(2), **job).workers[2], "node01:8890")
        c = discover(SLURM_PROCID=4, SLURM_NTASKS=6, SLURM_JOB_NODELIST="cn[7-8]",
                     SLURM_TASKS_PER_NODE="3(x2)", SLURM_LOCALID=1)
        self.assertEqual((c.rank, c.size, c.local_rank, c.workers[4]), (4, 6, 1, "cn8:8889"))

    def test_one_node_is_loopback(self):
        c = discover(SLURM_PROCID=2, SLURM_NTASKS=3, SLURM_JOB_NODELIST="localhost",
                     SLURM_TASKS_PER_NODE=3, TFTORUS_TF_PORT=7000)
        self.assertEqual(c.workers, ("127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"))
        self.assertEqual((c.local_rank, c.local_size), (2, 3))
        c = discover(SLURM_PROCID=0, SLURM_NTASKS=2, SLURM_STEP_NODELIST="n1",
                     SLURM_STEP_TASKS_PER_NODE=2, TFTORUS_TF_HOST="10.1.2.3")
        self.assertEqual(c.workers, ("10.1.2.3:8888", "10.1.2.3:8889"))

    def test_after_tf_config_and_horovodrun_and_mpirun(self):
        tf_config = '{"cluster": {"worker": ["h:1", "h:2"]}, "task": {"index": 1}}'
        self.assertEqual(discover(**srun(1), TF_CONFIG=tf_config).source, "TF_CONFIG")
        both = discover(**srun(1), **mpirun(0, 2, 0, 2))  # mpirun inside a Slurm job
        self.assertEqual((both.source, both.rank), ("mpirun", 0))
        self.assertEqual(discover().source, "single")

    def test_bad_input(self):
        cases = [
            (dict(srun(1), SLURM_PROCID="one"), r"^SLURM_PROCID='one' is not a number: start every "
                                                r"worker with srun"),
            (dict(srun(1), SLURM_STEP_NUM_TASKS="ten"), r"^SLURM_STEP_NUM_TASKS='ten' is not a "
                                                        r"number"),
            ({k: v for k, v in srun(1).items() if k != "SLURM_STEP_NUM_TASKS"},
             r"^SLURM_STEP_NUM_TASKS and SLURM_NTASKS are not set: SLURM_PROCID is set; start "
             r"every worker with srun"),
            ({k: v for k, v in srun(1).items() if k != "SLURM_STEP_NODELIST"},
             r"^SLURM_STEP_NODELIST and SLURM_JOB_NODELIST are not set"),
            ({k: v for k, v in srun(1).items() if k != "SLURM_STEP_TASKS_PER_NODE"},
             r"^SLURM_STEP_TASKS_PER_NODE and SLURM_TASKS_PER_NODE are not set"),
            (dict(srun(1), SLURM_PROCID=10), r"^SLURM_PROCID=10 is not a rank of the 10 tasks of "
                                             r"SLURM_STEP_NUM_TASKS"),
            (dict(srun(1), SLURM_STEP_NUM_TASKS=12), r"^SLURM_STEP_TASKS_PER_NODE='4\(x2\),2' puts "
                                                     r"10 tasks on the nodes but "
                                                     r"SLURM_STEP_NUM_TASKS=12: set both"),
            (dict(srun(1), SLURM_STEP_TASKS_PER_NODE="5(x2)"), r"names 3 nodes but "
                                                               r"SLURM_STEP_TASKS_PER_NODE="
                                                               r"'5\(x2\)' gives task counts for 2"),
            (dict(srun(1), SLURM_STEP_NODELIST="node[01-02"), r"is not a Slurm host list"),
            (dict(srun(1), SLURM_STEP_TASKS_PER_NODE="4x2,2"),
             r"is not Slurm's tasks per node"),
            (dict(srun(1), SLURM_STEP_NODELIST="n1,n1,n2"), r"names n1 more than once"),
            # --distribution=cyclic: rank 1 is task 0 of node02
            (dict(srun(1), SLURM_LOCALID=0), r"^SLURM_LOCALID=0 but rank 1 is task 1 of node "
                                             r"node01 .*--distribution=cyclic.*--distribution="
                                             r"block"),
            (dict(srun(1), SLURMD_NODENAME="node02"), r"^SLURMD_NODENAME=node02 but rank 1 falls "
                                                      r"on node node01"),
            (dict(srun(1), TFTORUS_TF_HOST="10.0.0.1"), r"^TFTORUS_TF_HOST \(or tf_host\) is "
                                                        r"'10.0.0.1', one address, but this srun "
                                                        r"step spans 3 nodes.*unset it"),
            (dict(srun(1), TFTORUS_TF_PORT=65534), r"ports 65534..65537 are not all in 1..65535; "
                                                   r"set TFTORUS_TF_PORT"),
        ]
        for env, message in cases:
            with self.subTest(message=message):
                with self.assertRaisesRegex(ValueError, message) as caught:
                    discover(**env)
                self.assertNotIn("\n", str(caught.exception))


class MpirunDiscoveryTest(tf.test.TestCase):

    def test_one_host_fixed_ports(self):
        c = discover(**mpirun(2, 4, 2, 4))
        self.assertEqual((c.source, c.rank, c.size, c.local_rank, c.local_size),
                         ("mpirun", 2, 4, 2, 4))
        self.assertEqual(c.workers, tuple(f"127.0.0.1:{8888 + r}" for r in range(4)))
        c = discover(**mpirun(0, 2, 0, 2, TFTORUS_TF_PORT=7100))
        self.assertEqual(c.workers, ("127.0.0.1:7100", "127.0.0.1:7101"))

    def test_bad_input(self):
        cases = [
            (mpirun("x", 4, 0, 4), r"^OMPI_COMM_WORLD_RANK='x' is not a number: start the "
                                   r"workers with Open MPI's mpirun"),
            (mpirun(4, 4, 0, 4), r"^OMPI_COMM_WORLD_RANK=4 is not a rank of "
                                 r"OMPI_COMM_WORLD_SIZE=4"),
            (mpirun(1, 4, 2, 2), r"^OMPI_COMM_WORLD_LOCAL_RANK=2 and _LOCAL_SIZE=2 do not fit"),
            (mpirun(1, 4, 0, 8), r"_LOCAL_SIZE=8 do not fit OMPI_COMM_WORLD_SIZE=4"),
            ({"OMPI_COMM_WORLD_RANK": 0}, r"^OMPI_COMM_WORLD_RANK is set but "
                                          r"OMPI_COMM_WORLD_SIZE is not"),
            (mpirun(1, 8, 1, 4), r"^mpirun started 8 ranks over several hosts \("
                                 r"OMPI_COMM_WORLD_LOCAL_SIZE=4\) and names no peer addresses: "
                                 r"set TFTORUS_RENDEZVOUS=host:port"),
            (mpirun(1, 8, 1, 4, TFTORUS_RENDEZVOUS="node01"), r"^TFTORUS_RENDEZVOUS='node01' is "
                                                              r"not host:port"),
            (mpirun(0, 4, 0, 4, TFTORUS_TF_PORT=65533), r"ports 65533..65536 are not all"),
        ]
        for env, message in cases:
            with self.subTest(message=message):
                with self.assertRaisesRegex(ValueError, message) as caught:
                    discover(**env)
                self.assertNotIn("\n", str(caught.exception))


KEY = bytes(range(32))  # a job's secret


def _free_port() -> int:
    return harness.free_ports(1)[0]


def _exchange(ranks, size, port, timeout, sizes=None, key=None, keys=None):
    """exchange_addresses of each rank in `ranks` in a thread: rank -> its list or exception.
    key: the job's secret (keys: a rank's own, where it differs)."""
    results = {}

    def one(rank):
        try:
            results[rank] = rendezvous.exchange_addresses(
                rank, (sizes or {}).get(rank, size), f"host{rank}:{100 + rank}",
                ("127.0.0.1", port), timeout,
                seal=job_secret.Seal((keys or {}).get(rank, key)))
        except Exception as e:  # noqa: BLE001  (the test looks at it)
            results[rank] = e
    threads = [threading.Thread(target=one, args=(r,), daemon=True) for r in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 10)
    return results


class RendezvousTest(tf.test.TestCase):
    """mpirun's address exchange across hosts, between threads on loopback."""

    def test_every_rank_gets_the_list(self):
        got = _exchange([2, 1, 3, 0], 4, _free_port(), 10)
        want = ("host0:100", "host1:101", "host2:102", "host3:103")
        self.assertEqual(got, {r: want for r in range(4)})

    def test_missing_rank_named_on_every_rank(self):
        start = time.monotonic()
        got = _exchange([0, 1], 4, _free_port(), 1.5)
        self.assertLess(time.monotonic() - start, 8)
        for rank in (0, 1):
            self.assertIsInstance(got[rank], RuntimeError)
            self.assertRegex(str(got[rank]), rf"^rank {rank}: rank\(s\) 2, 3 did not reach the "
                                             rf"rendezvous at 127.0.0.1:\d+ within 1.5s")

    def test_no_rank_zero(self):
        got = _exchange([1], 2, _free_port(), 1.0)
        self.assertRegex(str(got[1]), r"^rank 1: could not reach the rendezvous at 127.0.0.1:\d+ "
                                      r"\(TFTORUS_RENDEZVOUS, hosted by rank 0\) within 1s")

    def test_inconsistent_sizes(self):
        """A rank of the job (it holds the secret) started for another size stops them all."""
        got = _exchange([0, 1], 2, _free_port(), 5, sizes={1: 3}, key=KEY)
        for rank in (0, 1):
            self.assertRegex(str(got[rank]), rf"^rank {rank}: the rendezvous at .* got "
                                             rf"inconsistent ranks: rank 1 was started for 3 "
                                             rf"ranks, rank 0 for 2")

    def test_strangers_and_idle_connections_hold_nobody_up(self):
        """Issue 61: while the job's ranks register, a stranger holds connections open without a
        word, registers as rank 1 (unsealed, and sealed with another key) and with a wrong
        size, and replays a real rank's registration: the ranks get their list in time and
        rank 0 says what it dropped."""
        port = _free_port()
        strangers = []

        def attack():
            for _ in range(3):  # idle connections, held open
                strangers.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            forged = [b"tftorus-rendezvous-1 3 1 evil:1\n",
                      rendezvous._line(job_secret.Seal(None), {"magic": rendezvous._RDV_MAGIC,
                                                               "size": 3, "rank": 1,
                                                               "address": "evil:1"}),
                      rendezvous._line(job_secret.Seal(bytes(32)), {
                          "magic": rendezvous._RDV_MAGIC, "size": 2, "rank": 2,
                          "address": "evil:2"})]
            for line in forged:
                with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
                    c.sendall(line)
        sealed = job_secret.Seal(KEY)
        real = rendezvous._line(sealed, {"magic": rendezvous._RDV_MAGIC, "size": 3, "rank": 1,
                                         "address": "host1:101"})

        def replay():  # rank 1's registration sent again (a stranger who captured it)
            for _ in range(2):
                with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
                    c.sendall(real)
                    time.sleep(0.2)

        results = {}
        zero = threading.Thread(target=lambda: results.update(
            _exchange([0], 3, port, 20, key=KEY)), daemon=True)
        with mock.patch("sys.stderr") as err:
            zero.start()
            time.sleep(0.5)  # rank 0 listens
            attack()
            replay()  # the first copy is taken as rank 1's; the second is refused
            start = time.monotonic()
            results.update(_exchange([2], 3, port, 20, key=KEY))
            zero.join(25)
        said = "".join(c.args[0] for c in err.write.call_args_list)
        for c in strangers:
            c.close()
        want = ("host0:100", "host1:101", "host2:102")
        self.assertEqual(results, {0: want, 2: want})
        self.assertLess(time.monotonic() - start, 5)
        self.assertRegex(said, r"tftorus rendezvous \(rank 0\): dropped a connection from "
                               r"127.0.0.1:\d+: ")
        self.assertRegex(said, r"(\d+) connections dropped in all")
        self.assertGreaterEqual(int(re.search(r"(\d+) connections dropped", said).group(1)), 4)

    def test_a_rank_with_another_secret_is_refused(self):
        got = _exchange([0, 1], 2, _free_port(), 2, key=KEY, keys={1: bytes(32)})
        self.assertRegex(str(got[0]), r"^rank 0: rank\(s\) 1 did not reach the rendezvous .* "
                                      r"and job secret")
        self.assertRegex(str(got[1]), r"^rank 1: the rendezvous .* closed without an answer "
                                      r"\(did rank 0 end, or refuse this rank's job secret\?\)")


class LauncherArgumentsTest(tf.test.TestCase):

    def test_split(self):
        opts, program = command_line.parse(["-np", "2", WORKER, "-np", "5", "--port", "1"])
        self.assertEqual((opts.np, opts.port, program), (2, None, [WORKER, "-np", "5", "--port",
                                                                   "1"]))
        opts, program = command_line.parse(["--np=3", "--grace", "1", "-m", "pkg.mod", "--x",
                                            "-m"])
        self.assertEqual((opts.np, opts.grace, program), (3, 1.0, ["-m", "pkg.mod", "--x", "-m"]))
        opts, program = command_line.parse(["-np", "2", "--port", "9000", "--", WORKER])
        self.assertEqual((opts.port, program), (9000, [WORKER]))

    def test_tf_config(self):
        configs = [json.loads(c) for c in launcher.tf_configs([5001, 5002])]
        self.assertEqual([c["task"] for c in configs],
                         [{"type": "worker", "index": 0}, {"type": "worker", "index": 1}])
        self.assertEqual(configs[1]["cluster"], {"worker": ["127.0.0.1:5001", "127.0.0.1:5002"]})

    def test_bad_arguments(self):
        cases = [([WORKER], "give -np N (the number of ranks), or --nnodes"),
                 (["-np", "2"], "name the script to run"),
                 (["-np", "2", "-m"], "name the script to run"),
                 (["-np", "0", WORKER], "-np must be at least 1"),
                 (["-np", "2", "nowhere.py"], "no such script: nowhere.py"),
                 (["-np", "2", "--port", "65535", WORKER], "ports 65535..65536 are not all"),
                 (["-np", "2", "--grace", "-1", WORKER], "--grace must be >= 0")]
        for argv, message in cases:
            with self.subTest(argv=argv), mock.patch("sys.stderr") as err, \
                    self.assertRaises(SystemExit) as caught:
                command_line.parse(argv)
            self.assertEqual(caught.exception.code, 2)
            self.assertIn(message, "".join(c.args[0] for c in err.write.call_args_list))


# hosts "a:4,b:4,c:2" as horovodrun lays them out: rank r on HOSTS[r]
HOSTS = ["a"] * 4 + ["b"] * 4 + ["c"] * 2
#: each rank's (local rank, local size, cross rank, cross size) there, by hand: the cross
#: communicator of local rank 2 or 3 has the two hosts with that many slots
LAYOUT = [(0, 4, 0, 3), (1, 4, 0, 3), (2, 4, 0, 2), (3, 4, 0, 2), (0, 4, 1, 3), (1, 4, 1, 3),
          (2, 4, 1, 2), (3, 4, 1, 2), (0, 2, 2, 3), (1, 2, 2, 3)]


def horovod_values(host, rank, size, local_rank, local_size, cross_rank, cross_size):
    return {"HOROVOD_HOSTNAME": host, "HOROVOD_RANK": str(rank), "HOROVOD_SIZE": str(size),
            "HOROVOD_LOCAL_RANK": str(local_rank), "HOROVOD_LOCAL_SIZE": str(local_size),
            "HOROVOD_CROSS_RANK": str(cross_rank), "HOROVOD_CROSS_SIZE": str(cross_size)}


class HorovodVariablesTest(tf.test.TestCase):
    """The HOROVOD_* variables horovodrun gives, as tftorus.run and the tf engine's init give
    them (tftorus.launch.rank_layout.horovod_variables,
    tftorus.cluster.tf_runtime.horovod_variables)."""

    def test_hosts_of_unequal_slots(self):
        for rank, (host, layout) in enumerate(zip(HOSTS, LAYOUT)):
            self.assertEqual(rank_layout.horovod_variables(HOSTS, rank),
                             horovod_values(host, rank, len(HOSTS), *layout))

    @unittest.skipUnless(harness.HOROVOD, "horovodrun's own values: the classic stack")
    def test_as_horovodrun_gives_them(self):
        from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
        from horovod.runner.gloo_run import create_slot_env_vars
        for spec in ("a:4,b:4,c:2", "a:1,b:3,c:2", "localhost:3", "a:2,b:2"):
            slots = get_host_assignments(parse_hosts(spec), sum(
                int(h.split(":")[1]) for h in spec.split(",")))
            hosts = [slot.hostname for slot in slots]
            for slot in slots:
                with self.subTest(spec=spec, rank=slot.rank):
                    self.assertEqual(rank_layout.horovod_variables(hosts, slot.rank),
                                     create_slot_env_vars(slot))

    def test_hosts_taken_in_turn(self):
        # a TF_CONFIG may interleave hosts: local ranks count per host, cross in rank order
        got = [rank_layout.horovod_variables(["a", "b", "a", "b"], r) for r in range(4)]
        self.assertEqual([(g["HOROVOD_LOCAL_RANK"], g["HOROVOD_CROSS_RANK"]) for g in got],
                         [("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")])

    def test_from_srun_and_mpirun_clusters(self):
        c = discover(**srun(9))  # node[01-02] with 4 tasks each, gpu-a3 with 2
        self.assertEqual(tf_runtime.horovod_variables(c),
                         horovod_values("gpu-a3", 9, 10, *LAYOUT[9]))
        # loopback is horovodrun's "localhost"
        c = discover(**mpirun(1, 3, 1, 3), TFTORUS_TF_PORT=7000)
        self.assertEqual(tf_runtime.horovod_variables(c),
                         horovod_values("localhost", 1, 3, 1, 3, 0, 1))
        # mpirun's own local ranks win over one address for every "host"
        c = discovery.Cluster(("127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3", "127.0.0.1:4"),
                               3, 1, 2, "mpirun", 60.0)
        self.assertEqual(tf_runtime.horovod_variables(c),
                         horovod_values("localhost", 3, 4, 1, 2, 1, 2))

    def test_init_sets_only_what_is_absent(self):
        c = discover(**srun(5))
        with _environment({"HOROVOD_CROSS_SIZE": "7"}):
            tf_runtime.publish_horovod_variables(c)
            self.assertEqual({k: v for k, v in os.environ.items() if k.startswith("HOROVOD_")},
                             {**horovod_values("node02", 5, 10, *LAYOUT[5]),
                              "HOROVOD_CROSS_SIZE": "7"})
        single = discover()
        with _environment({}):
            tf_runtime.publish_horovod_variables(single)  # no launcher: horovodrun gives none
            self.assertFalse([k for k in os.environ if k.startswith("HOROVOD_")])

    @unittest.skipUnless(harness.HOROVOD, "Horovod's engine: the classic stack")
    def test_horovods_engine_refuses_them_without_horovodrun(self):
        # a script under tftorus.run (or one started after a tf-engine init) has HOROVOD_RANK
        # but no rendezvous: Horovod would wait 30 s for it and abort
        from tftorus.runtime import process_state
        if process_state.is_initialized() or process_state.horovod_running():
            self.skipTest("Horovod already runs in this process")
        with _environment({"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2"}), \
                self.assertRaisesRegex(RuntimeError, r"^HOROVOD_RANK is set but horovodrun did "
                                                     r"not start this process .* use "
                                                     r"engine='tf'"):
            process_state.init(engine="horovod")


# -- real processes ------------------------------------------------------------------------

_CLEAR = {"TF_CONFIG": None, "HOROVOD_RANK": None, "TFTORUS_TF_HOST": None,
          "TFTORUS_TF_PORT": None, "TFTORUS_RENDEZVOUS": None, "TFTORUS_TF_TIMEOUT": "60",
          **{k: None for k in os.environ if k.startswith(("SLURM_", "SLURMD_", "OMPI_"))}}


def _ok_lines(test, output, source, size=3, prefix=""):
    """Each rank's "rank r of N (source) ... sum [..] ok" line (prefixed `[r] ` by the launcher)."""
    for r in range(size):
        pre = f"[{r}] " if prefix else ""
        test.assertRegex(output, rf"(?m)^{re.escape(pre)}rank {r} of {size} \({source}\) .* sum "
                                 rf"\[6\.0, 60\.0\] ok$")


class LocalLauncherTest(tf.test.TestCase):

    def test_three_ranks_all_reduce_with_rank_prefixes(self):
        result = harness.run(["-m", "tftorus.run", "-np", "3", WORKER], timeout=120, env=_CLEAR)
        self.assertEqual(result.returncode, 0, harness.describe(result))
        _ok_lines(self, result.output, "TF_CONFIG", prefix=True)
        for r in range(3):
            self.assertRegex(result.output, rf"(?m)^\[{r}\] rank {r} of 3 \(TF_CONFIG\) local {r} "
                                            rf"of 3 workers 127\.0\.0\.1:\d+,127\.0\.0\.1:\d+,")
        # the launcher's own lines (its import of tftorus) may be bare; no rank's line is
        self.assertNotRegex(result.output, r"(?m)^(rank \d of 3|Traceback)")

    def test_every_rank_gets_horovodruns_variables_and_a_users_is_kept(self):
        worker = harness.worker("horovod_variables.py")
        clear = {**_CLEAR, **{k: None for k in os.environ if k.startswith("HOROVOD_")}}
        result = harness.run(["-m", "tftorus.run", "-np", "3", worker], timeout=60, env=clear)
        self.assertEqual(result.returncode, 0, harness.describe(result))
        for r in range(3):
            self.assertIn(f"[{r}] HOROVOD_VARIABLES " + json.dumps(dict(sorted(horovod_values(
                "localhost", r, 3, r, 3, 0, 1).items()))), result.output)
        result = harness.run(["-m", "tftorus.run", "-np", "2", worker], timeout=60,
                             env={**clear, "HOROVOD_HOSTNAME": "mine"})
        self.assertEqual(result.returncode, 0, harness.describe(result))
        for r in range(2):
            self.assertIn(f"[{r}] HOROVOD_VARIABLES " + json.dumps(dict(sorted({
                **horovod_values("localhost", r, 2, r, 2, 0, 1),
                "HOROVOD_HOSTNAME": "mine"}.items()))), result.output)
        self.assertIn("[tftorus.run] HOROVOD_HOSTNAME set in the environment: every rank gets "
                      "that value", result.output)

    def test_the_ranks_network_is_their_own(self):
        """Issue 61: TensorFlow's servers bind every interface; tftorus.run's ranks run in a
        network of their own (loopback only), so a port they listen on is out of reach from
        this machine's network, and each rank holds the job's secret. --share-network keeps the
        machine's network (the port is then reachable, as before)."""
        worker = harness.worker("listen_like_tf.py")
        for share in (False, True):
            with self.subTest(share_network=share):
                box = {}

                def knock():  # while the ranks wait: try their ports from out here
                    deadline = time.monotonic() + 60
                    while "ports" not in box and time.monotonic() < deadline:
                        time.sleep(0.1)
                    box["reached"] = []
                    for port in box.get("ports", []):
                        try:
                            socket.create_connection(("127.0.0.1", port), timeout=2).close()
                            box["reached"].append(port)
                        except OSError:
                            pass
                argv = ["-m", "tftorus.run", "-np", "2", *(["--share-network"] * share), worker]
                proc = subprocess.Popen([sys.executable, *argv], cwd=harness.ROOT,
                                        env={**harness._env(), "LISTEN_SECONDS": "6"},
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True)
                thread = threading.Thread(target=knock, daemon=True)
                thread.start()
                lines = []
                for line in proc.stdout:
                    lines.append(line)
                    found = re.findall(r"LISTENING (\d+)", "".join(lines))
                    if len(found) == 2 and "ports" not in box:
                        box["ports"] = [int(p) for p in found]
                proc.wait(60)
                thread.join(10)
                output = "".join(lines)
                if "the ranks share this machine's network (" in output and not share:
                    self.skipTest("this machine refuses network namespaces: " + output[:300])
                mine = os.readlink("/proc/self/ns/net")
                nets = set(re.findall(r"NET (\S+)", output))
                self.assertEqual(len(nets), 1, output)  # both ranks in one network
                self.assertEqual(re.findall(r"SECRET (\d+)", output), ["64", "64"], output)
                if share:
                    self.assertEqual(nets, {mine}, output)
                    self.assertEqual(len(box["reached"]), 2, output)
                else:
                    self.assertNotEqual(nets, {mine}, output)
                    self.assertEqual(set(re.findall(r"INTERFACES (\S+)", output)), {"lo"})
                    self.assertEqual(box["reached"], [], output)
                    self.assertNotIn("SOMEONE CONNECTED", output)

    def test_the_launcher_imports_no_tensorflow(self):
        # its ranks do; TensorFlow in the launcher cost each job 2.5-3.8 s of CPU and held a
        # TensorFlow runtime beside the ranks for the whole run
        result = harness.run(["-X", "importtime", "-m", "tftorus.run", "--help"], timeout=60)
        self.assertEqual(result.returncode, 0, harness.describe(result))
        self.assertIn("tftorus.run", result.output)
        self.assertRegex(result.output, r"(?m)\|\s+tftorus$")  # importtime's lines are there
        self.assertNotRegex(result.output, r"(?m)\|\s+(tensorflow|keras|numpy)$")

    def test_a_failing_rank_ends_the_others(self):
        # the collective timeout is 300 s: only the launcher can end ranks 0 and 2 this early
        result = harness.run([RUN_PY, "-np", "3", "--grace", "5", WORKER, "--fail-rank", "1",
                              "--code", "3"], timeout=120, env={**_CLEAR,
                                                                "TFTORUS_TF_TIMEOUT": "300"})
        self.assertFalse(result.timed_out, harness.describe(result))
        self.assertEqual(result.returncode, 3, harness.describe(result))
        self.assertLess(result.seconds, 60, harness.describe(result))
        self.assertIn("[1] failing on purpose with status 3", result.output)
        self.assertRegex(result.output, r"\[tftorus.run\] rank 1 exited with status 3; stopping "
                                        r"the other \d running rank\(s\)")
        self.assertIn("[tftorus.run] failed: rank 1 exited with status 3 first", result.output)
        self.assertNotIn("second all-reduce returned", result.output)

    def test_ctrl_c_ends_every_rank(self):
        harness.refuse_in_quick_tier()
        env = {k: v for k, v in {**harness._env(), **_CLEAR}.items() if v is not None}
        proc = subprocess.Popen([sys.executable, RUN_PY, "-np", "2", "--grace", "3", WORKER,
                                 "--sleep", "60"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=harness.ROOT, env=env,
                                start_new_session=True)
        try:
            pids = []
            deadline = time.monotonic() + 20
            while len(pids) < 2 and time.monotonic() < deadline:
                line = proc.stdout.readline()
                match = re.match(r"\[([01])\] pid (\d+)$", line.strip())
                if match:
                    pids.append(int(match.group(2)))
                elif not line:
                    break
            self.assertEqual(len(pids), 2, "both ranks started")
            proc.send_signal(signal.SIGINT)
            start = time.monotonic()
            _, err = proc.communicate(timeout=20)
            self.assertLess(time.monotonic() - start, 10)
            self.assertEqual(proc.returncode, 128 + signal.SIGINT, err)
            self.assertIn("[tftorus.run] got SIGINT; stopping every rank", err)
            for pid in pids:
                with self.assertRaises(ProcessLookupError, msg=f"rank pid {pid} still runs"):
                    os.kill(pid, 0)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()




def run_each(envs, timeout=120.0):
    """The worker as one plain process per env (what srun or mpirun would start): the output
    of all, the status of each, the seconds."""
    return harness.run_ranks([WORKER], len(envs), lambda i: {**_CLEAR, **envs[i]}, timeout)


class SchedulerEnvironmentTest(tf.test.TestCase):
    """3 plain processes, each given the variables srun or mpirun would give it."""

    def test_srun_variables(self):
        base = harness.free_port_base(3)
        result = run_each([dict(SLURM_PROCID=str(r), SLURM_NTASKS="3", SLURM_LOCALID=str(r),
                                SLURM_JOB_NODELIST="localhost", SLURM_TASKS_PER_NODE="3",
                                TFTORUS_TF_PORT=str(base)) for r in range(3)])
        self.assertEqual(result.returncodes, (0, 0, 0), harness.describe(result))
        _ok_lines(self, result.output, "slurm")
        self.assertIn(f"local 2 of 3 workers 127.0.0.1:{base},127.0.0.1:{base + 1},"
                      f"127.0.0.1:{base + 2} sum", result.output)

    def test_mpirun_variables_one_host(self):
        base = harness.free_port_base(3)
        result = run_each([{**{k: str(v) for k, v in mpirun(r, 3, r, 3).items()},
                            "TFTORUS_TF_PORT": str(base)} for r in range(3)])
        self.assertEqual(result.returncodes, (0, 0, 0), harness.describe(result))
        _ok_lines(self, result.output, "mpirun")
        self.assertIn(f"local 1 of 3 workers 127.0.0.1:{base},127.0.0.1:{base + 1},"
                      f"127.0.0.1:{base + 2} sum", result.output)

    def test_mpirun_variables_across_hosts_through_the_rendezvous(self):
        # each rank alone on its "host" (local size 1): the addresses go through rank 0's
        # rendezvous; each rank's TF server on a free port of its own
        rendezvous = f"127.0.0.1:{_free_port()}"
        result = run_each([{**{k: str(v) for k, v in mpirun(r, 3, 0, 1).items()},
                            "TFTORUS_RENDEZVOUS": rendezvous, "TFTORUS_TF_HOST": "127.0.0.1"}
                           for r in range(3)])
        self.assertEqual(result.returncodes, (0, 0, 0), harness.describe(result))
        _ok_lines(self, result.output, "mpirun")
        for r in range(3):
            self.assertRegex(result.output, rf"(?m)^rank {r} of 3 \(mpirun\) local 0 of 1 ")

    def test_a_stranger_at_the_rendezvous_of_a_real_job(self):
        """Issue 61: while 3 ranks with the job's secret start, a stranger holds 5 connections
        open without a word and registers as rank 1 (twice: the old line format and an
        unsealed one, then with a wrong size). The job starts as undisturbed, and rank 0 says
        what it dropped."""
        port = _free_port()
        secret = job_secret.make()
        held = []

        def stranger():
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # until rank 0 listens
                try:
                    held.append(socket.create_connection(("127.0.0.1", port), timeout=1))
                    break
                except OSError:
                    time.sleep(0.05)
            for _ in range(4):
                held.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            for line in (b"tftorus-rendezvous-1 3 1 evil:1\n",
                         rendezvous._line(job_secret.Seal(None), {
                             "magic": rendezvous._RDV_MAGIC, "size": 3, "rank": 1,
                             "address": "evil:1"}),
                         rendezvous._line(job_secret.Seal(None), {
                             "magic": rendezvous._RDV_MAGIC, "size": 7, "rank": 2,
                             "address": "evil:2"})):
                with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
                    c.sendall(line)
        thread = threading.Thread(target=stranger, daemon=True)
        thread.start()
        result = run_each([{**{k: str(v) for k, v in mpirun(r, 3, 0, 1).items()},
                            "TFTORUS_RENDEZVOUS": f"127.0.0.1:{port}",
                            "TFTORUS_TF_HOST": "127.0.0.1", job_secret.ENV: secret,
                            "LAUNCH_CHECK_DELAY": "0" if r == 0 else "8"}  # the stranger first
                           for r in range(3)])
        thread.join(10)
        for c in held:
            c.close()
        self.assertEqual(result.returncodes, (0, 0, 0), harness.describe(result))
        _ok_lines(self, result.output, "mpirun")
        self.assertNotIn("evil", result.output)
        self.assertRegex(result.output, r"tftorus rendezvous \(rank 0\): \d+ connections? "
                                        r"dropped in all")


if __name__ == "__main__":
    tf.test.main()
