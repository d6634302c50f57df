"""The stores compared by ``strataio bench sections``: one object per way of keeping a 2-D array.

Every contender holds the same float32 array and answers the same two calls, ``read(start,
stop)`` and ``write(start, data)``, on a box of it; :meth:`Contender.files` lists every file it
keeps, so a benchmark can evict them all from the page cache before a cold measurement, and
:meth:`Contender.forget` empties its own in-process caches of the array (the state a process
opening the array anew would find), for a measurement of a process's first read of data
written before.

- ``naive``: the whole array as one raw row-major file, accessed as a naive application does:
  one ``os.preadv`` / ``os.pwrite`` per contiguous piece of the box (one per row, or a single
  call when the box is whole rows). This is the baseline of APRIL's Table 3.
- ``strataio``: a sub-filed dataset (one file per chunk) through ``strataio.open_dataset``,
  with the process's decoded-chunk cache at its setting (``forget`` empties this dataset's
  chunks from it).
- ``strataio-tiered``: the same array as a dataset of a :class:`strataio.Session` with one
  tier, ``local`` (a POSIX directory, role ``localdisk``), and a SQLite catalog, both in the
  contender's directory: the storage hierarchy over the same disk as ``strataio``. Every
  chunk copy carries the CRC-32C the catalog records and reads check it (whole on the first
  read of a copy); that checksum belongs to the hierarchy and cannot be turned off. The
  plain ``strataio`` row keeps no checksum (``codec=None``, like zarr and TensorStore here),
  and the tiered dataset, checksums verified, is measured against it. ``forget`` leaves the
  dataset as a process opening it anew finds it: the decoded-chunk cache and the Session's
  chunk cache empty, and of the copies a read checked only what the catalog records (the
  store records its checks there, as at flush and close, and takes them back), so a first
  read reads in range the copies an earlier read checked, each under the object version
  checked.
- ``strataio-tiered-written``: the same, except that ``forget`` forgets every check and takes
  none from the catalog: a first read finds its copies as their write left them, unread,
  and reads each whole to check it (the once-per-write cost of the verified-once rule).
- ``strataio-crc32c``: the plain dataset with the Zarr ``crc32c`` codec, which reads every
  chunk whole and checks its CRC-32C on every read the decoded-chunk cache does not serve:
  the work of the tiered dataset's first read of a copy, without the hierarchy. In the
  ``first`` and ``cold`` modes the tiered dataset's time over this one is what the hierarchy
  itself costs; in ``warm`` mode (where the tiered dataset reads copies it checked before in
  range, unchecked) it measures another thing.
- ``h5py``: one HDF5 file, chunked dataset, HDF5's chunk cache disabled.
- ``zarr``: zarr-python 3 on a local directory store, no compression (it keeps no chunk cache).
- ``tensorstore``: TensorStore's ``zarr3`` driver on a ``file`` kvstore, cache pool of 0 bytes.
- ``tensorstore-cached``: the same with its cache pool on, as a user who turns it on would:
  ``total_bytes_limit`` equal to strataio's decoded-chunk cache for the run (so both caches
  have the same byte budget) and ``recheck_cached_data`` left at the driver's default,
  ``true``: every cached chunk is revalidated against storage on each read, as strataio's
  cache checks each chunk's version (``"open"`` or ``false`` would skip that check and serve
  data another process may have replaced). ``forget`` reopens it with a new context, whose
  cache pool is empty.

All chunked contenders use the same chunk shape and no compression. What a timed write
includes: ``naive``, ``strataio``, ``h5py``, ``zarr`` and TensorStore write into the page
cache, no fsync (TensorStore's ``file_io_sync`` is turned off for this: it would otherwise
fsync each chunk); ``strataio-tiered``'s ``write_section`` also announces a rewrite in the
catalog (one SQLite transaction, committed without waiting for the disk) before it replaces
the chunk objects; the rest of its durability (fsync of the new copies and the catalog
commit, which makes the announcement durable too) happens when the dataset is flushed or
closed, after the timed calls.

With ``--reopen`` a timed write includes the close: strataio's datasets, plain and tiered,
make their chunks durable there (fsync; the tiered one also commits its catalog rows). To
leave every store that can do so with the same file state, a TensorStore opened for a write
then syncs its files too (its default ``file_io_sync``). The naive file, h5py and zarr-python
have no such step: their rows end in the page cache.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from strataio.layout.extents import section_extents

#: every contender, in table order
CONTENDERS = (
    "naive",
    "strataio",
    "strataio-tiered",
    "strataio-tiered-written",
    "strataio-crc32c",
    "h5py",
    "zarr",
    "tensorstore",
    "tensorstore-cached",
)
#: rows written per setup call: setup writes the array in big blocks
_BLOCK_BYTES = 64 << 20

#: age beyond which a file's modification time reliably changes on the next write
_STAMP_TRUST_NS = 100_000_000
#: files to flush above which one sync(2) replaces per-file fdatasync(2)
_BULK_SYNC_FILES = 256

Box = tuple[slice, ...]


def _box(start: Sequence[int], stop: Sequence[int]) -> Box:
    return tuple(slice(a, b) for a, b in zip(start, stop))


def _files_under(root: Path) -> list[str]:
    out = []
    for dirpath, _dirs, files in os.walk(root):
        out.extend(os.path.join(dirpath, f) for f in files)
    return out


def _row_blocks(data: np.ndarray, chunk_rows: int) -> list[tuple[int, int]]:
    """Row ranges of about ``_BLOCK_BYTES``, aligned to ``chunk_rows`` (whole chunk rows)."""
    row_bytes = max(1, data[0].nbytes) if data.shape[0] else 1
    rows = max(chunk_rows, (_BLOCK_BYTES // row_bytes) // chunk_rows * chunk_rows)
    return [(a, min(a + rows, data.shape[0])) for a in range(0, data.shape[0], rows)]


class Contender:
    """A way of storing the benchmark array. Subclasses fill in the five methods, and
    :meth:`open_handle` / :meth:`release_handle` for the rows that open the array for every
    call (``bench sections --reopen``)."""

    name = ""
    #: whether its calls can each open and close the array (:meth:`reopened`)
    reopens = True

    def __init__(self, root: Path, chunks: tuple[int, ...], cache_bytes: int = 0) -> None:
        self.root = root
        self.chunks = chunks
        #: bytes of the contender's own cache, where it has one to size (tensorstore-cached)
        self.cache_bytes = cache_bytes
        self._dropper = CacheDropper()
        self._file_list: list[str] | None = None

    def setup(self, data: np.ndarray) -> None:
        """Store ``data`` (creating the files), then open the handle the timed calls use."""
        raise NotImplementedError

    def read(self, start: Sequence[int], stop: Sequence[int]) -> np.ndarray:
        raise NotImplementedError

    def write(self, start: Sequence[int], data: np.ndarray) -> None:
        raise NotImplementedError

    def files(self) -> list[str]:
        """Every file holding the array (all of them, not only those a call touches)."""
        return _files_under(self.root)

    def forget(self) -> None:
        """Empty this contender's own in-process caches of the array (not the page cache)."""

    def open_handle(self, mode: str) -> None:
        """Open the handle the calls use (``mode`` ``"r"`` or ``"r+"``), as after setup."""
        raise NotImplementedError

    def release_handle(self) -> None:
        """Close the handle the calls use; the calls need :meth:`open_handle` again."""
        raise NotImplementedError

    def reopened(self, call: Callable[[], Any], mode: str) -> Any:
        """``call()`` on a handle opened for it (``mode``) and closed after it: a user's
        open → section → close, every step in the time of the call."""
        self.open_handle(mode)
        try:
            return call()
        finally:
            self.release_handle()

    def drop_cache(self) -> None:
        """Nothing in memory: :meth:`forget`, then evict every file of this contender from the
        OS page cache.

        The file list is taken once: after setup every chunk exists (the data has no
        fill-value chunks), and the benchmark's writes replace files, never add them.
        """
        self.forget()
        if self._file_list is None:
            self._file_list = self.files()
        self._dropper.drop(self._file_list)

    def close(self) -> None:
        """Release handles and delete the files."""
        shutil.rmtree(self.root, ignore_errors=True)

    def _release(self, *names: str) -> None:
        """Close the handles held in attributes ``names`` (those set), in that order."""
        for name in names:
            handle = getattr(self, name, None)
            if handle is not None:
                handle.close()
                setattr(self, name, None)


