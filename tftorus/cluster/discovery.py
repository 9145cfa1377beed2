"""Where the job's ranks are: every rank's TF server address, this process' rank and its local
rank, found from what the launcher left in the environment (no TensorFlow involved):

  TF_CONFIG    {"cluster": {"worker": ["host:port", ...]}, "task": {"type": "worker", "index": i}}
               as tf.distribute reads it; rank = task index.
  horovodrun   HOROVOD_RANK / _SIZE / _LOCAL_RANK / _HOSTNAME and the Gloo rendezvous server
               (HOROVOD_GLOO_RENDEZVOUS_ADDR / _PORT). Each rank picks a port, publishes
               "host:port" in that server's key-value store, and reads everyone's. Horovod's own
               runtime is not started (hvd.init() stays the user's choice).
  mpirun       Open MPI's OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK / _LOCAL_SIZE. mpirun names
               no peer addresses: on one host (LOCAL_SIZE == SIZE) rank r listens on loopback at
               port base + r; across hosts every rank sends "rank host:port" to a small TCP
               rendezvous that rank 0 hosts at TFTORUS_RENDEZVOUS=host:port and gets the full
               list back (also used on one host when set).
  srun         Slurm's SLURM_PROCID, SLURM_STEP_NUM_TASKS (else SLURM_NTASKS), SLURM_LOCALID, the
               node list SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST) and SLURM_STEP_TASKS_PER_NODE
               (else SLURM_TASKS_PER_NODE), as TF's SlurmClusterResolver reads them: ranks fill the
               nodes in list order (srun's default block distribution; checked against
               SLURM_LOCALID), rank r listens on its node's name (loopback when the step has one
               node) at port base + its local rank.
  neither      one process, no server: every group is a single rank and answered locally.

The order is TF_CONFIG, horovodrun, mpirun, srun: mpirun run inside a Slurm job leaves the batch
step's SLURM_PROCID in every rank's environment, so Open MPI's variables, which only mpirun
sets, come first. The fixed base port of mpirun on one host and of srun is TFTORUS_TF_PORT, else
DEFAULT_PORT (8888, SlurmClusterResolver's). Bad or inconsistent variables raise a ValueError of
one line that names what to set. docs/guide/launching.md has every launch for users.

Addresses: TF's gRPC server listens on every interface of the port; what matters is the address
the *peers* dial, `host` (arg) or TFTORUS_TF_HOST, by default 127.0.0.1 when every rank is on
this machine and otherwise HOROVOD_HOSTNAME (horovodrun), the host name (mpirun's rendezvous) or
the node's name in the node list (srun, where one TFTORUS_TF_HOST for several nodes is an
error). The port is `port` / TFTORUS_TF_PORT plus the local rank (unique per host, and it stays
below 65536 however many hosts there are), else a free port picked by the OS where addresses are
exchanged (horovodrun, mpirun's rendezvous), else DEFAULT_PORT plus the local rank. tftorus/cluster/tf_runtime.py
starts TensorFlow's collective runtime over what is found here.

"""
import dataclasses
import itertools
import json
import logging
import os
import re
import socket
import time
from typing import List, Optional, Tuple

from tftorus.cluster import rendezvous
from tftorus.launch import job_secret

logger = logging.getLogger(__name__)

JOB = "worker"
DEFAULT_TIMEOUT_SECONDS = 300.0
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1", "ip6-localhost")
_KV_SCOPE = "tftorus_tf_cluster"
DEFAULT_PORT = 8888  # base port of srun's and one-host mpirun's TF servers (SlurmClusterResolver's)


@dataclasses.dataclass(frozen=True)
class Cluster:
    """Where every rank's TF server listens, and which one this process is."""

    workers: Tuple[str, ...]  # "host:port" of rank 0, 1, ...
    rank: int
    local_rank: int
    local_size: int
    source: str  # 'TF_CONFIG', 'horovodrun', 'mpirun', 'slurm' or 'single'
    timeout: float  # seconds a peer may be silent before collectives abort (peer_health)

    @property
    def size(self) -> int:
        return len(self.workers)

    def task(self, rank: int) -> str:
        return f"/job:{JOB}/replica:0/task:{rank}"

    @property
    def device(self) -> str:
        """This process' CPU device, the one every collective of the engine runs on."""
        return f"{self.task(self.rank)}/device:CPU:0"


_discovered: Optional[Cluster] = None


LAUNCHER_VARIABLES = ("TF_CONFIG", "HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID")


