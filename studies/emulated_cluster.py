"""An emulated multi-host cluster on this machine, and the all-reduce benchmark across it.

    sudo .venv/bin/python -m studies.emulated_cluster              # 2 hosts x 4 ranks, 0.25 Gbit/s
    sudo .venv/bin/python -m studies.emulated_cluster --hosts 2 --ranks-per-host 2 \\
        --link-gbit 0.5 --sizes 1M 16M --resnet
    sudo .venv/bin/python -m studies.emulated_cluster --sweep 2x2 2x4 4x2 --link-gbit 0.25 1 \\
        --engines horovod --sizes 16M 64M                  # one cluster per topology and rate
    sudo .venv/bin/python -m studies.emulated_cluster --sweep 2x2 2x4 4x2 --links-per-host 1 rank \\
        --engines horovod --variants hvd torus ring hierarchical   # one link, then a rail per rank

Each host is a Linux network namespace (tft-h0, tft-h1, ...) with one veth link to a bridge in
the root namespace (tftbr0, 10.77.0.254/24; host k is 10.77.0.k+1). Every host link is limited
to --link-gbit in both directions with a `tbf` qdisc on each end of its veth pair; traffic
between ranks of one host stays on the namespace's loopback, unlimited (the intra-node link).

--links-per-host K gives each host K such links, "rails" as on GPU nodes with a NIC per GPU:
link j of every host is on rail j's bridge (tftbr<j>, subnet 10.77.j.0/24), and the rank of
local rank l is bound to rail l mod K (Gloo's interface and the host name its process sets
resolve). Ranks of equal local rank (the torus' columns with a row per host) then talk over
their own rail; a flat ring's hop from one host to the next, between ranks of different local
ranks, goes over the rail of the receiving rank. `rank` means one link per rank of a host.
What is not emulated: latency (these kernels have no `netem`), and separate CPUs: every rank
of every host shares this machine's cores.

Horovod starts without ssh: a Gloo rendezvous server in the root namespace (on the bridge's
address) and one `ip netns exec tft-hK env HOROVOD_... python benchmark_allreduce.py --worker`
per rank, with the environment horovodrun would give it (rank, size, local and cross ranks,
HOROVOD_HOSTNAME = the host's address, HOROVOD_GLOO_IFACE = its veth). The grid defaults to one
row per host (Y = hosts, X = ranks per host): the torus' row phases stay inside a host and its
column phase crosses hosts, as on the paper's nodes. The tf engine's variants run after that
job, on the same hosts, in a job of their own without Horovod (`--tf-alone`;
studies/benchmark_allreduce.py says why): its ranks start the same way and exchange their TF
servers' addresses through the same kind of rendezvous server.

Prints per workload the median of each variant (slowest rank per call) and the ratios torus /
ring (beside its byte limit, see `byte_limit`), torus / hierarchical and torus / hvd; writes a CSV (default /tmp/tftorus_emulated/
allreduce.csv, with columns hosts, ranks_per_host, link_gbit and bytes for
studies/scale_model.py --csv) and two PNG plots beside it. Needs root; exits 77 (skipped)
with the reason where namespaces cannot be made. Sets up and removes everything itself.
"""
import argparse
import csv
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List, Optional

from studies import benchmark_allreduce as bench
from studies.out_dir import own_dir

SKIPPED = 77
PREFIX = "tft-h"
BRIDGE = "tftbr0"  # rail 0's, the one every host has
BRIDGE_IP = "10.77.0.254"  # rail 0's bridge address: the Gloo rendezvous
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(tempfile.gettempdir(), "tftorus_emulated")


# ==================================================================================================
# The namespaces
# ==================================================================================================

def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


def rail_subnet(rail: int) -> str:
    return f"10.77.{rail}"


def rail_bridge(rail: int) -> str:
    return f"tftbr{rail}"


def host_ip(k: int, rail: int = 0) -> str:
    """Host k's address on rail `rail` (rail 0: the one every host has)."""
    return f"{rail_subnet(rail)}.{k + 1}"


