"""Checks the collective test scripts share: a check every rank agrees on, an expected error
raised on every rank, and random basic indices."""

from __future__ import annotations

import sys

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank = comm.Get_rank()


def check(ok: bool, what: str) -> None:
    if not comm.allreduce(bool(ok), op=MPI.LAND):
        raise SystemExit(f"rank {rank}: check failed: {what}")


def random_selection(rng: np.random.Generator, shape: tuple[int, ...]) -> object:
    """A random basic index: None, or per dimension an integer or a slice (maybe empty)."""
    if rng.random() < 0.15:
        return None
    index = []
    for n in shape:
        r = rng.random()
        if r < 0.15:
            index.append(int(rng.integers(-n, n)))
        else:
            a = int(rng.integers(0, n + 1))
            b = int(rng.integers(a, n + 1)) if rng.random() < 0.95 else a
            index.append(slice(a, b))
    if index and rng.random() < 0.2:
        return (*index[:-1], Ellipsis)
    return tuple(index)


def write_then_read(ds, oracle: np.ndarray, rng: np.random.Generator, sels, datas, hints=None):
    """Each rank writes its own of ``sels`` / ``datas`` with ``write_all`` (hints
    ``hints``), the ``oracle`` takes every rank's writes in rank order (the highest rank's
    value wins), then each rank reads a random selection with ``read_all``: that
    selection, what the read gave, and what the oracle holds there (None: no selection)."""
    nprocs = comm.Get_size()
    ds.write_all(sels[rank], datas[rank], hints=hints)
    for sel, data in zip(sels, datas):
        if sel is not None:
            oracle[sel] = data
    reads = [random_selection(rng, ds.shape) for _ in range(nprocs)]
    got = ds.read_all(reads[rank])
    return reads[rank], got, None if reads[rank] is None else oracle[reads[rank]]


def raises_everywhere(call, cls: type[BaseException]) -> bool:
    try:
        call()
    except cls:
        return True
    except Exception as exc:  # noqa: BLE001
        print(f"rank {rank}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return False
    return False
