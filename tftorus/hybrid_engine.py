"""The "hybrid" engine: TensorFlow's collectives inside a host, Horovod's across hosts.

Why: Horovod performs every collective of every process set one after the other on its one
background thread (RunLoopOnce in horovod/common/operations.cc; with Gloo each op blocks that
thread until done), so on the Horovod engine the torus' row phases (inside a host) can never run
while its column phase (across hosts) is on the network. TF's collective ops run on TF's own
executor threads, so a row collective on TF and a column collective on Horovod are in flight at
the same time, and the torus' chunk pipeline overlaps them: chunk k's column all-reduce crosses
the hosts on Horovod (Gloo, the faster of the two across a slow link) while chunk k+1's row
reduce-scatter and chunk k-1's row all-gather run inside the host on TF.

The other way round (rows on Horovod, columns on TF) was measured slower than both plain engines
on the emulated clusters: TF's ring across hosts is 1.06-1.13x Gloo's (docs/emulated_cluster.md).

Both runtimes must be up: `tftorus.init(engine="hybrid")` (under horovodrun) starts TF's
collective runtime and Horovod with the grids' process sets. Which ranks share a host comes from
the addresses the ranks' TF servers publish (the host part of "host:port").
"""
from typing import Sequence

from tftorus.communicator import Communicator, Group


class HybridCommunicator(Communicator):
    engine = "hybrid"
    # A row (TF) and a column (Horovod) are served by different runtimes: they overlap.
    concurrent_groups = True

    def __init__(self, inside: Communicator, across: Communicator, hosts: Sequence[str]):
        """inside: the engine for groups within one host (the tf engine); across: for groups
        that span hosts (Horovod); hosts: every rank's host name, rank by rank."""
        if (inside.rank, inside.size) != (across.rank, across.size):
            raise ValueError(f"the two engines disagree on this process: rank {inside.rank} of "
                             f"{inside.size} ({inside.engine}) against rank {across.rank} of "
                             f"{across.size} ({across.engine}); start both in one launch")
        if len(hosts) != inside.size:
            raise ValueError(f"hosts names {len(hosts)} ranks, the world has {inside.size}")
        self.inside, self.across = inside, across
        self.hosts = tuple(hosts)

    @property
    def rank(self):
        return self.inside.rank

    @property
    def size(self):
        return self.inside.size

    @property
    def local_size(self):
        return self.hosts.count(self.hosts[self.rank])

    def engine_for(self, group: Group) -> Communicator:
        """The tf engine for a group inside one host, Horovod for one across hosts; Horovod for
        every group where the world is one host (nothing crosses a network to overlap with)."""
        if len(set(self.hosts)) > 1 and len({self.hosts[r] for r in group}) == 1:
            return self.inside
        return self.across

    # Horovod's alltoall and allgather leave the result's length unknown in a traced step, and
    # the tf engine needs it (its instance keys depend on the shape): every shape below is
    # known from the input's.

    def _reduce_scatter(self, tensor, group):
        out = self.engine_for(group)._reduce_scatter(tensor, group)
        out.set_shape([None if tensor.shape[0] is None else tensor.shape[0] // len(group)])
        return out

    def _all_reduce(self, tensor, group, op):
        out = self.engine_for(group)._all_reduce(tensor, group, op)
        out.set_shape(tensor.shape)
        return out

    def _all_gather(self, tensor, group, equal_sizes=False):
        out = self.engine_for(group)._all_gather(tensor, group, equal_sizes)
        if equal_sizes and tensor.shape[0] is not None:
            out.set_shape([tensor.shape[0] * len(group)] + tensor.shape.as_list()[1:])
        return out