def why_not_possible() -> str:
    """'' if namespaces, veths, bridges and tbf can be made here, else the reason."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, a bridge and tc qdiscs)"
    if not shutil.which("ip") or not shutil.which("tc"):
        return "needs iproute2's `ip` and `tc`"
    probe = f"{PREFIX}probe"
    made = sh("ip", "netns", "add", probe, check=False)
    sh("ip", "netns", "del", probe, check=False)
    if made.returncode:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    return ""


class Cluster:
    """H namespaces on K rail bridges, each host link rate-limited both ways. A context
    manager."""

    def __init__(self, hosts: int, link_gbit: float, links: int = 1):
        self.hosts, self.link_gbit, self.links = hosts, link_gbit, links

    def veth(self, k: int, rail: int) -> str:
        return f"tftv{k}r{rail}"  # the root-namespace end; the namespace end is eth<rail>

    def __enter__(self) -> "Cluster":
        teardown()  # leftovers of a run that was killed
        try:
            for rail in range(self.links):
                bridge = rail_bridge(rail)
                sh("ip", "link", "add", bridge, "type", "bridge")
                sh("ip", "addr", "add", f"{rail_subnet(rail)}.254/24", "dev", bridge)
                sh("ip", "link", "set", bridge, "up")
            for k in range(self.hosts):
                ns = f"{PREFIX}{k}"
                sh("ip", "netns", "add", ns)
                sh("ip", "-n", ns, "link", "set", "lo", "up")
                for rail in range(self.links):
                    outer, inner = self.veth(k, rail), f"eth{rail}"
                    sh("ip", "link", "add", outer, "type", "veth", "peer", "name", inner,
                       "netns", ns)
                    sh("ip", "link", "set", outer, "master", rail_bridge(rail), "up")
                    sh("ip", "-n", ns, "addr", "add", f"{host_ip(k, rail)}/24", "dev", inner)
                    sh("ip", "-n", ns, "link", "set", inner, "up")
                    # egress of each end: host -> bridge inside, bridge -> host on the outer end
                    for prefix, dev in ((["ip", "netns", "exec", ns], inner), ([], outer)):
                        sh(*prefix, "tc", "qdisc", "add", "dev", dev, "root", "tbf",
                           *tbf_args(self.link_gbit))
        except subprocess.CalledProcessError as error:
            teardown()
            raise SystemExit(f"setting up the emulated cluster failed: {' '.join(error.cmd)}: "
                             f"{error.stderr.strip()}")
        return self

    def __exit__(self, *exc):
        teardown()


def tbf_args(gbit: float) -> List[str]:
    rate = gbit * 1e9 / 8  # bytes/s
    # a burst of at least one timer tick's worth (HZ >= 100), so the rate is reachable
    burst = max(64 * 1024, int(rate / 100))
    return ["rate", f"{gbit * 1000:g}mbit", "burst", str(burst), "latency", "100ms"]


def teardown() -> None:
    """Remove every namespace and link this script makes (also those of a killed run)."""
    listed = sh("ip", "netns", "list", check=False).stdout.split()
    for name in listed:
        if name.startswith(PREFIX):
            sh("ip", "netns", "pids", name, check=False)
            for pid in sh("ip", "netns", "pids", name, check=False).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            sh("ip", "netns", "del", name, check=False)
    for line in sh("ip", "-o", "link", "show", check=False).stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if name.startswith("tftbr") or name.startswith("tftv"):
            sh("ip", "link", "del", name, check=False)


# ==================================================================================================
# Horovod across the namespaces
# ==================================================================================================

def launch(args, hosts: int, rph: int, bench_argv: List[str], log_path: str,
           links: int = 1) -> int:
    """Start every rank in its host's namespace with horovodrun's environment, bound to rail
    local rank mod `links`; echo rank 0."""
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
    from horovod.runner.http.http_server import RendezvousServer
    size = hosts * rph
    slots = get_host_assignments(
        parse_hosts(",".join(f"{host_ip(k)}:{rph}" for k in range(hosts))), size)
    server = RendezvousServer()
    port = server.start()
    server.init(slots)
    commands = []
    for slot in slots:
        k = int(slot.hostname.rsplit(".", 1)[1]) - 1
        rail = slot.local_rank % links
        env = {
            "HOROVOD_GLOO_RENDEZVOUS_ADDR": BRIDGE_IP, "HOROVOD_GLOO_RENDEZVOUS_PORT": port,
            "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo",
            "HOROVOD_GLOO_IFACE": f"eth{rail}", "HOROVOD_HOSTNAME": slot.hostname,
            "HOROVOD_RANK": slot.rank, "HOROVOD_SIZE": slot.size,
            "HOROVOD_LOCAL_RANK": slot.local_rank, "HOROVOD_LOCAL_SIZE": slot.local_size,
            "HOROVOD_CROSS_RANK": slot.cross_rank, "HOROVOD_CROSS_SIZE": slot.cross_size,
            # the tf engine's TF server at the rank's rail, as its process sets' Gloo is
            "TFTORUS_TF_HOST": host_ip(k, rail),
            **RANK_ENV, **threads_env(args, size),
            "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
            **{key: os.environ[key] for key in HOROVOD_PASSED if key in os.environ},
        }
        # Horovod 0.28.1 builds the Gloo contexts of process sets from the machine's host
        # name, not HOROVOD_GLOO_IFACE (its debug log shows them on 127.0.0.1, which the
        # other hosts cannot reach): each rank gets a UTS namespace named by its host's
        # address, as a real host's name would resolve to it: its rail's, so that its
        # process sets talk over its own link (HOROVOD_HOSTNAME stays the host's: Horovod
        # groups the ranks of a host by it).
        commands.append(["ip", "netns", "exec", f"{PREFIX}{k}", "unshare", "--uts", "sh", "-c",
                         'hostname "$0" && exec "$@"', host_ip(k, rail), "env",
                         *[f"{key}={value}" for key, value in env.items()], *bench_argv])
    try:
        return run_ranks(commands, log_path, args.timeout)
    finally:
        server.stop()


RANK_ENV = {"PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}


def intra_op_threads(requested, ranks: int) -> int:
    """Each rank's TF_NUM_INTRAOP_THREADS: `requested`, or with None this machine's cores shared
    among the cluster's ranks (at least 1), as an emulated host's ranks would share their
    host's cores; 0 leaves TensorFlow's default. That default, a pool per core in every rank,
    puts ranks x cores busy threads on the cores beside a step's compute and starves the
    collectives' threads (Horovod's background loop, Gloo, TF's collective executor): no step
    then hides its all-reduce (tests/workers/overlap.py measured that)."""
    if requested is not None:
        return requested
    return max(1, (os.cpu_count() or 1) // ranks)


def threads_env(args, ranks: int) -> dict:
    """The rank environment's TF_NUM_INTRAOP_THREADS from args.intra_op_threads (if the study
    has it), or nothing for TensorFlow's default."""
    threads = intra_op_threads(getattr(args, "intra_op_threads", 0), ranks)
    return {"TF_NUM_INTRAOP_THREADS": str(threads)} if threads else {}


