"""Storage drivers of :class:`strataio.File`: the one door through which its engines reach a file.

As ROMIO's ADIO function table does for MPI-IO, a :class:`Driver` offers the few operations
two-phase, data sieving and independent I/O need — vectored reads and writes of planned file
pieces (:class:`~strataio.storage.vectored.VectoredPlan`, an iovec table of Extents), a
contiguous read or write, byte-range locks, size, truncate, sync and close — and the engines
hold a driver, never a raw descriptor. Two drivers:

- :class:`PosixDriver`: a file descriptor; vectored transfers go through libc's
  ``preadv`` / ``pwritev`` (the ctypes fast path of :mod:`strataio.storage.vectored`), locks
  are POSIX ``fcntl`` byte-range locks, and large writes past the end of the file allocate
  their space first where that pays (:mod:`strataio.storage.preallocate`).
- :class:`ShapedDriver`: another driver made to cost what a slower device costs, by the cost
  model of the Shaped backend (:class:`~strataio.storage.shaped.CostModel`): every data call
  pays the model's fixed time (``open + seeks * seek + close``, ``seeks`` = the system calls
  the transfer makes) plus ``bytes / bandwidth`` (bytes the calls move, holes a sieving read
  crosses included), and at most ``concurrency`` data calls of one
  process proceed at once (an I/O thread and the calling thread share the device). The model's
  seconds are accounted (:attr:`ShapedDriver.accounted`) and slept for, multiplied by
  ``time_scale`` (0: account only). The model is per process: each rank's driver stands for its
  own share of the device (ranks on one node sharing a 200 MB/s disk each get 200 MB/s here).

:func:`open_driver` picks one by the ``strataio_driver`` hint (``posix`` or ``shaped``, with
``strataio_driver_bandwidth`` in bytes per second, ``strataio_driver_latency`` in seconds per
call, ``strataio_driver_concurrency`` and ``strataio_driver_time_scale``).

Errors: ``OSError`` from the system comes through as it is (the caller names the file);
a lock that cannot be taken raises :class:`~strataio.errors.BackendError`.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import threading
import time
from abc import ABC, abstractmethod
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from strataio.collective.hints import AUTOMATIC, ENABLE, MAX_READ_THREADS
from strataio.errors import BackendError, HintError
from strataio.storage.mapped import MAPPED_READ_BYTES, read_cached
from strataio.storage.preallocate import PREALLOCATE_BYTES, allocate, file_system_preallocates
from strataio.storage.shaped import CostModel, Drives, OpCost
from strataio.storage.vectored import VectoredPlan

__all__ = ["Driver", "PosixDriver", "ShapedDriver", "open_driver", "run_shared"]


class Driver(ABC):
    """An open file as the engines of :class:`strataio.File` see it. Offsets and sizes are in
    bytes; buffers are flat ``uint8`` numpy arrays. Reads past end-of-file fill zeros
    (:meth:`readv`) or stop there (:meth:`pread`)."""

    path: str = ""
    read_write: bool = False
    """Whether the file is open for reading and writing (a sieving write reads its spans back;
    on a write-only file it cannot)."""
    preallocates: bool = False
    """Whether large writes past the end of the file allocate their space first."""

    @abstractmethod
    def readv(self, plan: VectoredPlan, buf: np.ndarray) -> None:
        """Fill the planned pieces of ``buf`` from the file (``preadv`` of Extents)."""

    @abstractmethod
    def writev(self, plan: VectoredPlan, buf: np.ndarray) -> None:
        """Write the planned pieces of ``buf`` to the file (``pwritev`` of Extents)."""

    def read_mapped(self, plan: VectoredPlan, buf: np.ndarray) -> bool:
        """Fill the planned pieces of ``buf`` straight from the file's cached pages, where
        that beats staging them (:meth:`VectoredPlan.read_mapped`); False where the caller
        must read them its own way. This base class never does."""
        return False

    @abstractmethod
    def pread(self, buf: np.ndarray, offset: int) -> int:
        """Read into ``buf`` from ``offset`` until it is full or the file ends; the bytes read
        (the rest of ``buf`` is left as it was)."""

    @abstractmethod
    def pwrite(self, buf: np.ndarray, offset: int) -> None:
        """Write all of ``buf`` at ``offset``."""

    @abstractmethod
    def lock(self, offset: int, length: int, shared: bool = False) -> None:
        """Wait for a byte-range lock on ``[offset, offset + length)`` (``length`` > 0),
        exclusive or ``shared``. Locks belong to the process, as POSIX locks do."""

    @abstractmethod
    def unlock(self, offset: int, length: int) -> None:
        """Release a lock taken by :meth:`lock`."""

    @abstractmethod
    def size(self) -> int:
        """The file's size in bytes."""

    @abstractmethod
    def truncate(self, size: int) -> None:
        """Cut or extend the file to ``size`` bytes."""

    @abstractmethod
    def sync(self) -> None:
        """Flush written data to stable storage."""

    @abstractmethod
    def close(self) -> None:
        """Close the file (the driver is unusable afterwards)."""


