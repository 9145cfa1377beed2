"""The simulated cluster (studies/simulated_cluster.py, SimGrid): on small clusters, in seconds.

Where no two flows share a link beyond what the cost model also shares (a host's NIC, fairly),
the simulator and the cost model (tftorus/planning/cost_model.py) must give the same all-reduce
times; where they do share more (a rack's uplink), the simulator must see it and the model must not.
Needs SimGrid's Python bindings (Debian: apt-get install python3-simgrid; run_scripts/setup.sh
installs them where apt works): without them those tests skip, saying so. One SimGrid platform
per process, so every cluster here is built once, together. No processes are started.
"""
import sys
import unittest

from studies import simulated_cluster as sc
from tftorus.planning import cost_model as cm
from tftorus.torus.grid import TorusGrid

SIMGRID = sc.load_simgrid()
NEEDS_SIMGRID = unittest.skipIf(SIMGRID is None, f"SimGrid missing: {sc.SIMGRID_MISSING}")

# A cluster of 4 hosts x 4 ranks (16), one NIC per host, ranks of a host joined pairwise.
NIC_BW, NIC_LAT = 10e9, 10e-6  # node to node: 10 us (5 us each end), 10 GB/s each way
PAIR_BW, PAIR_LAT = 40e9, 2e-6
PER_OP, GAMMA = 7e-6, 2e-12
FLAT = sc.flat("flat", hosts=4, ranks=4, nic_bw=NIC_BW, nic_lat=NIC_LAT, pair_bw=PAIR_BW,
               pair_lat=PAIR_LAT)
# Two racks of 2 nodes x 2 GPUs, each rack with one uplink as fast as one NIC.
RACKS = sc.ClusterSpec("racks", sc.NodeSpec(gpus=2, pair_bw=PAIR_BW, pair_lat=PAIR_LAT, nics=1,
                                            nic_bw=NIC_BW, nic_lat=NIC_LAT / 2,
                                            nic_of_gpu=(0, 0)),
                       racks=2, nodes_per_rack=2, uplink_bw=NIC_BW)
MODEL = cm.CostModel(cm.Params(cm.Link(PAIR_LAT, 1 / PAIR_BW), cm.Link(NIC_LAT, 1 / NIC_BW),
                               gamma=GAMMA, per_op=PER_OP),
                     cm.Topology(ranks_per_host=4, nics_per_host=1))

_PLATFORM = None


def platform() -> "sc.Platform":
    global _PLATFORM
    if _PLATFORM is None:
        _PLATFORM = sc.Platform([FLAT, RACKS, sc.emulated("emu", hosts=2, ranks=2, links=1)])
    return _PLATFORM


@NEEDS_SIMGRID
class AgreesWithCostModelTest(unittest.TestCase):
    """Ring steps whose flows share only what the model shares: the same seconds."""

    CASES = [  # (algorithm, grid X); 16 ranks
        ("ring", 4),  # one flow leaves each host per step
        ("torus", 4),  # rows are hosts (NVLink-like pairs); columns: 4 ranks share a NIC
        ("torus", 8),  # rows span 2 hosts: one flow per host crosses
        ("torus", 2),  # half-host rows; columns of 8 cross hosts every other step
        ("hierarchical", 4),  # leaders: one rank per host crosses
    ]

    @classmethod
    def setUpClass(cls):
        sim = sc.Simulator(platform(), per_op=PER_OP, gamma=GAMMA)
        cls.nbytes = 8 * 2 ** 20
        requests = [("flat", a, TorusGrid(size=16, x=x), [cls.nbytes], "compact", None, None)
                    for a, x in cls.CASES]
        cls.simulated = [sc.total(r) for r in sim.many(requests)]

    def test_same_seconds_as_the_cost_model(self):
        for (algorithm, x), simulated in zip(self.CASES, self.simulated):
            with self.subTest(algorithm=algorithm, x=x):
                modelled = MODEL.seconds(algorithm, TorusGrid(size=16, x=x), self.nbytes)
                self.assertAlmostEqual(simulated / modelled, 1.0, delta=1e-4,
                                       msg=f"simulated {simulated:.6e} s, model {modelled:.6e} s")

    def test_torus_beats_ring_by_the_models_margin(self):
        ring, torus = self.simulated[0], self.simulated[1]
        self.assertLess(torus, ring)


@NEEDS_SIMGRID
class ContentionTest(unittest.TestCase):
    """More flows on a rack's uplink than it carries: the simulator slows them, the model (no
    contention above the host) does not."""

    def test_uplink_contention_is_seen(self):
        sim = sc.Simulator(platform())
        nbytes = 4 * 2 ** 20
        # 8 GPUs on 4 nodes; interleaved, nodes 0, 2, 1, 3 (racks 0, 1, 0, 1): every ring hop
        # between nodes leaves its rack, two flows each way on each uplink.
        grid = TorusGrid(size=8, x=2)
        interleaved = [0, 1, 4, 5, 2, 3, 6, 7]
        compact, crossing = sim.many([
            ("racks", "ring", grid, [nbytes], "compact", 0.0, 0.0),
            ("racks", "ring", grid, [nbytes], interleaved, 0.0, 0.0)])
        model = cm.CostModel(cm.Params(cm.Link(PAIR_LAT, 1 / PAIR_BW),
                                       cm.Link(NIC_LAT, 1 / NIC_BW)),
                             cm.Topology(ranks_per_host=2, nics_per_host=1))
        expected = model.seconds("ring", grid, nbytes)
        # compact: one hop each way leaves each rack, its uplink carries one flow: the model.
        self.assertAlmostEqual(sc.total(compact) / expected, 1.0, delta=1e-4)
        # interleaved: the model's time is unchanged (its picture has no racks); the uplinks
        # halve the crossing flows' rate, so the bandwidth part of each such step doubles.
        self.assertAlmostEqual(model.seconds("ring", grid, nbytes), expected)
        self.assertGreater(sc.total(crossing), 1.5 * expected)