#: Horovod's knobs a caller may set for every rank (HOROVOD_TIMELINE: rank 0 writes Horovod's
#: timeline of every collective there, a Chrome trace; docs/studies/emulated_cluster.md)
HOROVOD_PASSED = ("HOROVOD_TIMELINE", "HOROVOD_TIMELINE_MARK_CYCLES", "HOROVOD_CYCLE_TIME",
                  "HOROVOD_FUSION_THRESHOLD")
TF_PORT = 23456  # the TF_CONFIG launch's base port: rank l of a host listens on TF_PORT + l


def tf_config_workers(hosts: int, rph: int, port: int = TF_PORT) -> List[str]:
    """Every rank's "host:port" for a TF_CONFIG, ranks host by host (rank = k * rph + l, as
    horovodrun's slots): host k's address on rail 0, port + local rank l."""
    return [f"{host_ip(k)}:{port + l}" for k in range(hosts) for l in range(rph)]


def launch_tf_config(args, hosts: int, rph: int, argv: List[str], log_path: str,
                     port: int = TF_PORT) -> int:
    """Start every rank in its host's namespace with a TF_CONFIG naming all ranks at their
    hosts' addresses (tf_config_workers), as a Kubernetes TFJob or a user's own script gives
    it: no horovodrun, nothing else to rendezvous. Both tf.distribute's strategies and
    tftorus' tf engine start their TF server from it. Echo rank 0."""
    import json
    workers = tf_config_workers(hosts, rph, port)
    commands = []
    for rank in range(hosts * rph):
        config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": rank}}
        env = {"TF_CONFIG": json.dumps(config, separators=(",", ":")), **RANK_ENV,
               **threads_env(args, hosts * rph),
               "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
        commands.append(["ip", "netns", "exec", f"{PREFIX}{rank // rph}", "env",
                         *[f"{key}={value}" for key, value in env.items()], *argv])
    return run_ranks(commands, log_path, args.timeout)


def run_ranks(commands: List[List[str]], log_path: str, timeout: float) -> int:
    """Run one command per rank (rank = index), every line into log_path prefixed `[rank] `,
    rank 0's echoed; when one rank fails or `timeout` seconds pass, kill the others. 0 if
    every rank exited 0, else 1 with the log's last lines on stderr."""
    procs, threads = [], []
    lock = threading.Lock()
    with open(log_path, "w") as log:
        def pump(rank, stream):
            for line in stream:
                with lock:
                    log.write(f"[{rank}] {line}")
                    if rank == 0:
                        print(line, end="", flush=True)

        for rank, cmd in enumerate(commands):
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, cwd=REPO, start_new_session=True)
            procs.append(proc)
            thread = threading.Thread(target=pump, args=(rank, proc.stdout), daemon=True)
            thread.start()
            threads.append(thread)
        deadline = time.monotonic() + timeout
        timed_out = False
        while any(p.poll() is None for p in procs):
            if any(p.poll() for p in procs):
                break
            if time.monotonic() > deadline:
                timed_out = True
                break
            time.sleep(0.5)
        for p in procs:  # one rank failed or the time is up: the others would hang
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        for t in threads:
            t.join(timeout=5)
    codes = [p.wait() for p in procs]
    if any(codes):
        print(f"ranks exited with {codes}" + (" (timed out)" if timed_out else "")
              + f"; last lines of {log_path}:", file=sys.stderr)
        with open(log_path) as f:
            print("".join(f.readlines()[-30:]), file=sys.stderr)
        return 1
    return 0


