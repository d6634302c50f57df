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
"""

from __future__ import annotations

import os

try:
    from strataio.storage import _mapcopy
except ImportError:  # not built (no C compiler, not Linux): reads take the usual way
    _mapcopy = None

__all__ = ["ALIAS_BYTES", "MAPPED_READ_BYTES", "PAGE", "aliases", "read_cached"]

PAGE = 4096
#: a copy whose destination lies 1 to this many bytes less one further into its page than
#: its source is slow. preadv of 4 MiB from the page cache on the 2-core machine: 3 GB/s at
#: 1-8 bytes ahead, 8-9 GB/s at 16-24, 17-24 GB/s at 32 and more, or behind
ALIAS_BYTES = 64
#: reads from which an aliasing copy goes through a mapping (below, the mapping's faults and
#: unmapping cost more than the aliasing does: see the module doc)
MAPPED_READ_BYTES = 2 << 20
_off = os.environ.get("STRATAIO_NO_MAPPED_READS", "") not in ("", "0")


def aliases(dst_address: int, src_address: int) -> bool:
    """Whether a copy from ``src_address`` to ``dst_address`` aliases: its destination lies
    1 to ``ALIAS_BYTES - 1`` bytes further into its page than its source."""
    return 0 < (dst_address - src_address) % PAGE < ALIAS_BYTES


def read_cached(fd: int, offset: int, out: memoryview, address: int) -> int | None:
    """Copy the bytes of file ``fd`` from ``offset`` into ``out`` (at ``address``) through a
    mapping, if the read is large, its copy would alias and its pages are all cached; the
    bytes copied (fewer than ``len(out)`` only at the end of the file, the rest of ``out``
    left as it was), or None where the caller must read itself."""
    if _mapcopy is None or _off or len(out) < MAPPED_READ_BYTES or not aliases(address, offset):
        return None
    got = _mapcopy.read_cached(fd, offset, out)
    return None if got < 0 else got
