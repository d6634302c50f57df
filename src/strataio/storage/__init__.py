"""Storage backends: byte objects by key (POSIX files, memory, S3, shaped, superfiles)."""

from strataio.storage.base import Backend, Capabilities, validate_key
from strataio.storage.memory import MemoryBackend
from strataio.storage.posix import PosixBackend

__all__ = ["Backend", "Capabilities", "MemoryBackend", "PosixBackend", "validate_key"]
