"""studies/torus_timeline.py on a small Horovod-style trace: the torus calls it finds, the
spans it reports and the idle time of Horovod's thread."""
import json
import os
import tempfile
import unittest

from studies import torus_timeline as tl


def trace(calls_at_ms):
    """Horovod's timeline of torus calls: bucket 0 and 1, each all-to-all, all-reduce,
    all-gather one after the other (10 ms apart), a call per start time; an unclosed array."""
    events = []
    names = {}

    def pid(name):
        if name not in names:
            names[name] = len(names) + 1
            events.append({"name": "process_name", "ph": "M", "pid": names[name],
                           "args": {"name": name}})
        return names[name]

    for start in calls_at_ms:
        t = start * 1000
        for bucket in (0, 1):
            for op in ("Alltoall", "Allreduce", "Allgather"):
                p = pid(f"bucket{bucket}/Horovod{op}_bucket{bucket}_x_0")
                events += [{"ph": "B", "name": f"NEGOTIATE_{op.upper()}", "ts": t, "pid": p},
                           {"ph": "E", "ts": t + 2000, "pid": p},
                           {"ph": "B", "name": op.upper(), "ts": t + 2000, "pid": p},
                           {"ph": "E", "ts": t + 10000, "pid": p}]
                t += 10000
    return "[\n" + ",\n".join(json.dumps(e) for e in events) + ","  # as Horovod leaves it


class TorusTimelineTest(unittest.TestCase):
    def test_calls_spans_and_idle_time(self):
        path = os.path.join(tempfile.mkdtemp(), "timeline.json")
        with open(path, "w") as f:
            f.write(trace([0, 1000]))
        names, spans = tl.spans(tl.load(path))
        calls = tl.torus_calls(names, spans)
        self.assertEqual(len(calls), 2)
        self.assertEqual([(b, op) for b, op, *_ in calls[-1]],
                         [(0, "Alltoall"), (0, "Allreduce"), (0, "Allgather"),
                          (1, "Alltoall"), (1, "Allreduce"), (1, "Allgather")])
        text = tl.summary(calls[-1])
        # 6 collectives of 8 ms, each asked 2 ms before it ran: 60 ms, 48 busy, 12 idle
        self.assertIn("call: 60 ms from the first request to the last collective's end; "
                      "Horovod's thread busy 48 ms, idle 12 ms", text)
        out = os.path.join(tempfile.mkdtemp(), "t.png")
        self.assertEqual(tl.main([path, "--out", out]), 0)
        self.assertTrue(os.path.getsize(out) > 0)

    def test_no_torus_call_is_a_clear_error(self):
        path = os.path.join(tempfile.mkdtemp(), "timeline.json")
        with open(path, "w") as f:
            f.write("[\n")
        self.assertEqual(tl.main([path]), 2)


if __name__ == "__main__":
    unittest.main()