class Naive(Contender):
    """One raw file; one system call per contiguous piece of the box."""

    name = "naive"

    def setup(self, data: np.ndarray) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.path = self.root / "array.f32"
        self.shape = data.shape
        self.itemsize = data.dtype.itemsize
        self.dtype = data.dtype
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        view = memoryview(np.ascontiguousarray(data)).cast("B")
        pos = 0
        while pos < len(view):
            pos += os.pwrite(self.fd, view[pos : pos + _BLOCK_BYTES], pos)

    def open_handle(self, mode: str) -> None:
        flags = os.O_RDONLY if mode == "r" else os.O_RDWR
        self.fd = os.open(self.path, flags | os.O_CLOEXEC)

    def release_handle(self) -> None:
        os.close(self.fd)
        self.fd = None

    def _pieces(self, start: Sequence[int], stop: Sequence[int]) -> tuple[list[int], ...]:
        ext = section_extents(self.shape, self.itemsize, start, stop)
        return ext.offsets.tolist(), ext.lengths.tolist(), ext.mem.tolist()

    def read(self, start: Sequence[int], stop: Sequence[int]) -> np.ndarray:
        out = np.empty([b - a for a, b in zip(start, stop)], dtype=self.dtype)
        buf = memoryview(out).cast("B")
        fd = self.fd
        for off, n, m in zip(*self._pieces(start, stop)):
            got = os.preadv(fd, [buf[m : m + n]], off)
            if got != n:
                raise OSError(f"short read of {self.path}: {got} of {n} bytes at {off}")
        return out

    def write(self, start: Sequence[int], data: np.ndarray) -> None:
        stop = [a + n for a, n in zip(start, data.shape)]
        buf = memoryview(np.ascontiguousarray(data)).cast("B")
        fd = self.fd
        for off, n, m in zip(*self._pieces(start, stop)):
            done = os.pwrite(fd, buf[m : m + n], off)
            if done != n:
                raise OSError(f"short write of {self.path}: {done} of {n} bytes at {off}")

    def close(self) -> None:
        if getattr(self, "fd", None) is not None:
            os.close(self.fd)
            self.fd = None
        super().close()