@NEEDS_SIMGRID
class EmulatedFloorTest(unittest.TestCase):
    def test_torus_column_on_one_link_is_the_byte_limit(self):
        # 2 hosts x 2 ranks, 1 link of 0.25 Gbit/s: the torus' column all-reduce crosses each
        # host's link with 2(Y-1)/Y of the buffer (docs/studies/emulated_cluster.md's floor: 537 ms
        # for 16 MiB); its row phases ride free loopback here.
        sim = sc.Simulator(platform())
        nbytes = 16 * 2 ** 20
        (res,) = sim.many([("emu", "torus", TorusGrid(size=4, x=2), [nbytes], "compact", 0.0,
                            0.0)])
        self.assertAlmostEqual(sc.total(res), nbytes / sc.EMULATED_LINK_BW, delta=1e-3)


class WithoutSimGridTest(unittest.TestCase):
    def test_placements_are_permutations_of_whole_nodes(self):
        spec = sc.abci("abci")
        for how in ("compact", "fragmented", "scattered"):
            gpus = sc.placement(spec, 256, how)
            self.assertEqual(len(set(gpus)), 256)
            self.assertEqual(len({g // 4 for g in gpus}), 64)
            self.assertTrue(all(g % 4 == r % 4 for r, g in enumerate(gpus)))
        self.assertEqual(sc.placement(spec, 8, "compact"), list(range(8)))

    def test_phases_are_the_cost_models(self):
        grid = TorusGrid(size=3456, x=72)
        phases = sc.phases("torus", grid, 51.2e6, 4)
        self.assertEqual([p.steps for p in phases], [71, 94, 71])
        self.assertEqual(sum(p.steps for p in phases), grid.sequential_steps)
        nccl = sc.phases("nccl-hierarchical", grid, 51.2e6, 4)
        self.assertEqual([p.members for p in nccl], [4, 864, 4])

    def test_loader_leaves_debians_packages_off_the_path(self):
        sc.load_simgrid()
        self.assertNotIn(sc.DEBIAN_DIST_PACKAGES, sys.path)




class RailsCsvTest(unittest.TestCase):
    """The calibration's measured side, read from a studies.emulated_cluster CSV (no SimGrid)."""

    def write(self, fusion_mb):
        import csv
        import os
        import tempfile
        path = os.path.join(tempfile.mkdtemp(), "allreduce.csv")
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["hosts", "ranks_per_host", "link_gbit", "links_per_host", "fusion_mb",
                        "workload", "kind", "name", "median_ms"])
            for name, ms in (("ring", 5000), ("hierarchical", 3700), ("torus", 3600)):
                w.writerow([2, 2, 0.25, 1, fusion_mb, "resnet50 fp32", "variant", name, ms])
        return path

    def test_one_buffer_is_read(self):
        self.assertEqual(sc.read_rails_csv(self.write(128.0)),
                         {(2, 2, 1): {"resnet50 fp32": (5000.0, 3700.0, 3600.0)}})

    def test_buckets_are_refused_with_what_to_change(self):
        with self.assertRaisesRegex(SystemExit, "--fusion-threshold-mb 128"):
            sc.read_rails_csv(self.write(16.0))

    def test_fixed_costs_come_from_the_small_all_reduces(self):
        measured = {(2, 2, 1): {"flat 4 KiB": (20.0, 30.0, 28.0), "flat 16 MiB": (800, 600, 580)},
                    (2, 4, 1): {"flat 4 KiB": (22.0, 34.0, 30.0)},
                    (4, 2, 1): {"flat 16 MiB": (1000, 950, 940)}}
        costs = sc.fixed_costs(measured)
        # 2 x 2: per collective the median of (30-20)/2 and (28-20)/2, 4.5 ms; per call the
        # ring less one collective; clusters without 4 KiB rows take the median over all
        self.assertEqual(set(costs), {(2, 2), (2, 4), None})
        self.assertAlmostEqual(costs[(2, 2)][1], 4.5e-3)
        self.assertAlmostEqual(costs[(2, 2)][0], 15.5e-3)
        self.assertAlmostEqual(costs[(2, 4)][1], 5.0e-3)
        self.assertAlmostEqual(costs[None][1], 4.5e-3)  # of 5, 4, 6, 4
        self.assertAlmostEqual(costs[None][0], 21e-3 - 4.5e-3)
        self.assertEqual(sc.fixed_costs({(2, 2, 1): {"flat 16 MiB": (800, 600, 580)}}), {})


if __name__ == "__main__":
    unittest.main()
