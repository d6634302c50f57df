"""Large reads copied out of a mapping of the file, where the kernel's own copy is slow.

A copy whose destination lies 1 to :data:`ALIAS_BYTES` - 1 bytes further into its 4 KiB
page than its source runs slowly: the processor takes each load for one that depends on a
store just made 4 KiB away (4K aliasing). ``read`` copies from page-cache pages, which start
on a page, so a read from a page-aligned file offset into a numpy array's data (which
``malloc`` puts 16 bytes into a page) is such a copy. Measured on the 2-core machine (a file
just written, medians of 11): a ``preadv`` of 32 MiB from the page cache ran at 5.5 GB/s into
a buffer 16 bytes ahead and at 11.1 GB/s 64 bytes ahead; copying the same bytes out of a
mapping of the file (``memcpy`` picks its own way around the aliasing) ran at 9.5 and 10.0
GB/s. Reads of 2-4 MiB: 23-26 GB/s through ``preadv`` 16 bytes ahead, 30-32 mapped; 1 MiB
and below the mapping costs more than it saves (13.6 GB/s mapped against 24).

:func:`read_cached` takes that way for one large read whose copy would alias, when every
page it reads is in the page cache already (pages faulted in through a mapping are read
from the disk with less read-ahead than ``read`` gets; ``cachestat`` tells in about 1 us,
``mincore`` on older kernels in about 500 us for 32 MiB). Elsewhere, or where the compiled
helper ``strataio.storage._mapcopy`` is not built, it declines and the caller reads as
usual; so does ``STRATAIO_NO_MAPPED_READS=1``. The mapped copy is guarded against a file cut
shorter meanwhile (a mapped page past the end raises ``SIGBUS``): the copy then declines
too, and the caller's read sees the new end of the file, as it would have anyway.

A copy of :data:`STREAM_COPY_BYTES` or more (half the last-level cache) goes through the
mapping whether it aliases or not, with non-temporal stores: the destination's lines are
written to memory without being read into the cache first, a third less memory traffic
for a copy the cache cannot hold anyway. 16 MiB on the 2-core machine (32 MiB cache): 22
GB/s against 14 with ``memcpy`` from the mapping and 19 with ``preadv`` that does not alias
(7 where it does); four processes copying 16 MiB each at once, 24-27 GiB/s in all against
16-17 and 9-13. Below it ``memcpy`` is faster (8 MiB: 26 against 23 GB/s) and leaves the
bytes cached for what reads them next. ``STRATAIO_STREAM_COPY_BYTES`` sets that size
(bytes or a size like ``16MiB``; 0: never stream).

:func:`gather_cached` does the same for a read of many pieces (a vectored read's) that
moves :data:`MAPPED_READ_BYTES` or more: one mapping of the file bytes they span, a copy
per piece in one compiled loop, the holes between them never copied. It takes the read
where the copies win whether the file's pages sit in large folios (a file written in large
calls, lately) or in single pages (one written 4 KiB at a time, or split since by memory
reclaim), where a mapping's page faults cost more. GB/s, pieces 128 bytes apart, large
folios / single pages, mapped against ``preadv``:

- most bytes would alias (HPIO's regions read into a numpy buffer): 64 MiB in 4 KiB pieces
  streamed 20.5 / 4.9 against 5.0 / 3.9; 8 MiB with ``memcpy`` 18 / 5.1 against 13 / 5.5;
- small pieces (under :data:`GATHER_PIECE_BYTES` on average), whose ``preadv`` the
  kernel's cost per iovec bounds: 4 MiB in 512-byte pieces 22.5 / 6.6 against 6.8 / 5.1,
  in 64-byte pieces 11.4 / 2.2 against 0.8 / 0.5;
- enough to stream: 64 MiB in 4 KiB pieces that do not alias 21.7 / 4.8 against
  12.5 / 4.7, in 1 MiB pieces 22.6 / 5.2 against 14.1 / 5.4.

Elsewhere (pieces of 1 KiB or more that do not alias, under :data:`STREAM_COPY_BYTES`)
``preadv`` keeps the read: 8 MiB in 4 KiB pieces mapped 24 / 6.4 against 19 / 9.5, 2 MiB
31 / 8.8 against 19 / 14.4: faster with large folios, slower with single pages. A read the
caller would stage (data sieving: its span read into a buffer, each piece copied out of
it) is a gather in every case: one copy instead of two, holes not copied at all.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from strataio.sizes import parse_size

try:
    from strataio.storage import _mapcopy
except ImportError:  # not built (no C compiler, not Linux): reads take the usual way
    _mapcopy = None

__all__ = [
    "ALIAS_BYTES",
    "MAPPED_READ_BYTES",
    "PAGE",
    "STREAM_COPY_BYTES",
    "aliases",
    "gather_cached",
    "last_level_cache_bytes",
    "read_cached",
]

PAGE = 4096
#: a copy whose destination lies 1 to this many bytes less one further into its page than
#: its source is slow. preadv of 4 MiB from the page cache on the 2-core machine: 3 GB/s at
#: 1-8 bytes ahead, 8-9 GB/s at 16-24, 17-24 GB/s at 32 and more, or behind
ALIAS_BYTES = 64
#: reads from which an aliasing copy goes through a mapping (below, the mapping's faults and
#: unmapping cost more than the aliasing does: see the module doc)
MAPPED_READ_BYTES = 2 << 20
_off = os.environ.get("STRATAIO_NO_MAPPED_READS", "").strip() not in ("", "0")


def last_level_cache_bytes(default: int = 32 << 20) -> int:
    """The size of the largest data cache of CPU 0, from sysfs (``default`` where it does
    not say). Not ``sysconf(_SC_LEVEL3_CACHE_SIZE)``: on AMD processors glibc reports the
    cache of every core complex summed there (320 MiB on a part with 32 MiB)."""
    best = 0
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            if (index / "type").read_text().strip() == "Instruction":
                continue
            text = (index / "size").read_text().strip().upper()
            scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
            best = max(best, int(text.rstrip("KMG")) * scale)
        except (OSError, ValueError):
            continue
    return best or default


def _stream_copy_bytes() -> int:
    """``$STRATAIO_STREAM_COPY_BYTES`` (bytes, or a size like ``16MiB``; 0 or ``none``: never
    stream), else half the last-level cache (the source and the destination of a larger
    copy cannot both stay in it), 4 MiB at least. A value it cannot read raises
    :class:`~strataio.errors.ConfigError`."""
    given = os.environ.get("STRATAIO_STREAM_COPY_BYTES", "").strip()
    if given:
        n = parse_size(given, where="$STRATAIO_STREAM_COPY_BYTES")
        return n if n else 1 << 62
    return max(4 << 20, last_level_cache_bytes() // 2)


#: copies from which non-temporal stores beat ``memcpy`` (see the module doc)
STREAM_COPY_BYTES = _stream_copy_bytes()
#: the average piece below which a gather is taken whatever its size and aliasing (the
#: kernel's cost per iovec bounds ``preadv``), and never streamed (the stores at each piece's
#: edges cost more than a stream saves: 4 MiB in 512-byte pieces 18 GB/s streamed against
#: 22 with ``memcpy``; 64 MiB in 1 KiB pieces 17-18 against 5.7)
GATHER_PIECE_BYTES = 1024
#: the most file bytes a gather spans per byte it moves: a sparser read is left to
#: ``preadv``, whose calls skip the holes (the mapped copy needs every page of the span
#: cached, and on kernels without ``cachestat`` asks ``mincore`` about each)
GATHER_SPAN_RATIO = 4


def aliases(dst_address: int, src_address: int) -> bool:
    """Whether a copy from ``src_address`` to ``dst_address`` aliases: its destination lies
    1 to ``ALIAS_BYTES - 1`` bytes further into its page than its source."""
    return 0 < (dst_address - src_address) % PAGE < ALIAS_BYTES


def read_cached(fd: int, offset: int, out: memoryview, address: int) -> int | None:
    """Copy the bytes of file ``fd`` from ``offset`` into ``out`` (at ``address``) through a
    mapping, if the read is large, its copy would alias or is large enough to stream
    (:data:`STREAM_COPY_BYTES`), and its pages are all cached; the bytes copied (fewer than
    ``len(out)`` only at the end of the file, the rest of ``out`` left as it was), or None
    where the caller must read itself."""
    n = len(out)
    if _mapcopy is None or _off or n < MAPPED_READ_BYTES:
        return None
    stream = n >= STREAM_COPY_BYTES
    if not stream and not aliases(address, offset):
        return None
    got = _mapcopy.read_cached(fd, offset, out, int(stream))
    return None if got < 0 else got


def gather_cached(
    fd: int,
    out: memoryview,
    address: int,
    file: np.ndarray,
    lengths: np.ndarray,
    mem: np.ndarray,
    span: tuple[int, int] | None = None,
    *,
    staged: bool = False,
) -> bool:
    """Copy each piece (``lengths[i]`` bytes of file ``fd`` at ``file[i]``, to ``out``, whose
    data is at ``address``, at ``mem[i]``; int64 vectors) through one mapping, where the
    module doc's rules take the read: the pieces move :data:`MAPPED_READ_BYTES` or more and
    fill at least
    1 / :data:`GATHER_SPAN_RATIO` of the file bytes they span (``span``, ``(first, end)``,
    where the caller knows it); they are enough to stream, or most of their bytes would
    alias, or they average under :data:`GATHER_PIECE_BYTES`, or the caller would otherwise
    stage them (``staged``: read their span into a buffer, then copy each out); the file
    reaches the end of their span and its pages are all cached. True when done; False where
    the caller must read itself (``out`` may then hold some pieces already: the caller's
    read writes them again)."""
    if _mapcopy is None or _off or not len(file):
        return False
    total = int(lengths.sum())
    if total < MAPPED_READ_BYTES:
        return False
    first, end = span if span is not None else (int(file.min()), int((file + lengths).max()))
    if end - first > GATHER_SPAN_RATIO * total:
        return False  # (sparse: every page of the span would have to be cached)
    small = total < GATHER_PIECE_BYTES * len(file)
    stream = total >= STREAM_COPY_BYTES and not small
    if not stream and not small and not staged:
        ahead = (address + mem - file) % PAGE
        if 2 * int(lengths[(ahead > 0) & (ahead < ALIAS_BYTES)].sum()) < total:
            return False
    return _mapcopy.gather_cached(fd, out, file, lengths, mem, int(stream)) == total
