"""POSIX backend: objects are files under a root directory.

Partial reads and writes batch Extents into ``preadv`` / ``pwritev`` calls (one call per run of
file-adjacent pieces, up to ``IOV_MAX`` buffers; :mod:`strataio.storage.vectored`). Whole-object
``put`` writes a temporary file in the same directory and renames it over the target, so a crash
leaves the old object or the new one, never a torn one.

A put killed before its rename leaves its temporary file (``<object>.<pid>.<n>.strataio-tmp``,
:meth:`PosixBackend.leftovers`). Whether a temporary file is such a leftover or belongs to a put
running now is decided by a lock, never a clock: a put holds an exclusive ``flock`` on its
temporary file from just after creating it until after its rename, and the kernel releases the
lock when the process dies (kill -9 included). :func:`judge_leftover` takes the lock without
waiting: got, the writer is gone and the file can be deleted at once; refused, a put is writing
it. (A file system that keeps no locks leaves the question open: such files are never deleted.
Locks must be seen by every host that writes: NFS with its lock manager is, a mount with
host-local locks, such as NFS ``nolock`` or Lustre ``localflock``, is not.)
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import os
import stat
import threading
from collections.abc import Iterable, Iterator, Sequence
from enum import StrEnum
from pathlib import Path

import numpy as np

from strataio.errors import BackendError, ExistsError, NotFoundError, ShapeMismatchError
from strataio.layout.extents import Extents
from strataio.storage.base import (
    Backend,
    BytesLike,
    Capabilities,
    Version,
    check_batch,
    validate_key,
)
from strataio.storage.vectored import VectoredPlan

try:  # the compiled batch read (setup.py); where it was not built, the same loop in Python
    from strataio.storage import _filebatch
except ImportError:  # pragma: no cover - depends on the build
    _filebatch = None

TMP_SUFFIX = ".strataio-tmp"
_tmp_counter = iter(range(1 << 62))
_tmp_lock = threading.Lock()
#: ``_put_file``'s "whatever version is there" (None means "no object there")
_ANY_VERSION = object()
#: how many times a put makes its folders and opens its file where another process removes
#: them, found empty, in between: each retry needs another removal inside that narrow window
_FOLDER_TRIES = 8


def _transfer(fd: int, ext: Extents, buf: memoryview, write: bool) -> None:
    """Move the pieces of ``ext`` between file ``fd`` and ``buf`` (positions ``ext.mem``)."""
    if len(ext) == 0:
        return
    data = np.frombuffer(buf, dtype=np.uint8) if write else np.ndarray(len(buf), np.uint8, buf)
    try:
        plan = VectoredPlan(ext.offsets, ext.lengths, ext.mem)
        if write:
            plan.write(fd, data)
        else:
            plan.read(fd, data)
    except ValueError as exc:  # pieces outside the buffer or the file: refused before any I/O
        raise ShapeMismatchError(str(exc)) from None


def _finish_short(fd: int, views: list[memoryview], pos: int, done: int, write: bool) -> None:
    """Complete a short preadv/pwritev; a read past end-of-file zero-fills (a hole)."""
    skip = done
    for v in views:
        if skip >= len(v):
            skip -= len(v)
            pos += len(v)
            continue
        rest = v[skip:]
        pos += skip
        skip = 0
        while len(rest):
            n = os.pwrite(fd, rest, pos) if write else os.preadv(fd, [rest], pos)
            if n == 0:  # end of file on read: the rest reads as zeros
                rest[:] = b"\x00" * len(rest)
                break
            rest = rest[n:]
            pos += n


#: :meth:`PosixBackend.root_problem` of a root with nothing at its path
ROOT_MISSING = "missing"


class PosixBackend(Backend):
    """Objects are files under ``root``; keys are relative paths below it.

    A ``root`` that is not a directory (gone since it was made, a volume unmounted with its
    mount point, a file in its place) is a backend that does not answer, never one that holds
    no objects: every look that would find an object missing (:meth:`get`, :meth:`size`,
    :meth:`exists`, :meth:`versions`, :meth:`list`, :meth:`delete`...) raises
    :class:`BackendError` naming it, and no put makes it again (only the constructor makes
    it, with ``create``). Else a listing of such a tier found every copy gone, and a probe
    that put an object made an empty root in its place."""

    def __init__(self, root: str | os.PathLike[str], *, create: bool | None = True) -> None:
        """``create``: make ``root`` (and its parents) if missing; False: refuse a ``root``
        that is not a directory; None: look at nothing (a tier built while its directory is
        unusable: each operation fails until it is usable again)."""
        self.root = Path(root).absolute()
        if create:
            self.root.mkdir(parents=True, exist_ok=True)
        elif create is not None and not self.root.is_dir():
            raise NotFoundError(f"backend root {self.root} is not a directory")
        self.url = f"posix:{self.root}"
        self._prefix = str(self.root) + os.sep
        self.capabilities = Capabilities(
            partial_write=True, append=True, preferred_io_size=4 << 20, latency=0.0
        )

    # ----------------------------------------------------------------- helpers
    def path(self, key: str) -> str:
        """The file path of ``key`` (validated)."""
        return self._prefix + validate_key(key)

    def key_problem(self, key: str) -> str:
        """Why ``key`` can name no file here: its path, or that of the temporary file a put
        writes beside it, over the bytes a path may have on the root's file system
        (PATH_MAX), or a part of it over those of a file name (NAME_MAX); "" where it can."""
        path = os.fsencode(self.path(key))
        path_max, name_max = _limits(str(self.root))
        tmp = len(path) + _TMP_ROOM
        if tmp >= path_max:  # (PATH_MAX counts the final NUL)
            return (
                f"its path of {len(path)} bytes ({tmp} with the temporary file a put writes "
                f"beside it) is over the {path_max - 1} bytes a path may have on this file "
                f"system ({self.root})"
            )
        parts = [len(p) for p in path[len(os.fsencode(self._prefix)) :].split(b"/")]
        parts[-1] += _TMP_ROOM
        if max(parts) > name_max:
            return (
                f"a part of its path of {max(parts)} bytes (with the temporary file a put "
                f"writes beside it) is over the {name_max} bytes a file name may have on "
                f"this file system ({self.root})"
            )
        return ""

    def root_problem(self) -> str:
        """Why the root cannot be used, in words: "" where it is a directory,
        :data:`ROOT_MISSING` where nothing is there, else the system's reason (``Not a
        directory``, ``Permission denied``...)."""
        try:
            if stat.S_ISDIR(os.stat(self.root).st_mode):
                return ""
            return os.strerror(errno.ENOTDIR)
        except FileNotFoundError:
            return ROOT_MISSING
        except OSError as exc:
            return exc.strerror or str(exc)

    def _root_error(self) -> BackendError | None:
        """The error of a root that is not a directory (see the class doc); None where it
        is one."""
        why = self.root_problem()
        if not why:
            return None
        if why == ROOT_MISSING:
            said = (
                "is missing (a volume not mounted, or the directory removed): nothing is "
                "made in its place; mount it or put it back"
            )
        else:
            said = f"cannot be used: {why}"
        return BackendError(f"{self.url}: the backend's root {self.root} {said}")

    def _missing(self, key: str) -> NotFoundError:
        """The error of ``key`` found missing: :class:`NotFoundError`, but where the root is
        not a directory, whose error is raised."""
        root = self._root_error()
        if root is not None:
            raise root
        return NotFoundError(f"no object {key!r} in {self.url}")

    def _ensure_parent(self, path: str) -> None:
        """Make the folders of ``path`` below the root (never the root: see the class
        doc)."""
        root = self._root_error()
        if root is not None:
            raise root
        os.makedirs(os.path.dirname(path), exist_ok=True)

    def _open_creating(self, path: str, flags: int) -> int:
        """``os.open`` of ``path`` with ``flags`` (``O_CREAT`` among them), making its
        folders where missing, and again where they are removed, found empty, between their
        making and the open (:meth:`remove_empty_folders` of a deleted dataset's name, in
        another process)."""
        for _ in range(_FOLDER_TRIES):
            try:
                return os.open(path, flags, 0o644)
            except FileNotFoundError:
                with contextlib.suppress(FileNotFoundError):  # (one above went meanwhile)
                    self._ensure_parent(path)
        return os.open(path, flags, 0o644)

    def _open(self, key: str, flags: int) -> int:
        path = self.path(key)
        try:
            return os.open(path, flags | os.O_CLOEXEC, 0o644)
        except FileNotFoundError:
            if flags & os.O_CREAT:
                return self._open_creating(path, flags | os.O_CLOEXEC)
            raise self._missing(key) from None
        except OSError as exc:
            raise BackendError(f"{self.url}: cannot open {key!r}: {exc}") from exc

    # ----------------------------------------------------------------- Backend
    def read(self, key: str, extents: Extents) -> bytearray:
        out = bytearray(int((extents.mem + extents.lengths).max(initial=0)))
        self.readinto(key, extents, out)
        return out

    def readinto(self, key: str, extents: Extents, out: BytesLike) -> int:
        """Read the pieces of ``extents`` into ``out`` at positions ``extents.mem``.

        Returns the object's size in bytes (bytes past its end read as zeros).
        """
        fd = self._open(key, os.O_RDONLY)
        try:
            with _naming(self.path(key)):
                _transfer(fd, extents, memoryview(out).cast("B"), write=False)
            return os.fstat(fd).st_size
        finally:
            os.close(fd)

    def readinto_range(
        self, key: str, offset: int, out: memoryview, *, nowait: bool = False
    ) -> int:
        return self.readinto_range_versioned(key, offset, out, nowait=nowait)[0]

    def readinto_range_versioned(
        self, key: str, offset: int, out: memoryview, *, nowait: bool = False
    ) -> tuple[int, Version]:
        """The read and the version from one ``fstat`` of the descriptor read, after the
        read: the version of the very object the bytes came from (a put that replaces the
        key meanwhile makes a new inode, which this descriptor does not see)."""
        (got,) = self._read_ranges([key], [offset], [out], nowait)
        if isinstance(got, Exception):
            raise got
        return got

    def readinto_ranges_versioned(
        self,
        keys: Sequence[str],
        offsets: Sequence[int],
        outs: Sequence[memoryview],
        *,
        nowait: bool = False,
    ) -> list[tuple[int, Version] | Exception]:
        """Per file: open, advise, one ``preadv`` (``RWF_NOWAIT`` with ``nowait``: served
        from the page cache or the pages are asked for and ``BlockingIOError`` EINPROGRESS
        comes back in its place), ``fstat``, close; a missing file gives
        :class:`NotFoundError`. The batch runs in one compiled loop without the GIL
        (``strataio.storage._filebatch``) where the package was built with it, else in one
        Python loop: a section's first read of many small chunks spent more in Python calls
        per file than in the system calls."""
        return self._read_ranges(keys, offsets, outs, nowait)

    def _read_ranges(
        self,
        keys: Sequence[str],
        offsets: Sequence[int],
        outs: Sequence[memoryview],
        nowait: bool,
    ) -> list[tuple[int, Version] | Exception]:
        # (the body of both reads, single and batched: a subclass may route the batch
        # through the single read, Backend's per-key loop, which must then not come back)
        check_batch(keys, offsets, outs)
        if _filebatch is None:
            return self._read_ranges_python(keys, offsets, outs, nowait)
        prefix = self._prefix
        got = _filebatch.read_ranges(
            [_fs_path(prefix, k) for k in keys], list(offsets), list(outs), nowait
        )
        results: list[tuple[int, Version] | Exception] = []
        missing = False
        for key, (err, size, ino, ctime_ns) in zip(keys, got):
            if not err:
                results.append((size, (ino, size, ctime_ns)))
            elif err == errno.ENOENT:
                results.append(NotFoundError(f"no object {key!r} in {self.url}"))
                missing = True
            elif err == errno.EINPROGRESS:
                results.append(BlockingIOError(errno.EINPROGRESS, f"fetching {key!r}"))
            else:
                results.append(OSError(err, os.strerror(err), prefix + key))
        return self._found_missing(results) if missing else results

    def _found_missing(
        self, results: list[tuple[int, Version] | Exception]
    ) -> list[tuple[int, Version] | Exception]:
        """``results`` of a batch read some of which found no object: where the root is not
        a directory, its error in place of each "no object"."""
        root = self._root_error()
        if root is None:
            return results
        return [root if isinstance(r, NotFoundError) else r for r in results]

    def _read_ranges_python(
        self,
        keys: Sequence[str],
        offsets: Sequence[int],
        outs: Sequence[memoryview],
        nowait: bool,
    ) -> list[tuple[int, Version] | Exception]:
        """:meth:`readinto_ranges_versioned` without the compiled loop."""
        prefix = self._prefix
        flags = os.O_RDONLY | os.O_CLOEXEC
        results: list[tuple[int, Version] | Exception] = []
        missing = False
        for key, offset, out in zip(keys, offsets, outs):
            try:
                fd = os.open(prefix + validate_key(key), flags)
            except FileNotFoundError:
                results.append(NotFoundError(f"no object {key!r} in {self.url}"))
                missing = True
                continue
            except OSError as exc:
                results.append(_named(exc, prefix + key))
                continue
            try:
                # One call reads the whole range, so kernel readahead has nothing to add;
                # worse, its markers on cached pages make RWF_NOWAIT refuse reads that need
                # no I/O at all. (Only advice: a file that takes none is read all the same.)
                with contextlib.suppress(OSError):
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
                if nowait:
                    # RWF_NOWAIT: served from the page cache or EAGAIN, never a disk wait;
                    # a file system that takes no such read (tmpfs, FUSE) is read plainly
                    try:
                        got = os.preadv(fd, [out], offset, os.RWF_NOWAIT)
                    except BlockingIOError:
                        got = 0
                    except OSError as exc:
                        if exc.errno != errno.EOPNOTSUPP:
                            raise
                        got = os.preadv(fd, [out], offset)
                    st = os.fstat(fd)
                    if got < len(out) and offset + got < st.st_size:
                        _start_fetch(fd, offset + got, len(out) - got)
                        results.append(BlockingIOError(errno.EINPROGRESS, f"fetching {key!r}"))
                        continue
                else:
                    got = os.preadv(fd, [out], offset)
                    st = os.fstat(fd)
                if got < len(out):
                    _finish_short(fd, [out], offset, got, write=False)
                    st = os.fstat(fd)
                results.append((st.st_size, (st.st_ino, st.st_size, st.st_ctime_ns)))
            except OSError as exc:
                results.append(_named(exc, prefix + key))
            finally:
                os.close(fd)
        return self._found_missing(results) if missing else results

    def write(self, key: str, extents: Extents, data: BytesLike) -> None:
        fd = self._open(key, os.O_WRONLY | os.O_CREAT)
        try:
            with _naming(self.path(key)):
                _transfer(fd, extents, memoryview(data).cast("B"), write=True)
        finally:
            os.close(fd)

    def get(self, key: str) -> bytearray:
        fd = self._open(key, os.O_RDONLY)
        try:
            n = os.fstat(fd).st_size
            out = bytearray(n)
            view = memoryview(out)
            got = 0
            with _naming(self.path(key)):  # (a directory opens, and fails at the read)
                while got < n:
                    k = os.readv(fd, [view[got:]])
                    if k == 0:
                        del out[got:]
                        break
                    got += k
            return out
        finally:
            os.close(fd)

    def put(self, key: str, data: BytesLike, *, durable: bool = False) -> None:
        self._put_file(key, data, durable)

    def put_versioned(self, key: str, data: BytesLike, *, durable: bool = False) -> Version | None:
        """:meth:`put`; the version is that of the file this put renamed into place, taken
        through its descriptor after the rename (which sets its ctime), so a put by another
        process right after cannot pass for it. (A subclass that overrides :meth:`put` has
        its objects put through that, and their versions looked up after.)"""
        if type(self).put is not PosixBackend.put:
            return super().put_versioned(key, data, durable=durable)
        return self._put_file(key, data, durable)

    def put_new(self, key: str, data: BytesLike, *, durable: bool = False) -> Version | None:
        """:meth:`put_versioned`, linking the new file into place (which fails, atomically,
        where the name is taken) instead of renaming it over whatever is there."""
        if type(self).put is not PosixBackend.put:
            return super().put_new(key, data, durable=durable)
        return self._put_file(key, data, durable, replace=False)

    def put_if(
        self, key: str, data: BytesLike, version: Version | None, *, durable: bool = False
    ) -> Version | None:
        """:meth:`Backend.put_if`: the look and the rename hold the folder's lock
        exclusively, so another process's put or conditional delete is either seen by the
        look or comes after the rename."""
        if type(self).put is not PosixBackend.put:
            return super().put_if(key, data, version, durable=durable)
        return self._put_file(key, data, durable, only_over=version)

    def _put_file(
        self,
        key: str,
        data: BytesLike,
        durable: bool,
        replace: bool = True,
        only_over: Version | None | object = _ANY_VERSION,
    ) -> Version:
        path = self.path(key)
        # (an error of something in the way names the object, not the temporary file)
        with _naming(path):
            tmp, fd = self._create_tmp(path)
            try:
                view = memoryview(data).cast("B")
                while len(view):
                    view = view[os.write(fd, view) :]
                if durable:
                    os.fsync(fd)
                conditional = only_over is not _ANY_VERSION
                with _folder_lock(os.path.dirname(path), exclusive=conditional):
                    if conditional and self.versions([key]) != [only_over]:
                        raise ExistsError(f"object {key!r} changed since it was looked at")
                    if replace:
                        os.replace(tmp, path)
                    else:
                        try:
                            os.link(tmp, path)
                        except FileExistsError:
                            if os.path.isdir(path):  # (no object: a directory in its way)
                                raise IsADirectoryError(
                                    errno.EISDIR, os.strerror(errno.EISDIR), path
                                ) from None
                            raise ExistsError(f"object {key!r} exists already") from None
                        os.unlink(tmp)  # (after the link: its ctime, in the version, is final)
                st = os.fstat(fd)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            finally:
                os.close(fd)
            if durable:
                _fsync_dir(os.path.dirname(path))
            return (st.st_ino, st.st_size, st.st_ctime_ns)

    def _create_tmp(self, path: str) -> tuple[str, int]:
        """A new temporary file beside ``path``, open for writing, under this process's lock
        (held until the descriptor is closed: see the module's docstring)."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        while True:
            with _tmp_lock:
                tmp = f"{path}.{os.getpid()}.{next(_tmp_counter)}{TMP_SUFFIX}"
            try:
                fd = self._open_creating(tmp, flags)
            except FileExistsError:  # left by an earlier process of the same pid
                continue
            try:
                with contextlib.suppress(OSError):  # (no locks here: see judge_leftover)
                    fcntl.flock(fd, fcntl.LOCK_EX)
                if names_file(tmp, fd):
                    return tmp, fd
            except BaseException:
                os.close(fd)
                raise
            # judge_leftover found it between its creation and the lock, and deleted it
            os.close(fd)

    def versions(self, keys: Sequence[str]) -> list[Version | None]:
        """``(inode, size, ctime_ns)`` per key: a put makes a new inode, and any write or
        truncation, by any process, a new ctime (which the kernel, unlike mtime, never lets a
        user set back). One compiled loop where the package was built with it."""
        prefix = self._prefix
        if _filebatch is not None:
            got = _filebatch.stat_files([_fs_path(prefix, k) for k in keys])
            out: list[Version | None] = []
            for key, (err, size, ino, ctime_ns) in zip(keys, got):
                if err == errno.ENOENT:
                    out.append(None)
                elif err:
                    raise OSError(err, os.strerror(err), prefix + key)
                else:
                    out.append((ino, size, ctime_ns))
        else:
            os_stat = os.stat
            out = []
            for key in keys:
                try:
                    st = os_stat(prefix + validate_key(key))
                except FileNotFoundError:
                    out.append(None)
                    continue
                out.append((st.st_ino, st.st_size, st.st_ctime_ns))
        if None in out and (root := self._root_error()) is not None:
            raise root
        return out

    def size(self, key: str) -> int:
        """The object's size; a directory at its path is no object, and raises
        IsADirectoryError (something in its way), as a read of it does."""
        path = self.path(key)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            raise self._missing(key) from None
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
        return st.st_size

    def exists(self, key: str) -> bool:
        if os.path.isfile(self.path(key)):
            return True
        self._missing(key)
        return False

    def delete(self, key: str) -> None:
        try:
            os.unlink(self.path(key))
        except FileNotFoundError:
            self._missing(key)

    def delete_if(self, key: str, version: Version) -> bool:
        """Delete the file if it is still at ``version``; the look and the unlink hold the
        folder's lock, which every put takes (shared) around its rename: a put by another
        process between the two is never the file deleted."""
        path = self.path(key)
        with _folder_lock(os.path.dirname(path), exclusive=True):
            if self.versions([key]) != [version]:
                return False
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        return True

    def list(self, prefix: str = "") -> Iterator[str]:
        base = self.root / validate_key(prefix.rstrip("/")) if prefix else self.root
        if not base.is_dir():
            if (root := self._root_error()) is not None:
                raise root
            return
        for dirpath, _dirs, files in os.walk(base):
            rel = os.path.relpath(dirpath, self.root)
            for f in sorted(files):
                if f.endswith(TMP_SUFFIX):
                    continue
                yield f if rel == "." else f"{rel}/{f}".replace(os.sep, "/")

    def remove_empty_folders(self, prefix: str) -> int:
        """:meth:`Backend.remove_empty_folders`: an ``rmdir`` of each folder under
        ``prefix``, deepest first, which fails on one holding anything (a file put, a
        temporary file of a put running, a folder made meanwhile), left as it is."""
        removed = 0
        for dirpath, _dirs, _files in os.walk(self.path(prefix.rstrip("/")), topdown=False):
            try:
                os.rmdir(dirpath)
            except OSError:
                continue  # (not empty, gone already, or refused: it holds no object)
            removed += 1
        return removed

    def sync(self, keys: Iterable[str] | None = None) -> None:
        """fsync each object and then each directory holding one, so that both the bytes and
        the renames that put them in place survive a power loss. A key with no object there
        is passed over; one with a file where one of its folders should be (ENOTDIR) is too,
        and once the others are synced, the first such raises NotADirectoryError naming
        that object: a put made there did not stay (a commit's look at its version tells)."""
        if keys is None:
            keys = list(self.list())
        dirs: set[str] = set()
        in_way: OSError | None = None
        for key in keys:
            path = self.path(key)
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            except NotADirectoryError as exc:
                in_way = in_way or _named(exc, path)
                continue
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            dirs.add(os.path.dirname(path))
        for d in sorted(dirs):
            _fsync_dir(d)
        if in_way is not None:
            raise in_way

    def truncate(self, key: str, nbytes: int) -> None:
        """Set the object's size to ``nbytes`` (growing with zeros), creating it if needed."""
        fd = self._open(key, os.O_WRONLY | os.O_CREAT)
        try:
            os.ftruncate(fd, nbytes)
        finally:
            os.close(fd)

    def drop_cache(self, key: str) -> None:
        """Evict ``key``'s pages from the OS page cache (for cold-cache measurements).

        Dirty pages cannot be dropped, so the file is flushed first.
        """
        try:
            fd = os.open(self.path(key), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)

    def leftovers(self) -> Iterator[str]:
        """Paths of the temporary files of ``put`` calls: those of puts killed before their
        rename, and those of puts running now (:func:`judge_leftover` tells them apart)."""
        for dirpath, _dirs, files in os.walk(self.root):
            for f in files:
                if f.endswith(TMP_SUFFIX):
                    yield os.path.join(dirpath, f)


def names_file(path: str, fd: int) -> bool:
    """Whether ``path`` still names the file open as ``fd``: not unlinked since it was
    opened, nor replaced by another. (The link count alone does not say it on NFS: a file
    unlinked there while a client holds it open is renamed to a hidden ``.nfs*`` name, its
    count staying 1.)"""
    mine = os.fstat(fd)
    if not mine.st_nlink:
        return False
    try:
        now = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino)