def launched() -> bool:
    """Whether a launcher started this process as one of several (what _discover reads)."""
    return any(os.environ.get(name, "").strip() for name in LAUNCHER_VARIABLES)


def _float_env(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number of seconds") from None


def _int_env(name: str) -> Optional[int]:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    if not raw.isdigit():
        raise ValueError(f"{name}={raw!r} is not a port number")
    return int(raw)


def free_port(host: str) -> int:
    # The port is free now; TF's server binds it moments later. The gap is small, and a base
    # port (TFTORUS_TF_PORT) avoids it where ports are firewalled or contended.
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind(("" if family == socket.AF_INET else "::", 0))
        return s.getsockname()[1]


def host_names(workers) -> list:
    """Each worker's host, loopback names as one ("localhost", horovodrun's name for it)."""
    hosts = [split_address(w)[0] for w in workers]
    return ["localhost" if h in LOOPBACK_NAMES else h for h in hosts]


def split_address(address: str) -> Tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"worker address {address!r} is not 'host:port'")
    return host.strip("[]"), int(port)


def _local_ranks(workers, rank) -> Tuple[int, int]:
    """(local rank, local size): tasks sharing this task's host name."""
    hosts = [split_address(w)[0] for w in workers]
    mine = hosts[rank]
    same = [i for i, h in enumerate(hosts) if h == mine or
            (h in LOOPBACK_NAMES and mine in LOOPBACK_NAMES)]
    return same.index(rank), len(same)


def from_tf_config(raw: str, timeout: float) -> Cluster:
    try:
        config = json.loads(raw)
        workers = tuple(config["cluster"][JOB])
        task = config.get("task", {})
        task_type, index = task.get("type", JOB), int(task["index"])
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(
            f"TF_CONFIG must look like {{\"cluster\": {{\"worker\": [\"host:port\", ...]}}, "
            f"\"task\": {{\"type\": \"worker\", \"index\": i}}}}; could not read it ({e!r})") from e
    other_jobs = sorted(set(config["cluster"]) - {JOB})
    if task_type != JOB or other_jobs:
        raise ValueError(f"the tf engine runs one job named 'worker' (rank = task index); "
                         f"TF_CONFIG has task type {task_type!r} and jobs {other_jobs}")
    if not 0 <= index < len(workers):
        raise ValueError(f"TF_CONFIG task index {index} is outside the {len(workers)} workers")
    for w in workers:
        split_address(w)
    local_rank, local_size = _local_ranks(workers, index)
    return Cluster(workers, index, local_rank, local_size, "TF_CONFIG", timeout)


def _horovod_env(name: str) -> int:
    raw = os.environ.get(name, "")
    if not raw.strip().isdigit():
        raise RuntimeError(f"{name} is {raw!r}: the tf engine under horovodrun needs the "
                           f"variables horovodrun sets (HOROVOD_RANK, HOROVOD_SIZE, ...)")
    return int(raw)


def from_horovodrun(host: Optional[str], port: Optional[int], timeout: float,
                    rendezvous_timeout: float) -> Cluster:
    """Swap addresses through horovodrun's rendezvous key-value store (HTTP PUT/GET), each value
    sealed under the job's secret and read as text (never unpickled, as Horovod's own client
    would): a value that fails the seal is skipped and read again."""
    rank, size = _horovod_env("HOROVOD_RANK"), _horovod_env("HOROVOD_SIZE")
    local_rank = _horovod_env("HOROVOD_LOCAL_RANK")
    local_size = int(os.environ.get("HOROVOD_LOCAL_SIZE", "0") or 0) or size
    addr = os.environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR")
    kv_port = os.environ.get("HOROVOD_GLOO_RENDEZVOUS_PORT")
    if not addr or not kv_port:
        raise RuntimeError("HOROVOD_RANK is set but HOROVOD_GLOO_RENDEZVOUS_ADDR/_PORT are not: "
                           "launch with `horovodrun --gloo`, or give every process a TF_CONFIG")
    hostname = os.environ.get("HOROVOD_HOSTNAME", "localhost")
    if host is None:
        single_host = local_size == size or hostname in LOOPBACK_NAMES
        host = "127.0.0.1" if single_host else hostname
    my_port = port + local_rank if port is not None else free_port(host)
    me = f"[{host}]:{my_port}" if ":" in host else f"{host}:{my_port}"
    seal = job_secret.Seal(job_secret.load())
    if rank == 0 and not seal.authenticated:
        job_secret.warn_unauthenticated("the address exchange through horovodrun's store")
    store = f"http://{join_address(addr, int(kv_port))}/{_KV_SCOPE}"
    _kv_put(f"{store}/{rank}", seal.seal_json({"rank": rank, "address": me}))
    workers, deadline, refused = [], time.monotonic() + rendezvous_timeout, {}
    for r in range(size):
        while True:
            value = _kv_get(f"{store}/{r}")
            address, why = _kv_address(seal, value, r) if value is not None else (None, None)
            if address is not None:
                workers.append(address)
                break
            if why:
                refused[r] = why
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"rank {rank}: rank {r} did not publish its TF server address within "
                    f"{rendezvous_timeout:.0f}s" + (
                        f" (what the store held for it was refused: {refused[r]}; are all ranks "
                        f"started with the same job secret?)" if r in refused else
                        " (did it call tftorus.init(engine='tf')?)"))
            time.sleep(0.05)
    return Cluster(tuple(workers), rank, local_rank, local_size, "horovodrun", timeout)


