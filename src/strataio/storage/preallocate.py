"""Preallocation of file space ahead of writes that extend a file (Linux ``fallocate``).

A buffered write into blocks a file does not have yet makes ext4 reserve space page by page
(delayed allocation), under the inode lock that every writer of the file queues on. Allocating
the range first, in one ``fallocate`` call, spares the write that work. Measured on ext4
(2-core machine, 64 MiB written into a new file, processes each writing their own pieces,
MB/s plain -> preallocated, median of 11): 64 MiB at once 4497 -> 6574; 4 MiB pieces 1, 2, 4
processes 4562 / 4678 / 4114 -> 6095 / 6168 / 5502; 1 MiB 4596 -> 5871; 256 KiB 4294 ->
5081; 128 KiB 4079 -> 4230; 64 KiB 3672 -> 3380 and 16 KiB 2172 -> 1341 (a system call
more per small write costs more than it saves). With an ``fsync`` before close the gain was
gone (one process: 2-5 % slower; two: 11-16 % faster), so what it saves is CPU time in the
write call, not work for the disk. On tmpfs preallocating was 5-15 % slower, so only ext4
preallocates unless asked.

Space is allocated with ``FALLOC_FL_KEEP_SIZE``: the file's size changes only when the write
lands, exactly as without preallocation. Never through glibc's ``posix_fallocate``: where a
file system cannot allocate it falls back to writing a byte into every block, which would
overwrite data another process writes meanwhile. After a crash before the file is synced,
bytes not yet written back read as zeros, as the holes that delayed allocation can leave do
(one rank's pages written back before another's). A file cut to nothing and written again
(``File.open(path, "w")`` over an old file) is then written back like a new file, at the
kernel's pace: ext4 starts writing a truncated file back at close only while it holds
delayed allocations. Unsynced bytes are durable in neither case; ``sync`` makes them so.

Only the files :class:`strataio.File`'s POSIX driver writes in place preallocate. Files
written whole and renamed over an old one never do: chunk objects
(:meth:`strataio.storage.posix.PosixBackend.put`) and the shards of a collective shard
write (:mod:`strataio.arrays.collective_shards`). Renaming a file that has delayed
allocations makes ext4 start writing it back (``auto_da_alloc``), which keeps the old or the
new bytes after a crash before the flush; a preallocated file is renamed without that, and
could come back as zeros where the old one was durable. (It would be faster: a 4 MiB put
took 0.8 ms instead of 4.0, 14 KiB 0.16 instead of 0.20, the rename no longer starting the
write-back.)
"""

from __future__ import annotations

import ctypes
import errno
import sys

__all__ = ["PREALLOCATE_BYTES", "allocate", "file_system_preallocates"]

#: bytes past a file's end from which a write preallocates them first (measured above: from
#: here the gain was clear at one process and two; 128 KiB gained 4 % and 17 %, 64 KiB lost 8 %
#: at one process)
PREALLOCATE_BYTES = 256 << 10

_KEEP_SIZE = 0x01  # FALLOC_FL_KEEP_SIZE
#: statfs magic numbers of the file systems where preallocation was measured to pay
_MEASURED = frozenset({0xEF53})  # EXT4_SUPER_MAGIC (ext2 and ext3 share it)


def _libc_fallocate() -> tuple[object, object] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        # (fallocate64 takes 64-bit offsets on 32-bit systems too; 64-bit glibc has both)
        fallocate = getattr(libc, "fallocate64", None) or libc.fallocate
        fstatfs = libc.fstatfs
    except (OSError, AttributeError):
        return None
    fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    fallocate.restype = ctypes.c_int
    fstatfs.argtypes = [ctypes.c_int, ctypes.c_void_p]
    fstatfs.restype = ctypes.c_int
    return fallocate, fstatfs


_CALLS = _libc_fallocate()


def file_system_preallocates(fd: int) -> bool:
    """Whether the file system holding open file ``fd`` is one where preallocating extending
    writes was measured to make them faster (see the module doc); False where unknown."""
    if _CALLS is None:
        return False
    buf = ctypes.create_string_buffer(256)  # struct statfs; f_type (a C long) comes first
    if _CALLS[1](fd, buf) != 0:  # type: ignore[operator]
        return False
    kind = ctypes.c_ulong.from_buffer(buf).value & 0xFFFFFFFF
    return kind in _MEASURED


def allocate(fd: int, offset: int, length: int) -> bool:
    """Allocate ``length`` bytes of ``fd`` from ``offset`` without changing its size or any
    byte of it; False (nothing to retry) where the system or the file system cannot, or
    where the disk is full (the write that follows then reports it)."""
    if _CALLS is None or length <= 0:
        return False
    if _CALLS[0](fd, _KEEP_SIZE, offset, length) == 0:  # type: ignore[operator]
        return True
    err = ctypes.get_errno()
    if err == errno.EINTR:  # once more
        return _CALLS[0](fd, _KEEP_SIZE, offset, length) == 0  # type: ignore[operator]
    return False