#: bytes from which a read is shared among the threads a rank may use (below, one thread
#: reads faster than a hand-off costs)
SPLIT_READ_BYTES = 8 << 20
_split_pool: ThreadPoolExecutor | None = None
_split_lock = threading.Lock()


_read_thread = threading.local()  # .busy: this thread is one of the read threads


def _mark_read_thread() -> None:
    _read_thread.busy = True


def _read_pool() -> ThreadPoolExecutor:
    global _split_pool
    with _split_lock:
        if _split_pool is None:
            _split_pool = ThreadPoolExecutor(
                MAX_READ_THREADS - 1,
                thread_name_prefix="strataio-read",
                initializer=_mark_read_thread,
            )
        return _split_pool


def run_shared(work: list[Any]) -> None:
    """Run the callables ``work``: the first on this thread, the others on the read threads
    (at most ``MAX_READ_THREADS - 1`` at once); raise the first error once all are done.
    Called from a read thread (work shared again), it runs them all on that thread: the
    others may all be busy with the work that waits for this one."""
    if getattr(_read_thread, "busy", False):
        for w in work:  # (nothing else runs for this call: an error can go at once)
            w()
        return
    pool = _read_pool()
    futures = []
    error: BaseException | None = None
    try:
        for w in work[1:]:
            futures.append(pool.submit(w))
        work[0]()
    except BaseException as exc:  # (a refused hand-off too: the shares handed off finish first)
        error = exc
    for f in futures:
        exc = f.exception()
        if error is None and exc is not None:
            error = exc
    if error is not None:
        raise error


