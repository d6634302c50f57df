"""The storage hierarchy: tiers, placement hints, the mover, the tiered chunk store, the commit
of residency changes, fsck."""

from strataio.tiers.cache import ChunkCache
from strataio.tiers.commit import Commit
from strataio.tiers.fsck import FsckReport, fsck
from strataio.tiers.mover import MoveHandle, Mover, MoveResult, Progress
from strataio.tiers.placement import HINTS, DatasetDisabledError, Placement
from strataio.tiers.store import TieredChunkStore
from strataio.tiers.tier import Tier, TierSet

__all__ = [
    "HINTS",
    "ChunkCache",
    "Commit",
    "DatasetDisabledError",
    "FsckReport",
    "MoveHandle",
    "MoveResult",
    "Mover",
    "Placement",
    "Progress",
    "Tier",
    "TierSet",
    "TieredChunkStore",
    "fsck",
]