# ==================================================================================================
# Report: ratios and plots from the CSV
# ==================================================================================================

def byte_limit(hosts: int, ranks_per_host: int, links: int = 1) -> float:
    """Torus / ring time where the host links are the only bottleneck: the bytes each host must
    send across its busiest link. A flat ring over ranks laid out host by host crosses each
    host once, on one link, with 2(N-1)/N of the buffer; the torus' column all-reduces (one per
    rank of a host, each on 1/X of the buffer) send 2(Y-1)/Y of it, spread over the host's
    `links` rails. Y = hosts, X = ranks per host, N = X Y. Leader-based hierarchical sends the
    torus' bytes through one link: its limit against the ring is that of the torus on one
    link, and the torus' against it is 1 / links."""
    n = hosts * ranks_per_host
    return (hosts - 1) / hosts * n / (n - 1) / links


def model_ms(algorithm: str, hosts: int, ranks_per_host: int, link_gbit: float, links: int,
             nbytes: float) -> float:
    """The cost model's time for the bytes across the host links alone (tftorus.planning.cost_model with
    only inter-host beta: no latency, no intra-host or CPU cost): a floor to set each
    measurement beside. A rank is bound to one rail when a host has several links."""
    from tftorus.planning import cost_model as cm
    from tftorus.torus.grid import TorusGrid
    params = cm.Params(intra=cm.Link(0.0, 0.0), inter=cm.Link(0.0, 8 / (link_gbit * 1e9)))
    topology = cm.Topology(ranks_per_host, nics_per_host=links,
                           nics_per_rank=1 if links > 1 else None)
    grid = TorusGrid(hosts * ranks_per_host, ranks_per_host)  # a row per host
    return 1e3 * cm.CostModel(params, topology).seconds(algorithm, grid, nbytes)


