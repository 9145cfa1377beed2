"""What a launcher gives each rank besides its command: horovodrun's HOROVOD_* variables, from
the hosts the ranks run on. The local launcher (tftorus/launch/local.py) sets them for its
ranks; a rank that srun, mpirun or a TF_CONFIG started publishes the same values itself at init
(tftorus/cluster/tf_runtime.py), so scripts written for horovodrun read them whatever started
them. Standard library only."""
from typing import Dict, Sequence

#: What horovodrun (Gloo) puts in each rank's environment (Horovod 0.28.1's
#: runner/gloo_run.py), for scripts that read them rather than ask hvd.rank().
HOROVOD_VARIABLES = ("HOROVOD_HOSTNAME", "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK",
                     "HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE")


def horovod_variables(hosts: Sequence[str], rank: int) -> Dict[str, str]:
    """horovodrun's variables for `rank` where rank r runs on hosts[r]. Local: its place and
    count among its host's ranks. Cross: Horovod's cross communicator, the ranks of the same
    local rank (one per host that has that many ranks), in rank order, which is horovodrun's
    host order, as it numbers ranks host by host."""
    host = hosts[rank]
    local_of = [hosts[:r].count(h) for r, h in enumerate(hosts)]
    cross = [r for r, local in enumerate(local_of) if local == local_of[rank]]
    values = (host, rank, len(hosts), local_of[rank], hosts.count(host), cross.index(rank),
              len(cross))
    return {name: str(value) for name, value in zip(HOROVOD_VARIABLES, values)}
