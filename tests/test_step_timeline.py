"""studies/step_timeline.py on a small step: a three-layer accelerator's waits and a Horovod
timeline of its collectives (the format rank 0 writes, as in test_torus_timeline), for tftorus'
buckets and for Horovod's fused all-reduces: the clocks aligned, the lanes and the table's
numbers, and the picture."""
import collections
import contextlib
import io
import json
import os
import tempfile
import time
import unittest

from studies import step_timeline as st

PERF_START = 1000.0  # perf_counter at the step's batch begin
EPOCH_MINUS_PERF = 1_700_000_000.0  # time.time() - perf_counter() in the worker
TIMELINE_START_S = 10.0  # Horovod's timeline began this long before the step (wall clock)

Wait = collections.namedtuple("Wait", "phase layer started due ended")


def waits():
    """Layers a, b, c: forward 0.1 s each (0-0.3 s), backward 0.2 s each in reverse order:
    c's gradients at 0.5 s, b's at 0.7, a's at 0.9 (seconds after PERF_START)."""
    out, t = [], PERF_START
    for phase, layers, seconds in (("forward", "abc", 0.1), ("backward", "cba", 0.2)):
        for layer in layers:
            out.append(Wait(phase, layer, t, t + seconds, t + seconds))
            t += seconds
    return out


#: the gradients in the optimizer's order: (layer, bytes on the wire); c's is 1 MiB
VARIABLES = [("a", 1 << 18), ("a", 1 << 18), ("b", 1 << 19), ("c", 1 << 20)]


def record(variant, buckets=None, drift_s=0.0):
    return st.step_record(variant, "fp16", waits(), PERF_START, PERF_START + 1.2,
                          EPOCH_MINUS_PERF, EPOCH_MINUS_PERF + drift_s, VARIABLES, buckets)


class Trace:
    """Horovod's timeline as rank 0 writes it: microseconds since its start, whose wall-clock
    time is in the first event; a tensor per pid, B/E pairs (sub-activities nested), an array
    left unclosed."""

    def __init__(self):
        start_us = round((EPOCH_MINUS_PERF + PERF_START - TIMELINE_START_S) * 1e6)
        self.events = [{"name": "process_name", "ph": "M", "pid": 0,
                        "args": {"start_time_since_epoch_in_micros": start_us}},
                       {"name": "process_sort_index", "ph": "M", "pid": 0,
                        "args": {"sort_index": 0}}]
        self.pids = {}

    def us(self, step_s):  # a time in the step as Horovod's ts
        return round((TIMELINE_START_S + step_s) * 1e6)

    def op(self, tensor, kind, asked, start, end):
        """One collective: negotiated from `asked`, run from `start` to `end` (step seconds)."""
        if tensor not in self.pids:
            self.pids[tensor] = pid = len(self.pids) + 1
            self.events.append({"name": "process_name", "ph": "M", "pid": pid,
                                "args": {"name": tensor}})
        pid = self.pids[tensor]
        self.events += [
            {"ph": "B", "name": f"NEGOTIATE_{kind}", "ts": self.us(asked), "pid": pid},
            {"ph": "X", "name": "0", "ts": self.us(asked), "pid": pid, "dur": 0},
            {"ph": "E", "ts": self.us(start), "pid": pid},
            {"ph": "B", "name": kind, "ts": self.us(start), "pid": pid},
            {"ph": "B", "name": f"GLOO_{kind}", "ts": self.us(start) + 10, "pid": pid},
            {"ph": "E", "ts": self.us(end) - 10, "pid": pid},
            {"ph": "E", "ts": self.us(end), "pid": pid,
             "args": {"dtype": "float16", "shape": "[8]"}}]

    def write(self, directory):
        with open(os.path.join(directory, st.TIMELINE_FILE), "w") as f:
            f.write("[\n" + ",\n".join(json.dumps(e) for e in self.events) + ",")


def torus_ops(trace, offset=0.0):
    """tftorus: bucket 0 (c's gradient) and bucket 1 (a's and b's), three phases each."""
    for bucket, asked, phases in ((0, 0.51, ((0.52, 0.60), (0.61, 0.70), (0.71, 0.75))),
                                  (1, 0.91, ((0.95, 1.00), (1.01, 1.05), (1.06, 1.10)))):
        before = asked
        for op, (start, end) in zip(("Alltoall", "Allreduce", "Allgather"), phases):
            trace.op(f"DistributedSGD_Allreduce/bucket{bucket}/Horovod{op}_bucket{bucket}_x_0",
                     op.upper(), before + offset, start + offset, end + offset)
            before = end


