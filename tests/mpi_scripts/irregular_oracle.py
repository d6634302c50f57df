"""Index schedules and loop caches under mpiexec, against a numpy oracle of the file.

Every rank keeps the oracle (the file's items as numpy) in step by allgathering what each
rank wrote. Cases: random index sets with repeats, empty ranks, every index on one
aggregator, several iterations (small buffers), records of 1, 12 and 32 bytes; write then
read back; a schedule reused across calls and files; duplicate writes refused on every rank
and allowed with ``strataio_duplicate_writes=last-rank``; bad indices and value counts refused
on every rank with nothing written; reads of a file that ends before its items (zeros past
the end, only the items before it counted, and where the file ends agreed where no rank has
an item); a randomized sequence of loops through a LoopCache equal to
the same sequence without it. Rank 0 prints one JSON object of outcomes.
"""

from __future__ import annotations

import json
import os
import sys
from functools import partial

import numpy as np
from mpi4py import MPI

import strataio
from strataio.errors import DuplicateWriteError, SelectionError, ShapeMismatchError, StrataError


def file_items(path: str, nitems: int, itemsize: int) -> np.ndarray:
    raw = np.fromfile(path, dtype=np.uint8)
    full = np.zeros(nitems * itemsize, dtype=np.uint8)
    full[: min(raw.size, full.size)] = raw[: full.size]
    return full.reshape(nitems, itemsize)