def read_rows(path: str) -> List[Dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def medians(rows: List[Dict[str, str]], kinds=("variant",)) -> Dict[str, Dict[str, float]]:
    """workload -> variant (and, if asked, torus phase) -> median ms."""
    by = {}
    for r in rows:
        if r["kind"] in kinds:
            by.setdefault(r["workload"], {})[r["name"]] = float(r["median_ms"])
    return by


def workload_bytes(rows: List[Dict[str, str]]) -> Dict[str, float]:
    """workload -> the bytes its all-reduce sends: half the FP32 bytes with the FP16 wire (CSVs
    written before the wire_bytes column: read from the workload's name)."""
    sizes = {}
    for r in rows:
        if r.get("wire_bytes"):
            sizes[r["workload"]] = float(r["wire_bytes"])
        elif r.get("bytes"):
            sizes[r["workload"]] = float(r["bytes"]) / (2 if "fp16" in r["workload"] else 1)
    return sizes


def floor_table(rows: List[Dict[str, str]], cluster: tuple) -> str:
    """The torus and its column phase beside their floors (the cost model on the host links
    alone, for the bytes on the wire): what is left above the floor is ours to find. The row
    phases stay inside a host, on no emulated link: their floor is 0, so all of their time and
    the packing's is the torus' excess over the column's floor."""
    by = medians(rows, kinds=("variant", "phase"))
    sizes = workload_bytes(rows)
    head = ("| workload | wire MiB | floor ms | variant | ms | / floor | its column alone ms | "
            "column / floor | variant - column ms |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for workload, v in by.items():
        if workload not in sizes:
            continue
        floor = model_ms("torus", *cluster, sizes[workload])
        for name in (n for n in v if n.startswith("torus") and "native" not in n):
            # the engine's own column phase: Horovod's, or the tf engine's for torus-tf*
            column = v.get("tf column all-reduce" if name.startswith("torus-tf")
                           else "column all-reduce")
            cells = [f"{sizes[workload] / 2**20:.1f}", f"{floor:.0f}", name, f"{v[name]:.0f}",
                     f"{v[name] / floor:.2f}", "" if column is None else f"{column:.0f}",
                     "" if column is None else f"{column / floor:.2f}",
                     "" if column is None else f"{v[name] - column:.0f}"]
            lines.append(f"| {workload} | " + " | ".join(cells) + " |")
    return "\n".join(lines) if len(lines) > 2 else ""


def ratio_table(rows: List[Dict[str, str]], limit: float,
                cluster: Optional[tuple] = None) -> str:
    """Medians and ratios per workload; with `cluster` (hosts, ranks per host, Gbit/s, links)
    the cost model's floor for the link bytes (model_ms) beside torus, hierarchical and ring."""
    by, sizes = medians(rows), workload_bytes(rows)
    torus_names = [n for n in dict.fromkeys(n for v in by.values() for n in v)
                   if n.startswith("torus") and "native" not in n]
    modelled = ("torus", "hierarchical", "ring") if cluster else ()
    head = ("| workload | " + " | ".join(f"{n} ms" for n in ("hvd", "ring", "hierarchical",
                                                             *torus_names))
            + " | byte limit | " + " | ".join(f"{t} / ring" for t in torus_names)
            + " | torus / hierarchical | torus / hvd |"
            + "".join(f" model {a} ms |" for a in modelled))
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for workload, v in by.items():
        cells = [f"{v[n]:.1f}" if n in v else "" for n in ("hvd", "ring", "hierarchical",
                                                          *torus_names)]
        cells.append(f"{limit:.3f}")
        cells += [f"{v[t] / v['ring']:.2f}" if t in v and "ring" in v else ""
                  for t in torus_names]
        cells += [f"{v['torus'] / v[b]:.2f}" if "torus" in v and b in v else ""
                  for b in ("hierarchical", "hvd")]
        cells += [f"{model_ms(a, *cluster, sizes[workload]):.1f}" if workload in sizes else ""
                  for a in modelled]
        lines.append(f"| {workload} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


ROW_PHASES = ("reduce-scatter (alltoall)", "row all-gather")
ROW0_PHASES = ("one row's reduce-scatter", "one row's all-gather")


def phase_table(rows: List[Dict[str, str]]) -> str:
    """Where the Horovod torus' time goes, as fractions of the ring: its column phase alone, its
    row phases with every host at work (as here, all on one machine's cores) and with one host
    at work (as on hosts with cores of their own), and column + that host's rows: what the torus
    would take with its phases one after the other on separate machines ('' where not timed)."""
    by = medians(rows, kinds=("variant", "phase"))
    head = ("| workload | torus / ring | column alone / ring | row phases, every host / ring | "
            "row phases, one host / ring | column + one host's rows / ring |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for workload, v in by.items():
        if "ring" not in v or "column all-reduce" not in v:
            continue
        ring = v["ring"]
        every = sum(v[p] for p in ROW_PHASES) if all(p in v for p in ROW_PHASES) else None
        one = sum(v[p] for p in ROW0_PHASES) if all(p in v for p in ROW0_PHASES) else None
        column = v["column all-reduce"]
        cells = [v.get("torus"), column, every, one, None if one is None else column + one]
        cells = [None if c is None else c / ring for c in cells]
        lines.append(f"| {workload} | " + " | ".join("" if c is None else f"{c:.3f}"
                                                     for c in cells) + " |")
    return "\n".join(lines) if len(lines) > 2 else ""


def sweep_table(results: List[tuple]) -> str:
    """One line per (topology, link, links per host, workload): each torus variant / ring
    beside its byte limit, and torus / leader-based hierarchical beside 1 / links."""
    names = [n for n in dict.fromkeys(n for *_, rows in results for v in medians(rows).values()
                                      for n in v) if n.startswith("torus") and "native" not in n]
    head = ("| hosts x ranks | link Gbit/s | links per host | workload | byte limit | "
            + " | ".join(f"{n} / ring" for n in names)
            + " | torus / hierarchical | its byte limit |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for hosts, rph, gbit, links, rows in results:
        for workload, v in medians(rows).items():
            cells = [f"{v[n] / v['ring']:.2f}" if n in v and "ring" in v else "" for n in names]
            cells.append(f"{v['torus'] / v['hierarchical']:.2f}"
                         if "torus" in v and "hierarchical" in v else "")
            lines.append(f"| {hosts} x {rph} | {gbit:g} | {links} | {workload} | "
                         f"{byte_limit(hosts, rph, links):.3f} | " + " | ".join(cells)
                         + f" | {1 / links:.3f} |")
    return "\n".join(lines)


def plan_table(results: List[tuple]) -> str:
    """Per cluster and workload, what a user gets by default (planned, planned-tf) beside the
    fixed 16 MiB torus of the same engine and beside hvd.allreduce ('' where not timed)."""
    head = ("| hosts x ranks | workload | hvd ms | torus ms | planned ms | planned / torus | "
            "torus-tf ms | planned-tf ms | planned-tf / torus-tf | planned-tf / hvd |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for hosts, rph, _, _, rows in results:
        for workload, v in medians(rows).items():
            def ms(name):
                return f"{v[name]:.0f}" if name in v else ""

            def ratio(a, b):
                return f"{v[a] / v[b]:.3f}" if a in v and b in v else ""
            cells = [ms("hvd"), ms("torus"), ms("planned"), ratio("planned", "torus"),
                     ms("torus-tf"), ms("planned-tf"), ratio("planned-tf", "torus-tf"),
                     ratio("planned-tf", "hvd")]
            lines.append(f"| {hosts} x {rph} | {workload} | " + " | ".join(cells) + " |")
    return "\n".join(lines) if len(lines) > 2 else ""


def sweep_plot(results: List[tuple], out_dir: str) -> str:
    """torus / ring measured per topology and workload, with the byte limit as a bar."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    labels = [f"{h}x{r}, {k} link{'s' if k > 1 else ''}\n{g:g} Gbit/s"
              for h, r, g, k, _ in results]
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(results)) + 3, 4.5))
    ax.bar(range(len(results)), [byte_limit(h, r, k) for h, r, _, k, _ in results],
           color="0.85", label="byte limit (host link bytes, torus / ring)")
    workloads = list(dict.fromkeys(w for *_, rows in results for w in medians(rows)))
    timed = {n for *_, rows in results for v in medians(rows).values() for n in v}
    names = [n for n in ("torus", "torus-tf", "torus-tf-nochunks") if n in timed]
    names += sorted(n for n in timed if n.startswith("torus-") and n not in names
                    and n != "torus-native")
    pairs = [(name, workload) for name in names for workload in workloads]
    markers, top = "osD^v<>", 1.1
    for k, (name, workload) in enumerate(pairs):
        xs, ys = [], []
        for i, (*_, rows) in enumerate(results):
            v = medians(rows).get(workload, {})
            if name in v and "ring" in v:
                xs.append(i + (k - (len(pairs) - 1) / 2) * min(0.12, 0.8 / len(pairs)))
                ys.append(v[name] / v["ring"])
        if xs:
            top = max(top, max(ys) + 0.05)
            j = workloads.index(workload)
            ax.plot(xs, ys, markers[names.index(name) % len(markers)], color=f"C{j}", ls="",
                    label=f"{name} / ring, {workload}", mfc="none" if name != "torus" else None)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(range(len(results)), labels, fontsize=8)
    ax.set_ylabel("all-reduce time, torus / flat ring")
    ax.set_title("emulated clusters: torus against the ring, and the limit set by bytes",
                 fontsize=10)
    ax.set_ylim(0, top)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside, not on, the data
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path = os.path.join(out_dir, "emulated_sweep.png")
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def plots(rows: List[Dict[str, str]], out_dir: str, title: str, link_gbit: float) -> List[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    flat = [r for r in rows if r["kind"] == "variant" and r["workload"].startswith("flat")]
    names = sorted({r["name"] for r in flat}, key=lambda n: (n != "hvd", n))
    size = int(flat[0]["np"]) if flat else 1
    paths = []
    for kind in ("time", "busbw"):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for name in names:
            pts = sorted((int(r["bytes"]), float(r["median_ms"])) for r in flat if r["name"] == name)
            xs = [b / 2 ** 20 for b, _ in pts]
            ys = ([ms for _, ms in pts] if kind == "time" else
                  [2 * (size - 1) / size * b / (ms / 1e3) / 1e9 * 8 for b, ms in pts])
            ax.plot(xs, ys, marker="o", ms=3, label=name)
        ax.set_xscale("log")
        ax.set_xlabel("buffer size (MiB, FP32)")
        if kind == "time":
            ax.set_yscale("log")
            ax.set_ylabel("all-reduce time (ms, slowest rank, median)")
        else:
            ax.axhline(link_gbit, color="k", ls="--", lw=1, label=f"host link {link_gbit:g} Gbit/s")
            ax.set_ylabel("bus bandwidth 2(N-1)/N x bytes / time (Gbit/s)")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = os.path.join(out_dir, f"emulated_{kind}.png")
        fig.savefig(path, dpi=90)
        plt.close(fig)
        paths.append(path)
    return paths


# ==================================================================================================
# Main
# ==================================================================================================

def topology(text: str):
    match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"not HOSTSxRANKS: {text!r} (e.g. 2x4)")
    return int(match.group(1)), int(match.group(2))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--hosts", type=int, default=2)
    p.add_argument("--ranks-per-host", type=int, default=4)
    p.add_argument("--sweep", nargs="+", type=topology, metavar="HxR",
                   help="clusters to run one after the other (hosts x ranks per host), "
                        "instead of --hosts / --ranks-per-host")
    p.add_argument("--link-gbit", type=float, nargs="+", default=[0.25],
                   help="each host's link, Gbit/s; several: one cluster each")
    p.add_argument("--links-per-host", nargs="+", default=["1"], metavar="K",
                   help="links (rails) per host, each at --link-gbit, a rank bound to rail "
                        "local rank mod K; 'rank': one per rank of a host; several: one "
                        "cluster each")
    p.add_argument("--grid", default=None, help="YxX (default: hosts x ranks-per-host)")
    p.add_argument("--engines", nargs="+", choices=("horovod", "tf"), default=["horovod", "tf"])
    p.add_argument("--sizes", nargs="*", type=bench.parse_size,
                   default=[bench.parse_size(s) for s in ("1M", "16M", "64M")])
    p.add_argument("--resnet", nargs="*", choices=("fp32", "fp16"), default=["fp32"])
    p.add_argument("--variants", nargs="*",
                   default=["hvd", "torus", "ring", "hierarchical", "torus-tf",
                            "torus-tf-nochunks", "reduce-scatter (alltoall)",
                            "column all-reduce", "row all-gather",
                            "one row's reduce-scatter", "one row's all-gather"],
                   help="variants and torus phases to time (hvd is always timed)")
    p.add_argument("--chunks", type=int, default=16,
                   help="chunks of the torus-chunks<K> and torus-tf-chunks<K> variants")
    p.add_argument("--fusion-threshold-mb", type=float, default=16.0,
                   help="tftorus' buckets, MiB (default 16: the optimizers' own, so the torus "
                        "sends what a training step sends; Horovod's all-reduce keeps its 128)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--out", default=DEFAULT_OUT, help="CSV, log and plots (default %(default)s)")
    p.add_argument("--timeout", type=float, default=2400, help="seconds before every rank is killed")
    p.add_argument("--report", action="store_true",
                   help="print the tables of an earlier run from its CSVs under --out (the same "
                        "--sweep and links), building nothing")
    args = p.parse_args(argv)
    for links in args.links_per_host:
        if links != "rank" and not (links.isdigit() and int(links) >= 1):
            p.error(f"--links-per-host takes whole numbers >= 1 or 'rank', got {links!r}")
    args.clusters = [(h, r, g, r if k == "rank" else int(k))
                     for h, r in (args.sweep or [(args.hosts, args.ranks_per_host)])
                     for g in args.link_gbit for k in args.links_per_host]
    for hosts, rph, gbit, links in args.clusters:
        if links > rph:
            p.error(f"{hosts}x{rph}: {links} links per host is more than its {rph} ranks "
                    f"(a rank is bound to one link)")
        if hosts < 2 or rph < 1 or gbit <= 0:
            p.error(f"{hosts}x{rph} at {gbit:g} Gbit/s: need at least 2 hosts, 1 rank per host "
                    f"and a link above 0 Gbit/s")
        if hosts > 250:
            p.error("at most 250 hosts (one /24 subnet)")
    if args.grid and len(args.clusters) > 1:
        p.error("--grid applies to one cluster; leave it out with --sweep or several --link-gbit")
    return args


def run_cluster(args, hosts: int, rph: int, gbit: float, links: int,
                out: str) -> List[Dict[str, str]]:
    """Build one emulated cluster, run the benchmark across it, print its table; its CSV rows."""
    size = hosts * rph
    grid = args.grid or f"{hosts}x{rph}"
    own_dir(out)
    csv_path = os.path.join(out, "allreduce.csv")
    if os.path.exists(csv_path):
        os.remove(csv_path)  # one run per CSV: the ratios and plots are of this run
    shapes_file = os.path.join(out, "resnet50_shapes.json")
    if args.resnet and not os.path.exists(shapes_file):
        import json
        with open(shapes_file, "w") as f:
            json.dump(bench.resnet50_shapes(), f)
    bench_args = bench.parse_args(
        ["--np", str(size), "--grids", f"{size}={grid}", "--engines", *args.engines,
         "--repeats", str(args.repeats), "--warmup", str(args.warmup), "--csv", csv_path,
         "--tag", "emulated", "--sizes", *[str(b) for b in args.sizes],
         "--resnet", *args.resnet, "--variants", *args.variants, "--chunks", str(args.chunks),
         "--fusion-threshold-mb", f"{args.fusion_threshold_mb:g}",
         "--meta", f"hosts={hosts}", f"ranks_per_host={rph}", f"link_gbit={gbit:g}",
         f"links_per_host={links}"])
    title = (f"{hosts} hosts x {rph} ranks, {links} x {gbit:g} Gbit/s link"
             f"{'s' if links > 1 else ''} per host, grid {grid}")
    print(f"emulated cluster: {title}; CSV {csv_path}", flush=True)
    start = time.time()
    with Cluster(hosts, gbit, links):  # Horovod's job, then the tf engine's (bench.jobs)
        rc = 0
        for name, argv in bench.worker_argvs(bench_args, size, shapes_file):
            log = os.path.join(out, "ranks.log" if name == "horovod" else f"ranks-{name}.log")
            rc = launch(args, hosts, rph, argv, log, links) or rc
    if rc or not os.path.exists(csv_path):
        return []
    rows = read_rows(csv_path)
    print(f"\n== {title}: medians and ratios (below 1: the torus is faster) ==")
    print(ratio_table(rows, byte_limit(hosts, rph, links), (hosts, rph, gbit, links)))
    floors = floor_table(rows, (hosts, rph, gbit, links))
    if floors:
        print(f"\n== the torus against its floor (the host links alone, the wire's bytes) ==")
        print(floors)
    phases = phase_table(rows)
    if phases:
        limit = byte_limit(hosts, rph, links)
        print(f"\n== where the Horovod torus' time goes (byte limit {limit:.3f}) ==")
        print(phases)
    for path in plots(rows, out, title, gbit):
        print(f"plot: {path}")
    print(f"CSV: {csv_path}  ({time.time() - start:.0f} s)")
    return rows


def report(args) -> int:
    """The tables of an earlier run, from the CSVs under --out (no cluster is built)."""
    results = []
    for hosts, rph, gbit, links in args.clusters:
        out = (args.out if len(args.clusters) == 1 else
               os.path.join(args.out, f"{hosts}x{rph}_{gbit:g}gbit_{links}link"))
        path = os.path.join(out, "allreduce.csv")
        if not os.path.exists(path):
            print(f"no CSV at {path}: run the sweep first, with the same --out", file=sys.stderr)
            return 1
        results.append((hosts, rph, gbit, links, read_rows(path)))
    for hosts, rph, gbit, links, rows in results:
        print(f"\n== {hosts} hosts x {rph} ranks, {links} x {gbit:g} Gbit/s ==")
        print(ratio_table(rows, byte_limit(hosts, rph, links), (hosts, rph, gbit, links)))
    print("\n== the default (planned, planned-tf) beside the fixed torus and hvd.allreduce ==")
    print(plan_table(results))
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.report:
        return report(args)
    reason = why_not_possible()
    if reason:
        print(f"emulated cluster skipped: {reason}. Run as root on Linux with iproute2.",
              file=sys.stderr)
        return SKIPPED
    results, failed = [], []
    for hosts, rph, gbit, links in args.clusters:
        out = (args.out if len(args.clusters) == 1 else
               os.path.join(args.out, f"{hosts}x{rph}_{gbit:g}gbit_{links}link"))
        rows = run_cluster(args, hosts, rph, gbit, links, out)
        if rows:
            results.append((hosts, rph, gbit, links, rows))
        else:
            failed.append(f"{hosts}x{rph} at {links} x {gbit:g} Gbit/s")
    if len(args.clusters) > 1 and results:
        print("\n== every cluster: torus / ring, measured, beside the byte limit ==")
        print(sweep_table(results))
        print(f"plot: {sweep_plot(results, args.out)}")
    planned = plan_table(results)
    if planned:
        print("\n== the default (planned, planned-tf) beside the fixed torus and hvd.allreduce ==")
        print(planned)
    return exit_status(failed, " (see ranks.log in their folders)")


def exit_status(failed, hint: str = "") -> int:
    """A study's exit status over its clusters: 1, naming the failed ones on stderr, if any."""
    if failed:
        print(f"failed: {', '.join(failed)}{hint}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
