"""The step benchmark's report and arguments (studies/emulated_step.py), without processes.

Both stacks: the classic one's (Horovod's optimizer the peer) and the current one's
(MultiWorkerMirroredStrategy the peer, TF_CONFIG launches), each answered from arguments, so
either stack runs every test here in one process.
"""
import argparse
import contextlib
import io
import json
from unittest import mock

import tensorflow as tf

from studies import emulated_cluster as cluster
from studies import emulated_step


def row(variant, repeat, step, allreduce=0.0, wire="fp16", hosts="2", rph="2", cpu=None):
    """A CSV row; `cpu` (step, all-reduce) CPU seconds of every rank, absent from older CSVs."""
    out = {"hosts": hosts, "ranks_per_host": rph, "link_gbit": "0.25", "wire": wire,
           "repeat": str(repeat), "variant": variant, "step_s": str(step),
           "allreduce_s": str(allreduce)}
    if cpu is not None:
        out.update(step_cpu_s=str(cpu[0]), allreduce_cpu_s=str(cpu[1]))
    return out


class EmulatedStepReportTest(tf.test.TestCase):

    def test_ratios_and_hidden_fraction(self):
        rows = [row("compute", 0, 1.0), row("hvd", 0, 4.0, 3.0), row("default", 0, 2.5, 2.0),
                row("compute", 1, 1.0), row("hvd", 1, 4.0, 3.0), row("default", 1, 2.5, 2.0)]
        table = emulated_step.step_table(rows).splitlines()
        self.assertEqual(len(table), 3)  # header, hvd, default: compute is a column
        default = table[2].split()
        self.assertEqual(default[0], "default")
        self.assertEqual(default[1:4], ["2.500", "1.000", "2.000"])
        self.assertEqual(default[4], "0.50")  # (1 + 2 - 2.5) / min(1, 2)
        self.assertEqual(default[5], "0.62")  # 2.5 / 4 (rounded half to even)
        self.assertEqual(default[6], "1.25")  # 2.5 / max(1, 2)
        self.assertEqual(table[1].split()[5], "1.00")

    def test_cpu_seconds_of_step_and_all_reduce(self):
        rows = [row("compute", 0, 1.0, cpu=(2.0, 0.0)), row("hvd", 0, 4.0, 3.0, cpu=(4.0, 1.5)),
                row("default", 0, 2.5, 2.0, cpu=(3.0, 0.8))]
        table = emulated_step.step_table(rows).splitlines()
        self.assertIn("CPU s", table[0])
        default = table[2].split()
        self.assertEqual(default[4], "0.50")  # the columns before are as without CPU times
        self.assertEqual(default[7:9], ["3.00", "0.80"])
        self.assertEqual(table[3], "(CPU s: every rank's; compute alone 2.00 CPU s a step)")
        older = emulated_step.step_table([row("compute", 0, 1.0), row("hvd", 0, 4.0, 3.0)])
        self.assertNotIn("CPU", older)  # a CSV from before the CPU columns

    def test_the_virtual_model_has_the_bound_column(self):
        share = emulated_step.virtual_overlap_share()  # after the forward pass and last layer
        self.assertAllClose(share, 2 / 3, atol=0.01)
        rows = [dict(row("compute", 0, 1.0), model="virtual"),
                dict(row("hvd", 0, 2.8, 2.0), model="virtual"),
                dict(row("default", 0, 2.2, 1.6), model="virtual")]
        table = emulated_step.step_table(rows).splitlines()
        self.assertIn("bound", table[0])
        default = table[2].split()
        self.assertEqual(default[4], "0.40")  # (1 + 1.6 - 2.2) / min(1, 1.6)
        self.assertEqual(default[5], f"{share:.2f}")  # share x compute / min(compute, 1.6)
        self.assertNotIn("bound", emulated_step.step_table([row("compute", 0, 1.0),
                                                             row("hvd", 0, 4.0, 3.0)]))

    def test_clusters_are_parsed_with_a_clear_error(self):
        self.assertEqual(emulated_step.topology("2x4"), (2, 4))
        for bad in ("2", "2x", "0x4", "axb"):
            with self.assertRaisesRegex(argparse.ArgumentTypeError, "HOSTSxRANKS_PER_HOST"):
                emulated_step.topology(bad)