class Strataio(Contender):
    """A strataio sub-filed dataset, one file per chunk."""

    name = "strataio"
    #: the dataset's codec (None: raw chunks)
    codec: str | None = None

    def setup(self, data: np.ndarray) -> None:
        import strataio

        self.path = self.root / "array.zarr"
        with strataio.create_dataset(
            self.path, data.shape, data.dtype, self.chunks, codec=self.codec, overwrite=True
        ) as ds:
            for a, b in _row_blocks(data, self.chunks[0]):
                ds.write_section((a, 0), data[a:b])
        self.open_handle("r+")

    def open_handle(self, mode: str) -> None:
        import strataio

        self.ds = self.named_by = strataio.open_dataset(self.path, mode=mode)

    def release_handle(self) -> None:
        self._release("ds")

    def read(self, start: Sequence[int], stop: Sequence[int]) -> np.ndarray:
        return self.ds.read_section(start, stop)

    def write(self, start: Sequence[int], data: np.ndarray) -> None:
        self.ds.write_section(start, data)

    def forget(self) -> None:
        """Its chunks out of the process's decoded-chunk cache, which outlives a handle
        (``named_by``, the last handle opened, names them there, closed or not)."""
        self.named_by.clear_cache()

    def close(self) -> None:
        self._release("ds")
        super().close()


