"""Issue 6, failure detection: a worker that dies or stalls stops every other worker within a
bounded time, with an error naming the lost rank and what it was doing (both engines); issue 39:
on the tf engine (both stacks) resuming after a SIGKILL reproduces the uninterrupted run.

The verdict logic runs on a fake clock; the rest are real training jobs (run_scripts/train.py on
a tiny generated data set) with one worker SIGKILLed or SIGSTOPped mid-training."""
import json
import os
import re
import signal
import socket
import tempfile
import threading
import time
import unittest
import uuid

import psutil

from official_resnet.data import embedded_data
from official_resnet.run import checkpointing
from tests import harness
from tftorus.reliability import watchdog

TRAIN, FLAGFILE = harness.TRAIN, harness.FLAGFILE
SPEC = embedded_data.EmbeddedSpec(num_train=1024, num_validation=128, train_shards=4,
                                  validation_shards=2)


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def info(counter, what="train step", phase=1, epoch=0.42, step=17):
    return {"c": counter, "w": what, "p": phase, "e": epoch, "s": step}


class VerdictTest(unittest.TestCase):
    def test_silent_rank_is_lost_after_the_heartbeat_timeout(self):
        clock = FakeClock()
        m = watchdog.Monitor(4, heartbeat_timeout=10, stall_timeout=100, clock=clock)
        for t in range(12):
            clock.now += 1
            for r in (0, 1, 3) if t > 1 else range(4):
                m.heard(r, info(t))
            if t <= 11:
                self.assertIsNone(m.verdict(), t)  # rank 2 last heard at t = 1 (+1 s)
        clock.now += 0.5
        v = m.verdict()
        self.assertEqual((v.kind, v.ranks), ("lost", [2]))
        self.assertRegex(v.text, r"^rank 2 lost: no heartbeat for 10\.5 s \(last seen: phase 1, "
                                 r"epoch 0\.42, step 17, train step\)$")

    def test_finished_rank_is_never_lost(self):
        clock = FakeClock()
        m = watchdog.Monitor(2, heartbeat_timeout=5, stall_timeout=100, clock=clock)
        m.heard(1, info(3), finished=True)
        clock.now += 60
        m.heard(0, info(3))
        self.assertIsNone(m.verdict())

    def test_never_heard_rank_is_lost_with_start_up(self):
        clock = FakeClock()
        m = watchdog.Monitor(3, heartbeat_timeout=5, stall_timeout=100, clock=clock)
        clock.now += 6
        m.heard(0, info(1))
        m.heard(1, info(1))
        v = m.verdict()
        self.assertEqual(v.ranks, [2])
        self.assertIn("no heartbeat yet (start-up)", v.text)

    def test_stalled_rank_behind_the_others(self):
        clock = FakeClock()
        m = watchdog.Monitor(3, heartbeat_timeout=5, stall_timeout=30, clock=clock)
        for t in range(40):
            clock.now += 1
            m.heard(0, info(min(t, 6)))
            m.heard(1, info(min(t, 5), what="evaluation"))  # stuck in its 5th unit of work
            m.heard(2, info(min(t, 6)))
            if t < 35:
                self.assertIsNone(m.verdict(), t)
        clock.now += 1
        v = m.verdict()
        self.assertEqual((v.kind, v.ranks), ("stalled", [1]))
        self.assertRegex(v.text, r"rank 1 stalled: no progress for 3\d\.0 s .*evaluation\)")

    def test_everyone_waiting_together_is_no_stall(self):
        clock = FakeClock()
        m = watchdog.Monitor(3, heartbeat_timeout=5, stall_timeout=30, clock=clock)
        for _ in range(100):
            clock.now += 1
            for r in range(3):
                m.heard(r, info(7))
        self.assertIsNone(m.verdict())

    def test_rank0_silence(self):
        clock = FakeClock()
        m = watchdog.Rank0Monitor(heartbeat_timeout=5, clock=clock)
        clock.now += 4
        m.replied(info(2, what="checkpoint"))
        clock.now += 5
        self.assertIsNone(m.verdict())
        clock.now += 0.5
        v = m.verdict()
        self.assertEqual(v.ranks, [0])
        self.assertIn("rank 0 lost: no reply for 5.5 s (last seen: phase 1, epoch 0.42, step 17, "
                      "checkpoint)", v.text)
        m.replied(None, finished=True)
        clock.now += 100
        self.assertIsNone(m.verdict())

    def test_udp_round_trip_reports_a_silent_rank_to_all(self):
        """Real sockets and threads: rank 2 never beats; ranks 0 and 1 both get the verdict."""
        exits = {}
        dogs = start_watchdogs(world_size=3, heartbeat_timeout=1.0, exits=exits)
        deadline = time.monotonic() + 10
        while len(exits) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertEqual(exits, {0: 4, 1: 4})
        for d in dogs:
            self.assertEqual(d._verdict.ranks, [2])
            d._stop.set()

    def test_a_rank_whose_thread_could_not_run_finds_the_verdict(self):
        """Rank 1's watchdog thread does not run while rank 0 decides and exits (its main thread
        held the interpreter in a blocked call): once it runs it reports rank 2, not rank 0."""
        exits = {}
        server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        server.bind(("127.0.0.1", 0))
        address = ("127.0.0.1", server.getsockname()[1])
        rank0 = watchdog.Watchdog(0, 3, address, heartbeat_timeout=1.0, stall_timeout=100,
                                  sock=server, exit=lambda code: exits.setdefault(0, code))
        rank1 = watchdog.Watchdog(1, 3, address, heartbeat_timeout=1.0, stall_timeout=100,
                                  exit=lambda code: exits.setdefault(1, code))
        rank0.start()
        rank1._send({"r": 1, "i": info(0)}, address)  # one beat, then its thread is starved
        deadline = time.monotonic() + 10
        while 0 not in exits and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertEqual(exits, {0: 4})  # rank 1 was silent too, but for less than rank 2
        rank0._stop.set()
        time.sleep(1.5)  # past rank 1's own heartbeat timeout: rank 0 is gone
        rank1.start()
        while 1 not in exits and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertEqual(exits, {0: 4, 1: 4})
        self.assertIn(2, rank1._verdict.ranks, rank1._verdict.text)
        self.assertNotIn("rank 0 lost", rank1._verdict.text)
        rank1._stop.set()

    def test_normal_finish_is_no_loss(self):
        exits = {}
        dogs = start_watchdogs(world_size=2, heartbeat_timeout=0.5, exits=exits)
        time.sleep(0.3)
        dogs[1].stop()  # rank 1 finishes first; rank 0 keeps running past the timeout
        time.sleep(1.5)
        dogs[0].stop()
        self.assertEqual(exits, {})


