"""Hosts for the multi-node launcher's tests: Linux network namespaces on one bridge, each with
its own host name (h1, h2, ...), an /etc/hosts naming them all, and a real OpenSSH server that
takes a key this module makes, so `ssh h2 ...` from h1 works as on a cluster (BatchMode, no
password). Needs root, iproute2 and Debian's openssh-server (run_scripts/setup.sh installs it);
`why_not_possible()` says what is missing, for a test to skip with.

    with Hosts(2) as hosts:
        result = hosts.run(1, [sys.executable, "-m", "tftorus.run", "-np", "4",
                               "-H", "h1:2,h2:2", "--ssh", hosts.ssh, "script.py"])

The file system is shared, as with NFS on a cluster: every host runs the same checkout and Python.
"""
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Sequence

from tests import harness

PREFIX = "tftmn"  # namespaces tftmn1.., bridge tftmnbr, veths tftmnv1..
SUBNET = "10.78.0"
SSHD = "/usr/sbin/sshd"


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


def address(host: int) -> str:
    return f"{SUBNET}.{host}"


def why_not_possible() -> str:
    """'' when emulated hosts can be made here, else why not."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    for tool, package in (("ip", "iproute2"), ("unshare", "util-linux"),
                          ("ssh", "openssh-client"), ("ssh-keygen", "openssh-client")):
        if not shutil.which(tool):
            return f"needs `{tool}` ({package})"
    if not os.path.exists(SSHD):
        return "needs Debian's openssh-server (run_scripts/setup.sh installs it)"
    made = sh("ip", "netns", "add", f"{PREFIX}probe", check=False)
    sh("ip", "netns", "del", f"{PREFIX}probe", check=False)
    if made.returncode:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    return ""


def teardown() -> None:
    """Remove every namespace, link and hosts file this module makes, killing what runs there."""
    for name in sh("ip", "netns", "list", check=False).stdout.split():
        if name.startswith(PREFIX):
            for pid in sh("ip", "netns", "pids", name, check=False).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            sh("ip", "netns", "del", name, check=False)
            shutil.rmtree(f"/etc/netns/{name}", ignore_errors=True)
    for line in sh("ip", "-o", "link", "show", check=False).stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if name.startswith(PREFIX):
            sh("ip", "link", "del", name, check=False)


class Hosts:
    """`count` emulated hosts h1..hN at 10.78.0.1..N, each running sshd. A context manager."""

    def __init__(self, count: int):
        self.count = count
        self.dir = tempfile.mkdtemp(prefix="tftorus-hosts-")
        self.sshd: List[subprocess.Popen] = []
        self.ssh_config = os.path.join(self.dir, "ssh_config")
        #: the --ssh command the launcher takes to reach the hosts
        self.ssh = f"ssh -F {shlex.quote(self.ssh_config)}"

    def namespace(self, host: int) -> str:
        return f"{PREFIX}{host}"

    def __enter__(self) -> "Hosts":
        teardown()
        try:
            self._network()
            self._keys()
            for host in range(1, self.count + 1):
                self._start_sshd(host)
        except Exception:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        for proc in self.sshd:
            proc.kill()
            proc.wait()
        teardown()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _network(self) -> None:
        bridge = f"{PREFIX}br"
        sh("ip", "link", "add", bridge, "type", "bridge")
        sh("ip", "link", "set", bridge, "up")
        names = "".join(f"{address(h)} h{h}\n" for h in range(1, self.count + 1))
        for host in range(1, self.count + 1):
            ns, outer = self.namespace(host), f"{PREFIX}v{host}"
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            sh("ip", "link", "add", outer, "type", "veth", "peer", "name", "eth0", "netns", ns)
            sh("ip", "link", "set", outer, "master", bridge, "up")
            sh("ip", "-n", ns, "addr", "add", f"{address(host)}/24", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
            os.makedirs(f"/etc/netns/{ns}", exist_ok=True)  # `ip netns exec` mounts these
            with open(f"/etc/netns/{ns}/hosts", "w") as f:
                f.write(f"127.0.0.1 localhost\n{names}")
            # names come from that file; the machine's name server is out of the emulated
            # network's reach, so an unknown name would wait out the resolver's retries (about
            # 10 s): here it asks loopback, where nothing answers, and fails at once
            with open(f"/etc/netns/{ns}/resolv.conf", "w") as f:
                f.write("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")

    def _keys(self) -> None:
        self.host_key = os.path.join(self.dir, "host_key")
        self.user_key = os.path.join(self.dir, "user_key")
        for key in (self.host_key, self.user_key):
            sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key)
        self.authorized = os.path.join(self.dir, "authorized_keys")
        shutil.copy(self.user_key + ".pub", self.authorized)
        with open(self.ssh_config, "w") as f:
            f.write(f"Host *\n  User root\n  IdentityFile {self.user_key}\n"
                    f"  IdentitiesOnly yes\n  StrictHostKeyChecking no\n"
                    f"  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n")
        os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege separation directory

    def _start_sshd(self, host: int) -> None:
        options = {"ListenAddress": address(host), "PermitRootLogin": "prohibit-password",
                   "AuthorizedKeysFile": self.authorized, "StrictModes": "no",
                   "PasswordAuthentication": "no", "KbdInteractiveAuthentication": "no",
                   "UsePAM": "no", "PidFile": "none", "AcceptEnv": "none",
                   "PrintMotd": "no", "MaxStartups": "100"}
        command = [SSHD, "-D", "-e", "-f", "/dev/null", "-h", self.host_key,
                   *[arg for k, v in options.items() for arg in ("-o", f"{k}={v}")]]
        proc = subprocess.Popen(self.in_host(host, command), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        self.sshd.append(proc)
        deadline = time.monotonic() + 10
        while sh("ip", "netns", "exec", self.namespace(host), "ssh", "-F", self.ssh_config,
                 "-o", "BatchMode=yes", "-o", "ConnectTimeout=2", f"h{host}", "true",
                 check=False).returncode:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"sshd on h{host} did not start (exit {proc.poll()})")
            time.sleep(0.2)

    def in_host(self, host: int, command: Sequence[str]) -> List[str]:
        """`command` run on host `host`: its namespace, its host name."""
        line = f"hostname h{host} && exec " + " ".join(shlex.quote(w) for w in command)
        return ["ip", "netns", "exec", self.namespace(host), "unshare", "--uts", "sh", "-c",
                line]

    def start(self, host: int, command: Sequence[str], env: Optional[Dict[str, str]] = None,
              ) -> subprocess.Popen:
        harness.refuse_in_quick_tier()
        environ = {k: v for k, v in {**harness._env(), **(env or {})}.items() if v is not None}
        return subprocess.Popen(self.in_host(host, command), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, cwd=harness.ROOT,
                                env=environ, start_new_session=True)

    def run(self, host: int, command: Sequence[str], timeout: float = 300.0,
            env: Optional[Dict[str, str]] = None) -> harness.Result:
        """`command` on host `host`, to its end; its output (stdout and stderr) and status."""
        start = time.monotonic()
        return harness.finish(self.start(host, command, env), timeout, start)

    def processes(self, host: int) -> List[int]:
        """Every process running on host `host` but its sshd."""
        sshd = {p.pid for p in self.sshd}
        pids = []
        for pid in sh("ip", "netns", "pids", self.namespace(host), check=False).stdout.split():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmdline = f.read()
            except OSError:
                continue
            if int(pid) not in sshd and not cmdline.startswith((SSHD.encode(), b"sshd")):
                pids.append(int(pid))
        return pids


def main(argv: Sequence[str]) -> int:
    """python -m tests.emulated_hosts N COMMAND...: run COMMAND on h1 of N emulated hosts, the
    --ssh command that reaches the others in $TFTORUS_TEST_SSH; e.g. the main job over two:

        python -m tests.emulated_hosts 2 sh -c '.venv-current/bin/python -m tftorus.run -np 4 \\
            -H h1:2,h2:2 --ssh "$TFTORUS_TEST_SSH" run_scripts/train.py --exp=2 --grid=2x2 \\
            --engine=tf --flagfile=run_scripts/embedded.flags --model_dir=runs/across-hosts'
    """
    if len(argv) < 2 or not argv[0].isdigit():
        print("usage: python -m tests.emulated_hosts N COMMAND...", file=sys.stderr)
        return 2
    why = why_not_possible()
    if why:
        print(f"emulated hosts: {why}", file=sys.stderr)
        return 2
    with Hosts(int(argv[0])) as hosts:
        proc = hosts.start(1, argv[1:], env={"TFTORUS_TEST_SSH": hosts.ssh})
        for line in proc.stdout:
            sys.stdout.write(line)
        return proc.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
