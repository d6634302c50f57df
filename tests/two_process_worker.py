"""One of two processes working on one tiered dataset until it is killed (see
``test_two_process_crash.py``): ``writer`` rewrites chunks with values never used before,
flushes and moves; ``mover`` only stages, migrates, evicts and reads. The writer logs each
value to ``ROOT/oracle.log`` before its write call (``W i j value``) and ``F`` once a flush
returned, each line fsynced: every value logged before an ``F`` is durable then.

    python two_process_worker.py ROOT ROLE SEED
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import numpy as np

import strataio
from strataio.errors import StrataError

SHAPE, CHUNKS = (60, 60), (10, 10)  # 36 chunks of 400 bytes (int32: every value exact)
GRID = (SHAPE[0] // CHUNKS[0], SHAPE[1] // CHUNKS[1])


def config_text(local_capacity: int) -> str:
    """Three POSIX tiers under the working folder, the fast one with room for a few chunks."""
    tiers = [("local", "localdisk"), ("remote", "remotedisk"), ("archive", "remotetape")]
    text = '[catalog]\nurl = "cat.db"\n'
    for name, role in tiers:
        text += f'\n[[tiers]]\nname = "{name}"\nkind = "posix"\nrole = "{role}"\npath = "{name}"\n'
        if name == "local":
            text += f"capacity = {local_capacity}\n"
    return text


def box(i0: int, i1: int, j0: int, j1: int) -> tuple[slice, slice]:
    """The array section of chunks ``i0:i1`` x ``j0:j1``."""
    return np.s_[i0 * CHUNKS[0] : i1 * CHUNKS[0], j0 * CHUNKS[1] : j1 * CHUNKS[1]]


class Oracle:
    """The writer's log (see the module doc)."""

    def __init__(self, path: Path) -> None:
        self.file = open(path, "a")  # noqa: SIM115 (open for the process's life)

    def log(self, line: str) -> None:
        self.file.write(line + "\n")
        self.file.flush()
        os.fsync(self.file.fileno())


def run(root: Path, role: str, seed: int) -> None:
    rng = random.Random(seed)
    os.chdir(root)
    s = strataio.Session(root / "strataio.toml")
    if role == "create":
        ds = s.create_dataset("a", SHAPE, "i4", CHUNKS, hint="LOCALDISK", codec=None)
        values = np.arange(1, GRID[0] * GRID[1] + 1, dtype="i4").reshape(GRID)
        oracle = Oracle(root / "oracle.log")
        for (i, j), v in np.ndenumerate(values):
            oracle.log(f"W {i} {j} {v}")
        ds[...] = np.kron(values, np.ones(CHUNKS, "i4"))
        ds.close()
        oracle.log("F")
        s.close()
        return
    ds = s.open_dataset("a", "r+" if role == "writer" else "r")
    oracle = Oracle(root / "oracle.log") if role == "writer" else None
    value = seed * 100_000  # (seeds below 20 000: within int32)
    print("ready", flush=True)
    while True:
        op = rng.random()
        i0 = rng.randrange(GRID[0])
        i1 = rng.randrange(i0 + 1, min(GRID[0], i0 + 3) + 1)
        j0 = rng.randrange(GRID[1])
        j1 = rng.randrange(j0 + 1, min(GRID[1], j0 + 3) + 1)
        try:
            if oracle is not None and op < 0.40:
                block = np.empty(((i1 - i0) * CHUNKS[0], (j1 - j0) * CHUNKS[1]), "i4")
                for i in range(i0, i1):
                    for j in range(j0, j1):
                        value += 1
                        oracle.log(f"W {i} {j} {value}")
                        block[box(i - i0, i - i0 + 1, j - j0, j - j0 + 1)] = value
                ds[box(i0, i1, j0, j1)] = block
            elif oracle is not None and op < 0.55:
                ds.flush()
                oracle.log("F")
            elif op < 0.65:
                ds.migrate(box(i0, i1, j0, j1), to=rng.choice(["remote", "archive"])).wait()
            elif op < 0.75:
                ds.stage(box(i0, i1, j0, j1), to=rng.choice(["local", "remote"])).wait()
            elif op < 0.82:
                ds.evict(box(i0, i1, j0, j1), tier=rng.choice(["local", "remote"])).wait()
            else:
                _ = ds[box(i0, i1, j0, j1)]
        except StrataError:
            pass  # (a move refused or a read raced: the other process is at work)
        if oracle is None and rng.random() < 0.05:
            ds.close()
            ds = s.open_dataset("a", "r")


if __name__ == "__main__":
    run(Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]))