def index_sets(rng: np.random.Generator, rank: int, nprocs: int, nitems: int) -> dict:
    """Named index sets of this rank (the same draws on every rank: seeded by the case)."""
    sets = {
        "random_repeats": rng.integers(0, nitems, 40 + 7 * rank),
        "empty_ranks": rng.integers(0, nitems, 30) if rank % 2 == 0 else np.zeros(0, np.int64),
        "one_aggregator": rng.integers(0, max(nitems // (2 * nprocs), 1), 25),
        "everything_reversed": np.arange(nitems)[::-1],
        "none_anywhere": np.zeros(0, np.int64),
    }
    return sets


def disjoint(rng: np.random.Generator, rank: int, nprocs: int, nitems: int, frac: float):
    """A random share of the items per rank, no index on two ranks (the same permutation on
    every rank), in a random order with repeats."""
    perm = np.random.default_rng(nitems).permutation(nitems)
    take = perm[: int(nitems * frac)]
    mine = take[rank::nprocs]
    rng.shuffle(mine)
    reps = rng.integers(0, max(mine.size, 1), mine.size // 4) if mine.size else []
    return np.concatenate([mine, mine[reps]]) if mine.size else mine


def expect_error(cls, fn, *args) -> str:
    try:
        fn(*args)
    except cls:
        return "raised"
    except Exception as exc:  # noqa: BLE001
        return f"wrong {type(exc).__name__}: {exc}"
    return "no error"


def main(workdir: str) -> None:
    comm = MPI.COMM_WORLD
    rank, nprocs = comm.Get_rank(), comm.Get_size()
    out: dict[str, object] = {}
    failures: list[str] = []

    def check(name: str, ok: bool) -> None:
        if not ok:
            failures.append(name)

    for itemsize, nitems, buffer_size in ((1, 257, None), (12, 500, 120), (32, 300, 32 * 7)):
        path = os.path.join(workdir, f"items{itemsize}.bin")
        seed = np.random.default_rng(1000 + itemsize)
        start = seed.integers(0, 256, (nitems, itemsize), dtype=np.uint8)
        if rank == 0:
            start.tofile(path)
        comm.Barrier()
        oracle = start.copy()
        f = strataio.File.open(comm, path, "r+")
        rng = np.random.default_rng(itemsize * 7919 + rank)
        for name, idx in index_sets(rng, rank, nprocs, nitems).items():
            sched = strataio.IndexSchedule(comm, idx, nitems, itemsize, buffer_size=buffer_size)
            got = np.empty((idx.size, itemsize), np.uint8)
            f.read_items(sched, got)
            check(f"read {name} {itemsize}", np.array_equal(got, oracle[idx]))
            f.read_items(sched, got)  # reused: no rebuild
            check(f"reread {name} {itemsize}", np.array_equal(got, oracle[idx]))

        # write then read back, a schedule reused across calls
        wr = disjoint(rng, rank, nprocs, nitems, 0.8)
        sched = strataio.IndexSchedule(comm, wr, nitems, itemsize, buffer_size=buffer_size)
        check(f"no shared {itemsize}", sched.shared == 0)
        for step in range(2):
            vals = np.random.default_rng(rank * 31 + step).integers(
                0, 256, (wr.size, itemsize), dtype=np.uint8
            )
            # repeats of an index on one rank: its last occurrence wins
            last = {}
            for pos, i in enumerate(wr.tolist()):
                last[i] = pos
            f.write_items(sched, vals)
            for idxs, v in comm.allgather((np.array(list(last)), vals[list(last.values())])):
                if idxs.size:
                    oracle[idxs] = v
            back = np.empty_like(vals)
            f.read_items(sched, back)
            check(f"write read back {itemsize} step {step}", np.array_equal(back, oracle[wr]))
            comm.Barrier()
            check(
                f"file bytes {itemsize} step {step}",
                np.array_equal(file_items(path, nitems, itemsize), oracle),
            )

        # errors: on every rank, nothing written
        before = file_items(path, nitems, itemsize)
        bad = np.array([nitems if rank == nprocs - 1 else 0])
        out[f"out_of_range_{itemsize}"] = expect_error(
            SelectionError, strataio.IndexSchedule, comm, bad, nitems, itemsize
        )
        if nprocs > 1:  # a schedule's shape must be the same on every rank
            last = rank == nprocs - 1
            for what, args in (
                ("itemsize", (nitems, itemsize * 2 if last else itemsize)),
                ("nitems", (nitems + last, itemsize)),
                # past an int64 on one rank: refused there, where the comparison of the
                # ranks' shapes failed on that rank alone and the others waited in it
                ("huge_nitems", (2**70 if last else nitems, itemsize)),
                ("huge_itemsize", (nitems, 2**70 if last else itemsize)),
            ):
                out[f"mismatched_{what}_{itemsize}"] = expect_error(
                    StrataError, strataio.IndexSchedule, comm, wr, *args
                )
            out[f"mismatched_huge_buffer_{itemsize}"] = expect_error(
                StrataError,
                partial(strataio.IndexSchedule, buffer_size=2**70 if last else None),
                comm,
                wr,
                nitems,
                itemsize,
            )
            out[f"mismatched_aggregators_{itemsize}"] = expect_error(
                StrataError,
                partial(strataio.IndexSchedule, aggregators=[0] if last else [0, 1]),
                comm,
                wr,
                nitems,
                itemsize,
            )
        short = np.zeros((max(wr.size - (rank == 0), 0), itemsize), np.uint8)
        out[f"wrong_count_{itemsize}"] = expect_error(
            ShapeMismatchError, f.write_items, sched, short
        )
        dup = np.array([0, 1, 2])  # every rank writes items 0..2
        dsched = strataio.IndexSchedule(comm, dup, nitems, itemsize)
        dvals = np.full((3, itemsize), rank + 1, np.uint8)
        if nprocs > 1:
            out[f"duplicate_{itemsize}"] = expect_error(
                DuplicateWriteError, f.write_items, dsched, dvals
            )
        comm.Barrier()
        check(
            f"nothing written {itemsize}",
            np.array_equal(file_items(path, nitems, itemsize), before),
        )
        f.close()

        # last-rank: the highest rank's value wins; a schedule reused on another file
        g = strataio.File.open(comm, path, "r+", {"strataio_duplicate_writes": "last-rank"})
        g.write_items(dsched, dvals)
        oracle[dup] = nprocs
        comm.Barrier()
        check(f"last-rank {itemsize}", np.array_equal(file_items(path, nitems, itemsize), oracle))
        g.close()

    # a LoopCache against the sequence without it, over random loops with 7/8 overlap
    nitems, itemsize = 400, 16
    for trial in range(3):
        rng = np.random.default_rng(5000 + trial)  # the same on every rank
        paths = [os.path.join(workdir, f"loop{trial}_{k}.bin") for k in ("cached", "plain")]
        start = rng.integers(0, 256, (nitems, itemsize), dtype=np.uint8)
        if rank == 0:
            for p in paths:
                start.tofile(p)
        comm.Barrier()
        fc = strataio.File.open(comm, paths[0], "r+")
        fp = strataio.File.open(comm, paths[1], "r+")
        owner = rng.permutation(nitems)[: nitems // 2]
        loops = []
        for _ in range(4):
            keep = owner[rng.random(owner.size) < 7 / 8]
            extra = rng.choice(
                np.setdiff1d(np.arange(nitems), keep), owner.size - keep.size, replace=False
            )
            owner = np.concatenate([keep, extra])
            rng.shuffle(owner)  # items move between ranks
            loops.append(owner[rank::nprocs].copy())
        bs = int(rng.choice([16 * 5, 1 << 20]))
        scheds = [
            strataio.IndexSchedule(comm, ix, nitems, itemsize, buffer_size=bs) for ix in loops
        ]
        dt = np.dtype((np.uint32, 4))

        def body(k: int, ix: np.ndarray, v: np.ndarray) -> np.ndarray:
            return (v * 3 + ix[:, None].astype(np.uint32) + k).astype(np.uint32)

        cache = strataio.LoopCache(fc, scheds[0], dtype=dt)
        vals = cache.values
        for k, ix in enumerate(loops):
            plain = np.empty((ix.size, 4), np.uint32)
            fp.read_items(scheds[k], plain)
            check(f"cache values trial {trial} loop {k}", np.array_equal(vals, plain))
            plain = body(k, ix, plain)
            fp.write_items(scheds[k], plain)
            vals = body(k, ix, vals)
            if k + 1 < len(loops):
                vals = cache.advance(scheds[k + 1], vals)
        cache.flush(vals)
        tot = cache.totals()
        fc.close()
        fp.close()
        comm.Barrier()
        a = np.fromfile(paths[0], dtype=np.uint8)
        b = np.fromfile(paths[1], dtype=np.uint8)
        check(f"cache file bytes trial {trial}", np.array_equal(a, b))
        held = sum(s.unique.size for s in scheds)
        check(f"cache reads fewer items trial {trial}", tot.items_read < comm.allreduce(held))
        out[f"cache_items_read_{trial}"] = tot.items_read
        out[f"plain_items_read_{trial}"] = comm.allreduce(held)

    # a file shorter than its items (its end cutting one): the items wholly before the end
    # are read and counted, every rank hears where it ends, the rest read as zeros
    for itemsize, nitems, buffer_size in ((1, 257, None), (12, 500, 120), (32, 300, 32 * 7)):
        path = os.path.join(workdir, f"short{itemsize}.bin")
        start = np.random.default_rng(2000 + itemsize).integers(
            1, 256, (nitems, itemsize), dtype=np.uint8
        )
        nbytes = (nitems // 3) * itemsize + itemsize // 2
        if rank == 0:
            start.reshape(-1)[:nbytes].tofile(path)
        comm.Barrier()
        whole = nbytes // itemsize
        f = strataio.File.open(comm, path, "r")
        rng = np.random.default_rng(itemsize * 31 + rank)
        for name, idx in index_sets(rng, rank, nprocs, nitems).items():
            sched = strataio.IndexSchedule(comm, idx, nitems, itemsize, buffer_size=buffer_size)
            got = np.full((idx.size, itemsize), 0xEE, np.uint8)
            io = f.read_items(sched, got)
            check(
                f"short read {name} {itemsize}",
                np.array_equal(got, file_items(path, nitems, itemsize)[idx]),
            )
            read = np.unique(idx[idx < whole]).size
            check(f"short count {name} {itemsize}", (io.items, io.file_items) == (read, whole))
        f.close()

    # an aggregator's I/O failure: raised on every rank, no rank left waiting
    path = os.path.join(workdir, "fail.bin")
    if rank == 0:
        np.arange(1000, dtype=np.int64).tofile(path)
    comm.Barrier()
    f = strataio.File.open(comm, path, "r+")
    sched = strataio.IndexSchedule(comm, np.arange(1000)[rank::nprocs], 1000, 8)
    vals = np.arange(1000)[rank::nprocs].copy()  # (the other aggregators write these back)
    fd = f.driver.fd
    saved = os.dup(fd)
    for what, mode in (("read", os.O_WRONLY), ("write", os.O_RDONLY)):
        if rank == nprocs - 1:  # this aggregator's file descriptor now refuses the transfer
            refusing = os.open(os.devnull, mode)
            os.dup2(refusing, fd)
            os.close(refusing)
        call = f.read_items if what == "read" else f.write_items
        out[f"io_failure_{what}"] = expect_error(strataio.StrataError, call, sched, vals)
        os.dup2(saved, fd)
    os.close(saved)
    back = np.zeros(sched.n, np.int64)
    f.read_items(sched, back)  # usable afterwards
    check("usable after failures", np.array_equal(back, np.arange(1000)[rank::nprocs]))

    # no item on any rank: every rank looks at the file's end, and the same end is reported
    # on every rank; a look failing on one rank raises on every rank
    empty = strataio.IndexSchedule(comm, np.zeros(0, np.int64), 2000, 8)
    none = np.zeros(0, np.int64)
    io = f.read_items(empty, none)
    check("no items: where the file ends", (io.items, io.file_items) == (0, 1000))

    def size_fails() -> int:
        raise strataio.StrataError(f"{path}: the file's size cannot be read")

    if rank == nprocs - 1:
        f._size = size_fails
    out["io_failure_size"] = expect_error(strataio.StrataError, f.read_items, empty, none)
    if rank == nprocs - 1:
        del f._size
    f.close()

    everyone = comm.gather(failures)
    if rank == 0:
        out["failures"] = sorted({f for fs in everyone for f in fs})
        print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