class PosixDriver(Driver):
    """A POSIX file descriptor (owned: :meth:`close` closes it).

    ``threads``: how many threads a large read (:data:`SPLIT_READ_BYTES` and more) is shared
    among; :class:`strataio.File` sets it from the cores its rank's node has spare (one rank
    alone on a node of several cores reads with more than one). Writes are never shared:
    the file's inode lock serializes concurrent writes to one file.

    :meth:`preallocate` makes a write of :data:`~strataio.storage.preallocate.PREALLOCATE_BYTES`
    or more past the end of the file allocate that space first, in one call
    (:mod:`strataio.storage.preallocate`); :attr:`preallocates` says whether it does."""

    __slots__ = ("_allocated_end", "fd", "path", "preallocates", "read_write", "threads")

    def __init__(self, fd: int, path: str = "") -> None:
        self.fd = fd
        self.path = path
        self.read_write = (fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE) == os.O_RDWR
        self.threads = 1
        self.preallocates = False
        self._allocated_end = 0

    def preallocate(self, on: bool = True) -> None:
        """Preallocate extending writes from now on (``on``) or not."""
        self.preallocates = on
        self._allocated_end = 0  # (the first large write asks the size)

    def _make_room(self, first: int, end: int, nbytes: int) -> None:
        """Before a write of ``nbytes`` into file bytes ``[first, end)``: allocate the part
        past the end of the file, if it is :data:`PREALLOCATE_BYTES` or more and the write
        fills at least 3/4 of its span (pieces with wide holes between them would allocate
        the holes too). The file's size is asked only then, and only past the highest end
        this driver has written: ranks writing interleaved spans would otherwise each
        allocate what the first of them did (see BENCHMARKS.md, "Writes that allocate their
        space first"). Threads writing through one driver at once can only add or skip an
        allocation by racing here."""
        if end <= self._allocated_end:
            return
        start = max(first, self._allocated_end)
        self._allocated_end = end  # (the write extends the file to here)
        if end - start < PREALLOCATE_BYTES or 4 * nbytes < 3 * (end - first):
            return
        start = max(start, os.fstat(self.fd).st_size)
        if end - start >= PREALLOCATE_BYTES and not allocate(self.fd, start, end - start):
            self.preallocates = False  # unsupported here, or the disk is full

    @classmethod
    def open(cls, path: str, flags: int, mode: int = 0o666) -> PosixDriver:
        """``os.open(path, flags, mode)`` as a driver (``OSError`` as the system raises it;
        a directory, which Linux opens read-only, is :class:`IsADirectoryError` here)."""
        fd = os.open(path, flags | os.O_CLOEXEC, mode)
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            os.close(fd)
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
        return cls(fd, path)

    def readv(self, plan: VectoredPlan, buf: np.ndarray) -> None:
        if self.threads > 1 and plan.moved >= SPLIT_READ_BYTES:
            parts = plan.split(self.threads)
            if len(parts) > 1:
                fd = self.fd
                run_shared([lambda p=p: p.read(fd, buf) for p in parts])
                return
        plan.read(self.fd, buf)

    def read_mapped(self, plan: VectoredPlan, buf: np.ndarray) -> bool:
        parts = [plan]
        if self.threads > 1 and plan.moved >= SPLIT_READ_BYTES:
            parts = plan.split(self.threads)
        done = [False] * len(parts)
        fd = self.fd

        def part(k: int) -> None:
            done[k] = parts[k].read_mapped(fd, buf, staged=True)

        if len(parts) > 1:
            run_shared([lambda k=k: part(k) for k in range(len(parts))])
        else:
            part(0)
        return all(done)

    def writev(self, plan: VectoredPlan, buf: np.ndarray) -> None:
        if self.preallocates:
            self._make_room(*plan.span, plan.moved)
        plan.write(self.fd, buf)

    def pread(self, buf: np.ndarray, offset: int) -> int:
        n = len(buf)
        if self.threads > 1 and n >= SPLIT_READ_BYTES:
            cut = [n * k // self.threads for k in range(self.threads + 1)]
            got = [0] * self.threads

            def part(k: int) -> None:
                got[k] = self._pread(buf[cut[k] : cut[k + 1]], offset + cut[k])

            run_shared([lambda k=k: part(k) for k in range(self.threads)])
            # (a share that ended short ended at the end of the file: none after it read any)
            done = 0
            for k in range(self.threads):
                done += got[k]
                if got[k] < cut[k + 1] - cut[k]:
                    break
            return done
        return self._pread(buf, offset)

    def _pread(self, buf: np.ndarray, offset: int) -> int:
        mv = memoryview(buf)
        pos, fd = offset, self.fd
        if len(mv) >= MAPPED_READ_BYTES:
            got = read_cached(fd, pos, mv, int(buf.__array_interface__["data"][0]))
            if got is not None:
                mv = mv[got:]
                pos += got
        while len(mv):
            n = os.preadv(fd, [mv], pos)
            if n == 0:
                break
            mv = mv[n:]
            pos += n
        return pos - offset

    def pwrite(self, buf: np.ndarray, offset: int) -> None:
        if self.preallocates:
            self._make_room(offset, offset + len(buf), len(buf))
        mv = memoryview(buf)
        pos, fd = offset, self.fd
        while len(mv):
            n = os.pwrite(fd, mv, pos)
            mv = mv[n:]
            pos += n

    def lock(self, offset: int, length: int, shared: bool = False) -> None:
        try:
            fcntl.lockf(self.fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX, length, offset)
        except OSError as exc:
            raise BackendError(
                f"{self.path or 'file'}: cannot lock bytes [{offset}, {offset + length}): {exc}"
            ) from exc

    def unlock(self, offset: int, length: int) -> None:
        fcntl.lockf(self.fd, fcntl.LOCK_UN, length, offset)

    def size(self) -> int:
        return os.fstat(self.fd).st_size

    def truncate(self, size: int) -> None:
        os.ftruncate(self.fd, size)
        # (what a cut frees is no longer allocated; what an extension adds is a hole)
        self._allocated_end = min(self._allocated_end, size)

    def sync(self) -> None:
        os.fsync(self.fd)

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)


class LayeredDriver(Driver):
    """A driver over another, ``inner`` (same file): locks, size, truncation, sync and close
    pass through; subclasses change the data calls."""

    def __init__(self, inner: Driver) -> None:
        self.inner = inner
        self.path = inner.path
        self.read_write = inner.read_write

    @property  # type: ignore[override]
    def preallocates(self) -> bool:
        return self.inner.preallocates

    def lock(self, offset: int, length: int, shared: bool = False) -> None:
        self.inner.lock(offset, length, shared)

    def unlock(self, offset: int, length: int) -> None:
        self.inner.unlock(offset, length)

    def size(self) -> int:
        return self.inner.size()

    def truncate(self, size: int) -> None:
        self.inner.truncate(size)

    def sync(self) -> None:
        self.inner.sync()

    def close(self) -> None:
        self.inner.close()


