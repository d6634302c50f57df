"""The metadata catalog: tiers, datasets, chunk residency and the performance database."""

from strataio.catalog.base import (
    COPY_STATES,
    DATASET_STATES,
    TIER_ROLES,
    TIER_STATES,
    Catalog,
    ChunkCopy,
    CommitOutcome,
    CopyId,
    DatasetRecord,
    PerfRow,
    TierRecord,
    TierUsage,
    VerifiedCopy,
    WriterRecord,
    codec_json,
    open_catalog,
)

__all__ = [
    "COPY_STATES",
    "DATASET_STATES",
    "TIER_ROLES",
    "TIER_STATES",
    "Catalog",
    "ChunkCopy",
    "CommitOutcome",
    "CopyId",
    "DatasetRecord",
    "PerfRow",
    "TierRecord",
    "TierUsage",
    "VerifiedCopy",
    "WriterRecord",
    "codec_json",
    "open_catalog",
]
