"""`horovodrun` (its own command line and elastic driver), with host names of the form
elastic-host-<i> standing for this machine: one machine plays several one-slot hosts, so the
elastic driver can lose one of them (it blacklists the host of a failed worker) and find
another, as on a cluster. Horovod runs a worker over ssh unless its host resolves to a local
address; only that lookup is changed here.

    python elastic_driver.py [horovodrun arguments...]
"""
import sys

from horovod.runner import launch
from horovod.runner.util import network

_resolve = network.resolve_host_address


def _resolve_emulated(host_name):
    return "127.0.0.1" if host_name.startswith("elastic-host-") else _resolve(host_name)


network.resolve_host_address = _resolve_emulated

if __name__ == "__main__":
    sys.exit(launch.run_commandline())