def open_identified(path: str, flags: int) -> tuple[int, tuple[int, int]]:
    """Open ``path`` (with ``flags``, made with mode 0o644 where they say so): its descriptor
    and the file's ``(st_dev, st_ino)``, which name it however its path changes (a lock
    file's holders note theirs by it)."""
    fd = os.open(path, flags, 0o644)
    try:
        st = os.fstat(fd)
    except BaseException:
        os.close(fd)
        raise
    return fd, (st.st_dev, st.st_ino)


#: the lock files this process holds, by ``(st_dev, st_ino)``: (pid, how many holds); a
#: child forked while one was held does not hold it
_HELD_LOCKS: dict[tuple[int, int], tuple[int, int]] = {}
#: taken around each opening (and noting) of a lock file and around each judgment of one, so
#: that a judge never opens a lock file this process is about to note (on NFS, closing any
#: descriptor of a file drops the process's locks on it)
HELD_LOCKS_MUTEX = threading.Lock()


def open_held(path: str, flags: int) -> tuple[int, tuple[int, int]]:
    """Open lock file ``path`` (:func:`open_identified`) and note it held by this process;
    the caller holds :data:`HELD_LOCKS_MUTEX`."""
    fd, key = open_identified(path, flags)
    pid, n = _HELD_LOCKS.get(key, (os.getpid(), 0))
    _HELD_LOCKS[key] = (os.getpid(), n + 1 if pid == os.getpid() else 1)
    return fd, key


