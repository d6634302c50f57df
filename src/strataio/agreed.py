"""Errors agreed on every rank: a collective call that fails on one rank fails on all of them,
before any byte is written, and no rank is left waiting.

Used by every collective call of strataio (``File``, collective Datasets, a parallel
Session's opens and creates). A failing rank re-raises its own exception; the others raise
an exception of the same :class:`StrataError` class naming the failing rank. Arguments a
collective call needs alike on every rank are compared the same way
(:func:`same_on_every_rank`): ranks that passed different ones all raise.
"""

from __future__ import annotations

import array
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from mpi4py import MPI

from strataio.errors import ArgumentError, StrataError


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
    """Whether ``data`` (a 62-bit BLAKE2b digest of it) or any of ``numbers`` differs between
    the ranks of ``comm`` (:func:`differs`): the arguments of a collective call, say."""
    # (62 bits: the digest and its negation both fit an int64)
    digest = int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") >> 2
    return differs(comm, [digest, *numbers])


def same_on_every_rank(comm: MPI.Comm | None, call: str, args: Mapping[str, Any]) -> None:
    """Raise :class:`ArgumentError` on every rank of ``comm`` where the ranks passed the
    collective ``call`` different ``args`` (argument name to its value, normalized: the
    metadata each rank would write, not the spelling it used), naming the arguments and the
    ranks that differ from rank 0. Each rank would otherwise go on with its own: writing
    chunks the others (and the metadata, rank 0's) do not describe, or waiting in a
    collective the others skip. Call it before anything is created or written.

    One ``Allreduce`` of a digest when the ranks agree (:func:`differs_in`); an
    ``allgather`` of the arguments only where the digests differ."""
    if comm is None or comm.Get_size() == 1:
        return
    if not differs_in(comm, repr(sorted(args.items())).encode()):
        return
    everyone: list[Mapping[str, Any]] = comm.allgather(dict(args))
    ours = everyone[0]
    apart = []
    for rank, theirs in enumerate(everyone):
        keys = [k for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k)]
        if keys:  # (in the order the call takes them)
            keys.sort(key=lambda k: list(ours).index(k) if k in ours else len(ours))
            shown = "; ".join(
                f"{k} {_short(theirs.get(k))} against {_short(ours.get(k))}" for k in keys
            )
            apart.append(f"rank {rank} passed another {', '.join(keys)} than rank 0 ({shown})")
    if not apart:  # (equal values the digest told apart: dicts in another order, say)
        return
    more = f"; {len(apart) - 3} more ranks differ" if len(apart) > 3 else ""
    first = _short(next(iter(ours.values()), ""))
    raise ArgumentError(
        f"{call}({first}) is collective, and {'; '.join(apart[:3])}{more}: every rank "
        "must pass the same arguments"
    )


def _short(value: Any) -> str:
    """``repr(value)``, cut in the middle to a length an error message can carry (paths
    differ in their ends)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:28] + "..." + text[-29:]
