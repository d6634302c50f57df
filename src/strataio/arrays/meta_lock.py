"""The lock that makes a change of a plain array's ``zarr.json`` one step across processes.

An attribute change reads ``zarr.json``, changes it and puts it back
(:meth:`strataio.arrays.store.ChunkStore.update_meta`); two changes that overlap in time
would each put what they read plus their own change, and the later put would drop the
earlier change. On a file system the change holds an exclusive ``flock`` on the array's
*meta lock file*, ``.zarr.json.lock`` in the array's folder (:func:`lock_path`), from before
its read until after its rename, so changes by any number of processes and threads apply
one after the other. (A Zarr reader looks for ``zarr.json`` alone, and never sees it.)

The lock file is made by the change that needs it and removed by that change before it lets
go of the lock, so none stays behind after a change; a change that takes the lock on a file
its name no longer holds (removed by the change before it, or by a judge) makes it again.
A change killed while it holds the lock leaves the file: the kernel releases the lock, and
:func:`judge` tells such a file (:attr:`~strataio.storage.posix.LeftoverState.DEAD`, deleted
where asked) from the lock file of a change running now (``strataio fsck PATH``), as for a
put's temporary file (:func:`strataio.storage.posix.judge_leftover`).

Threads of one process take a thread lock per folder first, so only one of them opens the
lock file at a time: on NFS, where ``flock`` is emulated with ``fcntl`` locks, closing any
descriptor of a file drops the process's locks on it, and a lock the process takes again is
never refused by its own. For the same reason :func:`judge` answers for a lock file this
process holds from what it noted (:func:`strataio.storage.posix.held_here`), never opening
it. On a file system that keeps no locks the
change is two steps, as on a backend without locks (NFS ``nolock``, Lustre ``localflock``:
see :mod:`strataio.storage.posix`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import weakref
from collections.abc import Iterator

from strataio.storage.posix import (
    HELD_LOCKS_MUTEX,
    LeftoverState,
    close_held,
    held_here,
    judge_leftover,
    names_file,
    take_lock_file,
)

__all__ = ["LOCK_NAME", "is_meta_lock", "judge", "lock_path", "meta_lock"]

#: the meta lock file's name, in the array's folder
LOCK_NAME = ".zarr.json.lock"

#: one thread lock per array folder, by ``(st_dev, st_ino)``, while some thread uses it
_FOLDERS: weakref.WeakValueDictionary[tuple[int, int], threading.Lock] = (
    weakref.WeakValueDictionary()
)
_FOLDERS_MUTEX = threading.Lock()


def lock_path(folder: str) -> str:
    """The meta lock file of the array whose folder is ``folder``."""
    return os.path.join(folder, LOCK_NAME)


def is_meta_lock(name: str) -> bool:
    """True if file ``name`` (a path, or a name) is an array's meta lock file."""
    return os.path.basename(name) == LOCK_NAME


@contextlib.contextmanager
def meta_lock(folder: str) -> Iterator[None]:
    """Hold the meta lock of the array in ``folder`` (see the module's docstring) for the
    body of the ``with``; waits while another process or thread holds it. Raises
    :class:`OSError` where the lock file cannot be made (no such folder, no permission)."""
    st = os.stat(folder)
    with _FOLDERS_MUTEX:
        mine = _FOLDERS.setdefault((st.st_dev, st.st_ino), threading.Lock())
    with mine:
        path = lock_path(folder)
        fd, key = take_lock_file(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, fcntl.LOCK_EX)
        try:
            yield
        finally:
            try:
                if names_file(path, fd):  # (it does: a judge deletes only files not held)
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
            finally:
                with HELD_LOCKS_MUTEX:
                    close_held(fd, key)  # (releases the lock)


def judge(path: str, *, remove: bool = False) -> LeftoverState:
    """Whether a change holds the meta lock file ``path``: LIVE where one does (this
    process's included), DEAD where its change was killed (deleted with ``remove``), GONE
    where no file is there any more, UNKNOWN where no lock can be taken or refused here."""
    with HELD_LOCKS_MUTEX:
        try:
            st = os.stat(path, follow_symlinks=False)
        except FileNotFoundError:
            return LeftoverState.GONE
        if held_here(st):  # (never opened here while held here)
            return LeftoverState.LIVE
        return judge_leftover(path, remove=remove)
