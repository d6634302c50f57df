"""Child process for the crash tests: repeats one operation on a dataset until it is killed.

``python crash_worker.py CONFIG OP`` opens a Session on the configuration file ``CONFIG``
(``-`` = the embedded default, relative to the working directory), prints ``ready`` once
dataset ``a`` is open, then one line ``k`` each time step ``k`` has been flushed. The array
after step ``k`` is :func:`state` ``(op, k)``; a step in progress moves each chunk from
``state(op, k - 1)`` to ``state(op, k)``.

Operations: ``create`` (datasets ``n1``, ``n2``... created and written whole), ``whole``
(rewrite everything), ``partial`` (rewrite a region that cuts through chunks), ``chunkwise``
(rewrite chunk by chunk, one put each), ``stage`` (stage to the disk tier, then evict it),
``migrate`` (migrate to the archive, then stage back), ``evict`` (rewrite on the disk tier,
then evict it: its only copy is written back first).
"""

from __future__ import annotations

import sys

import numpy as np

import strataio

SHAPE, CHUNKS = (60, 60), (10, 10)
OPS = ("create", "whole", "partial", "chunkwise", "stage", "migrate", "evict")
#: operations that change the data (the others only move it)
WRITES = ("whole", "partial", "chunkwise", "evict")


def version(k: int) -> np.ndarray:
    """The whole array as written by step ``k``."""
    return np.arange(np.prod(SHAPE), dtype="f4").reshape(SHAPE) + 1000.0 * k


def region(k: int) -> tuple[slice, slice]:
    """The region step ``k`` of a partial rewrite writes (never aligned to chunks; inside
    the array at every step, however many steps a worker gets to run)."""
    r, c = (7 * k) % 40, (13 * k) % 37
    return np.s_[r : r + 17 + k % 5, c : c + 23 - k % 7]


def state(op: str, k: int) -> np.ndarray:
    """Dataset ``a`` after step ``k`` of ``op`` (step 0: as set up)."""
    if op == "partial":
        out = version(0)
        for j in range(1, k + 1):
            out[region(j)] = version(j)[region(j)]
        return out
    return version(k if op in WRITES else 0)


def hint(op: str) -> str:
    return "LOCALDISK" if op in ("evict", "migrate") else "AUTO"


def setup(session: strataio.Session, op: str) -> None:
    ds = session.create_dataset("a", SHAPE, "f4", CHUNKS, hint=hint(op))
    ds[...] = version(0)
    ds.close()


def main(config: str, op: str) -> None:
    with strataio.Session(None if config == "-" else config) as s:
        tiers = s.tiers.names
        fast, slow = tiers[0], tiers[-1]
        ds = s.open_dataset("a", "r+")
        print("ready", flush=True)
        k = 0
        while True:
            k += 1
            if op == "create":
                new = s.create_dataset(f"n{k}", SHAPE, "f4", CHUNKS)
                new[...] = version(k)
                new.close()
            elif op == "whole":
                ds[...] = version(k)
            elif op == "partial":
                ds[region(k)] = version(k)[region(k)]
            elif op == "chunkwise":
                v = version(k)
                for i in range(0, SHAPE[0], CHUNKS[0]):
                    for j in range(0, SHAPE[1], CHUNKS[1]):
                        ds[i : i + CHUNKS[0], j : j + CHUNKS[1]] = v[i : i + 10, j : j + 10]
            elif op == "stage":
                ds.stage(None, to=fast).wait()
                ds.evict(None, tier=fast).wait()
            elif op == "migrate":
                ds.migrate(None, to=slow).wait()
                ds.stage(None, to=fast).wait()
            elif op == "evict":
                ds[...] = version(k)
                ds.flush()
                ds.evict(None, tier=fast).wait()
            else:
                raise SystemExit(f"unknown operation {op!r}")
            ds.flush()
            print(k, flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