class StrataioChecked(Strataio):
    """The sub-filed dataset with the ``crc32c`` codec: every chunk read whole and checked."""

    name = "strataio-crc32c"
    codec = "crc32c"


class StrataioTiered(Contender):
    """The array as a dataset of a Session whose one tier is a POSIX directory (see the module
    doc): chunks, catalog and all under this contender's directory."""

    name = "strataio-tiered"
    #: the dataset's name in the catalog
    dataset = "array"
    #: whether ``forget`` leaves the checks the catalog records to be learned again (a new
    #: process's view) rather than forgetting every check
    reload_checks = True

    def setup(self, data: np.ndarray) -> None:
        import strataio
        from strataio.storage.posix import PosixBackend
        from strataio.tiers.tier import Tier, TierSet

        self.root.mkdir(parents=True, exist_ok=True)
        tiers = TierSet([Tier("local", PosixBackend(self.root / "local"), "localdisk", order=0)])
        self.session = strataio.Session(tiers=tiers, catalog=self.root / "catalog.db")
        with self.session.create_dataset(
            self.dataset, data.shape, data.dtype, self.chunks, hint="LOCALDISK", codec=None
        ) as ds:
            for a, b in _row_blocks(data, self.chunks[0]):
                ds.write_section((a, 0), data[a:b])
        self.open_handle("r+")

    def open_handle(self, mode: str) -> None:
        """A dataset handle of the contender's Session (a process opens its Session once,
        as it makes its TensorStore context once, and datasets through it)."""
        self.ds = self.named_by = self.session.open_dataset(self.dataset, mode=mode)

    def release_handle(self) -> None:
        self._release("ds")

    def read(self, start: Sequence[int], stop: Sequence[int]) -> np.ndarray:
        return self.ds.read_section(start, stop)

    def write(self, start: Sequence[int], data: np.ndarray) -> None:
        self.ds.write_section(start, data)

    def files(self) -> list[str]:
        """Chunks, metadata and catalog; not SQLite's ``-shm`` index, which the open catalog
        keeps mapped in memory by design (its pages cannot be evicted)."""
        return [f for f in super().files() if not f.endswith("-shm")]

    def forget(self) -> None:
        """Empty the decoded-chunk cache and the Session's chunk cache, and leave the store as
        a process opening the dataset finds it: its changes committed (an untimed flush, as
        that process's writer closed), the checks of copies found so far recorded in the
        catalog, and nothing learned from the catalog (:meth:`TieredChunkStore.forget_learned`):
        its next read or write of a chunk learns the chunk's rows and recorded checks in
        one query, as that process's does. The handle stays open, as the plain dataset's
        does. Between handles (``--reopen``) only the caches, the rows the Session keeps of
        closed handles (:attr:`Session.row_memo`) among them: a handle opened next learns
        from the catalog. Last, the catalog's pages cached in the process go too
        (:meth:`Catalog.drop_cached_pages`): that process reads them from the database's
        files (from the page cache, but in ``cold`` mode, where those files are evicted)."""
        self.named_by.clear_cache()
        self.session.cache.clear()
        self.session.row_memo.forget()
        if self.ds is not None:
            if self.reload_checks:
                if self.ds.mode != "r":
                    self.ds.flush()
                self.ds.store.forget_learned()
            else:
                self.ds.store.forget_checks()
        self.session.catalog.drop_cached_pages()

    def close(self) -> None:
        self._release("ds", "session")
        super().close()