class ShapedDriver(LayeredDriver):
    """``inner`` with the delays of ``model`` around every data call (see the module docs).

    ``concurrency``: data calls of this process that may proceed at once (None: the model's
    ``drives``, unlimited when that is None too); ``time_scale``: multiplies every sleep.
    """

    def __init__(
        self,
        inner: Driver,
        model: CostModel,
        time_scale: float = 1.0,
        concurrency: int | None = None,
    ) -> None:
        if time_scale < 0:
            raise HintError(f"shaped driver: time scale must be >= 0, got {time_scale}")
        super().__init__(inner)
        self.model = model
        self.time_scale = float(time_scale)
        n = model.drives if concurrency is None else concurrency
        self._slots = Drives(n) if n else None
        self._lock = threading.Lock()
        self.accounted = 0.0
        """Model seconds charged so far (before ``time_scale``)."""
        self.calls = 0
        """Data calls charged so far."""
        self.bytes = 0
        """Bytes moved by the charged calls."""

    @classmethod
    def with_rate(
        cls,
        inner: Driver,
        bandwidth: float,
        latency: float = 0.0,
        concurrency: int | None = None,
        time_scale: float = 1.0,
    ) -> ShapedDriver:
        """A device of ``bandwidth`` bytes per second and ``latency`` seconds per system call
        (the model's ``seek``), both directions alike."""
        if bandwidth <= 0 or latency < 0:
            raise HintError(
                f"shaped driver: bandwidth must be > 0 and latency >= 0 "
                f"(got {bandwidth} B/s, {latency} s)"
            )
        op = OpCost(seek=latency, bandwidth=bandwidth)
        model = CostModel(name=f"{bandwidth:.0f}B/s", read=op, write=op)
        return cls(inner, model, time_scale, concurrency)

    def _charge(self, write: bool, nbytes: int, seeks: int, t0: float) -> None:
        """Account one data call and sleep out what the model says it costs beyond the wall
        time the inner driver took (started at ``t0``)."""
        op = self.model.write if write else self.model.read
        cost = op.time(nbytes, seeks)
        with self._lock:
            self.accounted += cost
            self.calls += 1
            self.bytes += nbytes
        rest = cost * self.time_scale - (time.perf_counter() - t0)
        if rest > 0:
            time.sleep(rest)

    def _data(self, write: bool, nbytes: int, seeks: int, io: Any, *args: Any) -> Any:
        if self._slots is None:
            t0 = time.perf_counter()
            out = io(*args)
            self._charge(write, nbytes, seeks, t0)
            return out
        with self._slots:
            t0 = time.perf_counter()
            out = io(*args)
            self._charge(write, nbytes, seeks, t0)
        return out

    def readv(self, plan: VectoredPlan, buf: np.ndarray) -> None:
        self._data(False, plan.moved, plan.calls, self.inner.readv, plan, buf)

    def writev(self, plan: VectoredPlan, buf: np.ndarray) -> None:
        self._data(True, plan.moved, plan.calls, self.inner.writev, plan, buf)

    def pread(self, buf: np.ndarray, offset: int) -> int:
        return self._data(False, buf.size, 1, self.inner.pread, buf, offset)

    def pwrite(self, buf: np.ndarray, offset: int) -> None:
        self._data(True, buf.size, 1, self.inner.pwrite, buf, offset)


def open_driver(path: str, flags: int, mode: int = 0o666, hints: Any = None) -> Driver:
    """Open ``path`` (``os.open`` flags and permission ``mode``) through the driver the
    ``strataio_driver`` hint names (default ``posix``); opened for writing, its POSIX file
    preallocates extending writes as ``strataio_preallocate`` says (default *automatic*: on
    the file systems where that was measured to pay)."""
    driver = PosixDriver.open(path, flags, mode)
    if flags & os.O_ACCMODE != os.O_RDONLY:
        want = getattr(hints, "strataio_preallocate", AUTOMATIC)
        if want == ENABLE or (want == AUTOMATIC and file_system_preallocates(driver.fd)):
            driver.preallocate()
    kind = getattr(hints, "strataio_driver", "posix")
    if kind == "posix":
        return driver
    if kind == "shaped":
        concurrency = int(hints.strataio_driver_concurrency) or None
        return ShapedDriver.with_rate(
            driver,
            float(hints.strataio_driver_bandwidth),
            float(hints.strataio_driver_latency),
            concurrency,
            float(hints.strataio_driver_time_scale),
        )
    driver.close()
    raise HintError(f"hint strataio_driver={kind!r}: expected posix or shaped")