def close_held(fd: int, key: tuple[int, int]) -> None:
    """Close a lock file's descriptor, releasing its lock, and forget one hold of it; the
    caller holds :data:`HELD_LOCKS_MUTEX`."""
    try:
        os.close(fd)
    finally:
        pid, n = _HELD_LOCKS.pop(key, (0, 0))
        if pid == os.getpid() and n > 1:
            _HELD_LOCKS[key] = (pid, n - 1)


def held_here(st: os.stat_result) -> bool:
    """True if this process holds the lock file ``st`` is of (the caller holds
    :data:`HELD_LOCKS_MUTEX`): a judge answers from this, never opening it."""
    got = _HELD_LOCKS.get((st.st_dev, st.st_ino))
    return got is not None and got[0] == os.getpid()


def take_lock_file(path: str, flags: int, mode: int) -> tuple[int, tuple[int, int]]:
    """Open lock file ``path`` with ``flags`` (``O_CREAT`` among them to make it), note it
    held (:func:`open_held`) and ``flock`` it with ``mode``, again where the name no longer
    names the file locked (deleted meanwhile by its last holder or a judge): its descriptor
    and ``(st_dev, st_ino)``, for :func:`close_held`. Where the file system keeps no locks
    it is held unlocked (its judges tell nothing)."""
    while True:
        with HELD_LOCKS_MUTEX:
            fd, key = open_held(path, flags)
        try:
            with contextlib.suppress(OSError):  # (no locks on this file system)
                fcntl.flock(fd, mode)
            if names_file(path, fd):
                return fd, key
        except BaseException:
            with HELD_LOCKS_MUTEX:
                close_held(fd, key)
            raise
        with HELD_LOCKS_MUTEX:
            close_held(fd, key)


