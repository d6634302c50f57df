"""What the ranks of a communicator share on their nodes.

Collective I/O on a node-local file system depends on whether every rank has a core of its own:
MPI ranks poll while they wait in a collective, so with more ranks than cores on a node the
waiting ranks take core time from the ones doing the work (an aggregator, say), while
independent I/O never waits on another rank; and an aggregator can only overlap its file
access with the exchange in a thread of its own if a core is left for that thread.
:func:`spare_cores` counts once per communicator and caches the answer on it as an MPI
attribute (freed with the communicator).
"""

from __future__ import annotations

import os

from mpi4py import MPI

_KEYVAL: int | None = None


def _cpus() -> frozenset[int]:
    """The CPUs this process may run on."""
    try:
        return frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux: assume every CPU of the machine
        return frozenset(range(os.cpu_count() or 1))


def spare_cores(comm: MPI.Comm) -> int:
    """CPUs left over on the node with the fewest: the CPUs the node's ranks may run on together
    minus the node's ranks (negative when ranks share cores). Collective the first time on
    ``comm``; the same answer on every rank."""
    global _KEYVAL
    if _KEYVAL is None:
        _KEYVAL = MPI.Comm.Create_keyval()
    cached = comm.Get_attr(_KEYVAL)
    if cached is not None:
        return int(cached)
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        cpus = frozenset().union(*node.allgather(_cpus()))
        mine = len(cpus) - node.Get_size()
    finally:
        node.Free()
    answer = int(comm.allreduce(mine, op=MPI.MIN))
    comm.Set_attr(_KEYVAL, answer)
    return answer


def crowded(comm: MPI.Comm) -> bool:
    """True when, on some node, ``comm`` has more ranks than the node's ranks have CPUs to
    run on together (collective the first time on ``comm``)."""
    return spare_cores(comm) < 0