class CurrentStackReportTest(tf.test.TestCase):
    """MWMS is the peer: its rows (wire fp32, no compression) stand in every wire's table."""

    def rows(self):
        rows = []
        for repeat in range(3):
            rows += [row("compute", repeat, 0.5, wire="fp32"),
                     row("default", repeat, 3.0, 2.5, wire="fp32"),
                     row("compute", repeat, 0.5, wire="fp16"),
                     row("default", repeat, 1.5 + 0.1 * repeat, 1.2, wire="fp16"),
                     row("mwms", repeat, 5.0, 4.8, wire="fp32")]
        return rows

    def test_the_ratio_column_is_to_mwms(self):
        table = emulated_step.step_table([r for r in self.rows() if r["wire"] == "fp32"])
        lines = table.splitlines()
        self.assertIn("step/mwms", lines[0])
        self.assertNotIn("step/hvd", lines[0])
        cells = {line.split()[0]: line.split() for line in lines[1:]}
        self.assertEqual(cells["mwms"][5], "1.00")
        self.assertEqual(cells["default"][5], "0.60")  # 3.0 / 5.0
        self.assertEqual(cells["mwms"][4], "0.60")  # hidden: (0.5 + 4.8 - 5.0) / 0.5
        self.assertEqual(cells["default"][6], "1.20")  # 3.0 / max(0.5, 2.5)

    def test_the_peer_is_the_fastest_tuned_mwms(self):
        rows = [r for r in self.rows() if r["wire"] == "fp32"]
        packed = [dict(r, variant="mwms-pack16", step_s=str(float(r["step_s"]) * 0.8))
                  for r in rows if r["variant"] == "mwms"]
        shipped = [dict(r, variant="mwms-as-shipped", step_s="0.1")
                   for r in rows if r["variant"] == "mwms"]  # failed runs are no peer
        lines = emulated_step.step_table(rows + packed + shipped).splitlines()
        self.assertIn("step/mwms-pack16", lines[0])
        cells = {line.split()[0]: line.split() for line in lines[1:]}
        self.assertEqual(cells["mwms-pack16"][5], "1.00")
        self.assertEqual(cells["default"][5], "0.75")  # 3.0 / (5.0 x 0.8)

    def test_mwms_stands_in_every_wire_table_and_makes_none_of_its_own(self):
        text = emulated_step.report_rows(self.rows())
        tables = [t for t in text.split("\n== ") if t.strip()]
        self.assertEqual(len(tables), 2)  # fp32 and fp16, no third for MWMS alone
        fp16 = next(t for t in tables if "fp16 wire" in t)
        self.assertIn("mwms sends FP32 (no compression)", fp16)
        cells = {line.split()[0]: line.split() for line in fp16.splitlines()[2:]}
        self.assertEqual(cells["mwms"][1], "5.000")
        self.assertEqual(cells["default"][1], "1.600")  # median of 1.5, 1.6, 1.7
        self.assertEqual(cells["default"][5], "0.32")  # 1.6 / 5.0, per repeat then median
        fp32 = next(t for t in tables if "fp32 wire" in t)
        self.assertNotIn("no compression", fp32)

    def test_mwms_of_one_cluster_stays_out_of_another(self):
        rows = self.rows() + [row("compute", 0, 0.4, wire="fp32", hosts="1", rph="4"),
                              row("default", 0, 0.8, 0.3, wire="fp32", hosts="1", rph="4")]
        one_host = next(t for t in emulated_step.report_rows(rows).split("\n== ")
                        if t.startswith("1 host"))
        self.assertNotIn("\nmwms", one_host)
        self.assertIn("n/a", one_host.splitlines()[-1])  # no peer there: no ratio

    def test_a_classic_report_is_unchanged(self):
        rows = [row("compute", 0, 1.0), row("hvd", 0, 4.0, 3.0), row("default", 0, 2.5, 2.0)]
        self.assertEqual(emulated_step.report_rows(rows),
                         "\n== 2 host(s) x 2 ranks, 0.25 Gbit/s host links, fp16 wire ==\n"
                         + emulated_step.step_table(rows))
        self.assertIn("step/hvd", emulated_step.step_table(rows))


