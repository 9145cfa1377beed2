"""`python -m tftorus.run` across hosts: from one host over ssh (-H, as horovodrun) and the same
command on every node (--nnodes, as torchrun).

The launcher's parsing and placement are checked here without processes. The jobs run on
emulated hosts (tests/emulated_hosts.py: network namespaces as root, each with its own host name
and a real sshd that takes a key made here): a user's Keras fit on 4 ranks over 2 hosts equal to
NumPy's, in both forms, each rank saying its host, local rank and GPU; a rank SIGKILLed on h2
ending every process on both hosts within 10 s, the rank and host named; a lost host; an unknown
and an unreachable host refused in one line within 30 s, with nothing left running."""
import json
import os
import signal
import sys
import tempfile
import time

import numpy as np
import tensorflow as tf

from tests import emulated_hosts, harness
from tests.workers import user_fit_accumulation as user_fit
from tftorus.launch import command_line, over_ssh

WORKER = "tests/workers/across_hosts.py"
RANKS = 4
# the links given, so the fits skip init's link probe (tests/test_planner.py tests the probe)
LINKS = {"TFTORUS_LINKS": "intra=3.4us@50GB/s,inter=9.6us@12.5GB/s,lanes=2"}


class ParsingTest(tf.test.TestCase):

    def test_hosts_and_slots(self):
        self.assertEqual(over_ssh.parse_hosts("h1:8,h2:8"), [("h1", 8), ("h2", 8)])
        self.assertEqual(over_ssh.parse_hosts("h1,h2:2"), [("h1", 1), ("h2", 2)])
        self.assertEqual(over_ssh.assign([("h1", 8), ("h2", 8)], 12), [("h1", 8), ("h2", 4)])
        self.assertEqual(over_ssh.assign([("h1", 2), ("h2", 2)], 2), [("h1", 2)])
        for bad, says in (("h1:0", "NAME:SLOTS with SLOTS >= 1"), ("h1:x", "NAME:SLOTS"),
                          (",", "names no host"), ("h1:2,h1:2", "h1 more than once")):
            with self.subTest(bad=bad), self.assertRaisesRegex(ValueError, says):
                over_ssh.parse_hosts(bad)
        with self.assertRaisesRegex(ValueError, r"-np 20 but the hosts have 16 slots "
                                                r"\(h1:8,h2:8\): lower -np"):
            over_ssh.assign([("h1", 8), ("h2", 8)], 20)

    def test_hostfile(self):
        path = os.path.join(tempfile.mkdtemp(), "hosts")
        with open(path, "w") as f:
            f.write("# the cluster\nh1 slots=8\nh2:4\n\nh3\n")
        self.assertEqual(over_ssh.parse_hostfile(path), [("h1", 8), ("h2", 4), ("h3", 1)])
        with open(path, "w") as f:
            f.write("h1 slots=8 extra\n")
        with self.assertRaisesRegex(ValueError, "line 1: 'h1 slots=8 extra'; write 'NAME "
                                                "slots=N'"):
            over_ssh.parse_hostfile(path)

    def test_forwarded_environment(self):
        environ = {"TFTORUS_GRID": "2x2", "NCCL_DEBUG": "INFO", "HOME": "/root",
                   "TF_CONFIG": "{}", "TFTORUS_JOB_SECRET": "ab" * 32, "MY_DATA": "/data",
                   "PATH": "/usr/bin"}
        env = over_ssh.forwarded_environment(["MY_DATA", "EXTRA=1"], environ)
        self.assertEqual(env, {"TFTORUS_GRID": "2x2", "NCCL_DEBUG": "INFO", "MY_DATA": "/data",
                               "EXTRA": "1", "PATH": "/usr/bin"})
        with self.assertRaisesRegex(ValueError, "TFTORUS_JOB_SECRET is not forwarded"):
            over_ssh.forwarded_environment(["TFTORUS_JOB_SECRET"], environ)
        line = over_ssh.remote_shell_line(["python", "a b.py"], {"X": "it's"})
        self.assertIn("exec env X='it'\"'\"'s' python 'a b.py'", line)

    def test_forms_refuse_mixed_or_missing_options(self):
        for argv, says in (
                (["--nnodes", "2", "x.py"], "needs all of --nnodes, --node-rank"),
                (["--nnodes", "2", "--node-rank", "2", "--rendezvous", "h:1",
                  "--nproc-per-node", "1", "x.py"], r"--node-rank must be in 0..1"),
                (["-np", "2", "--nnodes", "2", "--node-rank", "0", "--rendezvous", "h:1",
                  "--nproc-per-node", "1", "x.py"], "leave out -np"),
                (["-H", "h1:2", "x.py"], "give -np N"),
                (["-np", "2", "-H", "h1", "--hostfile", "f", "x.py"], "not both")):
            with self.subTest(argv=argv):
                with _stderr() as err, self.assertRaises(SystemExit):
                    command_line.parse(argv)
                self.assertRegex(err.getvalue(), says)


