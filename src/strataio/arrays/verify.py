"""A plain dataset's stored chunks checked, as ``strataio fsck PATH`` checks them.

A plain dataset has no catalog, so no checksum recorded apart from its chunks: a chunk is
sound when it decodes through the array's codec pipeline (a ``crc32c`` codec then checks
its checksum, a compressor its frame, a sharded array every inner chunk and its index) to
the chunk's shape. Bytes changed in a chunk whose codecs keep no checksum (raw, or a
compressor's stored block) decode still, and go unnoticed: ``crc32c`` is what catches them.
A quick check reads nothing: it asks only each chunk's size, which tells something only
where chunks are stored plain (raw or with ``crc32c``: one size for all).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from strataio.arrays.dataset import Dataset
from strataio.errors import CodecError
from strataio.sizes import counted

__all__ = ["ChunkCheck", "verify_chunks"]

#: bytes of stored chunks read per batch
BATCH_BYTES = 64 << 20


@dataclass
class ChunkCheck:
    """What :func:`verify_chunks` found: ``chunks`` looked at, ``problems`` as (chunk key,
    what is wrong), and how they were checked (``how``: "decoded", "sized", or "listed"
    where a quick check has no size to compare)."""

    chunks: int = 0
    how: str = "decoded"
    problems: list[tuple[str, str]] = field(default_factory=list)


def verify_chunks(
    ds: Dataset, *, quick: bool = False, progress: Callable[[int, int], None] | None = None
) -> ChunkCheck:
    """Check every stored chunk of ``ds`` (open to read): each read and decoded, or with
    ``quick`` only sized where that tells (see the module doc). ``progress(done, total)``
    follows it in chunks. A chunk deleted meanwhile is no problem (it reads as the fill
    value)."""
    store, codecs = ds.store, ds.codecs
    keys = sorted(store.list_chunks())
    out = ChunkCheck(chunks=len(keys))
    plain_size = codecs.stored_nbytes if getattr(codecs, "is_plain", False) else None
    if quick:
        sized = getattr(store, "chunk_size", None)
        if plain_size is None or sized is None:
            out.how = "listed"
            return out
        out.how = "sized"
        for done, key in enumerate(keys, 1):
            size = sized(key)
            if size is not None and size != plain_size:
                out.problems.append(
                    (key, f"{counted(size, 'byte')}; its chunks store {plain_size}")
                )
            if progress is not None:
                progress(done, len(keys))
        return out
    # batches of about BATCH_BYTES (a compressed chunk counted at its decoded size)
    per = max(1, BATCH_BYTES // max(1, plain_size or codecs.chunk_nbytes))
    done = 0
    for at in range(0, len(keys), per):
        batch = keys[at : at + per]
        for key, blob in zip(batch, store.get_chunks(batch)):
            if blob is not None:
                try:
                    codecs.decode(blob)
                except CodecError as exc:
                    out.problems.append((key, str(exc)))
        done += len(batch)
        if progress is not None:
            progress(done, len(keys))
    return out
