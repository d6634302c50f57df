"""The temporary files of collective shard writes and the lock that tells a running write's
from a killed one's.

A collective shard write (:mod:`strataio.arrays.collective_shards`) writes each shard to a
temporary file beside it, ``<shard>.<token>.part`` (``token``: 8 hex digits, one per call,
the same on every rank), which several ranks fill -- each its run of inner chunks, the
shard's leader its index -- and the leader renames over the shard. A call killed before its
renames leaves those files.

Whether a ``.part`` file is such a leftover or belongs to a call running now is decided by a
lock, never a clock, as for a put's temporary file
(:func:`strataio.storage.posix.judge_leftover`), but by one lock per call, not per file: the
call's *lock file* ``.<token>.lock`` in the array's folder (:func:`lock_path`), on which
every rank holds a *shared* ``flock`` through one descriptor (:class:`CallLock`), however
many shards the call writes. Shared locks coexist, so the ranks never wait on each other,
while a judge's exclusive lock is refused as long as any of them lives. The order:

1. Once the ranks have agreed on the call's arguments, rank 0 makes the lock file and locks
   it before it sends the token to the other ranks; each of them opens it (never making it)
   and locks it once it has the token, and the ranks agree that every one holds it. So
   every rank holds it before the call makes any ``.part`` file, and until the call ends.
2. Each rank removes the lock file as it leaves the call (the first to get there does):
   after the ranks have agreed that the call is over (every shard renamed, or the call
   failed and nothing will be renamed any more) and after it has itself removed every
   ``.part`` file of the call still there. So once the call has returned on a rank that
   held the lock, no file of the call is left. (A rank that leaves by an error the others
   do not share, when the call cannot complete, removes it too: a judge may then delete
   ``.part`` files the others still write, which fails their index write or rename, never
   makes a shard of an index alone: after the agreement that comes before the indexes
   every run is written.)

:func:`judge` judges a ``.part`` file by its call's lock file. Refused, a rank of the call
lives. Got, no rank holds it: every rank that made or wrote a ``.part`` file of the call
held it from before then, so each is dead, and a call one of whose ranks is gone cannot pass
the agreement that comes before the renames; its files will never be renamed. No lock file,
the call is over: a rank removed it after every ``.part`` file of the call was renamed or
removed, or a judge removed it having found it unheld; a ``.part`` file there then is dead
either way (on a file system that keeps no locks too: no judge removes a lock file there).
A dead ``.part`` file can be deleted at once.

The lock file is judged the same way, and deleted where dead: a killed call leaves it. A
judge may delete it between rank 0 making it and locking it (no ``.part`` file of the call
exists yet); rank 0, finding under its lock that the name no longer holds its file
(:func:`strataio.storage.posix.names_file`), makes it again. The other ranks open it only
once rank 0 holds it, when no judge deletes it. A judge checks, holding the exclusive lock,
that the name still holds the file it locked before it judges by it.

Each rank opens the lock file once and closes it once, when the call ends: on NFS, where
``flock`` is emulated with ``fcntl`` locks, closing any descriptor of a file drops the
process's locks on it (and a lock the process takes on it again is never refused by its own),
so no code path opens a lock file a second time while this process holds it. The ``.part``
files, which the ranks open and close as they write, carry no lock; and :func:`judge`, in a
process that holds the lock file it would open (a rank judging its own call's files), answers
from the lock files it holds (:func:`~strataio.storage.posix.held_here`) instead of opening it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
from collections.abc import Iterator

from strataio.storage.posix import (
    HELD_LOCKS_MUTEX,
    LeftoverState,
    close_held,
    held_here,
    lock_to_judge,
    names_file,
    open_held,
    take_lock_file,
)

__all__ = [
    "LOCK_SUFFIX",
    "PART_SUFFIX",
    "CallLock",
    "call_locks",
    "is_lock_file",
    "is_part_file",
    "judge",
    "lock_path",
    "part_files",
    "part_path",
]

PART_SUFFIX = ".part"
LOCK_SUFFIX = ".lock"
_PART = re.compile(r"\.([0-9a-f]{8})\.part\Z")
_LOCK = re.compile(r"\A\.([0-9a-f]{8})\.lock\Z")
#: times a judge looks again at a lock file replaced while it took its lock
_TRIES = 8


def part_path(shard_path: str, token: str) -> str:
    """The temporary file of the shard at ``shard_path`` in the call named by ``token``."""
    return f"{shard_path}.{token}{PART_SUFFIX}"


def lock_path(folder: str, token: str) -> str:
    """The lock file, in the array's ``folder``, of the call named by ``token``."""
    return os.path.join(folder, f".{token}{LOCK_SUFFIX}")