def _kv_put(url: str, value: bytes) -> None:
    from urllib.request import Request, urlopen
    request = Request(url, data=value, method="PUT")
    with urlopen(request, timeout=30):
        pass


def _kv_get(url: str) -> Optional[bytes]:
    """The value stored at `url`, None while there is none (404)."""
    from urllib.error import HTTPError, URLError
    from urllib.request import urlopen
    try:
        with urlopen(url, timeout=30) as response:
            return response.read(1 << 16)
    except HTTPError as e:
        if e.code == 404:
            return None
        raise RuntimeError(f"horovodrun's key-value store at {url}: HTTP {e.code}") from None
    except URLError as e:
        raise RuntimeError(f"horovodrun's key-value store at {url}: {e.reason}") from None


def _kv_address(seal: job_secret.Seal, value: bytes, rank: int):
    """(rank `rank`'s address from its sealed value, None) or (None, why it was refused)."""
    found, why = seal.open_json(value)
    if found is None:
        return None, why
    if found.get("rank") != rank or not isinstance(found.get("address"), str):
        return None, f"not rank {rank}'s address"
    return found["address"], None


# -- Slurm (srun) ---------------------------------------------------------------------------

def join_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _check_ports(base: int, count: int, what: str) -> None:
    if not 0 < base or base + count - 1 > 65535:
        raise ValueError(f"{what}: ports {base}..{base + count - 1} are not all in 1..65535; set "
                         f"TFTORUS_TF_PORT to a lower base port")


def _split_outside_brackets(expr: str, what: str) -> List[str]:
    parts, depth, current = [], 0, ""
    for c in expr:
        if c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
        if depth not in (0, 1):
            break
        if c == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += c
    if depth != 0:
        raise ValueError(f"{what}: unbalanced brackets")
    return parts + [current]


def _expand_ranges(ranges: str, what: str) -> List[str]:
    out = []
    for item in ranges.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", item)
        if m is None:
            raise ValueError(f"{what}: [{ranges}] is not a list of numbers and ranges like 01-04")
        first, last = m.group(1), m.group(2) or m.group(1)
        if int(last) < int(first):
            raise ValueError(f"{what}: the range {item.strip()} runs backwards")
        out.extend(str(i).zfill(len(first)) for i in range(int(first), int(last) + 1))
    return out


def expand_hostlist(expr: str, name: str = "the node list") -> List[str]:
    """A Slurm host list, in its order: 'node[01-03,07],gpu-a3' -> ['node01', 'node02', 'node03',
    'node07', 'gpu-a3']; several bracket groups in one name expand as a product
    ('r[1-2]n[1-2]' -> r1n1, r1n2, r2n1, r2n2)."""
    what = f"{name}={expr!r} is not a Slurm host list"
    hosts = []
    for part in _split_outside_brackets(expr.strip(), what):
        part = part.strip()
        if not part:
            raise ValueError(f"{what}: an empty name")
        pieces = re.split(r"(\[[^\[\]]*\])", part)
        choices = []
        for piece in pieces:
            if piece.startswith("["):
                choices.append(_expand_ranges(piece[1:-1], what))
            elif "[" in piece or "]" in piece:
                raise ValueError(f"{what}: unbalanced brackets")
            else:
                choices.append([piece])
        hosts.extend("".join(c) for c in itertools.product(*choices))
    return hosts


def expand_tasks_per_node(expr: str, name: str = "the tasks per node") -> List[int]:
    """Slurm's tasks per node, one count per node of the node list: '4(x2),2' -> [4, 4, 2]."""
    counts = []
    for part in expr.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:\(x(\d+)\))?\s*", part)
        if m is None or int(m.group(1)) == 0 or int(m.group(2) or 1) == 0:
            raise ValueError(f"{name}={expr!r} is not Slurm's tasks per node (counts like "
                             f"'4(x2),2': 4 tasks on each of 2 nodes, then 2)")
        counts.extend([int(m.group(1))] * int(m.group(2) or 1))
    return counts