class LeftoverState(StrEnum):
    """What :func:`judge_leftover` found of a temporary file."""

    DEAD = "dead"  # no process holds it: its put was killed (deleted, where asked)
    LIVE = "live"  # a put running now holds it
    UNKNOWN = "unknown"  # no lock could be taken or refused here: left, never deleted
    GONE = "gone"  # no file there any more (renamed into place, or deleted meanwhile)


def lock_to_judge(path: str) -> tuple[LeftoverState | None, int]:
    """Try to take the exclusive ``flock`` of the file at ``path`` without waiting, to judge
    whether a writer holds it: ``(None, fd)`` where it was taken (held through ``fd``, which
    the caller closes), else ``(state, -1)``: GONE (no file there), LIVE (a writer holds its
    lock) or UNKNOWN (no lock to take or refuse here, or no file of ours: a link, say)."""
    fd = -1
    # (open for writing where allowed: NFS takes an exclusive flock only on such a descriptor)
    for mode in (os.O_RDWR, os.O_RDONLY):
        try:
            fd = os.open(path, mode | os.O_NOFOLLOW | os.O_CLOEXEC)
            break
        except FileNotFoundError:
            return LeftoverState.GONE, -1
        except PermissionError:
            continue
        except OSError:
            return LeftoverState.UNKNOWN, -1
    if fd < 0:
        return LeftoverState.UNKNOWN, -1
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        return (
            LeftoverState.LIVE if isinstance(exc, BlockingIOError) else LeftoverState.UNKNOWN
        ), -1
    return None, fd


