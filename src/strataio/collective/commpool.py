"""The private communicators of open files, kept for the next file opened on the same one.

A :class:`strataio.File` talks on a duplicate of the communicator it was opened on (as ROMIO's
files do), so that its messages never meet the application's, and agrees on every collective
call through a persistent ``Allgather`` on that duplicate
(:class:`~strataio.collective.agreement.Agreement`). Duplicating is collective (in MPICH an
allreduce that picks a context id), and a program opens file after file on one communicator:
so a closed file hands its agreement, duplicate included, back here, kept as an attribute of
the communicator it came from (freed with it), and the next file opened there takes it.

Every rank opens and closes a communicator's files in the same order (both calls are
collective), so every rank takes back the same duplicate. A duplicate is handed back only when
nothing is pending on it: :meth:`strataio.File.close` returns it after its last collective.
"""

from __future__ import annotations

from typing import Any

from mpi4py import MPI

from strataio.collective.agreement import Agreement

#: agreements kept per communicator (files open at once on one communicator, at most)
KEEP = 4

_KEYVAL: int | None = None


def _release(agreement: Agreement) -> None:
    comm = agreement.comm
    agreement.free()
    comm.Free()


def _free_pool(comm: MPI.Comm, keyval: int, pool: Any) -> None:
    """Attribute delete callback: the communicator is freed (or MPI finalizes)."""
    while pool:
        _release(pool.pop())


def _pool(comm: MPI.Comm) -> list[Agreement]:
    global _KEYVAL
    if _KEYVAL is None:
        _KEYVAL = MPI.Comm.Create_keyval(delete_fn=_free_pool)
    pool = comm.Get_attr(_KEYVAL)
    if pool is None:
        pool = []
        comm.Set_attr(_KEYVAL, pool)
    return pool


def take(comm: MPI.Comm) -> Agreement:
    """An agreement over a private duplicate of ``comm`` (collective: every rank of ``comm``
    calls it at the same point): one handed back earlier, else a new one."""
    pool = _pool(comm)
    return pool.pop() if pool else Agreement(comm.Dup())


def give_back(comm: MPI.Comm, agreement: Agreement) -> None:
    """Keep ``agreement`` (from :func:`take` on ``comm``, nothing pending on it) for the next
    :func:`take`; freed instead when ``comm`` itself has been freed or enough are kept
    (collective, like :func:`take`)."""
    if comm == MPI.COMM_NULL:
        _release(agreement)
        return
    pool = _pool(comm)
    if len(pool) >= KEEP:
        _release(agreement)
    else:
        pool.append(agreement)
