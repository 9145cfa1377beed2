"""The emulated cluster (studies/emulated_cluster.py): its links are really rate-limited,
Horovod runs across its namespaces, every algorithm sums correctly across the hosts, and nothing
is left behind. Needs root; skipped otherwise."""
import csv
import os
import subprocess
import sys
import time
import unittest

from tests import harness

from studies import emulated_cluster as ec

REASON = ec.why_not_possible()

RECEIVER = """
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 5999)); s.listen(1); print("ready", flush=True)
c, _ = s.accept(); n = 0; start = None
while True:
    b = c.recv(1 << 16)
    if not b: break
    start = start or time.monotonic(); n += len(b)
print(n, time.monotonic() - start, flush=True)
"""
SENDER = """
import socket, sys
s = socket.create_connection((sys.argv[1], 5999)); s.sendall(b"x" * int(sys.argv[2])); s.close()
"""


def leftovers():
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    return ([n for n in names.split() if n.startswith(ec.PREFIX)]
            + [l for l in links.splitlines() if "tftbr" in l or "tftv" in l])


class ByteLimitTest(unittest.TestCase):

    def test_the_limits_of_the_issue_table(self):
        for hosts, rph, limit in ((2, 2, 0.667), (2, 4, 0.571), (4, 2, 0.857), (4, 4, 0.8)):
            self.assertAlmostEqual(ec.byte_limit(hosts, rph), limit, places=3)
            # a rail per rank: the torus' columns spread over them, the ring keeps one
            self.assertAlmostEqual(ec.byte_limit(hosts, rph, rph), limit / rph, places=3)

    def test_the_models_floor_follows_the_bytes_on_the_busiest_link(self):
        mib16 = 16 * 2 ** 20
        one_link = {a: ec.model_ms(a, 2, 4, 0.25, 1, mib16) for a in ("torus", "hierarchical",
                                                                       "ring")}
        self.assertAlmostEqual(one_link["torus"] / one_link["ring"], ec.byte_limit(2, 4), 3)
        self.assertAlmostEqual(one_link["hierarchical"], one_link["torus"], 6)  # same bytes
        rails = {a: ec.model_ms(a, 2, 4, 0.25, 4, mib16) for a in ("torus", "hierarchical")}
        self.assertAlmostEqual(rails["torus"] * 4, rails["hierarchical"], 6)
        self.assertAlmostEqual(rails["hierarchical"], one_link["hierarchical"], 6)

    def test_phase_table(self):
        def row(name, ms, kind="phase"):
            return {"workload": "flat 64 MiB", "name": name, "kind": kind, "median_ms": str(ms)}
        rows = [row("ring", 1000.0, "variant"), row("torus", 700.0, "variant"),
                row("column all-reduce", 600.0), row("reduce-scatter (alltoall)", 40.0),
                row("row all-gather", 30.0), row("one row's reduce-scatter", 20.0),
                row("one row's all-gather", 10.0)]
        self.assertIn("| flat 64 MiB | 0.700 | 0.600 | 0.070 | 0.030 | 0.630 |",
                      ec.phase_table(rows))
        # without the one-row phases those columns stay empty; without a column phase, no table
        self.assertIn("| flat 64 MiB | 0.700 | 0.600 | 0.070 |  |  |", ec.phase_table(rows[:5]))
        self.assertEqual(ec.phase_table(rows[:2]), "")

    def test_the_floor_is_of_the_bytes_on_the_wire(self):
        def row(workload, name, ms, kind="variant", **extra):
            return {"workload": workload, "name": name, "kind": kind, "median_ms": str(ms),
                    **extra}
        mib = 2 ** 20
        floor = ec.model_ms("torus", 2, 2, 0.25, 1, 64 * mib)  # FP32's
        fp32 = floor
        rows = [row("resnet50 fp32", "torus", fp32 * 1.2, bytes=str(64 * mib)),
                row("resnet50 fp32", "column all-reduce", fp32 * 1.1, "phase"),
                row("resnet50 fp16", "torus", fp32 * 0.6, bytes=str(64 * mib),
                    wire_bytes=str(32 * mib)),
                row("resnet50 fp16", "torus-tf", fp32 * 0.55, bytes=str(64 * mib),
                    wire_bytes=str(32 * mib))]
        table = ec.floor_table(rows, (2, 2, 0.25, 1))
        self.assertIn(f"| resnet50 fp32 | 64.0 | {floor:.0f} | torus | {fp32 * 1.2:.0f} | "
                      f"1.20 | {fp32 * 1.1:.0f} | 1.10 |", table)
        # the FP16 wire halves the floor: the same time is twice as far above it
        self.assertIn(f"| resnet50 fp16 | 32.0 | {floor / 2:.0f} | torus | {fp32 * 0.6:.0f} "
                      f"| 1.20 |", table)
        self.assertIn("| torus-tf |", table)
        # a CSV from before the wire_bytes column: the FP16 workload's bytes from its name
        self.assertEqual(ec.workload_bytes([row("resnet50 fp16", "torus", 1.0,
                                                bytes=str(64 * mib))]),
                         {"resnet50 fp16": 32.0 * mib})

    def test_sweep_arguments(self):
        args = ec.parse_args(["--sweep", "2x2", "2x4", "--link-gbit", "0.25", "1"])
        self.assertEqual(args.clusters, [(2, 2, 0.25, 1), (2, 2, 1.0, 1), (2, 4, 0.25, 1),
                                         (2, 4, 1.0, 1)])
        args = ec.parse_args(["--sweep", "2x4", "4x2", "--links-per-host", "1", "rank"])
        self.assertEqual(args.clusters, [(2, 4, 0.25, 1), (2, 4, 0.25, 4), (4, 2, 0.25, 1),
                                         (4, 2, 0.25, 2)])
        for bad in (["--sweep", "1x4"],  # one host is no cluster
                    ["--hosts", "2", "--ranks-per-host", "2", "--links-per-host", "3"],
                    ["--links-per-host", "two"]):
            with self.assertRaises(SystemExit):
                ec.parse_args(bad)


