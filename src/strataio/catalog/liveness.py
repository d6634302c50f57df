"""Writer liveness: tokens the kernel (or the database server) releases when a process dies.

Every Session registers itself as a *writer* of its catalog and holds a token while it is
open; rows and objects a writer leaves in flight (an announced rewrite, a put not yet
committed, a migration's destination) belong to it. ``fsck`` resolves at once whatever a
writer whose token is gone left behind, and leaves alone only what a live writer may still
be working on. No clock decides: a process killed a second ago is as dead as one killed a
day ago, and a live one stays live however slow it is.

The tokens:

- SQLite catalog: an ``fcntl`` lock (POSIX record lock) on a file per writer, in the
  directory ``<catalog file>.writers/`` beside the database. The lock dies with the process
  (kill -9 included) and is seen by every process on the machine, and on NFS through the
  lock manager. POSIX locks belong to a process, not a file descriptor, and closing any
  descriptor of a file drops the process's lock on it; so this process never opens the lock
  file of a writer it holds itself (:data:`_HELD` answers for those).
- PostgreSQL catalog: a session-level advisory lock, held by the catalog's connection; the
  server releases it when the connection ends (the client died, or closed it).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import socket
import threading
import uuid
from collections.abc import Iterable
from pathlib import Path

#: writer ids whose token this process holds: id -> (pid, open lock file descriptor or -1)
_HELD: dict[str, tuple[int, int]] = {}
_HELD_LOCK = threading.Lock()


def new_writer_id() -> str:
    """A fresh writer id: host, process id and a random part (for people reading listings;
    only the random part makes it unique)."""
    host = socket.gethostname().split(".")[0][:32] or "host"
    return f"{host}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


def held_here(writer: str) -> bool:
    """True if this process holds ``writer``'s token."""
    with _HELD_LOCK:
        got = _HELD.get(writer)
    return got is not None and got[0] == os.getpid()


def advisory_key(writer: str) -> int:
    """The PostgreSQL advisory-lock key (a signed 64-bit integer) of ``writer``."""
    return int.from_bytes(
        hashlib.blake2b(writer.encode(), digest_size=8, person=b"strataio").digest(),
        "big",
        signed=True,
    )


def advisory_halves(key: int) -> tuple[int, int]:
    """``(classid, objid)`` under which ``pg_locks`` lists the advisory lock ``key``."""
    unsigned = key & 0xFFFFFFFFFFFFFFFF
    return unsigned >> 32, unsigned & 0xFFFFFFFF


def note_held(writer: str, fd: int = -1) -> None:
    with _HELD_LOCK:
        _HELD[writer] = (os.getpid(), fd)


def note_released(writer: str) -> int:
    """Forget that this process holds ``writer``; return its lock file descriptor (or -1)."""
    with _HELD_LOCK:
        pid, fd = _HELD.pop(writer, (0, -1))
    return fd if pid == os.getpid() else -1


class LockFiles:
    """The writers' lock files of one SQLite catalog, in directory ``root``."""

    SUFFIX = ".lock"

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def path(self, writer: str) -> Path:
        return self.root / f"{writer.replace('/', '_')}{self.SUFFIX}"

    def hold(self, writer: str) -> None:
        """Create ``writer``'s lock file and lock it for as long as this process lives (or
        until :meth:`release`)."""
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path(writer), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BaseException:
            os.close(fd)
            raise
        note_held(writer, fd)

    def release(self, writer: str) -> None:
        """Drop ``writer``'s lock and remove its file (this process must hold it)."""
        fd = note_released(writer)
        if fd < 0:
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path(writer))
        os.close(fd)  # closing the descriptor releases the lock

    def alive(self, writers: Iterable[str]) -> set[str]:
        """The writers among ``writers`` whose lock some process holds."""
        out = set()
        for w in writers:
            if held_here(w):
                out.add(w)
                continue
            try:
                fd = os.open(self.path(w), os.O_RDWR | os.O_CLOEXEC)
            except FileNotFoundError:
                continue  # never locked, or removed by a check that found it dead
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno not in (errno.EACCES, errno.EAGAIN):
                    raise
                out.add(w)  # another process holds it: that writer is alive
            finally:
                os.close(fd)  # also drops the lock this check may have taken
        return out

    def forget(self, writers: Iterable[str]) -> None:
        """Remove the lock files of writers found dead."""
        for w in writers:
            if not held_here(w):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path(w))
