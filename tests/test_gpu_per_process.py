"""A GPU per process on the tf engine (tftorus/cluster/gpu_per_process.py), checked on CPU: the
decision for every kind of launch (the local rank and size each launcher gives, what the process
sees, what the user set), and that applying it makes exactly the calls of Horovod's pinning
lines, which TensorFlow then takes as no-ops when the user's script runs them after init. On a
machine with GPUs, run_scripts/gpu_check.py runs the real thing (docs/guide/gpus.md)."""
import os
from unittest import mock

import tensorflow as tf

from tftorus.cluster import discovery, gpu_per_process


class Device:
    def __init__(self, name):
        self.name, self.device_type = name, "GPU"

    def __repr__(self):
        return self.name


class HostConfig:
    """The part of tf.config the choice touches, on a host with `count` GPUs; records calls."""

    def __init__(self, count: int, visible=None):
        self.physical = [Device(f"GPU:{i}") for i in range(count)]
        self.visible = list(self.physical if visible is None else visible)
        self.calls = []
        self.experimental = self

    def list_physical_devices(self, kind):
        return list(self.physical) if kind == "GPU" else []

    def get_visible_devices(self, kind):
        return list(self.visible)

    def set_memory_growth(self, device, on):
        self.calls.append(("memory_growth", device.name, on))

    def set_visible_devices(self, device, kind):
        self.calls.append(("visible", device.name, kind))
        self.visible = [device]


def horovods_lines(config, local_rank):
    """What every Horovod example runs after hvd.init()."""
    gpus = config.list_physical_devices("GPU")
    for gpu in gpus:
        config.experimental.set_memory_growth(gpu, True)
    if gpus:
        config.set_visible_devices(gpus[local_rank], "GPU")


class ChoiceTest(tf.test.TestCase):

    def test_the_local_ranks_gpu_on_a_host_of_eight(self):
        for local_rank in range(8):
            choice = gpu_per_process.choose(local_rank, 8, 32, gpus=8)
            self.assertEqual(choice.gpu, local_rank)
            self.assertIn(f"local rank {local_rank} of 8 takes GPU {local_rank}", choice.why)

    def test_every_launchers_local_rank(self):
        """Each launcher's way of telling the local rank leads to the same GPU: rank 5 of 16 on
        two hosts of 8 is local rank 5."""
        workers = [f"h{1 + r // 8}:{2222 + r % 8}" for r in range(16)]
        cluster = discovery.from_tf_config(
            '{"cluster": {"worker": %s}, "task": {"type": "worker", "index": 13}}'
            % str(workers).replace("'", '"'), 60.0)
        self.assertEqual((cluster.local_rank, cluster.local_size), (5, 8))
        self.assertEqual(gpu_per_process.choose(cluster.local_rank, cluster.local_size,
                                                cluster.size, 8).gpu, 5)
        slurm = {"SLURM_PROCID": "13", "SLURM_NTASKS": "16", "SLURM_STEP_NODELIST": "h[1-2]",
                 "SLURM_STEP_TASKS_PER_NODE": "8(x2)", "SLURM_LOCALID": "5",
                 "SLURM_NODEID": "1", "SLURMD_NODENAME": "h2"}
        with mock.patch.dict(os.environ, slurm, clear=False):
            cluster = discovery.from_slurm(None, None, 60.0)
        self.assertEqual((cluster.local_rank, cluster.local_size, cluster.size), (5, 8, 16))
        self.assertEqual(gpu_per_process.choose(5, 8, 16, 8).gpu, 5)

    def test_when_devices_are_left_alone(self):
        cases = [
            (dict(world_size=1, gpus=8), "a process alone"),
            (dict(world_size=16, gpus=0), "no GPU visible"),
            (dict(world_size=16, gpus=8, narrowed=True), "chose its GPUs before init"),
            (dict(world_size=16, gpus=8, on=False), "TFTORUS_GPU_PER_PROCESS=0"),
        ]
        for kwargs, why in cases:
            with self.subTest(**kwargs):
                choice = gpu_per_process.choose(3, 8, **kwargs)
                self.assertIsNone(choice.gpu)
                self.assertIn(why, choice.why)

    def test_one_visible_gpu_is_the_one(self):
        """A launcher or the user gave each rank its own CUDA_VISIBLE_DEVICES."""
        self.assertEqual(gpu_per_process.choose(6, 8, 16, gpus=1).gpu, 0)

    def test_fewer_gpus_than_ranks_is_refused_saying_what_to_do(self):
        with self.assertRaisesRegex(ValueError, r"8 ranks on this host but each sees only 4 GPUs "
                                    r"\(CUDA_VISIBLE_DEVICES=0,1,2,3\): start at most 4 ranks "
                                    r"per host \(-H host:4\).*TFTORUS_GPU_PER_PROCESS=0"):
            gpu_per_process.choose(1, 8, 16, gpus=4, cuda_visible_devices="0,1,2,3")

    def test_the_variable(self):
        for raw, on in (("", True), ("1", True), ("on", True), ("0", False), ("off", False),
                        ("No", False)):
            with self.subTest(raw=raw), mock.patch.dict(os.environ,
                                                        {gpu_per_process.ENV: raw}):
                self.assertEqual(gpu_per_process.enabled(), on)
        with mock.patch.dict(os.environ, {gpu_per_process.ENV: "gpu3"}), \
                self.assertRaisesRegex(ValueError, "TFTORUS_GPU_PER_PROCESS='gpu3': use 1"):
            gpu_per_process.enabled()


