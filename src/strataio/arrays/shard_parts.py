"""The temporary files of collective shard writes and the lock that tells a running write's
from a killed one's.

A collective shard write (:mod:`strataio.arrays.collective_shards`) writes each shard to a
temporary file beside it, ``<shard>.<token>.part`` (``token``: 8 hex digits, one per call,
the same on every rank), which several ranks fill -- each its run of inner chunks, the
shard's leader its index -- and the leader renames over the shard. A call killed before its
rename leaves that file.

Whether a ``.part`` file is such a leftover or belongs to a write running now is decided by a
lock, never a clock, with the rule of a put's temporary file
(:func:`strataio.storage.posix.judge_leftover`): every rank that writes a run to a ``.part``
file holds a *shared* ``flock`` on it from just after opening it, and the shard's leader, the
one rank that renames it, holds one from its turn in the offset chain, before the ranks agree
that every run is written; each holds it until the call ends, after the renames or after a
failed call has removed its files. Shared locks coexist, so the ranks never wait on each
other, while ``judge_leftover``'s exclusive lock is refused as long as any of them lives. A
``.part`` file that nobody holds is therefore one whose leader is gone, so that nothing will
rename it, or one whose leader has not opened it yet: every run in it was then written by a
rank that has died since (a live one would hold it), and its call cannot pass the agreement
that comes before the renames. Either way it can be deleted at once. A rank that has opened
the file but not locked it yet may find it deleted meanwhile (nothing it wrote was in it) and
opens the name again.

Each rank keeps one descriptor open per ``.part`` file it leads or writes until the call
ends.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import threading
from collections.abc import Iterator

__all__ = ["PART_SUFFIX", "PartLocks", "is_part_file", "part_files", "part_path"]

PART_SUFFIX = ".part"
_PART = re.compile(r"\.[0-9a-f]{8}\.part\Z")


def part_path(shard_path: str, token: str) -> str:
    """The temporary file of the shard at ``shard_path`` in the call named by ``token``."""
    return f"{shard_path}.{token}{PART_SUFFIX}"


def is_part_file(name: str) -> bool:
    """True if file (or chunk key) ``name`` is a shard write's temporary file."""
    return _PART.search(name) is not None


def part_files(folder: str) -> Iterator[str]:
    """Paths of the shard writes' temporary files under ``folder`` (an array's folder):
    those of writes killed before their rename, and those of writes running now
    (:func:`strataio.storage.posix.judge_leftover` tells them apart)."""
    for dirpath, _dirs, files in os.walk(folder):
        for f in files:
            if is_part_file(f):
                yield os.path.join(dirpath, f)


class PartLocks:
    """One rank's shared locks on the ``.part`` files it leads or writes in one call (see the
    module's docstring): :meth:`hold` before writing a file, :meth:`release` once the call is
    over. Thread-safe."""

    def __init__(self) -> None:
        self._fds: dict[str, int] = {}
        self._mutex = threading.Lock()

    def hold(self, path: str) -> None:
        """Open ``path`` (created where missing) and hold a shared lock on it until
        :meth:`release`; a second call for the same path does nothing."""
        with self._mutex:
            if path in self._fds:
                return
            flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC
            os.makedirs(os.path.dirname(path), exist_ok=True)
            while True:
                # (open for reading: NFS takes a shared flock only on such a descriptor)
                fd = os.open(path, flags, 0o644)
                try:
                    with contextlib.suppress(OSError):  # (no locks here: see judge_leftover)
                        fcntl.flock(fd, fcntl.LOCK_SH)
                    if os.fstat(fd).st_nlink:
                        self._fds[path] = fd
                        return
                except BaseException:
                    os.close(fd)
                    raise
                # deleted as a leftover between its opening and the lock: open the name again
                os.close(fd)

    def release(self) -> None:
        """Let go of every file held (closing its descriptor releases its lock)."""
        with self._mutex:
            fds, self._fds = list(self._fds.values()), {}
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)

    def __len__(self) -> int:
        with self._mutex:
            return len(self._fds)
