"""Run under ``mpiexec -n N``: random collective Dataset writes and reads, the whole array
compared after every step with a numpy oracle through collective, serial and zarr-python
reads.

``collective_random.py DIR SEED CASES STEPS``: every rank derives the same random sequence
from SEED, so every rank knows every rank's selection and data and keeps the oracle (the
writes applied in rank order: where sections overlap the highest rank's value wins). Per
case a random dataset (1 to 3 dimensions, extents not multiples of the chunk, a random
dtype and fill value, plain or sharded, raw, checksummed or compressed, on a plain store or
a Session's tiers), then STEPS steps of ``write_all`` (random selections, maybe
overlapping, empty or None; data as an array, a scalar or of another dtype; random shard
hints) followed by ``read_all``; after each step the whole array is read with
``read_all``, by every rank on its own (``ds[...]``) and on rank 0 through a new handle and
with zarr-python. Prints ``ok`` on rank 0.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import zarr
from collective_checks import check, random_selection, write_then_read
from mpi4py import MPI

import strataio
from strataio.storage.posix import PosixBackend
from strataio.tiers.tier import Tier, TierSet

comm = MPI.COMM_WORLD
rank, nprocs = comm.Get_rank(), comm.Get_size()
root = Path(sys.argv[1])
seed, cases, steps = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])

DTYPES = ["|b1", "|i1", "<u2", ">i4", "<i8", "<f4", ">f8", "<c8"]
CODECS = [None, "crc32c", "zstd", "lz4", "blosc", "zstd+crc32c"]


def fill_for(rng: np.random.Generator, dtype: np.dtype) -> object:
    if dtype.kind == "b":
        return bool(rng.integers(0, 2))
    if dtype.kind == "f" and rng.random() < 0.3:
        return float("nan")
    if dtype.kind == "c" and rng.random() < 0.3:
        return complex(7, 1)
    return int(rng.integers(0, 3)) * 7


def random_values(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype) -> object:
    """Values for a selection of ``shape``: an array of ``dtype`` (sometimes one that casts
    to it safely), or a scalar to broadcast."""
    if dtype.kind == "b":
        arr: np.ndarray = rng.integers(0, 2, size=shape).astype(bool)
    elif dtype.kind in "iu":
        arr = rng.integers(0, 100, size=shape).astype(dtype)
    elif dtype.kind == "c":
        arr = (rng.integers(-50, 50, size=shape) + 1j * rng.integers(-5, 5, size=shape)).astype(
            dtype
        )
    else:
        arr = rng.integers(-500, 500, size=shape).astype(dtype) / 4
        if rng.random() < 0.2 and arr.size:
            arr.flat[0] = np.nan
    r = rng.random()
    if r < 0.1 and arr.size:
        return arr.flat[0].item()  # a scalar, broadcast
    if r < 0.25 and dtype.kind in "fc" and dtype.itemsize >= 8:
        # safely cast on the way in (mostly zeros: whole inner chunks of them)
        return rng.integers(0, 2, size=shape).astype("<i2")
    return arr


def same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")


def compare_whole(ds, oracle: np.ndarray, path: Path | None, what: str) -> None:
    """The whole array read collectively, serially (every rank through this handle, rank 0
    through a new one too) and by zarr-python (rank 0, where the array is a folder of its
    own) against ``oracle``."""
    got = ds.read_all(...)
    check(same(np.asarray(got), oracle), f"{what}: read_all(...)")
    ok = same(np.asarray(ds[...]), oracle)  # (every rank, independently)
    if not ok:
        print(f"rank {rank}: {what}: serial read differs", file=sys.stderr)
    if rank == 0 and path is not None:
        fresh = strataio.open_dataset(path)
        if not same(fresh[...], oracle):
            print(f"{what}: a new handle reads otherwise", file=sys.stderr)
            ok = False
        fresh.close()
        z = zarr.open_array(str(path), mode="r")[...]
        if not same(np.asarray(z), oracle):
            print(f"{what}: zarr-python reads otherwise", file=sys.stderr)
            ok = False
    check(ok, f"{what}: serial and zarr-python reads")


def run_case(ds, oracle: np.ndarray, path: Path | None, rng: np.random.Generator, what: str):
    for step in range(steps):
        sels = [random_selection(rng, ds.shape) for _ in range(nprocs)]
        datas = []
        for sel in sels:
            if sel is None:
                datas.append(None if rng.random() < 0.7 else np.zeros((0,), ds.dtype))
            else:
                datas.append(random_values(rng, oracle[sel].shape, ds.dtype))
        hints = None
        if rng.random() < 0.5:
            hints = {
                "strataio_shard_alignment": int(rng.choice([1, 7, 512, 4096])),
                "strataio_pipeline_groups": int(rng.integers(1, nprocs + 2)),
            }
        read, got, want = write_then_read(ds, oracle, rng, sels, datas, hints)
        if want is None:
            ok = got is None
        else:
            ok = same(np.asarray(got), np.asarray(want)) and np.ndim(got) == np.ndim(want)
        check(ok, f"{what} step {step}: read {read} after writes {sels}")
        compare_whole(ds, oracle, path, f"{what} step {step} (writes {sels})")


rng = np.random.default_rng(seed)
tiers = TierSet(
    [
        Tier("disk", PosixBackend(root / "disk"), "localdisk", order=0),
        Tier("tape", PosixBackend(root / "tape"), "remotetape", order=1),
    ]
)
with strataio.Session(tiers=tiers, catalog=root / "cat.db", comm=comm) as session:
    for case in range(cases):
        nd = int(rng.integers(1, 4))
        inner = tuple(int(x) for x in rng.integers(1, 5, size=nd))
        sharded = rng.random() < 0.5
        shards = tuple(c * int(rng.integers(1, 4)) for c in inner) if sharded else None
        outer = shards or inner
        # extents not multiples of the chunk (nor of the shard)
        shape = tuple(int(o * rng.integers(1, 3) + rng.integers(1, o + 1)) for o in outer)
        shape = tuple(s if s % o else s + 1 for s, o in zip(shape, outer))
        dtype = np.dtype(DTYPES[int(rng.integers(len(DTYPES)))])
        codec = CODECS[int(rng.integers(len(CODECS)))]
        fill = fill_for(rng, dtype)
        tiered = not sharded and rng.random() < 0.3  # (a Session's datasets are unsharded)
        what = (
            f"case {case}: {shape} {dtype.str} chunks {inner} shards {shards} codec {codec} "
            f"fill {fill} {'tiered' if tiered else 'plain'}"
        )
        oracle = np.full(shape, fill, dtype=dtype)
        if tiered:
            ds = session.create_dataset(
                f"t{case}", shape, dtype, inner, hint="AUTO", codec=codec, fill_value=fill
            )
            path = None
        else:
            path = root / f"a{case}"
            ds = strataio.create_dataset(
                path, shape, dtype, inner, codec=codec, fill_value=fill, shards=shards, comm=comm
            )
        run_case(ds, oracle, path, rng, what)
        ds.close()

if rank == 0:
    print("ok", flush=True)