# --------------------------------------------------------------------------------------------
# Real jobs.
# --------------------------------------------------------------------------------------------
HEARTBEAT = 8.0
# One intra-op thread per worker in the jobs whose histories are compared bit for bit (as
# tests/test_resume.py on the current stack, where TF 2.21's CPU kernels on several threads
# varied in the last bits while the collectives overlap the backward pass); on both stacks here,
# so the comparison never rests on a kernel's threading.
BIT_EXACT = {"TF_NUM_INTRAOP_THREADS": "1"}
# what may differ between identical runs: the clock
TIMING = ("images_per_sec", "elapsed")


def history(model_dir):
    with open(os.path.join(model_dir, "history.jsonl")) as f:
        return [json.loads(line) for line in f]


def _rank_of(proc: psutil.Process):
    env = proc.environ()
    if "HOROVOD_RANK" in env:
        return int(env["HOROVOD_RANK"])
    if "TF_CONFIG" in env:
        return int(json.loads(env["TF_CONFIG"])["task"]["index"])
    return None


def _workers(tag: str):
    """{rank: psutil.Process} of this test's training processes (marked by an env var)."""
    found = {}
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if TRAIN not in (proc.info["cmdline"] or []):
                continue
            env = proc.environ()
            if env.get("TFTORUS_TEST_TAG") == tag:
                rank = _rank_of(proc)
                if rank is not None:
                    found[rank] = proc
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


def start_watchdogs(world_size, heartbeat_timeout, exits):
    """Watchdogs of ranks 0 and 1 on real loopback sockets, in this process; an exit records
    its status in `exits` instead of ending the test."""
    server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    server.bind(("127.0.0.1", 0))
    address = ("127.0.0.1", server.getsockname()[1])
    return [watchdog.Watchdog(r, world_size, address, heartbeat_timeout=heartbeat_timeout,
                              stall_timeout=100, sock=server if r == 0 else None,
                              exit=lambda code, r=r: exits.setdefault(r, code)).start()
            for r in (0, 1)]


def _alive(proc):
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class TerminateHookTest(unittest.TestCase):
    """Gloo's uncaught exception in Horovod's thread ends in std::terminate: the hook speaks first,
    then the usual abort (with libstdc++'s message) follows."""

    def test_terminate_says_what_the_rank_was_doing_then_aborts(self):
        code = ("import ctypes; from tftorus.reliability import watchdog; "
                "watchdog.progress('train step', phase=1, epoch=0.5, step=3); "
                "assert watchdog.install_terminate_hook(); "
                "ctypes.CDLL('libstdc++.so.6')._ZSt9terminatev()")
        result = harness.run(["-c", code], timeout=120, env={"HOROVOD_RANK": "5"})
        self.assertEqual(result.returncode, -signal.SIGABRT, harness.describe(result))
        self.assertIn("tftorus: rank 5 lost a Horovod connection (a peer died or closed it) "
                      "while in phase 1, epoch 0.50, step 3, train step", result.output,
                      harness.describe(result))
        self.assertIn("terminate called", result.output, harness.describe(result))