def hvd_ops(trace):
    """Horovod's optimizer: c's gradient alone, then a's and b's fused (each tensor's span
    started and ended a few microseconds apart, as Horovod's thread writes them in turn)."""
    trace.op("DistributedSGD_Allreduce/cond_3/HorovodAllreduce_x_0", "ALLREDUCE", 0.51, 0.55,
             0.65)
    for k, (name, asked) in enumerate((("cond", 0.905), ("cond_1", 0.91), ("cond_2", 0.72))):
        trace.op(f"DistributedSGD_Allreduce/{name}/HorovodAllreduce_x_0", "ALLREDUCE", asked,
                 0.93 + k * 1e-5, 1.15 + k * 1e-5)


class StepTimelineTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()
        trace = Trace()
        trace.op("line_up", "ALLREDUCE", -0.06, -0.05, -0.01)  # before the step: not in it
        torus_ops(trace, offset=-3.0)  # the step before: same tensors, outside this one
        torus_ops(trace)
        hvd_ops(trace)
        trace.op("line_up", "ALLREDUCE", 1.25, 1.26, 1.3)  # after the step's end
        trace.write(self.dir)
        self.events = st.torus_timeline.load(os.path.join(self.dir, st.TIMELINE_FILE))

    def test_record_is_relative_to_the_step(self):
        r = record("default", [[3], [0, 1, 2]], drift_s=0.00025)
        self.assertAlmostEqual(r["step_s"], 1.2)
        self.assertEqual(r["waits"][0][:2], ["forward", "a"])
        self.assertAlmostEqual(r["waits"][-1][4], 0.9)
        self.assertAlmostEqual(st.passes(r)["backward_end"], 0.9)
        self.assertAlmostEqual(st.passes(r)["forward_end"], 0.3)
        self.assertIn("wall clock moved +0.25 ms", st.table(r, []))
        # the worker's clock difference: the two Python clocks read together
        self.assertAlmostEqual(st.epoch_minus_perf(), time.time() - time.perf_counter(),
                               delta=0.01)

    def test_torus_buckets_aligned_and_tabulated(self):
        r = record("default", [[3], [0, 1, 2]])
        lanes = st.lanes(r, st.step_collectives(r, self.events))
        # the torus' 6 phases of this step alone; Horovod's tensors make the fused lanes
        self.assertEqual([lane.label for lane in lanes][:2], ["bucket 0", "fused 0 (1 tensor)"])
        bucket0, bucket1 = [lane for lane in lanes if lane.label.startswith("bucket")]
        self.assertEqual(len(bucket0.collectives), 3)
        self.assertAlmostEqual(bucket0.asked, 0.51, places=5)
        self.assertAlmostEqual(bucket0.start, 0.52, places=5)
        self.assertAlmostEqual(bucket0.end, 0.75, places=5)
        self.assertAlmostEqual(bucket0.ready, 0.5, places=5)  # c's backward
        self.assertEqual(bucket0.nbytes, 1 << 20)
        self.assertAlmostEqual(bucket1.ready, 0.9, places=5)  # a's backward, the last
        self.assertAlmostEqual(bucket1.end, 1.1, places=5)
        # its phases in order, each asked when the one before ended
        self.assertEqual([c.kind for c in bucket1.collectives],
                         ["ALLTOALL", "ALLREDUCE", "ALLGATHER"])
        self.assertAlmostEqual(bucket1.collectives[1].asked, 1.0, places=5)
        only_torus = [lane for lane in lanes if lane.label.startswith("bucket")]
        text = st.table(r, only_torus)
        self.assertIn("  bucket 0                  1.0    0.500    0.510    0.520    0.750"
                      "            -0.150", text)
        self.assertIn("  bucket 1                  1.0    0.900    0.910    0.950    1.100"
                      "             0.200", text)
        self.assertIn("last collective ends 0.200 s after the backward pass; the step ends "
                      "0.300 s after it", text)

    def test_a_clock_offset_moves_every_span(self):
        # the same trace read with a step 0.25 s later on the wall clock: everything 0.25 s
        # earlier in the step, and what fell before the step's start is left out
        r = record("default", [[3], [0, 1, 2]])
        r["step_start_epoch_s"] += 0.25
        lanes = [lane for lane in st.lanes(r, st.step_collectives(r, self.events))
                 if lane.label.startswith("bucket")]
        self.assertAlmostEqual(lanes[0].start, 0.27, places=5)
        self.assertAlmostEqual(lanes[1].end, 0.85, places=5)

    def test_horovod_fused_allreduces(self):
        r = record("hvd")
        fused = [lane for lane in st.lanes(r, st.step_collectives(r, self.events))
                 if lane.label.startswith("fused")]
        self.assertEqual([lane.label for lane in fused],
                         ["fused 0 (1 tensor)", "fused 1 (3 tensors)"])
        self.assertEqual(fused[0].gradients, [3])
        self.assertEqual(sorted(fused[1].gradients), [0, 1, 2])
        self.assertAlmostEqual(fused[1].ready, 0.9, places=5)
        self.assertAlmostEqual(fused[1].asked, 0.91, places=5)  # its last tensor handed in
        self.assertAlmostEqual(fused[1].start, 0.93, places=5)
        self.assertEqual(fused[1].nbytes, (1 << 19) + (1 << 19))
        text = st.table(r, fused)
        self.assertIn("  fused 1 (3 tensors)       1.0    0.900    0.910    0.930    1.150"
                      "             0.250", text)
        # a gradient named twice: no name is trusted
        twice = [[c._replace(tensor="X_Allreduce/cond_1/H") for c in group]
                 for group in ([fused[0].collectives[0]], fused[1].collectives)]
        self.assertEqual(st.hvd_gradients(twice, 4), [None, None])
        # another collective in the step (here the line-up after it, read 0.25 s earlier) is
        # a lane of its own, named by its kind; Horovod's optimizer's keep their gradients
        r["step_start_epoch_s"] += 0.25
        step_lanes = st.lanes(r, st.step_collectives(r, self.events))
        self.assertIn("allreduce 2 (1 tensor)", [lane.label for lane in step_lanes])
        self.assertEqual(next(lane for lane in step_lanes
                              if lane.label == "fused 1 (3 tensors)").gradients, [0, 1, 2])

    def test_drawing_and_command(self):
        for r in (record("hvd"), record("default", [[3], [0, 1, 2]])):
            st.save_record(self.dir, r)
        out = os.path.join(self.dir, "step.png")
        self.assertEqual(st.main([self.dir, "--out", out]), 0)
        self.assertGreater(os.path.getsize(out), 10000)
        self.assertEqual([r["variant"] for r in st.load_records(self.dir)], ["hvd", "default"])
        self.assertEqual(st.main([self.dir, "--variants", "ring"]), 2)
        self.assertEqual(st.main([tempfile.mkdtemp()]), 2)

    def test_plan_buckets_need_every_gradient(self):
        Bucket = collections.namedtuple("Bucket", "indices")
        Plan = collections.namedtuple("Plan", "buckets")
        partial, whole = Plan([Bucket((0, 1))]), Plan([Bucket((3,)), Bucket((0, 1, 2))])
        self.assertEqual(st.plan_buckets([whole, partial], 4), [[3], [0, 1, 2]])
        self.assertIsNone(st.plan_buckets([partial], 4))


