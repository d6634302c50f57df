"""Child process for the superfile crash test: puts members in a loop until it is killed.

``python superfile_worker.py ROOT`` opens superfile ``vr`` (created by the test), prints
``ready``, then puts ``img00000``, ``img00001``, ... and after every fifth member flushes and
prints the number of the last member put (all members up to it are then durable).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

import strataio
from strataio.storage.posix import PosixBackend
from strataio.tiers.tier import Tier, TierSet

#: bytes of members per container: a few images each, so containers also seal on their own
CONTAINER = 3000


def tiers(root: Path) -> TierSet:
    return TierSet(
        [
            Tier("disk", PosixBackend(root / "disk"), "localdisk", order=0),
            Tier("tape", PosixBackend(root / "tape"), "remotetape", order=1),
        ]
    )


def member(i: int) -> np.ndarray:
    """Member ``i``'s image: every byte depends on ``i``, so a wrong member never passes."""
    return (
        ((np.arange(32 * 24, dtype=np.int64) * 31 + i * 7919) % 256)
        .astype(np.uint8)
        .reshape(32, 24)
    )


def main(root: Path) -> None:
    with strataio.Session(tiers=tiers(root), catalog=root / "cat.db") as s:
        sf = s.superfile("vr")
        print("ready", flush=True)
        i = 0
        while True:
            sf.put(f"img{i:05d}", member(i))
            if i % 5 == 4:
                sf.flush()
                print(i, flush=True)
            i += 1


if __name__ == "__main__":
    main(Path(sys.argv[1]))
