"""Storage backends: byte objects by key (POSIX files, memory, S3, shaped, superfiles)."""

from strataio.storage.base import Backend, Capabilities, validate_key
from strataio.storage.memory import MemoryBackend
from strataio.storage.posix import PosixBackend
from strataio.storage.s3 import S3Backend
from strataio.storage.s3_signed import create_bucket
from strataio.storage.shaped import PRESETS, CostModel, OpCost, Shaped

__all__ = [
    "PRESETS",
    "Backend",
    "Capabilities",
    "CostModel",
    "MemoryBackend",
    "OpCost",
    "PosixBackend",
    "S3Backend",
    "Shaped",
    "create_bucket",
    "validate_key",
]
