"""The tiers of the Session scripts run under mpiexec: a POSIX disk and a POSIX tape."""

from __future__ import annotations

from pathlib import Path

from strataio.storage.posix import PosixBackend
from strataio.tiers.tier import Tier, TierSet


def disk_and_tape(root: Path) -> TierSet:
    """``disk`` (localdisk) over ``tape`` (remotetape), under ``root``."""
    return TierSet(
        [
            Tier("disk", PosixBackend(root / "disk"), "localdisk", order=0),
            Tier("tape", PosixBackend(root / "tape"), "remotetape", order=1),
        ]
    )