def _first_env(names, hint: str) -> Tuple[str, str]:
    """(name, value) of the first of `names` that is set."""
    for name in names:
        value = os.environ.get(name, "").strip()
        if value:
            return name, value
    raise ValueError(f"{' and '.join(names)} {'are' if len(names) > 1 else 'is'} not set: {hint}")


def _count_env(name: str, value: str, hint: str) -> int:
    if not value.isdigit():
        raise ValueError(f"{name}={value!r} is not a number: {hint}")
    return int(value)


_SRUN_HINT = "start every worker with srun (e.g. `srun python train.py`), or give each a TF_CONFIG"


def from_slurm(host: Optional[str], port: Optional[int], timeout: float) -> Cluster:
    """Rank r listens on its node (the node list, filled in blocks) at base + its local rank."""
    rank = _count_env("SLURM_PROCID", os.environ["SLURM_PROCID"].strip(), _SRUN_HINT)
    size_var, size_raw = _first_env(("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"),
                                    f"SLURM_PROCID is set; {_SRUN_HINT}")
    size = _count_env(size_var, size_raw, _SRUN_HINT)
    nodes_var, nodes_raw = _first_env(("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"),
                                      f"SLURM_PROCID is set; {_SRUN_HINT}")
    tasks_var, tasks_raw = _first_env(("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"),
                                      f"SLURM_PROCID is set; {_SRUN_HINT}")
    nodes = expand_hostlist(nodes_raw, nodes_var)
    counts = expand_tasks_per_node(tasks_raw, tasks_var)
    if len(nodes) != len(counts):
        raise ValueError(f"{nodes_var}={nodes_raw!r} names {len(nodes)} nodes but {tasks_var}="
                         f"{tasks_raw!r} gives task counts for {len(counts)}: set both for the "
                         f"same step (srun does)")
    if sum(counts) != size:
        raise ValueError(f"{tasks_var}={tasks_raw!r} puts {sum(counts)} tasks on the nodes but "
                         f"{size_var}={size}: set both for the same step (srun does)")
    if not 0 <= rank < size:
        raise ValueError(f"SLURM_PROCID={rank} is not a rank of the {size} tasks of {size_var}; "
                         f"{_SRUN_HINT}")
    repeated = sorted({n for n in nodes if nodes.count(n) > 1})
    if repeated:
        raise ValueError(f"{nodes_var}={nodes_raw!r} names {repeated[0]} more than once; set it "
                         f"to each node of the step once")
    # srun's default (block) distribution: ranks fill node 0, then node 1, ...
    node = next(j for j in range(len(nodes)) if rank < sum(counts[:j + 1]))
    local_rank = rank - sum(counts[:node])
    layout = ("srun placed the ranks other than in blocks (e.g. --distribution=cyclic); run it "
              "with --distribution=block (srun's default), or give each worker a TF_CONFIG")
    local_raw = os.environ.get("SLURM_LOCALID", "").strip()
    if local_raw and _count_env("SLURM_LOCALID", local_raw, _SRUN_HINT) != local_rank:
        raise ValueError(f"SLURM_LOCALID={local_raw} but rank {rank} is task {local_rank} of node "
                         f"{nodes[node]} in {nodes_var} filled in order: {layout}")
    nodename = os.environ.get("SLURMD_NODENAME", "").strip()
    if nodename and nodename != nodes[node] and len(nodes) > 1:
        raise ValueError(f"SLURMD_NODENAME={nodename} but rank {rank} falls on node {nodes[node]} "
                         f"of {nodes_var} filled in order: {layout}")
    base = port if port is not None else DEFAULT_PORT
    _check_ports(base, max(counts), f"srun's {max(counts)} tasks on a node from base port {base}")
    if len(nodes) == 1:
        hosts = [host or "127.0.0.1"]
    elif host:
        raise ValueError(f"TFTORUS_TF_HOST (or tf_host) is {host!r}, one address, but this srun "
                         f"step spans {len(nodes)} nodes, each reached at its name in "
                         f"{nodes_var}: unset it")
    else:
        hosts = nodes
    workers = tuple(join_address(h, base + i) for h, n in zip(hosts, counts) for i in range(n))
    return Cluster(workers, rank, local_rank, counts[node], "slurm", timeout)


