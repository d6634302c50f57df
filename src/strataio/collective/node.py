"""What the ranks of a communicator share on their nodes.

Collective I/O on a node-local file system depends on whether every rank has a core of its own:
MPI ranks poll while they wait in a collective, so with more ranks than cores on a node the
waiting ranks take core time from the ones doing the work (an aggregator, say), while
independent I/O never waits on another rank; and an aggregator can only overlap its file
access with the exchange in a thread of its own if a core is left for that thread.
:func:`layout` counts once per communicator and caches the answer on it as an MPI attribute
(freed with the communicator).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from mpi4py import MPI

_KEYVAL: int | None = None


def _job_ranks_here() -> int:
    """Processes of this MPI job on this node, as its launcher tells them (MPICH's Hydra,
    Open MPI); 1 where none does."""
    for var in ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE"):
        value = os.environ.get(var, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return 1


def _cpus() -> frozenset[int]:
    """The CPUs this process may run on."""
    try:
        return frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux: assume every CPU of the machine
        return frozenset(range(os.cpu_count() or 1))


@dataclass(frozen=True, slots=True)
class NodeLayout:
    """How a communicator's ranks sit on their nodes."""

    nodes: int
    """Number of nodes the ranks run on."""
    spare_cores: int
    """CPUs left over on the node with the fewest: the CPUs its ranks may run on together minus
    its ranks (negative when ranks share cores)."""
    names: tuple[str, ...] = ()
    """Each rank's processor name (``MPI.Get_processor_name``), by rank (what
    ``cb_config_list`` matches)."""

    def spare_per_rank(self, rank: int) -> int:
        """CPUs ``rank`` may use beside its own: the spare cores of the node with the fewest,
        less the job's processes on ``rank``'s node outside this communicator (a file opened
        on ``COMM_SELF`` by every rank of a job), shared among the ranks there (0 where
        ranks share cores, or when the ranks' names are not known)."""
        if self.spare_cores <= 0 or not self.names:
            return 0
        mine = self.names.count(self.names[rank])
        here = max(mine, _job_ranks_here())
        return max(0, (self.spare_cores - (here - mine)) // here)

    @property
    def crowded(self) -> bool:
        """Some node has more ranks than CPUs."""
        return self.spare_cores < 0


def layout(comm: MPI.Comm) -> NodeLayout:
    """The :class:`NodeLayout` of ``comm``: collective the first time on ``comm``, then cached
    on it; the same answer on every rank."""
    global _KEYVAL
    if _KEYVAL is None:
        _KEYVAL = MPI.Comm.Create_keyval()
    cached = comm.Get_attr(_KEYVAL)
    if cached is not None:
        return cached
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        cpus = frozenset().union(*node.allgather(_cpus()))
        spare, leader = len(cpus) - node.Get_size(), node.Get_rank() == 0
    finally:
        node.Free()
    nodes = int(comm.allreduce(int(leader), op=MPI.SUM))
    spare = int(comm.allreduce(spare, op=MPI.MIN))
    names = tuple(comm.allgather(MPI.Get_processor_name()))
    answer = NodeLayout(nodes=nodes, spare_cores=spare, names=names)
    comm.Set_attr(_KEYVAL, answer)
    return answer