class StackArgumentsTest(tf.test.TestCase):

    def test_each_stack_has_its_peer_and_refuses_the_other(self):
        classic = emulated_step.parse_args([], horovod=True)
        current = emulated_step.parse_args([], horovod=False)
        self.assertEqual(classic.variants, ["hvd", "default"])
        self.assertEqual(current.variants, ["mwms", "default"])
        for horovod, other in ((True, "mwms"), (False, "hvd"), (False, "default-tf")):
            with self.assertRaises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
                emulated_step.parse_args(["--variants", other], horovod=horovod)
        self.assertEqual(emulated_step.parse_args(
            ["--variants", "mwms-as-shipped", "ring"], horovod=False).variants,
            ["mwms-as-shipped", "ring"])
        # the classic stack runs tftorus' tf engine beside Horovod's (the current one has no other)
        self.assertEqual(emulated_step.parse_args(["--variants", "hvd", "default", "default-tf"],
                                                  horovod=True).variants,
                         ["hvd", "default", "default-tf"])

    def test_the_virtual_models_step_is_given_once(self):
        args = emulated_step.parse_args(["--model", "virtual", "--ratio", "2"], horovod=True)
        argv = emulated_step.worker_argv(args, "fp16", ("2", "2", "0.25"))
        self.assertEqual(argv[argv.index("--model") + 1], "virtual")
        self.assertEqual(argv[argv.index("--ratio") + 1], "2.0")
        refused = {  # arguments -> the error's words
            ("--ratio", "2"): "add --model virtual",
            ("--model", "virtual"): "one of --compute-s SECONDS or --ratio",
            ("--model", "virtual", "--compute-s", "1", "--ratio", "2"): "one of --compute-s",
            ("--model", "virtual", "--compute-s", "0"): "must be > 0",
            ("--model", "virtual", "--ratio", "2", "--variants", "default"): "hvd among",
        }
        for argv, words in refused.items():
            err = io.StringIO()
            with self.assertRaises(SystemExit), contextlib.redirect_stderr(err):
                emulated_step.parse_args(list(argv), horovod=True)
            self.assertIn(words, err.getvalue())
        err = io.StringIO()
        with self.assertRaises(SystemExit), contextlib.redirect_stderr(err):
            emulated_step.parse_args(["--model", "virtual", "--ratio", "2"], horovod=False)
        self.assertIn("give --compute-s", err.getvalue())

    def test_current_launches_turn_with_the_repeat(self):
        args = emulated_step.parse_args(["--wires", "fp32", "fp16", "--variants", "mwms",
                                         "default"], horovod=False)
        first = emulated_step.current_launches(args, 0)
        self.assertEqual(first, [("tftorus", ["default"], ["fp32", "fp16"]),
                                 ("mwms", ["mwms"], ["fp32"])])
        self.assertEqual(emulated_step.current_launches(args, 1), first[::-1])
        self.assertEqual(emulated_step.current_launches(args, 2), first)
        only_mwms = emulated_step.parse_args(["--variants", "mwms-as-shipped"], horovod=False)
        self.assertEqual(emulated_step.current_launches(only_mwms, 0),
                         [("mwms-as-shipped", ["mwms-as-shipped"], ["fp32"])])

    def test_worker_commands(self):
        args = emulated_step.parse_args(["--repeats", "3"], horovod=True)
        classic = emulated_step.worker_argv(args, "fp16", ("2", "2", "0.25"))
        self.assertNotIn("--first-repeat", classic)
        self.assertEqual(classic[classic.index("--wires") + 1], "fp16")
        self.assertEqual(classic[classic.index("--repeats") + 1], "3")
        current = emulated_step.worker_argv(args, ["fp32", "fp16"], ("2", "2", "0.25"),
                                            ["default"], 2)
        self.assertEqual(current[current.index("--first-repeat") + 1], "2")
        self.assertEqual(current[current.index("--repeats") + 1], "1")
        self.assertEqual(current[current.index("--variants") + 1:current.index("--repeats")],
                         ["default"])
        worker = emulated_step.parse_args(current[current.index("--worker"):], horovod=False)
        self.assertEqual((worker.wires, worker.first_repeat, worker.repeats),
                         (["fp32", "fp16"], 2, 1))

    def test_each_rank_gets_its_share_of_the_cores(self):
        args = emulated_step.parse_args([], horovod=True)
        with mock.patch.object(cluster.os, "cpu_count", return_value=8):
            self.assertEqual(cluster.threads_env(args, 4), {"TF_NUM_INTRAOP_THREADS": "2"})
            self.assertEqual(cluster.threads_env(args, 16), {"TF_NUM_INTRAOP_THREADS": "1"})
            forced = emulated_step.parse_args(["--intra-op-threads", "0"], horovod=True)
            self.assertEqual(cluster.threads_env(forced, 4), {})  # TF's own pools
            self.assertEqual(cluster.threads_env(argparse.Namespace(), 4), {})  # no such flag
        with self.assertRaises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
            emulated_step.parse_args(["--intra-op-threads", "-1"], horovod=True)

    def test_tf_config_names_every_rank_at_its_host(self):
        self.assertEqual(cluster.tf_config_workers(2, 2, 23456),
                         ["10.77.0.1:23456", "10.77.0.1:23457",
                          "10.77.0.2:23456", "10.77.0.2:23457"])
        json.dumps({"cluster": {"worker": cluster.tf_config_workers(1, 4)}})


class MwmsHelpersTest(tf.test.TestCase):

    def test_the_slowest_rank_by_a_sum(self):
        values = [0.5, 2.0, 1.25]
        total = sum(tf.one_hot(r, 3, dtype=tf.float64) * v for r, v in enumerate(values))
        for rank, mine in enumerate(values):
            self.assertEqual(emulated_step.largest(lambda t: total, rank, 3, mine, tf), 2.0)

    def test_shims_take_a_nest_and_reduce_a_scalar_across_replicas(self):
        calls = []

        class Strategy:  # the two methods the shims use, recording what reduce is given
            def reduce(self, op, value, axis=None):
                if isinstance(value, (tuple, list, dict)):
                    raise ValueError("Attempt to convert a value (PerReplica ...)")
                calls.append((op, axis))
                return value

            def experimental_local_results(self, value):
                return (value,)

        strategy = Strategy()
        emulated_step.mwms_keras3_shims(strategy, tf)
        batch = (tf.zeros([4, 2]), tf.zeros([4], tf.int64))
        self.assertEqual(len(strategy.reduce("MEAN", batch, axis=None)), 2)
        strategy.reduce("MEAN", tf.constant(1.0), axis=0)  # a step's loss
        strategy.reduce("MEAN", tf.zeros([4]), axis=0)
        self.assertEqual(calls, [("MEAN", None), ("MEAN", None), ("MEAN", None),
                                 ("MEAN", 0)])


if __name__ == "__main__":
    tf.test.main()