@unittest.skipIf(REASON, f"emulated cluster not possible here: {REASON}")
class EmulatedClusterTest(unittest.TestCase):

    def test_host_links_carry_the_set_rate_and_teardown_is_complete(self):
        gbit, nbytes = 0.1, 4 * 1024 * 1024  # 12.5 MB/s: 4 MiB takes about 0.34 s
        with ec.Cluster(2, gbit):
            receiver = subprocess.Popen(
                ["ip", "netns", "exec", "tft-h1", sys.executable, "-c", RECEIVER],
                stdout=subprocess.PIPE, text=True)
            self.assertEqual(receiver.stdout.readline().strip(), "ready")
            subprocess.run(["ip", "netns", "exec", "tft-h0", sys.executable, "-c", SENDER,
                            ec.host_ip(1), str(nbytes)], check=True, timeout=60)
            got, seconds = receiver.communicate(timeout=60)[0].split()
            self.assertEqual(int(got), nbytes)
            rate_gbit = nbytes * 8 / float(seconds) / 1e9
            # the token bucket's first burst goes at full speed; the rest at the set rate
            self.assertGreater(rate_gbit, 0.6 * gbit)
            self.assertLess(rate_gbit, 1.5 * gbit)
        self.assertEqual(leftovers(), [])

    def test_rails_are_separate_links(self):
        # two senders at once, host 0 to host 1: on one rail each they get the rate each
        gbit, nbytes = 0.1, 4 * 1024 * 1024
        with ec.Cluster(2, gbit, links=2):
            receivers = [subprocess.Popen(
                ["ip", "netns", "exec", "tft-h1", sys.executable, "-c",
                 RECEIVER.replace("5999", str(5999 - rail))], stdout=subprocess.PIPE, text=True)
                for rail in (0, 1)]
            for r in receivers:
                self.assertEqual(r.stdout.readline().strip(), "ready")
            senders = [subprocess.Popen(
                ["ip", "netns", "exec", "tft-h0", sys.executable, "-c",
                 SENDER.replace("5999", str(5999 - rail)), ec.host_ip(1, rail), str(nbytes)])
                for rail in (0, 1)]
            self.assertEqual([s.wait(timeout=60) for s in senders], [0, 0])
            for r in receivers:
                got, seconds = r.communicate(timeout=60)[0].split()
                self.assertEqual(int(got), nbytes)
                self.assertGreater(nbytes * 8 / float(seconds) / 1e9, 0.6 * gbit)
        self.assertEqual(leftovers(), [])

    def test_benchmark_runs_across_hosts(self):
        out = os.path.join(harness.ROOT, "runs", "test_emulated")
        start = time.monotonic()
        result = subprocess.run(
            [sys.executable, "-m", "studies.emulated_cluster",
             "--hosts", "2", "--ranks-per-host", "2", "--links-per-host", "rank",
             "--sizes", "64K", "--resnet",
             "--engines", "horovod", "tf", "--variants", "hvd", "torus", "ring", "hierarchical",
             "column all-reduce", "one row's reduce-scatter", "one row's all-gather", "torus-tf",
             "--repeats", "2", "--out", out, "--timeout", "240"],
            capture_output=True, text=True, timeout=300, cwd=harness.ROOT)
        self.assertEqual(result.returncode, 0, result.stdout[-3000:] + result.stderr[-3000:])
        # 5 medians (torus-tf's from the second job), the byte limit (0.333 at 2 x 2 on a rail
        # per rank), torus and torus-tf / ring, torus / hierarchical, / hvd, and the model's
        # floor for torus, hierarchical and ring
        self.assertRegex(result.stdout, r"\| flat 64 KiB \|( [\d.]+ \|){5} 0\.333 \|"
                                        r"( [\d.]+ \|){7}")
        # where the time goes: column alone, and column + one host's row phases
        self.assertRegex(result.stdout, r"\| flat 64 KiB \| [\d.]+ \| [\d.]+ \|  \| [\d.]+ \| "
                                        r"[\d.]+ \|")
        with open(os.path.join(out, "allreduce.csv"), newline="") as f:
            rows = list(csv.DictReader(f))
        for column in ("hosts", "ranks_per_host", "link_gbit", "bytes", "median_ms", "max_err"):
            self.assertIn(column, rows[0])
        # the sums, not only the times: each variant against hvd.allreduce on the same inputs,
        # the tf engine's in a job of its own (no Horovod there) against its own ring
        variants = {(r["workload"], r["name"]): float(r["max_err"]) for r in rows
                    if r["kind"] == "variant" and r["name"] != "hvd"}
        self.assertEqual({name for _, name in variants},
                         {"torus", "ring", "hierarchical", "torus-tf"})
        self.assertIn("the tf engine alone", result.stdout)  # its worker checks: no Horovod
        for (workload, name), err in variants.items():
            self.assertLess(err, 1e-5, f"{name} on {workload}: relative error {err}")
        self.assertEqual(leftovers(), [])
        print(f"\nemulated 2 x 2 benchmark: {time.monotonic() - start:.0f} s")


if __name__ == "__main__":
    unittest.main()