class PinTest(tf.test.TestCase):

    def setUp(self):
        super().setUp()
        patcher = mock.patch.dict(os.environ, {gpu_per_process.ENV: ""})
        patcher.start()
        self.addCleanup(patcher.stop)

    def test_the_same_calls_as_horovods_lines(self):
        """So TensorFlow takes the user's lines after init as no-ops (it returns early when
        asked for what is set, and raises only on a change once its runtime runs)."""
        for local_rank in (0, 3, 7):
            ours, theirs = HostConfig(8), HostConfig(8)
            choice = gpu_per_process.pin(local_rank, 8, 16, config=ours)
            horovods_lines(theirs, local_rank)
            self.assertEqual(choice.gpu, local_rank)
            self.assertEqual(ours.calls, theirs.calls)
            self.assertEqual([d.name for d in ours.visible], [d.name for d in theirs.visible])

    def test_nothing_touched_on_a_cpu_host_or_when_chosen_already(self):
        for config in (HostConfig(0), HostConfig(8, visible=[Device("GPU:2")])):
            gpu_per_process.pin(1, 2, 2, config=config)
            self.assertEqual(config.calls, [])
        with mock.patch.dict(os.environ, {gpu_per_process.ENV: "0"}):
            config = HostConfig(8)
            gpu_per_process.pin(1, 2, 2, config=config)
            self.assertEqual(config.calls, [])

    def test_this_cpu_process(self):
        """The real tf.config here: no GPU, nothing changes, TF's runtime not started."""
        choice = gpu_per_process.pin(0, 2, 2)
        self.assertIsNone(choice.gpu)
        self.assertEqual(choice.why, "no GPU visible")


if __name__ == "__main__":
    tf.test.main()


class GpuCheckScriptTest(tf.test.TestCase):
    """run_scripts/gpu_check.py, the check for a GPU machine, runs here on the CPU (so it does
    not rot): Horovod's pinning lines after init, the all-reduce, a mixed-precision fit."""

    def test_two_ranks_on_the_cpu(self):
        from tests import harness
        result = harness.run_world(["run_scripts/gpu_check.py"], np=2, timeout=300)
        self.assertEqual(result.returncode, 0, harness.describe(result))
        for rank in range(2):
            self.assertIn(f"[rank {rank}] host ", result.output)
            self.assertIn(f"local rank {rank} of 2: no GPU: the CPU", result.output)
        self.assertIn("gpu check passed", result.output)
        result = harness.run(["run_scripts/gpu_check.py", "--require-gpus"], timeout=120)
        self.assertEqual(result.returncode, 2, harness.describe(result))
        self.assertIn("no GPU visible on ", result.output)