def on_read_only_file_system(path: str) -> bool:
    """Whether the file system holding ``path`` is mounted read-only (False where that cannot
    be told): there a temporary file's lock cannot be taken for writing, so
    :func:`lock_to_judge` finds it :attr:`~LeftoverState.UNKNOWN`, and nothing is deleted."""
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def judge_leftover(path: str, *, remove: bool = False) -> LeftoverState:
    """Whether the put that made temporary file ``path`` is still running, by trying its lock
    without waiting (see the module's docstring); with ``remove``, delete the file while
    holding the lock, only where it is :attr:`~LeftoverState.DEAD`. Safe beside running
    puts: a put that has made its file but not yet locked it sees the deletion once it holds
    the lock, and starts over under another name. (The temporary files of collective shard
    writes are judged by their call's lock file: :func:`strataio.arrays.shard_parts.judge`.)"""
    state, fd = lock_to_judge(path)
    if state is not None:
        return state
    try:
        mine = os.fstat(fd)
        if not mine.st_nlink:
            return LeftoverState.GONE
        if remove:
            try:
                now = os.stat(path, follow_symlinks=False)
            except FileNotFoundError:
                return LeftoverState.GONE
            if (now.st_dev, now.st_ino) != (mine.st_dev, mine.st_ino):
                return LeftoverState.UNKNOWN  # another file took the name: judged later
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        return LeftoverState.DEAD
    finally:
        os.close(fd)


