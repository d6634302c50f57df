"""Errors agreed on every rank: a collective call that fails on one rank fails on all of them,
before any byte is written, and no rank is left waiting.

Used by every collective call of strataio (``File``, collective Datasets, a parallel
Session's opens and creates). A failing rank re-raises its own exception; the others raise
an exception of the same :class:`StrataError` class naming the failing rank.
"""

from __future__ import annotations

import array
import zlib
from collections.abc import Sequence

import numpy as np
from mpi4py import MPI

from strataio.errors import StrataError


def agree(comm: MPI.Comm | None, exc: BaseException | None) -> None:
    """Raise on every rank if ``exc`` is set on any: the failing rank re-raises its own
    exception, the others an exception of the same class naming the rank (one ``Allreduce``
    when nothing failed). ``comm`` None is a single process."""
    if comm is None or comm.Get_size() == 1:
        if exc is not None:
            raise exc
        return
    # (a buffer of one int, not a pickled bool: 2 us against 7 at two ranks, more with the
    # caches cold, and every collective call of a file agrees at least once)
    failed = array.array("i", (exc is not None,))
    comm.Allreduce(MPI.IN_PLACE, [failed, MPI.INT], op=MPI.MAX)
    if failed[0]:
        raise_agreed(comm, exc)


def raise_agreed(comm: MPI.Comm, exc: BaseException | None) -> None:
    """Every rank knows some rank failed: exchange what failed and raise it everywhere."""
    mine = None if exc is None else (type(exc), str(exc))
    everyone = comm.allgather(mine)
    if exc is not None:
        raise exc
    rank, (cls, msg) = next((r, m) for r, m in enumerate(everyone) if m is not None)
    if not (isinstance(cls, type) and issubclass(cls, StrataError)):
        cls = StrataError
    raise cls(f"{msg} (raised on rank {rank})")


def differs(comm: MPI.Comm | None, values: Sequence[int]) -> bool:
    """Whether any of the integers ``values`` (the same count on every rank) differs between
    the ranks of ``comm``; the same answer on every rank (one ``Allreduce`` of the values and
    their negations)."""
    if comm is None or comm.Get_size() == 1:
        return False
    mine = np.asarray(values, dtype=np.int64)
    both = np.concatenate([mine, -mine])
    top = np.empty_like(both)
    comm.Allreduce(both, top, op=MPI.MAX)
    return bool(np.any(top[: mine.size] != -top[mine.size :]))


def differs_in(comm: MPI.Comm | None, data: bytes, *numbers: int) -> bool:
    """Whether ``data`` (a CRC-32 of it) or any of ``numbers`` differs between the ranks of
    ``comm`` (:func:`differs`): the arguments of a collective call, say."""
    return differs(comm, [zlib.crc32(data), *numbers])
