"""Two-phase I/O's ways of moving pieces, against a numpy oracle: in place (a rank's pieces back
to back in its buffer), through derived datatypes (pieces of 1 KiB and more land at their file
positions in the aggregator's buffer, or in the caller's memory), packed (small pieces), and the
read-modify-write of windows with holes, before and past the end of the file. Rank 0 prints one
JSON list of the cases that failed (empty when all pass)."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
from mpi4py import MPI

import strataio


def main(workdir: str) -> None:
    comm = MPI.COMM_WORLD
    rank, nprocs = comm.Get_rank(), comm.Get_size()
    block = 10_000
    rng = np.random.default_rng(7)
    whole = rng.integers(0, 256, block * nprocs, dtype=np.uint8)  # the same on every rank
    mine = whole[rank * block : (rank + 1) * block].copy()
    every_other = MPI.BYTE.Create_vector(block, 1, 2).Commit()  # fine gaps: a packed stream
    spread = np.zeros(2 * block, dtype=np.uint8)
    spread[::2] = mine
    half = block // 2  # one gap: pieces straight from memory, not back to back, so copied
    two_blocks = MPI.BYTE.Create_vector(2, half, half + 7).Commit()
    split = np.zeros(block + 7, dtype=np.uint8)
    split[:half], split[half + 7 :] = mine[:half], mine[half:]
    failed = []
    # small windows: many iterations, with and without the aggregators' background I/O thread
    for cb_size, overlap in ((4096, "enable"), (4096, "disable"), (1 << 20, "automatic")):
        for cb_nodes in (1, nprocs):
            hints = {
                "romio_cb_write": "enable",
                "romio_cb_read": "enable",
                "cb_buffer_size": str(cb_size),
                "cb_nodes": str(cb_nodes),
                "cb_config_list": "*:*",  # (one node: several aggregators only so)
                "strataio_cb_overlap": overlap,
            }
            case = f"cb_buffer_size={cb_size} cb_nodes={cb_nodes} overlap={overlap}"
            for name, spec in (
                ("contiguous", mine),
                ("strided", [spread, 1, every_other]),
                ("split", [split, 1, two_blocks]),
            ):
                path = os.path.join(workdir, f"{name}.{cb_size}.{cb_nodes}.bin")
                with strataio.File.open(comm, path, "w", hints=hints) as f:
                    f.write_at_all(rank * block, spec)
                    path_used = f.last_path
                comm.Barrier()
                on_disk = np.fromfile(path, dtype=np.uint8)
                if path_used != "two-phase" or not np.array_equal(on_disk, whole):
                    failed.append(f"write {name} {case}")
                with strataio.File.open(comm, path, "r", hints=hints) as f:
                    got = np.zeros(block, dtype=np.uint8)
                    f.read_at_all(rank * block, got)  # back to back: received in place
                    apart = np.zeros_like(split)
                    f.read_at_all(rank * block, [apart, 1, two_blocks])  # copied out
                    everything = np.zeros(block * nprocs, dtype=np.uint8)
                    f.read_at_all(0, everything)  # every rank reads all: pieces overlap
                    beyond = np.full(block, 9, dtype=np.uint8)
                    f.read_at_all(block * nprocs - block // 2, beyond)  # half past the end
                if not np.array_equal(got, mine):
                    failed.append(f"read own block {case} ({name} file)")
                if not np.array_equal(apart, split):
                    failed.append(f"read own block split {case} ({name} file)")
                if not np.array_equal(everything, whole):
                    failed.append(f"read everything {case} ({name} file)")
                tail = np.concatenate((whole[-(block // 2) :], np.zeros(block // 2, np.uint8)))
                if not np.array_equal(beyond, tail):
                    failed.append(f"read past the end {case} ({name} file)")
        # Rank 0 alone writes two runs far apart (no sieving across the gap): the aggregators'
        # pieces are in file order, so each run goes straight from the exchanged buffer.
        gap = 100_000
        runs = MPI.BYTE.Create_hindexed([half, half], [0, gap]).Commit()
        path = os.path.join(workdir, f"gapped.{cb_size}.bin")
        count = block if rank == 0 else 0
        hints = {**hints, "cb_nodes": "1"}  # one aggregator sees both runs (with 1 MiB)
        with strataio.File.open(comm, path, "w", hints=hints) as f:
            f.set_view(0, MPI.BYTE, runs)
            f.write_all([mine, count, MPI.BYTE])
        comm.Barrier()
        want = np.zeros(gap + half, dtype=np.uint8)
        want[:half], want[gap:] = whole[:half], whole[half:block]  # rank 0's block
        if not np.array_equal(np.fromfile(path, dtype=np.uint8), want):
            failed.append(f"write gapped cb_buffer_size={cb_size}")
        with strataio.File.open(comm, path, "r", hints=hints) as f:
            f.set_view(0, MPI.BYTE, runs)
            back = np.zeros(block, dtype=np.uint8)
            f.read_all([back, count, MPI.BYTE])
        if rank == 0 and not np.array_equal(back, mine):
            failed.append(f"read gapped cb_buffer_size={cb_size}")
        runs.Free()
        for cb_nodes in (1, nprocs):
            hints = {**hints, "cb_nodes": str(cb_nodes)}
            failed += _read_modify_write(comm, workdir, hints, f"{cb_size}.{overlap}")
    every_other.Free()
    two_blocks.Free()
    failed = sorted(set(sum(comm.allgather(failed), [])))
    if rank == 0:
        print(json.dumps(failed))


def _read_modify_write(comm: MPI.Comm, workdir: str, hints: dict, case: str) -> list[str]:
    """Pieces of unequal lengths (1500 / 2500 bytes, moved with derived datatypes) interleaved
    across the ranks with 100-byte holes, written over a file that ends in the middle of them:
    holes before the old end keep their bytes, holes past it read as zeros."""
    rank, nprocs = comm.Get_rank(), comm.Get_size()
    npieces, hole, old_size = 12, 100, 20_000
    lengths = np.tile([1500, 2500], npieces // 2)
    slot = int(lengths.max()) + hole
    offsets = (np.arange(npieces) * nprocs + rank) * slot
    data = np.random.default_rng(rank).integers(1, 256, int(lengths.sum()), dtype=np.uint8)
    path = os.path.join(workdir, f"rmw.{case}.{hints['cb_nodes']}.bin")
    if rank == 0:
        np.full(old_size, 0xAB, dtype=np.uint8).tofile(path)
    comm.Barrier()
    ftype = MPI.BYTE.Create_hindexed(lengths.tolist(), offsets.tolist()).Commit()
    with strataio.File.open(comm, path, "r+", hints=hints) as f:
        f.set_view(0, MPI.BYTE, ftype)
        f.write_all(data)
        path_used = f.last_path
    ftype.Free()
    comm.Barrier()
    every = comm.allgather((offsets, lengths, data))
    end = max(int(o[-1] + n[-1]) for o, n, _ in every)
    want = np.zeros(max(end, old_size), dtype=np.uint8)
    want[:old_size] = 0xAB
    for offs, lens, d in every:
        pos = np.concatenate(([0], np.cumsum(lens)))
        for o, n, p in zip(offs.tolist(), lens.tolist(), pos.tolist()):
            want[o : o + n] = d[p : p + n]
    got = np.fromfile(path, dtype=np.uint8)
    if path_used != "two-phase" or not np.array_equal(got, want):
        return [f"read-modify-write {case} cb_nodes={hints['cb_nodes']}"]
    return []


if __name__ == "__main__":
    main(sys.argv[1])