class TimelineOptionTest(unittest.TestCase):
    """emulated_step --timeline: the classic stack's virtual step, one launch, or a clear error."""

    def parse(self, *argv, horovod=True):
        from studies import emulated_step
        return emulated_step.parse_args(list(argv), horovod=horovod)

    def test_refusals_and_the_directory(self):
        virtual = ["--model", "virtual", "--compute-s", "1", "--clusters", "2x2", "--wires",
                   "fp16"]
        for argv, horovod, says in (
                (["--timeline", "d", "--clusters", "2x2", "--wires", "fp16"], True,
                 "with --model virtual"),
                (virtual + ["--timeline", "d"], False, "on the classic stack"),
                (virtual + ["--timeline", "d", "--wires", "fp16", "fp32"], True, "one --wires"),
                (virtual + ["--timeline", "d", "--link-gbit", "0.25", "1"], True,
                 "one --link-gbit")):
            error = io.StringIO()
            with self.subTest(argv=argv), self.assertRaises(SystemExit), \
                    contextlib.redirect_stderr(error):
                self.parse(*argv, horovod=horovod)
            self.assertIn("--timeline", error.getvalue())
            self.assertIn(says, error.getvalue())
        args = self.parse(*virtual, "--timeline", "d")
        self.assertEqual(args.timeline, os.path.abspath("d"))
        self.assertIsNone(self.parse(*virtual).timeline)

if __name__ == "__main__":
    unittest.main()