def is_part_file(name: str) -> bool:
    """True if file (or chunk key) ``name`` is a shard write's temporary file."""
    return _PART.search(name) is not None


def is_lock_file(name: str) -> bool:
    """True if file ``name`` (a path, or a name) is a shard write's lock file."""
    return _LOCK.search(os.path.basename(name)) is not None


def part_files(folder: str) -> Iterator[str]:
    """Paths of the shard writes' temporary files under ``folder`` (an array's folder):
    those of writes killed before their rename, and those of writes running now
    (:func:`judge` tells them apart)."""
    for dirpath, _dirs, files in os.walk(folder):
        for f in files:
            if is_part_file(f):
                yield os.path.join(dirpath, f)


def call_locks(folder: str) -> Iterator[str]:
    """Paths of the shard writes' lock files in ``folder`` (an array's folder): those of
    writes running now and those of killed ones (:func:`judge` tells them apart)."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return
    for f in names:
        if is_lock_file(f):
            yield os.path.join(folder, f)


class CallLock:
    """One rank's shared lock on its call's lock file (see the module's docstring), through
    one descriptor: :meth:`create` (rank 0) or :meth:`join` (the others) before the call
    makes any ``.part`` file, :meth:`release` once the call is over."""

    def __init__(self, path: str, fd: int, key: tuple[int, int]) -> None:
        self.path = path
        self._fd = fd
        self._key = key

    @classmethod
    def create(cls, path: str) -> CallLock:
        """Make the lock file ``path`` (or open it, where there) and hold it. Raises
        :class:`OSError` where it cannot be made."""
        # (open for reading too: NFS takes a shared flock only on such a descriptor)
        fd, key = take_lock_file(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, fcntl.LOCK_SH)
        return cls(path, fd, key)

    @classmethod
    def join(cls, path: str) -> CallLock:
        """Hold the lock file ``path``, which rank 0 made and holds. Raises
        :class:`OSError` (:class:`FileNotFoundError` where it is not there)."""
        with HELD_LOCKS_MUTEX:
            fd, key = open_held(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_SH)
        except BaseException:
            with HELD_LOCKS_MUTEX:
                close_held(fd, key)
            raise
        return cls(path, fd, key)

    def release(self, *, remove: bool = False) -> None:
        """Let go of the lock (closing the descriptor releases it); with ``remove`` (as the
        rank leaves the call) delete the lock file first. A second call does nothing."""
        fd, self._fd = self._fd, -1
        if fd < 0:
            return
        try:
            if remove:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path)
        finally:
            with HELD_LOCKS_MUTEX:
                close_held(fd, self._key)


def judge(path: str, folder: str, *, remove: bool = False) -> LeftoverState:
    """Whether the collective shard write that made ``path`` -- a ``.part`` file, or a lock
    file, of the array whose folder is ``folder`` -- is still running, by trying its call's
    lock without waiting (see the module's docstring); with ``remove``, delete ``path`` only
    where it is :attr:`~LeftoverState.DEAD`."""
    if is_lock_file(path):
        lock = path
    else:
        found = _PART.search(path)
        if found is None:
            raise ValueError(f"{path} is no file of a collective shard write")
        lock = lock_path(folder, found.group(1))
    with HELD_LOCKS_MUTEX:
        return _judge_by(lock, path, remove)


def _judge_by(lock: str, path: str, remove: bool) -> LeftoverState:
    """:func:`judge` of ``path`` by lock file ``lock`` (under
    :data:`~strataio.storage.posix.HELD_LOCKS_MUTEX`)."""
    for _ in range(_TRIES):
        try:
            if held_here(os.stat(lock, follow_symlinks=False)):  # (never opened again here)
                return _running(path)
        except FileNotFoundError:
            return _dead(path, remove)  # (the call is over)
        state, fd = lock_to_judge(lock)
        if state is LeftoverState.GONE:
            return _dead(path, remove)  # (the call is over)
        if state is LeftoverState.LIVE:
            return _running(path)
        if state is not None:
            return state
        try:
            if names_file(lock, fd):
                return _dead(path, remove)
            # (deleted, or made again, since it was opened: look again)
        finally:
            os.close(fd)
    return LeftoverState.UNKNOWN


def _running(path: str) -> LeftoverState:
    """The state of ``path``, a file of a call found running: GONE where it is renamed or
    removed already."""
    return LeftoverState.LIVE if os.path.lexists(path) else LeftoverState.GONE


def _dead(path: str, remove: bool) -> LeftoverState:
    """The state of ``path``, a file of a call found over: deleted with ``remove``."""
    if not os.path.lexists(path):
        return LeftoverState.GONE
    if remove:
        try:
            os.unlink(path)
        except FileNotFoundError:
            return LeftoverState.GONE
    return LeftoverState.DEAD
