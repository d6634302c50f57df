"""Run under ``mpiexec -n N``: collective writes and reads of sharded datasets against a numpy
oracle, read back by zarr-python and TensorStore.

``collective_shards.py DIR SEED ROUNDS``: every rank draws the same random sequence, so every
rank knows every rank's selection and data and keeps the oracle. Random rounds of
``write_all`` / ``read_all`` over several codecs, shapes and pipelined groups (the
communicator split in two); each rank's run in a shard starts on the alignment; a slab
decomposition as checkpoints write; errors on one rank (one that cannot open the call's lock
file included) raise on every rank with nothing written; a corrupt shard index raises on every rank; while a write runs, fsck's judge finds
its temporary shard file and its lock file live and deletes nothing, and no call leaves
either. Prints ``ok`` on rank 0.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import numpy as np
import tensorstore as ts
import zarr
from collective_checks import check, raises_everywhere, random_selection
from mpi4py import MPI

import strataio
from strataio.arrays import collective_shards
from strataio.arrays.shard_parts import CallLock, call_locks, judge, part_files
from strataio.arrays.sharding import EMPTY, ShardCodec
from strataio.errors import (
    BackendError,
    ChunkChangedError,
    CodecError,
    HintError,
    SelectionError,
    ShapeMismatchError,
)
from strataio.storage.posix import LeftoverState

comm = MPI.COMM_WORLD
rank, nprocs = comm.Get_rank(), comm.Get_size()
root = Path(sys.argv[1])
seed, rounds = int(sys.argv[2]), int(sys.argv[3])


def peers_agree(path: Path, oracle: np.ndarray) -> bool:
    """zarr-python and TensorStore read ``oracle`` (checked on rank 0 only)."""
    if rank != 0:
        return True
    z = zarr.open_array(str(path), mode="r")[...]
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(path)}}
    t = ts.open(spec, read=True).result().read().result()
    return np.array_equal(z, oracle) and np.array_equal(t, oracle)


def digest(path: Path) -> str:
    h = hashlib.sha256()
    for dirpath, _, files in sorted(os.walk(path)):
        for f in sorted(files):
            h.update(f.encode())
            h.update((Path(dirpath) / f).read_bytes())
    return h.hexdigest()


rng = np.random.default_rng(seed)
cases = [("zstd", "<i4", 1), ("lz4", ">f8", 2), ("blosc", "<u2", 1), ("zstd+crc32c", "<f4", 2)]
for case, (codec, dtype, groups) in enumerate(cases):
    nd = int(rng.integers(1, 4))
    shape = tuple(int(x) for x in rng.integers(1, 14, size=nd))
    inner = tuple(int(x) for x in rng.integers(1, 4, size=nd))
    shards = tuple(c * int(rng.integers(1, 4)) for c in inner)
    path = root / f"rand{case}"
    ds = strataio.create_dataset(
        path, shape, dtype, inner, shards=shards, codec=codec, fill_value=7, comm=comm
    )
    oracle = np.full(shape, 7, dtype=dtype)
    hints = {"strataio_pipeline_groups": groups, "strataio_shard_alignment": 512}
    what = f"{shape} inner {inner} shards {shards} {codec} groups {groups}"
    for r in range(rounds):
        sels = [random_selection(rng, shape) for _ in range(nprocs)]
        datas = []
        for sel in sels:
            piece = () if sel is None else oracle[sel].shape
            datas.append(rng.integers(-1000, 1000, size=piece).astype(dtype))
        ds.write_all(sels[rank], datas[rank] if sels[rank] is not None else None, hints=hints)
        for sel, data in zip(sels, datas):
            if sel is not None:
                oracle[sel] = data
        reads = [random_selection(rng, shape) for _ in range(nprocs)]
        got = ds.read_all(reads[rank])
        want = None if reads[rank] is None else oracle[reads[rank]]
        ok = got is None if want is None else np.array_equal(np.asarray(got), want)
        check(ok, f"{what} round {r}: read {reads[rank]} after writes {sels}")
    check(np.array_equal(ds[...], oracle), f"{what}: serial read")
    check(peers_agree(path, oracle), f"{what}: zarr-python and TensorStore read the oracle")
    ds.close()

# ---- slabs, as a checkpoint writes them: every rank's run starts on the alignment
shape, inner, shards = (16 * nprocs, 40), (4, 8), (16 * nprocs, 40)
ds = strataio.create_dataset(
    root / "slabs", shape, "<f8", inner, shards=shards, codec="zstd", comm=comm
)
mine = np.add.outer(np.arange(16) + 16 * rank, np.arange(40) / 8).astype("<f8")
mine[:, 30:] = 0  # inner chunks of fill values are not stored
ds.write_all(np.s_[16 * rank : 16 * rank + 16], mine, hints={"strataio_pipeline_groups": 2})
oracle = np.concatenate(comm.allgather(mine))
check(np.array_equal(ds.read_all(...), oracle), "slabs read back")
check(peers_agree(root / "slabs", oracle), "slabs read by zarr-python and TensorStore")
if rank == 0:
    codec = ds.codecs
    assert isinstance(codec, ShardCodec)
    raw = (root / "slabs" / "c" / "0" / "0").read_bytes()
    index = codec.index_of(memoryview(raw), len(raw))
    stored = index[index[:, 0] != EMPTY]
    order = np.argsort(stored[:, 0])
    start, end = stored[order, 0].astype(np.int64), (stored[order].sum(axis=1)).astype(np.int64)
    gaps = start[1:] != end[:-1]
    aligned = bool(np.all(start[1:][gaps] % 4096 == 0)) and start[0] == 0
    runs = int(gaps.sum()) + 1
    absent = int((index[:, 0] == EMPTY).sum())
else:
    aligned, runs, absent = True, nprocs, 4 * nprocs
check(aligned, "each rank's run starts on a 4 KiB boundary")
check(runs == nprocs, f"one run per rank ({runs})")
check(absent == 4 * nprocs, "fill inner chunks not stored")

# ---- the shard's temporary file, which every rank wrote its run to, is held until the
# rename by the call's lock: a judge (fsck --repair) on every rank while the indexes are
# written deletes nothing
write_indexes, judged = collective_shards._write_indexes, []
folder = str(root / "slabs")


def judging_write_indexes(comm_, store, codec_, rows, keys, temps, *rest):
    (lock,) = call_locks(folder)
    judged.extend(judge(f, folder, remove=True) for f in [lock, *temps])
    comm_.Barrier()  # (every rank has judged before the leader renames)
    write_indexes(comm_, store, codec_, rows, keys, temps, *rest)


collective_shards._write_indexes = judging_write_indexes
try:
    ds.write_all(np.s_[16 * rank : 16 * rank + 16], mine + 1)
finally:
    collective_shards._write_indexes = write_indexes
check(judged == [LeftoverState.LIVE] * 2, f"the running write's files are live ({judged})")
check(np.array_equal(ds.read_all(...), oracle + 1), "slabs read back after the judged write")

# ---- errors on one rank: every rank raises, nothing is written, nobody hangs
before = digest(root / "slabs")
last = rank == nprocs - 1
bad = np.s_[0 : 16 * nprocs + 1] if last else np.s_[0:1]
check(raises_everywhere(lambda: ds.write_all(bad, 5.0), SelectionError), "bad selection")
data = np.zeros((1, 39)) if last else np.zeros((1, 40))
check(
    raises_everywhere(lambda: ds.write_all(np.s_[rank : rank + 1], data), ShapeMismatchError),
    "shape mismatch",
)
check(
    raises_everywhere(
        lambda: ds.write_all(
            np.s_[rank], 1.0, hints={"strataio_shard_alignment": 0 if last else 4096}
        ),
        HintError,
    ),
    "bad hint",
)
if nprocs > 1:
    check(
        raises_everywhere(
            lambda: ds.write_all(np.s_[rank], 1.0, hints={"strataio_pipeline_groups": 1 + last}),
            HintError,
        ),
        "groups that differ between ranks",
    )
    join = CallLock.join
    if last:  # (the lock file cannot be opened there)

        def refused(path):
            raise PermissionError(13, "Permission denied", path)

        CallLock.join = refused
    try:
        check(
            raises_everywhere(lambda: ds.write_all(np.s_[rank], 1.0), BackendError),
            "a rank that cannot hold the call's lock",
        )
    finally:
        CallLock.join = join
comm.Barrier()
check(digest(root / "slabs") == before, "nothing written by failed calls")

# ---- a corrupt shard index raises on every rank
if rank == 0:
    shard = root / "slabs" / "c" / "0" / "0"
    raw = bytearray(shard.read_bytes())
    raw[-7] ^= 0x10
    shard.write_bytes(bytes(raw))
comm.Barrier()
check(raises_everywhere(lambda: ds.read_all(np.s_[rank]), CodecError), "corrupt index")
ds.close()
comm.Barrier()
check(rank != 0 or not list(part_files(str(root))), "no temporary shard file left")
check(not list(call_locks(folder)), "no lock file left")

# ---- a shard another job replaces (renames over) after its leader (rank 0) read its index
# and before another rank reads its inner chunks: every rank reads again, one version; a
# shard replaced at every try raises ChunkChangedError on every rank
if nprocs > 1:
    path = root / "replaced"
    rng2 = np.random.default_rng(9)
    v1, v2 = rng2.random((4 * nprocs, 8)), rng2.random((4 * nprocs, 8)) + 10
    v1[:, :4] = 1.0  # (compressible in v1, not in v2: the inner chunks' offsets move)
    ds = strataio.create_dataset(
        path, v1.shape, "f8", (4, 4), shards=v1.shape, codec="blosc", comm=comm
    )
    mine = np.s_[4 * rank : 4 * rank + 4]
    ds.write_all(mine, v1[mine])
    other = strataio.open_dataset(path, "r+") if last else None
    real, rewrites, limit = ds._versioned_span_reader, [], 1

    def replacing(key, offset, buf, **kw):
        # (on the last rank, which reads inner chunks of the shard rank 0 leads, only)
        if last and len(rewrites) < limit:
            other[...] = (v1, v2)[len(rewrites) % 2 == 0]
            rewrites.append(offset)
        return real(key, offset, buf, **kw)

    ds._versioned_span_reader = replacing
    check(np.array_equal(ds.read_all(mine), v2[mine]), "a shard replaced mid-read read anew")
    limit = 1 + 8
    check(raises_everywhere(lambda: ds.read_all(mine), ChunkChangedError), "replaced each try")
    check(not last or len(rewrites) == 1 + 8, f"eight tries ({len(rewrites)} rewrites)")
    ds._versioned_span_reader = real
    check(np.array_equal(ds.read_all(mine), v2[mine]), "the last rewrite's values")
    ds.close()

if rank == 0:
    print("ok")