class _stderr:
    """What argparse writes to stderr, captured."""

    def __enter__(self):
        import io
        self.old, sys.stderr = sys.stderr, io.StringIO()
        return sys.stderr

    def __exit__(self, *exc):
        sys.stderr = self.old
        return False


def _python(*argv):
    return [sys.executable, "-m", "tftorus.run", *argv]


class AcrossHostsTest(tf.test.TestCase):
    """Jobs on two emulated hosts (skipped, saying why, where they cannot be made)."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        why = emulated_hosts.why_not_possible()
        if why:
            raise __import__("unittest").SkipTest(f"emulated hosts: {why}")
        cls.hosts = emulated_hosts.Hosts(2).__enter__()

    @classmethod
    def tearDownClass(cls):
        cls.hosts.__exit__()
        super().tearDownClass()

    def tearDown(self):
        for host in (1, 2):  # each test leaves nothing running on any host
            self.assertEqual(self._left(host), [], f"processes left on h{host}")
        super().tearDown()

    def _left(self, host, wait: float = 5.0):
        deadline = time.monotonic() + wait
        while self.hosts.processes(host) and time.monotonic() < deadline:
            time.sleep(0.2)
        return self.hosts.processes(host)

    def check_fit(self, output: str, out: str):
        reference = user_fit.reference(RANKS)
        for rank in range(RANKS):
            host, local_rank = 1 + rank // 2, rank % 2
            self.assertIn(f"[{rank}] rank {rank}/{RANKS} on h{host}: local rank {local_rank} of 2, "
                          f"GPU {local_rank}", output)
            with np.load(os.path.join(out, f"rank{rank}.npz")) as f:
                got = [f[k] for k in sorted(f.files, key=lambda k: int(k.split("_")[1]))]
            for i, (a, b) in enumerate(zip(reference, got)):
                rel = np.max(np.abs(a - b)) / np.max(np.abs(a))
                self.assertLess(rel, 1e-5, f"rank {rank}, variable {i}: {rel:.2e}")
            with open(os.path.join(out, f"rank{rank}.json")) as f:
                self.assertEqual([log["updates"] for log in json.load(f)["logs"]],
                                 [8, 16, 20, 22])

    def test_fit_from_one_host_over_ssh(self):
        out = tempfile.mkdtemp(prefix="tftorus-hosts-fit-")
        result = self.hosts.run(1, _python("-np", str(RANKS), "-H", "h1:2,h2:2", "--ssh",
                                           self.hosts.ssh, WORKER, "fit", out), timeout=400,
                                env=LINKS)
        self.assertEqual(result.returncode, 0, harness.describe(result))
        self.check_fit(result.output, out)

    def test_fit_with_the_same_command_on_each_node(self):
        out = tempfile.mkdtemp(prefix="tftorus-nodes-fit-")
        secret = {"TFTORUS_JOB_SECRET": "5e" * 32, **LINKS}
        nodes = [self.hosts.start(
            node + 1, _python("--nnodes", "2", "--node-rank", str(node), "--rendezvous",
                              f"{emulated_hosts.address(1)}:29450", "--nproc-per-node", "2",
                              WORKER, "fit", out), env=secret) for node in (1, 0)]
        outputs = [node.communicate(timeout=400)[0] for node in nodes]
        for node, output in zip(nodes, outputs):
            self.assertEqual(node.returncode, 0, output[-3000:])
        self.check_fit("\n".join(outputs), out)
        self.assertNotIn("unauthenticated", "\n".join(outputs))

    def start_waiting_job(self, hosts_argv):
        pids = tempfile.mkdtemp(prefix="tftorus-hosts-pids-")
        os.chmod(pids, 0o777)
        proc = self.hosts.start(1, _python(*hosts_argv, WORKER, "wait", pids))
        deadline = time.monotonic() + 240
        while len(os.listdir(pids)) < RANKS:
            self.assertIsNone(proc.poll(), proc.stdout.read() if proc.poll() is not None else "")
            self.assertLess(time.monotonic(), deadline, "the ranks did not all start")
            time.sleep(0.5)
        time.sleep(1)  # the pid files are written before the first all-reduce
        return proc, pids

    def wait_for_end(self, proc, since: float):
        output, _ = proc.communicate(timeout=60)
        return output, time.monotonic() - since

    def test_a_rank_killed_on_h2_ends_the_job_on_both_hosts(self):
        proc, pids = self.start_waiting_job(["-np", str(RANKS), "-H", "h1:2,h2:2", "--ssh",
                                             self.hosts.ssh])
        with open(os.path.join(pids, "rank3.pid")) as f:
            victim = int(f.read())
        killed = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        output, seconds = self.wait_for_end(proc, killed)
        self.assertLess(seconds, 10.0, output[-3000:])
        self.assertEqual(proc.returncode, 128 + signal.SIGKILL, output[-3000:])
        self.assertIn("[tftorus.run] failed: rank 3 on h2 was killed by SIGKILL", output)
        for host in (1, 2):
            self.assertEqual(self._left(host, wait=10.0 - seconds), [],
                             f"processes left on h{host}")

    def test_a_lost_host_ends_the_job(self):
        """Every process on h2 killed at once, its node launcher too, as when a host dies."""
        proc, _ = self.start_waiting_job(["-np", str(RANKS), "-H", "h1:2,h2:2", "--ssh",
                                          self.hosts.ssh])
        killed = time.monotonic()
        for pid in self.hosts.processes(2):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        output, seconds = self.wait_for_end(proc, killed)
        self.assertLess(seconds, 10.0, output[-3000:])
        self.assertNotEqual(proc.returncode, 0)
        self.assertRegex(output, r"\[tftorus.run\] failed: (lost h2|rank [23] on h2|h2: its "
                                 r"launcher)")

    def test_unknown_and_unreachable_hosts_in_one_line(self):
        for hosts, says in (("h1:2,nosuchhost:2", "nosuchhost: its launcher (ssh) exited with "
                                                  "status 255: ssh: Could not resolve hostname"),
                            (f"h1:2,{emulated_hosts.SUBNET}.9:2",
                             f"{emulated_hosts.SUBNET}.9: its launcher (ssh) exited with status "
                             f"255")):
            with self.subTest(hosts=hosts):
                started = time.monotonic()
                # ssh takes an option's first value: 3 s in place of the launcher's 10 for
                # the address nobody answers at
                ssh = self.hosts.ssh.replace("ssh ", "ssh -o ConnectTimeout=3 ", 1)
                result = self.hosts.run(1, _python("-np", "4", "-H", hosts, "--ssh", ssh,
                                                   WORKER, "wait", "/nonexistent"), timeout=60)
                # no rank started anywhere: the launcher on h1 ends at once, not after its
                # grace and the coordinator's lost-node time (10 + 2 x 5 s)
                self.assertLess(time.monotonic() - started, 15.0, result.output[-2000:])
                self.assertEqual(result.returncode, 255, result.output[-2000:])
                failed = [line for line in result.output.splitlines()
                          if line.startswith("[tftorus.run] failed:")]
                self.assertEqual(len(failed), 1, result.output[-2000:])
                self.assertIn(says, failed[0])
                for host in (1, 2):
                    self.assertEqual(self._left(host), [], f"processes left on h{host}")


if __name__ == "__main__":
    tf.test.main()