# -- Open MPI (mpirun) ------------------------------------------------------------------------

_MPIRUN_HINT = "start the workers with Open MPI's mpirun, or give each a TF_CONFIG"


def from_mpirun(host: Optional[str], port: Optional[int], timeout: float,
                rendezvous_timeout: float) -> Cluster:
    """One host: loopback, base port + rank. Across hosts (or with TFTORUS_RENDEZVOUS on one):
    every rank's own address swapped through rank 0's TCP rendezvous."""
    values = {}
    for key in ("RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE"):
        name = f"OMPI_COMM_WORLD_{key}"
        raw = os.environ.get(name, "").strip()
        if not raw:
            raise ValueError(f"OMPI_COMM_WORLD_RANK is set but {name} is not: {_MPIRUN_HINT}")
        values[key] = _count_env(name, raw, _MPIRUN_HINT)
    rank, size = values["RANK"], values["SIZE"]
    local_rank, local_size = values["LOCAL_RANK"], values["LOCAL_SIZE"]
    if not 0 <= rank < size:
        raise ValueError(f"OMPI_COMM_WORLD_RANK={rank} is not a rank of OMPI_COMM_WORLD_SIZE="
                         f"{size}: {_MPIRUN_HINT}")
    if not 0 <= local_rank < local_size <= size:
        raise ValueError(f"OMPI_COMM_WORLD_LOCAL_RANK={local_rank} and _LOCAL_SIZE={local_size} "
                         f"do not fit OMPI_COMM_WORLD_SIZE={size}: {_MPIRUN_HINT}")
    one_host = local_size == size
    rendezvous_value = os.environ.get("TFTORUS_RENDEZVOUS", "").strip()
    if rendezvous_value:
        where = rendezvous.address_of(rendezvous_value)
        mine = host or ("127.0.0.1" if one_host else socket.gethostname())
        if port is not None:
            _check_ports(port, local_size, f"mpirun's {local_size} ranks on a host from base port "
                                           f"{port}")
        my_port = port + local_rank if port is not None else free_port(mine)
        workers = rendezvous.exchange_addresses(rank, size, join_address(mine, my_port), where,
                                     rendezvous_timeout)
    elif one_host:
        base = port if port is not None else DEFAULT_PORT
        _check_ports(base, size, f"mpirun's {size} ranks from base port {base}")
        workers = tuple(join_address(host or "127.0.0.1", base + r) for r in range(size))
    else:
        raise ValueError(f"mpirun started {size} ranks over several hosts ("
                         f"OMPI_COMM_WORLD_LOCAL_SIZE={local_size}) and names no peer addresses: "
                         f"set TFTORUS_RENDEZVOUS=host:port (rank 0's host, a free port) for every "
                         f"rank, e.g. mpirun -x TFTORUS_RENDEZVOUS=node01:29400 ...")
    return Cluster(workers, rank, local_rank, local_size, "mpirun", timeout)


def discover(host: Optional[str] = None, port: Optional[int] = None,
             timeout: Optional[float] = None, rendezvous_timeout: float = 300.0) -> Cluster:
    """Find the cluster (no TF runtime involved): TF_CONFIG, else horovodrun, else mpirun, else
    srun, else one process.

    The first discovery is kept and returned by later calls: under horovodrun a second one
    would publish a second port while peers may already have read the first.
    """
    global _discovered
    if _discovered is None:
        _discovered = _discover(host, port, timeout, rendezvous_timeout)
    return _discovered


def _discover(host, port, timeout, rendezvous_timeout) -> Cluster:
    timeout = timeout if timeout is not None else _float_env("TFTORUS_TF_TIMEOUT",
                                                             DEFAULT_TIMEOUT_SECONDS)
    if timeout <= 0:
        raise ValueError(f"the collective timeout must be > 0 seconds, got {timeout}")
    host = host or os.environ.get("TFTORUS_TF_HOST") or None
    port = port if port is not None else _int_env("TFTORUS_TF_PORT")
    if os.environ.get("TF_CONFIG", "").strip():
        return from_tf_config(os.environ["TF_CONFIG"], timeout)
    if os.environ.get("HOROVOD_RANK", "").strip():
        return from_horovodrun(host, port, timeout, rendezvous_timeout)
    if os.environ.get("OMPI_COMM_WORLD_RANK", "").strip():
        return from_mpirun(host, port, timeout, rendezvous_timeout)
    if os.environ.get("SLURM_PROCID", "").strip():
        return from_slurm(host, port, timeout)
    return Cluster(("localhost:0",), 0, 0, 1, "single", timeout)