class StrataioTieredWritten(StrataioTiered):
    """:class:`StrataioTiered` whose ``forget`` forgets every check of a copy: a first read
    finds the copies unread since their write and checks each whole."""

    name = "strataio-tiered-written"
    reload_checks = False
    #: (a handle opened anew takes the catalog's checks: no first reads to show that way)
    reopens = False


class H5py(Contender):
    """One HDF5 file with a chunked dataset; HDF5's chunk cache is off (``rdcc_nbytes=0``)."""

    name = "h5py"

    def setup(self, data: np.ndarray) -> None:
        import h5py

        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / "array.h5"
        with h5py.File(path, "w", rdcc_nbytes=0) as f:
            d = f.create_dataset("a", shape=data.shape, dtype=data.dtype, chunks=self.chunks)
            for a, b in _row_blocks(data, self.chunks[0]):
                d[a:b] = data[a:b]
        self.path = path
        self.open_handle("r+")

    def open_handle(self, mode: str) -> None:
        import h5py

        self.file = h5py.File(self.path, mode, rdcc_nbytes=0)
        self.dset = self.file["a"]

    def release_handle(self) -> None:
        self.dset = None
        self._release("file")

    def read(self, start: Sequence[int], stop: Sequence[int]) -> np.ndarray:
        out = np.empty([b - a for a, b in zip(start, stop)], dtype=self.dset.dtype)
        self.dset.read_direct(out, source_sel=_box(start, stop))
        return out

    def write(self, start: Sequence[int], data: np.ndarray) -> None:
        stop = [a + n for a, n in zip(start, data.shape)]
        self.dset.write_direct(np.ascontiguousarray(data), dest_sel=_box(start, stop))

    def close(self) -> None:
        self._release("file")
        super().close()


class Zarr(Contender):
    """zarr-python 3 on a local directory store, uncompressed."""

    name = "zarr"

    def setup(self, data: np.ndarray) -> None:
        import zarr

        path = str(self.root / "array.zarr")
        z = zarr.create_array(
            store=path,
            shape=data.shape,
            chunks=self.chunks,
            dtype=data.dtype,
            compressors=None,
            fill_value=0,
            zarr_format=3,
            overwrite=True,
        )
        for a, b in _row_blocks(data, self.chunks[0]):
            z[a:b] = data[a:b]
        self.path = path
        self.open_handle("r+")

    def open_handle(self, mode: str) -> None:
        import zarr

        self.z = zarr.open_array(store=self.path, mode=mode)

    def release_handle(self) -> None:
        self.z = None  # (zarr-python's arrays hold nothing to close)

    def read(self, start: Sequence[int], stop: Sequence[int]) -> np.ndarray:
        return self.z[_box(start, stop)]

    def write(self, start: Sequence[int], data: np.ndarray) -> None:
        stop = [a + n for a, n in zip(start, data.shape)]
        self.z[_box(start, stop)] = data


