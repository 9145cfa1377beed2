"""`python -m tftorus.run`'s command line, for every form of launch:

    python -m tftorus.run -np 4 train.py                                 # one host: local.py
    python -m tftorus.run -np 16 -H h1:8,h2:8 train.py                   # over ssh: over_ssh.py
    python -m tftorus.run --nnodes 2 --node-rank K --rendezvous h1:29400 \
        --nproc-per-node 8 train.py                                      # per node: multi_node.py
    python -m tftorus.run --make-secret

Bad input is one line and exit status 2, before anything starts. Standard library only.
"""
import argparse
import os
import shlex
import signal
import sys
from typing import List, Optional, Sequence, Tuple

from tftorus.launch import job_secret, multi_node, over_ssh, private_network
from tftorus.launch.local import DEFAULT_GRACE_SECONDS, NAME, Job, free_ports

_WITH_VALUE = ("-np", "--np", "-n", "--nproc", "--port", "--grace", "-H", "--hosts",
               "--hostfile", "-x", "--ssh", "--nnodes", "--node-rank", "--rendezvous",
               "--nproc-per-node", "--rendezvous-timeout")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"python -m {NAME}",
        usage=(f"python -m {NAME} -np N [options] (script.py | -m module) [args ...]\n"
               f"       python -m {NAME} -np N -H h1:8,h2:8 [-x NAME] [options] script.py ...\n"
               f"       python -m {NAME} --nnodes M --node-rank K --rendezvous HOST:PORT "
               f"--nproc-per-node P script.py ...\n"
               f"       python -m {NAME} --make-secret"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Start the processes (ranks) of a tftorus tf-engine job, like horovodrun or\n"
            "torchrun. Each runs this Python on the script (or -m module) with the arguments\n"
            "after it, a TF_CONFIG naming every rank (rank = task index), which\n"
            "tftorus.init() reads, and the HOROVOD_* variables horovodrun gives\n"
            "(HOROVOD_RANK, _SIZE, _LOCAL_RANK, ...; one set in the launcher's environment is\n"
            "kept for every rank). Output lines are prefixed with '[rank] '. When a rank exits\n"
            "non-zero, or a host is lost, every rank on every host gets SIGTERM, then SIGKILL\n"
            "after --grace seconds, and the launcher exits with that rank's status (128+N for\n"
            "signal N), naming it and its host. Ctrl-C or SIGTERM to the launcher ends every\n"
            "rank the same way. Every rank gets the job's secret in TFTORUS_JOB_SECRET (a new\n"
            "one unless it or TFTORUS_JOB_SECRET_FILE is set), which seals tftorus' control\n"
            "traffic; --make-secret prints one.\n\n"
            "One host (-np N alone): the ranks run in a network of their own (loopback only)\n"
            "on Linux; --share-network keeps this machine's.\n"
            "From one host over ssh (-H or --hostfile, as horovodrun): ranks fill the hosts\n"
            "in order, host by host; ssh must reach each host without a password.\n"
            "The same command on every node (--nnodes, as torchrun): node 0 hosts the\n"
            "rendezvous at --rendezvous; give every node the same TFTORUS_JOB_SECRET."),
        epilog=(
            "A scheduler may start the ranks itself instead: srun (Slurm), mpirun (Open MPI;\n"
            "TFTORUS_RENDEZVOUS across hosts), or a TF_CONFIG per process (Kubernetes).\n"
            "See docs/guide/launching.md.\n\n"
            "examples:\n"
            "  python -m tftorus.run -np 4 train.py --epochs 2\n"
            "  python -m tftorus.run -np 16 -H h1:8,h2:8 train.py\n"
            "  python -m tftorus.run --nnodes 2 --node-rank 0 --rendezvous h1:29400 "
            "--nproc-per-node 8 train.py"))
    p.add_argument("-np", "--np", "-n", "--nproc", dest="np", type=int, default=None,
                   metavar="N", help="number of processes (ranks) to start in all")
    p.add_argument("--port", type=int, default=None, metavar="BASE",
                   help="one host: rank r is named at 127.0.0.1:BASE+r (default: free ports "
                        "chosen by the OS)")
    p.add_argument("--share-network", action="store_true",
                   help="one host: run the ranks in this machine's network (default: a "
                        "private one, loopback only, where Linux allows it: TensorFlow's "
                        "servers listen on every interface, and nothing outside should reach "
                        "them)")
    p.add_argument("--grace", type=float, default=DEFAULT_GRACE_SECONDS, metavar="SECONDS",
                   help=f"after SIGTERM, seconds before SIGKILL (default "
                        f"{DEFAULT_GRACE_SECONDS:g})")
    p.add_argument("-H", "--hosts", default=None, metavar="H1:SLOTS,H2:SLOTS",
                   help="start the ranks on these hosts over ssh (a host alone: 1 slot)")
    p.add_argument("--hostfile", default=None, metavar="FILE",
                   help="the hosts, one per line: 'NAME slots=N' or 'NAME:N'")
    p.add_argument("-x", dest="forward", action="append", default=[], metavar="NAME[=VALUE]",
                   help="with -H: forward this environment variable to every host (repeat it; "
                        "variables starting with TFTORUS_, HOROVOD_, TF_, CUDA_, NCCL_, PYTHON, "
                        "OMP_, XLA_ and PATH, LD_LIBRARY_PATH, VIRTUAL_ENV go by default)")
    p.add_argument("--ssh", default="ssh", metavar="COMMAND",
                   help="with -H: the ssh command, e.g. 'ssh -p 2222 -i ~/.ssh/cluster' "
                        "(default: ssh; BatchMode and a 10 s connect timeout are added)")
    p.add_argument("--nnodes", type=int, default=None, metavar="M",
                   help="the same command on every node: the number of nodes")
    p.add_argument("--node-rank", type=int, default=None, metavar="K",
                   help="this node's number, 0..M-1 (node 0 hosts the rendezvous; its ranks "
                        "come first)")
    p.add_argument("--rendezvous", default=None, metavar="HOST:PORT",
                   help="node 0's host and a free port there")
    p.add_argument("--nproc-per-node", type=int, default=None, metavar="P",
                   help="ranks to start on this node")
    p.add_argument("--rendezvous-timeout", type=float, default=300.0, metavar="SECONDS",
                   help="how long the nodes may take to all register (default 300)")
    p.add_argument("--join", action="store_true", help=argparse.SUPPRESS)  # ssh: no coordinator
    p.add_argument("--secret-stdin", action="store_true", help=argparse.SUPPRESS)
    return p