#: bytes a put's temporary file name has beyond its object's (``.{pid}.{n}`` and
#: :data:`TMP_SUFFIX`; a pid of 7 digits, a count of 19)
_TMP_ROOM = len(f".{1 << 22}.{1 << 62}{TMP_SUFFIX}")


@functools.lru_cache(maxsize=64)
def _limits(root: str) -> tuple[int, int]:
    """The PATH_MAX (final NUL included) and NAME_MAX of the file system at ``root``
    (Linux's 4096 and 255 where it does not say)."""
    try:
        path_max, name_max = os.pathconf(root, "PC_PATH_MAX"), os.pathconf(root, "PC_NAME_MAX")
    except (OSError, ValueError):
        path_max = name_max = -1
    return (path_max if path_max > 0 else 4096), (name_max if name_max > 0 else 255)


def _named(exc: OSError, path: str) -> OSError:
    """``exc``, where it is of something in an object's way (EISDIR, ENOTDIR), naming the
    object's ``path``: the error of a read on a descriptor names no file, and one of a put
    names the temporary file."""
    if exc.errno not in (errno.EISDIR, errno.ENOTDIR) or exc.filename == path:
        return exc
    named = type(exc)(exc.errno, exc.strerror, path)
    named.__cause__ = exc
    return named


@contextlib.contextmanager
def _naming(path: str) -> Iterator[None]:
    """Raise an error of something in the way of the object at ``path`` as :func:`_named`."""
    try:
        yield
    except OSError as exc:
        named = _named(exc, path)
        if named is exc:
            raise
        raise named from exc


