"""Run under ``mpiexec -n N``: collective Dataset reads and writes against a numpy oracle.

``collective_dataset.py DIR SEED ROUNDS``: every rank draws the same random sequence (so
every rank knows every rank's selection and data, and keeps the oracle), then per round
each rank writes its own random section (or None) with ``write_all`` and reads another
with ``read_all``; the oracle applies the writes in rank order (the highest rank wins where
sections overlap). Fixed cases: every rank writing a piece of one chunk, every rank reading
the same chunks (each read from storage once, counted), errors on one rank raising on every
rank with nothing written, a corrupted chunk, and a Session's tiered dataset. Prints ``ok``
on rank 0 when every check passed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
from collective_checks import check, raises_everywhere, random_selection, write_then_read
from mpi4py import MPI

import strataio
from strataio.arrays.dataset import Dataset
from strataio.arrays.store import CountingChunkStore
from strataio.errors import (
    ArgumentError,
    ChecksumError,
    CodecError,
    DtypeMismatchError,
    ReadOnlyError,
    SelectionError,
    ShapeMismatchError,
    StrataError,
)
from strataio.storage.posix import PosixBackend
from strataio.tiers.tier import Tier, TierSet

comm = MPI.COMM_WORLD
rank, nprocs = comm.Get_rank(), comm.Get_size()
root = Path(sys.argv[1])
seed, rounds = int(sys.argv[2]), int(sys.argv[3])


def random_rounds(ds: Dataset, oracle: np.ndarray, rng: np.random.Generator, what: str) -> None:
    for r in range(rounds):
        sels = [random_selection(rng, ds.shape) for _ in range(nprocs)]
        datas = []
        for sel in sels:
            shape = () if sel is None else oracle[sel].shape
            datas.append(rng.integers(-1000, 1000, size=shape).astype(ds.dtype))
        datas = [d if s is not None else None for s, d in zip(sels, datas)]
        read, got, want = write_then_read(ds, oracle, rng, sels, datas)
        ok = got is None if want is None else np.array_equal(np.asarray(got), want)
        check(ok, f"{what} round {r}: read {read} after writes {sels}")
    check(np.array_equal(ds[...], oracle), f"{what}: whole array after {rounds} rounds")


rng = np.random.default_rng(seed)

# ---- random rounds on plain datasets of several ranks and codecs
for case, codec in enumerate([None, "crc32c", "zstd"]):
    nd = int(rng.integers(1, 4))
    shape = tuple(int(x) for x in rng.integers(1, 13, size=nd))
    chunks = tuple(int(x) for x in rng.integers(1, 6, size=nd))
    dtype = ["<i4", ">f8", "<u2"][case]
    ds = strataio.create_dataset(
        root / f"rand{case}", shape, dtype, chunks, codec=codec, fill_value=7, comm=comm
    )
    oracle = np.full(shape, 7, dtype=dtype)
    random_rounds(ds, oracle, rng, f"plain {shape}/{chunks} {codec}")
    ds.close()
    again = strataio.open_dataset(root / f"rand{case}", comm=comm)
    check(np.array_equal(again.read_all(...), oracle), "reopened read_all(...)")
    again.close()

# ---- every rank writes a piece of one chunk; every rank reads all of it
ds = strataio.create_dataset(root / "one", (4 * nprocs, 6), "<i8", (4 * nprocs, 6), comm=comm)
mine = np.full((4, 6), rank + 1, dtype="<i8")
ds.write_all(np.s_[4 * rank : 4 * rank + 4, :], mine)
want = np.repeat(np.arange(1, nprocs + 1), 4)[:, None] * np.ones((1, 6), dtype="<i8")
check(np.array_equal(ds.read_all(...), want), "pieces of one chunk")
check(len(os.listdir(root / "one" / "c")) == 1, "one chunk stored")
# half-covered chunk: pieces leave holes, the old values there survive (read-modify-write)
ds.write_all(*((np.s_[4 * rank, 1:3], -rank) if rank % 2 == 0 else (None, None)))
for r in range(0, nprocs, 2):
    want[4 * r, 1:3] = -r
check(np.array_equal(ds.read_all(...), want), "partial pieces of one chunk")

# ---- a shared chunk is read from storage once: count the chunks each rank reads
counted = Dataset(CountingChunkStore(ds.store), ds.meta, "r", name="counted", comm=comm)
counted.clear_cache()
got = counted.read_all(np.s_[:, rank % 6 : rank % 6 + 1])
check(np.array_equal(got, want[:, rank % 6 : rank % 6 + 1]), "column read")
check(comm.allreduce(counted.store.reads) == 1, "the shared chunk read once in all")
wide = strataio.create_dataset(root / "wide", (8, 8 * nprocs), "<f4", (4, 8), comm=comm)
wide.write_all(np.s_[:, 8 * rank : 8 * rank + 8], rank)
counted = Dataset(CountingChunkStore(wide.store), wide.meta, "r", name="wide", comm=comm)
counted.clear_cache()
sub = np.s_[1:7, 4 * rank + 2 : 4 * rank + 7]  # overlapping covers, every chunk shared by <= 2
got = counted.read_all(sub)
oracle = np.repeat(np.arange(nprocs, dtype="<f4"), 8)[None, :] * np.ones((8, 1), "<f4")
check(np.array_equal(got, oracle[sub]), "overlapping covers")
touched = {
    (a, b)
    for r in range(nprocs)
    for a in (0, 1)
    for b in range((4 * r + 2) // 8, (4 * r + 6) // 8 + 1)
}
check(comm.allreduce(counted.store.reads) == len(touched), "each chunk read once")

# ---- errors on one rank: every rank raises, nothing is written, nobody hangs
before = ds.read_all(...)
bad = np.s_[0 : 4 * nprocs + 1] if rank == nprocs - 1 else np.s_[0:1]
check(raises_everywhere(lambda: ds.write_all(bad, 5), SelectionError), "bad selection")
check(raises_everywhere(lambda: ds.read_all(bad), SelectionError), "bad read selection")
data = np.zeros((1, 5), "<i8") if rank == 0 else np.zeros((1, 6), "<i8")
check(
    raises_everywhere(lambda: ds.write_all(np.s_[rank : rank + 1], data), ShapeMismatchError),
    "shape mismatch",
)
data = np.array([["x"] * 6]) if rank == nprocs - 1 else np.zeros((1, 6), "<i8")
check(
    raises_everywhere(lambda: ds.write_all(np.s_[rank : rank + 1], data), DtypeMismatchError),
    "dtype mismatch",
)
data = None if rank == nprocs - 1 else np.zeros((1, 6), "<i8")
check(
    raises_everywhere(lambda: ds.write_all(np.s_[rank : rank + 1], data), ArgumentError),
    "a selection without data",
)
sel = None if rank == nprocs - 1 else np.s_[rank : rank + 1]
check(
    raises_everywhere(lambda: ds.write_all(sel, np.ones((1, 6), "<i8")), ArgumentError),
    "data without a selection",
)
check(np.array_equal(ds.read_all(...), before), "nothing written by failed calls")
ro = strataio.open_dataset(root / "one", "r", comm=comm)
check(raises_everywhere(lambda: ro.write_all(None), ReadOnlyError), "read-only")
ro.close()
last = rank == nprocs - 1
bad_name = root / ("missing" if last else "one")
check(raises_everywhere(lambda: strataio.open_dataset(bad_name, comm=comm), StrataError), "open")
check(
    raises_everywhere(
        lambda: strataio.create_dataset(
            root / "bad", (4,), "i4", (0,) if last else (2,), comm=comm
        ),
        StrataError,
    ),
    "create with a bad argument on one rank",
)
check(not (root / "bad" / "zarr.json").exists(), "nothing created")
for what, args in (
    ("chunks", ((4,), "i4", (4,) if last else (2,))),
    ("dtype", ((4,), "f8" if last else "i4", (2,))),
):
    if nprocs == 1:
        break  # (one rank cannot differ from itself)
    check(
        raises_everywhere(
            lambda a=args: strataio.create_dataset(root / "differ", *a, comm=comm), ArgumentError
        ),
        f"create with another {what} on one rank",
    )
check(not (root / "differ" / "zarr.json").exists(), "nothing created where ranks differ")
check(
    raises_everywhere(
        lambda: strataio.create_dataset(root / "one", (2,), "i4", comm=comm), StrataError
    ),
    "create over an existing dataset",
)

# ---- checksums: a corrupted shared chunk raises on every rank
if rank == 0:
    path = root / "one" / "c" / "0" / "0"
    raw = bytearray(path.read_bytes())
    raw[3] ^= 0xFF
    path.write_bytes(bytes(raw))
comm.Barrier()
ds.clear_cache()
check(raises_everywhere(lambda: ds.read_all(np.s_[rank]), CodecError), "corrupted chunk")
ds.close()

# ---- a Session's tiered datasets
tiers = TierSet(
    [
        Tier("disk", PosixBackend(root / "disk"), "localdisk", order=0),
        Tier("tape", PosixBackend(root / "tape"), "remotetape", order=1),
    ]
)
with strataio.Session(tiers=tiers, catalog=root / "cat.db", comm=comm) as s:
    shape = (6, 5 * nprocs)
    tds = s.create_dataset("tiered", shape, "<i4", (4, 3), hint="AUTO", codec="crc32c")
    oracle = np.zeros(shape, dtype="<i4")
    random_rounds(tds, oracle, rng, "tiered")
    tds.close()
    tds = s.open_dataset("tiered", "r+")
    check(np.array_equal(tds.read_all(...), oracle), "tiered reopened")
    check(
        raises_everywhere(lambda: s.open_dataset("tiered", "w" if last else "r"), StrataError),
        "session open with a bad mode on one rank",
    )
    check(
        raises_everywhere(
            lambda: s.create_dataset("t2", (4,), "i4", (2,), hint="NOPE" if last else "AUTO"),
            StrataError,
        ),
        "session create with a bad hint on one rank",
    )
    # a chunk whose bytes differ from the catalogued checksum is refused
    tds.close()
    if rank == 0:
        for tier in ("disk", "tape"):
            p = root / tier / "tiered" / "c" / "0" / "0"
            if p.exists():
                raw = bytearray(p.read_bytes())
                raw[0] ^= 0xFF
                p.write_bytes(bytes(raw))
    comm.Barrier()
    tds = s.open_dataset("tiered")
    check(raises_everywhere(lambda: tds.read_all(np.s_[0:1, 0:1]), ChecksumError), "tiered check")
    tds.close()

if rank == 0:
    print("ok", flush=True)