def parse(argv: Sequence[str]) -> Tuple[argparse.Namespace, List[str]]:
    """(launcher options, the command after `python`: [script, args...] or ['-m', module, ...]).
    Launcher options come first; the first other word (or `-m`, or what follows `--`) starts
    the program, so the program's own options are never taken for the launcher's."""
    argv = list(argv)
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            head, program = argv[:i], argv[i + 1:]
            break
        if word == "-m" or not word.startswith("-") or word == "-":
            head, program = argv[:i], argv[i:]
            break
        i += 2 if word in _WITH_VALUE else 1
    else:
        head, program = argv, []
    parser = _parser()
    opts = parser.parse_args(head)
    if not program or program == ["-m"]:
        parser.error("name the script to run (or -m module)")
    per_node = [opts.nnodes, opts.node_rank, opts.rendezvous, opts.nproc_per_node]
    if any(v is not None for v in per_node):
        if any(v is None for v in per_node):
            parser.error("the per-node form needs all of --nnodes, --node-rank, --rendezvous "
                         "and --nproc-per-node")
        if opts.np is not None or opts.hosts or opts.hostfile:
            parser.error("--nnodes starts this node's ranks only: leave out -np, -H and "
                         "--hostfile (or use -np with -H from one host instead)")
        if opts.nnodes < 1 or not 0 <= opts.node_rank < opts.nnodes:
            parser.error(f"--node-rank must be in 0..{opts.nnodes - 1} (--nnodes "
                         f"{opts.nnodes}), got {opts.node_rank}")
        if opts.nproc_per_node < 1:
            parser.error(f"--nproc-per-node must be at least 1, got {opts.nproc_per_node}")
    elif opts.np is None:
        parser.error("give -np N (the number of ranks), or --nnodes ... for the per-node form")
    elif opts.np < 1:
        parser.error(f"-np must be at least 1, got {opts.np}")
    if opts.hosts and opts.hostfile:
        parser.error("give -H or --hostfile, not both")
    if opts.grace < 0:
        parser.error(f"--grace must be >= 0 seconds, got {opts.grace}")
    if opts.rendezvous_timeout <= 0:
        parser.error(f"--rendezvous-timeout must be > 0 seconds, got {opts.rendezvous_timeout}")
    if opts.port is not None and (opts.np is None or not 0 < opts.port <= 65536 - opts.np):
        parser.error(f"--port {opts.port}: ports {opts.port}..{opts.port + (opts.np or 1) - 1} "
                     f"are not all in 1..65535")
    if program[0] != "-m" and not os.path.exists(program[0]):
        parser.error(f"no such script: {program[0]}")
    return opts, program


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv == ["--make-secret"]:  # for schedulers: export TFTORUS_JOB_SECRET=$(... --make-secret)
        print(job_secret.make())
        return 0
    opts, program = parse(argv)
    if opts.secret_stdin:  # a node started over ssh: the secret never on a command line
        os.environ[job_secret.ENV] = sys.stdin.readline().strip()
    if opts.nnodes is not None or opts.hosts or opts.hostfile:
        return _main_across_hosts(opts, program)
    job = Job(opts.grace)
    if opts.np > 1 and not opts.share_network:
        why = private_network.enter()
        if why:
            job.say(f"the ranks share this machine's network ({why}): TensorFlow's servers "
                    f"listen on every interface, reachable from other hosts unless a firewall "
                    f"stops them (docs/guide/security.md)")
    ports = (list(range(opts.port, opts.port + opts.np)) if opts.port is not None
             else free_ports(opts.np))
    old = {s: signal.signal(s, job.on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        job.start(program, ports)
        if job.signalled is not None:  # a signal while starting: stop the ranks started since
            job.stop(job.signalled)
        return job.wait()
    finally:
        job._signal_all(signal.SIGKILL)  # an error in the launcher itself: leave no rank behind
        for s, h in old.items():
            signal.signal(s, h)


def _main_across_hosts(opts: argparse.Namespace, program: List[str]) -> int:
    try:
        if opts.nnodes is not None:
            return multi_node.run_node(opts.node_rank, opts.nnodes, opts.nproc_per_node,
                                       opts.rendezvous, program, opts.grace,
                                       opts.rendezvous_timeout, coordinate=not opts.join)
        hosts = (over_ssh.parse_hostfile(opts.hostfile) if opts.hostfile
                 else over_ssh.parse_hosts(opts.hosts))
        return over_ssh.run(opts.np, hosts, program, opts.grace, opts.rendezvous_timeout,
                            opts.forward, shlex.split(opts.ssh))
    except ValueError as error:  # bad input: one line, nothing started
        print(f"[{NAME}] {error}", file=sys.stderr, flush=True)
        return 2
