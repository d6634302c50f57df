"""Compressed collective writes (No et al., §4 and Figure 5): bandwidth of ``write_all`` into a
sharded dataset at compression ratios 1:1, 2:1, 4:1 and 8:1, against the same write
uncompressed, on local disk and on a shaped device.

Run under ``mpiexec -n N python -m strataio.bench.compress ARGS``; ``strataio bench compress``
launches it. Each rank writes one slab of rows of a ``uint8`` array (``--per-rank`` bytes);
shards span every rank's slab (a shard is ``N * rows`` × 4096 bytes, inner chunks 64 × 4096),
so each shard's layout comes from the prefix sum over all ranks. Data of a controlled
compressibility: in every row of every inner chunk the first ``1/ratio`` of the bytes are
random and the rest zeros, so zstd stores about ``1/ratio`` of them (the achieved ratio is
measured and reported). The baseline, *uncompressed*, is the same write with raw inner chunks.

Contenders per storage: ``plain`` (one offset chain) and ``pipelined`` (the communicator split
into two groups, each with its own chain, chained to each other). Storage: ``local`` (the
POSIX driver, on the work directory's disk) and ``shaped`` (the shaped driver of :mod:`strataio.collective.driver`: a device of
``--bandwidth`` bytes per second shared by the ranks, each rank's driver given
``bandwidth / N``). A call's time is the slowest rank's (barrier, then the call), the figure
is logical bytes / time, median over ``--repeat`` rounds; rounds go round-robin over the
cases after one untimed round. As in the other benchmarks, timed writes end in the page
cache (no fsync: a dataset's writes are durable after ``flush``), alike for every case.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from mpi4py import MPI

import strataio
from strataio.arrays.codecs import normalize_codecs
from strataio.errors import ArgumentError

RATIOS = (1, 2, 4, 8)
#: inner chunk and shard width in bytes (columns of the uint8 array), inner chunk rows
_WIDTH = 4096
_INNER_ROWS = 64
#: the default codec: LZ4 (inside blosc), the fastest of numcodecs here, as the paper picked its
#: fastest codec (lzrw3)
CODEC = "lz4:1"


def codec_spec(text: str) -> list[dict[str, Any]]:
    """``NAME[:LEVEL]`` (zstd, lz4, blosc) as Zarr v3 codec entries, checked as a dataset
    checks them: an unknown name or a level that is no integer raises :class:`ArgumentError`,
    a level out of the codec's range :class:`CodecError`, naming the codec and the field."""
    name, _, level_text = text.partition(":")
    try:
        level = int(level_text or 1)
    except ValueError:
        raise ArgumentError(f"codec {text!r}: level {level_text!r} is not an integer") from None
    if name == "zstd":
        spec = [{"name": "zstd", "configuration": {"level": level}}]
    elif name in ("lz4", "blosc"):
        cname = "lz4" if name == "lz4" else "zstd"
        cfg = {"cname": cname, "clevel": level, "shuffle": "noshuffle"}
        spec = [{"name": "blosc", "configuration": cfg}]
    else:
        raise ArgumentError(f"unknown codec {text!r}: zstd[:LEVEL], lz4[:LEVEL] or blosc[:LEVEL]")
    normalize_codecs(spec, np.dtype(np.uint8))
    return spec


def slab(rank: int, rows: int, cols: int, ratio: int, seed: int) -> np.ndarray:
    """This rank's rows: per row of each ``_WIDTH``-byte column block, the first
    ``_WIDTH / ratio`` bytes random, the rest zeros (ratio 0: raw random data)."""
    rng = np.random.default_rng(seed + rank)
    out = np.zeros((rows, cols), dtype=np.uint8)
    keep = _WIDTH // max(ratio, 1)
    view = out.reshape(rows, cols // _WIDTH, _WIDTH)
    view[:, :, :keep] = rng.integers(0, 256, size=(rows, cols // _WIDTH, keep), dtype=np.uint8)
    return out


def stored_bytes(path: Path) -> int:
    """Bytes the dataset's shards hold (holes of the alignment excluded)."""
    return sum(p.stat().st_blocks * 512 for p in (path / "c").rglob("*") if p.is_file())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-rank", type=int, default=16 << 20)
    ap.add_argument("--cols", type=int, default=8 * _WIDTH)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--bandwidth", type=float, default=200e6)
    ap.add_argument("--storages", default="local,shaped")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--codec", default=CODEC)
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    rank, nprocs = comm.Get_rank(), comm.Get_size()
    cols = args.cols
    rows = max(_INNER_ROWS, args.per_rank // cols // _INNER_ROWS * _INNER_ROWS)
    shape = (rows * nprocs, cols)
    total = shape[0] * shape[1]
    root = None
    if rank == 0:
        root = tempfile.mkdtemp(prefix="strataio-bench-compress-", dir=args.workdir)
    root = Path(comm.bcast(root, root=0))
    storages = [s for s in args.storages.split(",") if s]
    groups = [("plain", 1)] + ([("pipelined", 2)] if nprocs > 1 else [])
    cases = [
        (storage, label, g, ratio)
        for storage in storages
        for label, g in groups
        for ratio in (0, *RATIOS)
    ]
    data = {ratio: slab(rank, rows, cols, ratio, args.seed) for ratio in (0, *RATIOS)}
    datasets = {}
    for ratio in (0, *RATIOS):
        codec = None if ratio == 0 else codec_spec(args.codec)
        datasets[ratio] = strataio.create_dataset(
            root / f"r{ratio}", shape, "u1", (_INNER_ROWS, _WIDTH), shards=(shape[0], _WIDTH),
            codec=codec, comm=comm,
        )  # fmt: skip
    times: dict[tuple[Any, ...], list[float]] = {c: [] for c in cases}
    mine = np.s_[rank * rows : (rank + 1) * rows]
    try:
        for rnd in range(args.repeat + 1):
            for case in cases:
                storage, _, g, ratio = case
                hints: dict[str, Any] = {"strataio_pipeline_groups": g}
                if storage == "shaped":
                    hints.update(
                        strataio_driver="shaped",
                        strataio_driver_bandwidth=int(args.bandwidth / nprocs),
                    )
                comm.Barrier()
                t0 = time.perf_counter()
                datasets[ratio].write_all(mine, data[ratio], hints=hints)
                t = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
                if rnd:
                    times[case].append(t)
        stored = {r: stored_bytes(root / f"r{r}") for r in (0, *RATIOS)} if rank == 0 else {}
        check = datasets[8].read_all(mine)
        ok = comm.allreduce(bool(np.array_equal(check, data[8])), op=MPI.LAND)
    finally:
        for ds in datasets.values():
            ds.close()
        comm.Barrier()
        if rank == 0:
            shutil.rmtree(root, ignore_errors=True)
    if rank != 0:
        return
    rows_out = []
    for storage in storages:
        for label, g in groups:
            base = statistics.median(times[(storage, label, g, 0)])
            for ratio in (0, *RATIOS):
                t = statistics.median(times[(storage, label, g, ratio)])
                rows_out.append(
                    {
                        "storage": storage,
                        "mode": label,
                        "ratio": "uncompressed" if ratio == 0 else f"{ratio}:1",
                        "achieved": total / max(stored[ratio], 1) if ratio else 1.0,
                        "seconds": t,
                        "bandwidth": total / t,
                        "speedup": base / t,
                    }
                )
    print(
        json.dumps(
            {
                "ranks": nprocs,
                "bytes": total,
                "bandwidth_model": args.bandwidth,
                "codec": args.codec,
                "verified": ok,
                "rows": rows_out,
            }
        )
    )


if __name__ == "__main__":
    main()