class WorkerLossTest(harness.EmbeddedDataCase, unittest.TestCase):
    SPEC = SPEC

    def args(self, engine, model_dir):
        """train.py's arguments: Exp. 2 for 3 epochs, the 8 s heartbeat timeout."""
        args = [TRAIN, f"--flagfile={FLAGFILE}", f"--data_dir={self.data}",
                f"--model_dir={model_dir}", "--bn_stat_batches=1", "--exp=2", "--epochs=3",
                f"--engine={engine}", f"--heartbeat_timeout={HEARTBEAT}", "--stall_timeout=600"]
        if engine == "tf":
            args += ["--grid=2x2", "--collective_timeout=300"]
        return args

    def launch(self, engine, victim, sig, np_=4, timeout=400, env=None):
        """Train; once the first epoch is logged and checkpointed, send `sig` to rank `victim`.
        Returns the result, the seconds from the signal to the job's end, and a dict with the
        victim's process, the survivors' and the run's model_dir. env: variables for every
        rank."""
        model_dir = tempfile.mkdtemp(dir=self.tmp)
        tag = uuid.uuid4().hex
        args = self.args(engine, model_dir)
        box = {"model_dir": model_dir}

        def attack():
            deadline = time.monotonic() + timeout - 60
            for name in ("history.jsonl", os.path.join("checkpoints", "latest")):
                while (not os.path.exists(os.path.join(model_dir, name))
                       and time.monotonic() < deadline):
                    time.sleep(0.1)
            time.sleep(1.0)  # into the second epoch's train steps
            workers = _workers(tag)
            if victim in workers:
                box["victim"] = workers[victim]
                box["survivors"] = [p for r, p in workers.items() if r != victim]
                box["at"] = time.monotonic()
                os.kill(workers[victim].pid, sig)
                # when the last survivor is gone, the victim too (a SIGSTOPped one never ends)
                while time.monotonic() < deadline and any(_alive(p) for p in box["survivors"]):
                    time.sleep(0.1)
                box["survivors_gone"] = time.monotonic() - box["at"]
                try:
                    box["victim"].kill()
                except psutil.NoSuchProcess:
                    pass

        thread = threading.Thread(target=attack, daemon=True)
        thread.start()
        env = {**(env or {}), "TFTORUS_TEST_TAG": tag}
        if engine == "tf":
            result = harness.run_tf_config(args, np=np_, timeout=timeout, env=env)
        else:
            result = harness.run(args, np=np_, timeout=timeout, env=env)
        thread.join(5)
        self.assertIn("victim", box, "never found the victim: " + harness.describe(result))
        for proc in box["survivors"] + [box["victim"]]:
            try:
                proc.kill()  # nothing may be left running (the SIGSTOPped victim included)
            except psutil.NoSuchProcess:
                pass
        for line in result.output.splitlines():  # shown with pytest -s
            if re.search(r"tftorus watchdog|tftorus: rank|^error:|Process \d+ exit|exit -?\d+\)",
                         line):
                print("   ", line[:400])
        return result, box.get("survivors_gone", float("inf")), box

    # A normal finish of a real job (no loss reported) is checked by test_paper_scale's launcher
    # test, whose jobs run with the same 8 s heartbeat timeout.

    def check_survivors_named_rank(self, result, victim, how_long, bound):
        self.assertFalse(result.timed_out, harness.describe(result))
        self.assertNotEqual(result.returncode, 0, harness.describe(result))
        self.assertLess(how_long, bound, harness.describe(result))
        self.assertRegex(result.output, rf"rank {victim} lost", harness.describe(result))

    def test_killed_worker_horovod_engine(self):
        result, seconds, box = self.launch("horovod", 2, signal.SIGKILL)
        print(f"\nhorovod engine, SIGKILL rank 2: survivors gone {seconds:.1f} s later")
        self.assertFalse(result.timed_out, harness.describe(result))
        self.assertNotEqual(result.returncode, 0, harness.describe(result))
        self.assertLess(seconds, HEARTBEAT + 30, harness.describe(result))
        # the launcher names the dead rank; the survivors say what they were doing
        self.assertTrue(re.search(r"Process 2 exit with status code", result.output)
                        or "rank 2 lost" in result.output, harness.describe(result))
        self.assertRegex(result.output, r"tftorus(: rank \d got SIGTERM| watchdog: rank 2 lost)",
                         harness.describe(result))
        self.assertFalse(any(_alive(p) for p in box["survivors"]), "a survivor is still running")

    def killed_tf_job(self):
        """The tf engine's job with rank 2 SIGKILLed in epoch 2, one intra-op thread per rank:
        one launch for the two tests that read it (the loss, then the resume)."""
        return harness.shared(("test_worker_loss", "tf", "SIGKILL rank 2"),
                              lambda: self.launch("tf", 2, signal.SIGKILL, env=BIT_EXACT))

    def test_killed_worker_tf_engine(self):
        result, seconds, box = self.killed_tf_job()
        print(f"\ntf engine, SIGKILL rank 2: survivors gone {seconds:.1f} s later; codes "
              f"{result.returncodes}")
        self.check_survivors_named_rank(result, 2, seconds, HEARTBEAT + 30)
        self.assertEqual(result.returncodes[2], -9, harness.describe(result))
        self.assertTrue(all(c in (3, 4) for i, c in enumerate(result.returncodes) if i != 2),
                        harness.describe(result))
        self.assertGreaterEqual(len(re.findall(r"rank 2 lost", result.output)), 3,
                                harness.describe(result))

    def test_killed_worker_tf_engine_then_resume_equals_uninterrupted(self):
        """Issue 39: train.py again with the same flags and model_dir resumes from the last
        checkpoint before the kill, and its per-epoch history equals, digit for digit, that of
        a run never interrupted (all but the clock's fields)."""
        result, _, box = self.killed_tf_job()
        self.assertIn("victim", box, "never found the victim: " + harness.describe(result))
        killed = box["model_dir"]
        found = checkpointing.latest_valid(killed)
        self.assertIsNotNone(found, "no checkpoint before the kill: " + harness.describe(result))
        at = found[1].epoch
        resumed = harness.run_tf_config(self.args("tf", killed), np=4, timeout=400, env=BIT_EXACT)
        self.assertEqual(resumed.returncode, 0, harness.describe(resumed))
        self.assertIn(f"resumed at epoch {at:.3f}", resumed.output, harness.describe(resumed))
        straight = tempfile.mkdtemp(dir=self.tmp)
        result = harness.run_tf_config(self.args("tf", straight), np=4, timeout=400,
                                       env=BIT_EXACT)
        self.assertEqual(result.returncode, 0, harness.describe(result))
        print(f"\ntf engine, SIGKILL rank 2 after the checkpoint at epoch {at:.3f}: resumed in "
              f"{resumed.seconds:.0f} s, uninterrupted run {result.seconds:.0f} s")

        def per_epoch(model_dir):
            return [{k: v for k, v in row.items() if k not in TIMING}
                    for row in history(model_dir)]
        expected = per_epoch(straight)
        self.assertEqual(len(expected), 3, expected)  # a Keras epoch per epoch (phases end at 1, 3)
        self.assertTrue(expected[0]["epoch"] <= at < expected[1]["epoch"],
                        f"the last checkpoint before the kill is at epoch {at}; the kill was "
                        f"meant for epoch 2 ({[row['epoch'] for row in expected]})")
        self.assertEqual(per_epoch(killed), expected)

    def test_stopped_worker_horovod_engine(self):
        result, seconds, box = self.launch("horovod", 1, signal.SIGSTOP)
        print(f"\nhorovod engine, SIGSTOP rank 1: survivors gone {seconds:.1f} s later")
        self.check_survivors_named_rank(result, 1, seconds, HEARTBEAT + 30)
        self.assertRegex(result.output, r"tftorus watchdog: rank 1 lost: no heartbeat for [\d.]+ s "
                                        r"\(last seen: phase \d, epoch [\d.]+, step \d+, ",
                         harness.describe(result))

    def test_stopped_worker_tf_engine(self):
        result, seconds, box = self.launch("tf", 3, signal.SIGSTOP)
        print(f"\ntf engine, SIGSTOP rank 3: survivors gone {seconds:.1f} s later; codes "
              f"{result.returncodes}")
        self.assertFalse(result.timed_out, harness.describe(result))
        self.assertLess(seconds, HEARTBEAT + 30, harness.describe(result))
        self.assertEqual([c for i, c in enumerate(result.returncodes) if i != 3], [4, 4, 4],
                         harness.describe(result))
        self.assertGreaterEqual(len(re.findall(r"rank 3 lost", result.output)), 3,
                                harness.describe(result))


if __name__ == "__main__":
    unittest.main()
