"""Child process for the crash tests: migrates or writes in a loop until it is killed.

``python tiers_worker.py ROOT migrate|write`` prints ``ready`` once the dataset is open, then one
line per completed step (for ``write``: the step number, after its flush).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

import strataio
from strataio.storage.posix import PosixBackend
from strataio.tiers.tier import Tier, TierSet

SHAPE, CHUNKS = (80, 80), (10, 10)


def tiers(root: Path) -> TierSet:
    return TierSet(
        [
            Tier("disk", PosixBackend(root / "disk"), "localdisk", order=0),
            Tier("tape", PosixBackend(root / "tape"), "remotetape", order=1),
        ]
    )


def version(k: int) -> np.ndarray:
    """The array after write step ``k`` (0 = as created)."""
    return np.arange(np.prod(SHAPE), dtype="f4").reshape(SHAPE) + 1000.0 * k


def main(root: Path, mode: str) -> None:
    with strataio.Session(tiers=tiers(root), catalog=root / "cat.db") as s:
        ds = s.open_dataset("a", "r+")
        print("ready", flush=True)
        k = 0
        while True:
            k += 1
            if mode == "migrate":
                ds.migrate(None, to="tape").wait()
                ds.stage(None, to="disk").wait()
            else:
                ds[...] = version(k)
                ds.flush()
            print(k, flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