class TensorStore(Contender):
    """TensorStore's zarr3 driver on a file kvstore, with its cache pool at 0 bytes."""

    name = "tensorstore"
    #: whether the cache pool holds ``cache_bytes`` (else 0 bytes: no cache)
    cached = False

    def _spec(self, create: bool, data: np.ndarray | None = None) -> dict:
        spec: dict = {
            "driver": "zarr3",
            "kvstore": {"driver": "file", "path": str(self.root / "array.zarr")},
            "context": {
                "cache_pool": {"total_bytes_limit": self.cache_bytes if self.cached else 0},
                # writes end in the page cache, as every contender's (the default fsyncs)
                "file_io_sync": self.sync_files,
            },
            "recheck_cached_data": True,
        }
        if create and data is not None:
            spec["metadata"] = {
                "shape": list(data.shape),
                "chunk_grid": {
                    "name": "regular",
                    "configuration": {"chunk_shape": list(self.chunks)},
                },
                "chunk_key_encoding": {"name": "default"},
                "data_type": str(data.dtype),
                "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
                "fill_value": 0,
            }
            spec["create"] = True
            spec["delete_existing"] = True
        else:
            spec["open"] = True
        return spec

    #: whether its writes fsync their files (``file_io_sync``; see the module doc)
    sync_files = False

    def _open(self) -> None:
        import tensorstore as ts

        # a new context: a new (empty) cache pool
        self.t = ts.open(self._spec(False), context=ts.Context()).result()

    def open_handle(self, mode: str) -> None:
        """A TensorStore in a new context; opened for a write in a timed call
        (:meth:`reopened`), one that syncs its files, as strataio's close does."""
        self._open()

    def reopened(self, call: Callable[[], Any], mode: str) -> Any:
        self.sync_files = mode != "r"
        try:
            return super().reopened(call, mode)
        finally:
            self.sync_files = False

    def release_handle(self) -> None:
        self.t = None  # (a TensorStore is closed when its last reference goes)

    def setup(self, data: np.ndarray) -> None:
        import tensorstore as ts

        t = ts.open(self._spec(True, data)).result()
        for a, b in _row_blocks(data, self.chunks[0]):
            t[a:b].write(data[a:b]).result()
        self._open()

    def read(self, start: Sequence[int], stop: Sequence[int]) -> np.ndarray:
        return self.t[_box(start, stop)].read().result()

    def write(self, start: Sequence[int], data: np.ndarray) -> None:
        stop = [a + n for a, n in zip(start, data.shape)]
        self.t[_box(start, stop)].write(data).result()


class TensorStoreCached(TensorStore):
    """TensorStore with a cache pool of ``cache_bytes``, every read revalidated (module doc)."""

    name = "tensorstore-cached"
    cached = True

    def forget(self) -> None:
        self._open()


_CLASSES: dict[str, type[Contender]] = {
    c.name: c
    for c in (
        Naive,
        Strataio,
        StrataioTiered,
        StrataioTieredWritten,
        StrataioChecked,
        H5py,
        Zarr,
        TensorStore,
        TensorStoreCached,
    )
}


def can_reopen(name: str) -> bool:
    """Whether contender ``name``'s calls can each open and close the array
    (:meth:`Contender.reopened`)."""
    return _CLASSES[name].reopens


def make_contender(
    name: str, root: Path, chunks: tuple[int, ...], cache_bytes: int = 0
) -> Contender:
    """The contender called ``name`` (one of :data:`CONTENDERS`), keeping its files in ``root``;
    ``cache_bytes`` sizes its own cache where it has one to size (``tensorstore-cached``)."""
    return _CLASSES[name](root, chunks, cache_bytes)


class CacheDropper:
    """Evicts files from the OS page cache: ``fdatasync`` (dirty pages cannot be dropped), then
    ``posix_fadvise(DONTNEED)``.

    ``fdatasync`` costs a journal round trip even on a clean file, so it is issued only for
    files modified (by ``st_mtime_ns`` / size) since this dropper last flushed them; every
    file is still advised out of the cache each time.
    """

    def __init__(self) -> None:
        self._flushed: dict[str, tuple[int, int]] = {}

    def drop(self, paths: Sequence[str]) -> None:
        stale = sum(1 for p in paths if p not in self._flushed)
        synced = stale > _BULK_SYNC_FILES
        if synced:  # after a bulk write, one sync(2) beats thousands of fdatasync(2)
            os.sync()
        for p in paths:
            try:
                fd = os.open(p, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                st = os.fstat(fd)
                stamp = (st.st_mtime_ns, st.st_size)
                if self._flushed.get(p) != stamp:
                    if not synced:
                        os.fdatasync(fd)
                    # a write within the file system's timestamp granularity of this one
                    # would leave st_mtime unchanged: trust only stamps older than that
                    if time.time_ns() - st.st_mtime_ns > _STAMP_TRUST_NS:
                        self._flushed[p] = stamp
                    else:
                        self._flushed.pop(p, None)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
