"""The exception hierarchy: every error strataio raises derives from :class:`StrataError`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class StrataError(Exception):
    """Base class of all strataio errors."""


class SelectionError(StrataError, IndexError):
    """A selection is out of bounds, stepped, or otherwise not a rectilinear box."""


class ArgumentError(StrataError, ValueError):
    """An argument outside what the call accepts: a shape, a chunk shape, a dtype, a mode,
    attributes that are no JSON."""


class ShapeMismatchError(StrataError, ValueError):
    """Data does not match the shape of the selection it is written to or read into."""


class DtypeMismatchError(StrataError, TypeError):
    """Data's dtype cannot be stored in (or read into) the target dtype without loss."""


class CodecError(StrataError, ValueError):
    """An unknown or misconfigured codec, or a chunk its codecs cannot decode."""


class ChecksumError(CodecError):
    """A stored chunk fails its checksum: the bytes on storage are corrupt, or are not this
    array's. Raised too for a chunk of the wrong size where its codecs include a checksum
    (``crc32c``; a shard whose index is checksummed): such bytes cannot be what the array
    wrote, whichever check (its size, its checksum, its decoded size) finds it first. Without
    a checksum codec a chunk of the wrong size is a plain :class:`CodecError` (nothing tells
    a damaged chunk from another array's); a tiered store's copy that differs from the
    checksum its catalog recorded is a ChecksumError whatever the codecs.

    A subclass of :class:`CodecError`, not the reverse: every ChecksumError is a chunk its
    codecs cannot decode, so ``except CodecError`` catches both (every chunk that cannot be
    read) and ``except ChecksumError`` catches the corrupt ones only."""


class ReadOnlyError(StrataError, PermissionError):
    """A write was attempted through a handle opened read-only, or a change (a write, a
    delete, an eviction) asked of a tier configured ``read_only``, or of one whose storage
    refuses writes now (:class:`WritesRefusedError`)."""


class InvalidKeyError(StrataError, ValueError):
    """A storage key would escape its backend's namespace or is malformed."""


class NotFoundError(StrataError, FileNotFoundError):
    """A dataset, object or tier that was asked for does not exist."""


class ExistsError(StrataError, FileExistsError):
    """Something to be created already exists."""


class MetadataError(StrataError, ValueError):
    """Stored metadata (zarr.json, catalog rows) is missing, malformed or unsupported."""


class ClosedError(StrataError, ValueError):
    """An operation on a handle that has been closed."""


class BackendError(StrataError, OSError):
    """A storage backend failed (I/O error, connection refused, timeout)."""


class StoreMissingError(BackendError):
    """The store a backend names does not exist (an S3 bucket): no object of it answers."""


class ObjectError(BackendError):
    """One object on a tier cannot be read or written, though the tier answers: something
    not of strataio's is in its way (a directory where the object should be, or a file where
    one of its folders should be: EISDIR, ENOTDIR), the storage refuses that object for what
    it is (its name too long: ENAMETOOLONG, an S3 key over 1024 bytes; its size over what
    the storage takes: EFBIG, S3 EntityTooLarge; a name or argument it takes of no object:
    EINVAL, EILSEQ, S3 InvalidArgument), or, for a call about one object whose
    caller goes on to others (:meth:`Tier.call_alone`), any backend failure (permission
    denied, an I/O error on that object). The tier is not marked down, and other
    objects there are read and written as before; a write does not go on to another tier
    for it, as it does from a tier that is down or full. The message names the tier and
    the object's path (and the limit it is over, where one is): move what is in the way,
    and write again.

    A write of a tiered dataset raises it once its other chunks are stored (each tried on
    the tiers its hint allows, as always); ``keys`` then names every chunk of the write not
    stored (each keeps its previous value): those something is in the way of, and any that
    found no tier with room that answered. A flush or close raises it where the object a
    write put was replaced before the catalog recorded it by something no write stands for
    (a directory, a file put by hand); ``keys`` then names those chunks (and any whose new
    objects were gone). Elsewhere ``keys`` is empty."""

    def __init__(self, message: str, keys: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.keys = list(keys)

    def __reduce__(self) -> tuple[Any, ...]:
        # (keys and all, through a pickle: another rank of a job raises it too)
        return type(self), (str(self), self.keys)


class TierDownError(BackendError):
    """A tier is marked down and was not used."""


class TierFullError(TierDownError):
    """A tier's device has no space left (ENOSPC, EDQUOT): the tier takes no writes for a
    while and is read as before (it is not marked down). A :class:`TierDownError`, so a write
    goes on to the next tier as from one that is down."""


class WritesRefusedError(TierDownError, ReadOnlyError):
    """A tier's storage refused a change while its reads answer: a file system mounted, or
    remounted after disk errors, read-only (EROFS), or write permission denied (EACCES,
    EPERM). The tier is not marked down: for a while it is read-only, as one configured
    ``read_only`` (:attr:`strataio.tiers.tier.Tier.writes_refused`). A
    :class:`TierDownError`, so a write goes on to the next tier as from one that is down, and
    a :class:`ReadOnlyError`, as a change asked of a read-only tier."""


class ChunkChangedError(BackendError):
    """A chunk that another process kept rewriting or moving while it was read: each copy
    read was of a version the catalog no longer listed. Nothing is damaged; read it again
    (or order the writes before the reads)."""


class ChunksNotStoredError(BackendError):
    """A write of a tiered dataset stored some of its chunks but not all: every tier its
    placement hint allows was full or down for the others; or a flush or close found chunks
    written since the last flush whose new objects were gone before the catalog recorded
    them. ``keys`` names the chunks not stored (each keeps its previous value); the message
    lists the first few (raised on the other ranks of a job for one rank's, ``keys`` may be
    empty)."""

    def __init__(self, message: str, keys: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.keys = list(keys)

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (str(self), self.keys)


class ConfigError(StrataError, ValueError):
    """A configuration file is missing, unreadable or has a bad value (the message names the
    file and the key)."""


class DatatypeError(StrataError, TypeError):
    """An MPI datatype cannot be flattened (null, unknown combiner, inconsistent type map) or
    used (a buffer's datatype never committed)."""


class HintError(StrataError, ValueError):
    """An I/O hint has a value that cannot be used (the message names the hint)."""


class ViewError(StrataError, ValueError):
    """A file view or a transfer does not fit MPI-IO's rules (negative displacement, filetype
    not a whole number of etypes, buffer not a whole number of etypes, ranks disagreeing)."""


class DatasetDisabledError(StrataError):
    """A dataset created with the DISABLE placement hint: its data was never stored."""


class CapabilityError(StrataError, NotImplementedError):
    """A store was asked for an optional capability it does not declare (the message names
    the store, the dataset and the capability)."""


class DuplicateWriteError(StrataError, ValueError):
    """A collective write through indirection arrays names one index on several ranks (the
    message says how many; the hint ``strataio_duplicate_writes=last-rank`` allows it)."""


class BusyError(StrataError, BlockingIOError):
    """Another process is doing what this call would do at the same time, where doing both
    at once spoils both (a calibration of the same tier); the message names that process."""


class DatasetInUseError(BusyError):
    """A dataset cannot be deleted while a process has it open (or is evicting from it): the
    message names the dataset and, for another process, its writer (host, pid). Close it
    there first; a process that died holds nothing."""