@functools.lru_cache(maxsize=1 << 16)
def _fs_path(prefix: str, key: str) -> bytes:
    """The file system path of ``key`` under ``prefix``, validated and encoded (chunk keys
    repeat across reads)."""
    return os.fsencode(prefix + validate_key(key))


def _start_fetch(fd: int, offset: int, nbytes: int) -> None:
    """Have the kernel read ``nbytes`` from ``offset`` into the page cache in the background
    (``POSIX_FADV_WILLNEED`` submits the reads and returns): the reads of many files started
    this way proceed together on the device, and a later ``pread`` on the calling thread
    waits only for what has not arrived, where a thread per file would pay a hand-off each.
    (A recent kernel already starts reading the pages a refused ``RWF_NOWAIT`` read wanted;
    the advice makes sure of it on kernels that do not.)"""
    with contextlib.suppress(OSError):  # only advice: the later read is what must succeed
        os.posix_fadvise(fd, offset, nbytes, os.POSIX_FADV_WILLNEED)


@contextlib.contextmanager
def _folder_lock(path: str, *, exclusive: bool) -> Iterator[None]:
    """An advisory lock (``flock``) on folder ``path``, across processes: puts take it
    shared around the rename that publishes a file; a conditional put or delete takes it
    exclusive around its look at the file's version and its rename or unlink. Where the
    folder is missing or cannot be locked (a file system without ``flock``), nothing is
    held: the look and the step are then two steps, as on a backend without the lock."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        yield
        return
    try:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)  # (releases the lock)


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.EACCES):
            return
        raise
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
