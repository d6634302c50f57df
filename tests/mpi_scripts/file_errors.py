"""Error agreement of strataio.File under mpiexec: a bad argument on one rank must raise the same
StrataError subclass on every rank, write no byte, and leave the file usable (no hang, no
desynchronised collective). Rank 0 prints one JSON object: check name -> exception class name
per rank."""

from __future__ import annotations

import errno
import json
import os
import sys

import numpy as np
from mpi4py import MPI

import strataio
from strataio.collective.cache_window import memory_to_share


class BadIndex:
    """An offset whose conversion fails with an error that is not strataio's."""

    def __index__(self) -> int:
        raise RuntimeError("no index")


def outcome(fn) -> str:
    try:
        fn()
    except Exception as exc:  # a non-StrataError on one rank is agreed too
        return type(exc).__name__
    return "ok"


def main(workdir: str) -> None:
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    path = os.path.join(workdir, "errors.bin")
    res: dict[str, str] = {}
    f = strataio.File.open(comm, path, "w")
    data = np.full(64, rank + 1, dtype=np.uint8)
    f.write_at_all(rank * 64, data)

    res["negative_disp"] = outcome(lambda: f.set_view(-8 if rank == 1 else 0, MPI.BYTE))
    six = MPI.BYTE.Create_contiguous(6).Commit()
    res["filetype_not_whole_etypes"] = outcome(lambda: f.set_view(0, MPI.INT, six))
    et = MPI.INT if rank == 0 else MPI.DOUBLE
    res["etype_sizes_disagree"] = outcome(lambda: f.set_view(0, et))
    # an INT etype broken across a hole: 2-byte runs 4 bytes apart
    halves = MPI.BYTE.Create_hvector(2, 2, 4).Commit()
    res["filetype_misaligned"] = outcome(
        lambda: f.set_view(0, MPI.INT, halves if rank == 1 else MPI.INT)
    )
    res["disp_not_integer"] = outcome(lambda: f.set_view(2.5 if rank == 0 else 0, MPI.BYTE))
    res["etype_not_datatype"] = outcome(lambda: f.set_view(0, "int" if rank == 1 else MPI.INT))
    loose = MPI.INT.Create_contiguous(2)  # never committed: MPI-IO refuses it in a view
    res["filetype_not_committed"] = outcome(
        lambda: f.set_view(0, MPI.INT, loose if rank == 1 else MPI.INT)
    )
    loose.Free()
    res["set_size_differs"] = outcome(lambda: f.set_size(64 * comm.Get_size() + rank))
    f.set_view(0, MPI.INT)
    odd = np.zeros(6 if rank == 0 else 8, dtype=np.uint8)
    res["buffer_not_whole_etypes"] = outcome(lambda: f.write_at_all(64, odd))
    small = np.zeros(16, dtype=np.uint8)
    spec = [small, 10, MPI.DOUBLE] if rank == 1 else [small, 2, MPI.DOUBLE]
    res["buffer_too_small"] = outcome(lambda: f.write_at_all(64, spec))
    res["negative_offset"] = outcome(lambda: f.read_at_all(-1 if rank == 0 else 0, small))
    res["read_into_readonly_buffer"] = outcome(lambda: f.read_at_all(0, bytes(8)))
    # a buffer datatype never committed on one rank (MPI refuses it): nothing is written
    pair = np.full(2, 99, dtype=np.int32)
    loose = MPI.INT.Create_contiguous(2)
    buf_spec = [pair, 1, loose] if rank == 1 else [pair, 2, MPI.INT]
    res["buffer_not_committed"] = outcome(lambda: f.write_at_all(0, buf_spec))
    loose.Free()
    # nothing above may have written a byte: still each rank's 64 bytes, nothing more
    f.set_view(0, MPI.BYTE)
    back = np.zeros(64 * comm.Get_size(), dtype=np.uint8)
    f.read_at_all(0, back)
    expect = np.repeat(np.arange(1, comm.Get_size() + 1, dtype=np.uint8), 64)
    res["file_unchanged"] = "ok" if np.array_equal(back, expect) else "changed"
    f.close()

    res["closed_read_all"] = outcome(lambda: f.read_all(small))
    res["closed_write_at"] = outcome(lambda: f.write_at(0, small))
    res["closed_get_view"] = outcome(f.get_view)
    res["closed_hints"] = outcome(lambda: f.hints)

    r = strataio.File.open(comm, path, "r")
    res["write_all_read_only"] = outcome(lambda: r.write_all(small))
    res["write_at_read_only"] = outcome(lambda: r.write_at(0, small))
    res["set_size_read_only"] = outcome(lambda: r.set_size(0))
    # A bad buffer on one rank fails a collective read of a read-only file everywhere, and
    # the next call is in step.
    nprocs = comm.Get_size()
    spec = [small, 10, MPI.DOUBLE] if rank == 1 else [small, 2, MPI.DOUBLE]
    res["read_only_bad_buffer"] = outcome(lambda: r.read_at_all(0, spec))
    whole = np.zeros(64 * nprocs, dtype=np.uint8)
    r.read_at_all(0, whole)
    expect = np.repeat(np.arange(1, nprocs + 1, dtype=np.uint8), 64)
    res["read_only_data"] = "ok" if np.array_equal(whole, expect) else "bad"
    # One rank reads one large piece, the other 1-byte pieces interleaved with it: automatic
    # mode aggregates (mean piece under 64 bytes, ranges interleave), with the same bytes.
    every_other = MPI.BYTE.Create_vector(64 * nprocs // 2, 1, 2).Commit()
    r.set_view(0, MPI.BYTE, MPI.BYTE if rank == 0 else every_other)
    got = np.zeros(64 * nprocs if rank == 0 else 64 * nprocs // 2, dtype=np.uint8)
    r.read_at_all(0, got)
    want = expect if rank == 0 else expect[::2]
    ok = np.array_equal(got, want)
    res["mixed_pieces_path"] = r.last_path if ok else "bad data"
    r.close()
    res["open_modes_differ"] = outcome(
        lambda: strataio.File.open(comm, path, "r" if rank == 0 else "r+")
    )

    res["open_x_existing"] = outcome(lambda: strataio.File.open(comm, path, "x"))
    missing = os.path.join(workdir, "missing.bin")
    res["open_missing"] = outcome(lambda: strataio.File.open(comm, missing, "r"))
    # an existing file opens on rank 0 before the agreement; that descriptor is closed again
    fds = len(os.listdir("/proc/self/fd"))
    one_missing = path if rank == 0 else missing
    res["open_missing_on_one_rank"] = outcome(lambda: strataio.File.open(comm, one_missing, "r"))
    res["no_descriptor_left"] = "ok" if len(os.listdir("/proc/self/fd")) == fds else "leak"
    # each rank naming its own file: refused before any is created (an aggregator would
    # write the other ranks' bytes into its own file)
    mine = os.path.join(workdir, f"own{rank}.bin")
    res["open_paths_differ"] = outcome(lambda: strataio.File.open(comm, mine, "w"))
    res["open_paths_differ_created_none"] = "ok" if not os.path.exists(mine) else "created"
    # a file name that is no path on one rank: refused on every rank, none left waiting
    named = path if rank == 0 else None
    res["open_path_not_a_path_on_one_rank"] = outcome(
        lambda: strataio.File.open(comm, named, "r").close()
    )
    # the same file under a relative and an absolute path is one file
    same = os.path.relpath(path) if rank == 0 else path
    res["open_relative_and_absolute"] = outcome(lambda: strataio.File.open(comm, same, "r").close())
    bad_hint = {"cb_buffer_size": "lots"} if rank == 1 else {}
    res["bad_hint"] = outcome(lambda: strataio.File.open(comm, path, "r", hints=bad_hint))
    res["bad_mode"] = outcome(lambda: strataio.File.open(comm, path, "rw"))
    # a mode that is no int of MPI flags (9.0 would cut to MODE_RDWR | MODE_CREATE)
    res["mode_not_flags"] = outcome(lambda: strataio.File.open(comm, path, 9.0).close())
    # "w" truncates, its flags given as an int do not: ranks that differ so are refused and
    # the file keeps its bytes
    kept = os.path.join(workdir, "kept.bin")
    if rank == 0:
        with open(kept, "wb") as out:
            out.write(b"keep")
    comm.Barrier()
    w_or_flags = "w" if rank == 0 else MPI.MODE_RDWR | MPI.MODE_CREATE
    res["open_w_and_its_flags"] = outcome(lambda: strataio.File.open(comm, kept, w_or_flags))
    res["open_w_and_its_flags_kept"] = "ok" if os.path.getsize(kept) == 4 else "truncated"
    sequential = MPI.MODE_RDONLY | MPI.MODE_SEQUENTIAL
    res["mode_sequential"] = outcome(lambda: strataio.File.open(comm, path, sequential))
    # hints choose the collective path of every call: ranks must agree on them
    size_hint = {"cb_buffer_size": str(1 << 20 if rank == 1 else 1 << 22)}
    res["hints_differ"] = outcome(lambda: strataio.File.open(comm, path, "r", hints=size_hint))
    own = {"ind_rd_buffer_size": str(1 << (20 + rank))}  # a rank's own independent I/O
    res["per_rank_hints"] = outcome(lambda: strataio.File.open(comm, path, "r", hints=own).close())
    res["bad_realms"] = outcome(
        lambda: strataio.File.open(comm, path, "r", hints={"strataio_realms": "nope"})
    )
    # more realm cache than the node has fails at open on every rank (only aggregators ask
    # for the memory: an allocation failing on one rank alone left the others waiting in it)
    huge = {"romio_cb_pfr": "enable", "strataio_realm_cache": str(2**62)}
    res["realm_cache_too_large"] = outcome(lambda: strataio.File.open(comm, path, "r", hints=huge))
    # two aggregators on this node, each cache fitting alone and both together not
    half = comm.bcast(memory_to_share() // 2 + (64 << 20) if rank == 0 else None)
    both = {"romio_cb_pfr": "enable", "cb_config_list": "*:*", "strataio_realm_cache": str(half)}
    res["realm_caches_too_large_on_a_node"] = outcome(
        lambda: strataio.File.open(comm, path, "r", hints=both)
    )
    # refused before open creates or cuts a file: "w" leaves its bytes, "x" creates none
    before = os.path.getsize(path)
    never = os.path.join(workdir, "never.bin")
    res["realm_cache_too_large_w"] = outcome(
        lambda: strataio.File.open(comm, path, "w", hints=huge)
    )
    res["realm_cache_too_large_x"] = outcome(
        lambda: strataio.File.open(comm, never, "x", hints=huge)
    )
    kept = os.path.getsize(path) == before and not os.path.exists(never)
    res["realm_cache_too_large_files_kept"] = "ok" if kept else "changed"
    res["open_directory"] = outcome(lambda: strataio.File.open(comm, workdir, "r"))
    with strataio.File.open(comm, path, "r") as h:
        # a failure that is not a StrataError (on rank 1) still reaches every rank
        res["set_view_not_strata"] = outcome(lambda: h.set_view(BadIndex() if rank == 1 else 0))
        switch = {"romio_cb_read": "enable" if rank == 0 else "disable"}
        res["view_hints_differ"] = outcome(lambda: h.set_view(0, MPI.BYTE, info=switch))
        h.set_view(0, MPI.BYTE, info={"romio_cb_read": "enable"})
        back = np.zeros(64 * nprocs, dtype=np.uint8)
        h.read_all(back)
        ok = h.hints["romio_cb_read"] == "enable" and h.last_path == "two-phase"
        res["view_hints_apply"] = "ok" if ok and np.array_equal(back, expect) else "bad"

    # a collective call that chose independent access: one rank's I/O failure raises on
    # every rank (no rank returns as if it had succeeded), and the next call is in step
    alone = {"romio_cb_write": "disable", "romio_cb_read": "disable"}
    with strataio.File.open(comm, path, "r+", hints=alone) as h:
        saved = {}
        if rank == 1 and h.driver is not None:

            def broken(*args: object, **kwargs: object) -> None:
                raise OSError(errno.EIO, "Input/output error")

            for name in ("pwrite", "writev", "pread", "readv", "read_mapped"):
                saved[name] = getattr(h.driver, name)
                setattr(h.driver, name, broken)
        eight = np.full(8, rank, dtype=np.uint8)
        res["independent_write_fails_on_one_rank"] = outcome(
            lambda: h.write_at_all(rank * 8, eight)
        )
        res["independent_read_fails_on_one_rank"] = outcome(lambda: h.read_at_all(0, eight))
        for name, method in saved.items():
            setattr(h.driver, name, method)
        h.write_at_all(rank * 8, np.full(8, rank + 1, dtype=np.uint8))
        res["independent_in_step_after"] = h.last_path

    # a close that fails on one rank raises on every rank, and the next open is in step
    failing = strataio.File.open(comm, path, "r")
    if rank == 1 and failing.driver is not None:
        real_close = failing.driver.close

        def broken_close() -> None:
            real_close()
            raise OSError(errno.EIO, "close failed")

        failing.driver.close = broken_close
    res["close_fails_on_one_rank"] = outcome(failing.close)

    # MODE_DELETE_ON_CLOSE: the file is gone on every rank once close returns (rank 0 deletes
    # it before the others leave), and a delete that fails raises on every rank
    doomed = os.path.join(workdir, "doomed.bin")
    amode = MPI.MODE_RDWR | MPI.MODE_CREATE | MPI.MODE_DELETE_ON_CLOSE
    left = 0
    for _ in range(20):
        with strataio.File.open(comm, doomed, amode) as d:
            d.write_at_all(rank * 8, np.zeros(8, dtype=np.uint8))
        left += os.path.exists(doomed)
    res["delete_on_close_gone_everywhere"] = "ok" if left == 0 else f"left {left} times"
    d = strataio.File.open(comm, doomed, amode)
    real_unlink = os.unlink
    if rank == 0:

        def refused_unlink(p: str) -> None:
            raise OSError(errno.EROFS, "Read-only file system", p)

        os.unlink = refused_unlink
    try:
        res["delete_on_close_fails"] = outcome(d.close)
    finally:
        os.unlink = real_unlink
    comm.Barrier()
    if rank == 0:
        os.unlink(doomed)

    # still in step: a collective round trip works after all of the above
    with strataio.File.open(comm, path, "r+") as g:
        g.write_at_all(rank * 8, np.full(8, 9, dtype=np.uint8))
        got = np.zeros(8, dtype=np.uint8)
        g.read_at_all(rank * 8, got)
        res["round_trip_after_errors"] = "ok" if (got == 9).all() else "bad"

    everyone = comm.gather(res, root=0)
    if rank == 0:
        merged = {k: [r[k] for r in everyone] for k in res}
        print(json.dumps(merged))


if __name__ == "__main__":
    main(sys.argv[1])
