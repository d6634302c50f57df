"""Buffer specifications as mpi4py spells them, turned into bytes + memory extents.

Accepted forms (``dt`` an ``MPI.Datatype``, ``disp`` in units of the datatype's extent, as in
mpi4py):

- ``buf`` — any contiguous buffer-protocol object (numpy array, bytes, bytearray, memoryview);
  all its bytes, in order;
- ``[buf]``, ``[buf, count]`` (count items of ``buf``'s own item size);
- ``[buf, dt]`` (as many whole ``dt`` as fit in ``buf``);
- ``[buf, count, dt]`` and ``[buf, (count, disp), dt]``;
- ``[MPI.BOTTOM, count, dt]``: ``dt``'s displacements are absolute addresses (from
  ``MPI.Get_address``), as in MPI; the memory they name must stay alive during the call.
- ``[None, 0]``, ``[None, 0, dt]``: nothing (a rank without data in a collective call).

The result names the bytes a transfer moves: ``mem`` pieces (offsets into the buffer, in MPI
pack order, with their positions in the packed data stream).
"""

from __future__ import annotations

import ctypes
import operator
from typing import Any

import numpy as np
from mpi4py import MPI

from strataio.errors import DatatypeError, ReadOnlyError, ShapeMismatchError, StrataError
from strataio.layout.datatypes import describe, flatten, flatten_count, is_committed
from strataio.layout.extents import Extents
from strataio.layout.memo import LayoutMemo, freeze
from strataio.layout.pieces import CopyPlan, as_bytes, plan_copy


class BufferSpec:
    """The bytes of one transfer: ``data`` (the whole buffer as ``uint8``) and ``mem`` pieces.

    ``nbytes`` is the length of the packed data stream (count × datatype size). When
    ``contiguous`` the stream is ``data[start : start + nbytes]``. (A plain slotted class:
    one is made per I/O call, and a frozen dataclass costs a microsecond to build.)
    """

    __slots__ = ("_mem", "contiguous", "data", "nbytes", "start")

    def __init__(
        self, data: np.ndarray, mem: Extents | None, nbytes: int, contiguous: bool, start: int
    ) -> None:
        self.data = data
        self._mem = mem  # None: contiguous, made when asked for
        self.nbytes = nbytes
        self.contiguous = contiguous
        self.start = start

    @property
    def mem(self) -> Extents:
        """The memory pieces: offsets into :attr:`data`, ``mem`` = stream positions."""
        if self._mem is None:
            self._mem = freeze(Extents.single(self.start, self.nbytes))
        return self._mem

    def pack(self, out: np.ndarray | None = None) -> np.ndarray:
        """The data stream as one contiguous ``uint8`` array (a view when contiguous), packed
        into ``out`` (``nbytes`` long) when given."""
        if self.contiguous:
            return self.data[self.start : self.start + self.nbytes]
        if out is None:
            out = np.empty(self.nbytes, dtype=np.uint8)
        _copy_plans(self.mem)[0].run(out, self.data)
        return out

    def unpack(self, stream: np.ndarray) -> None:
        """Scatter a packed stream into the buffer (no-op when ``stream`` is the buffer)."""
        if not self.contiguous:
            _copy_plans(self.mem)[1].run(self.data, stream)

    def place(self, file: Extents) -> Extents:
        """File pieces of this transfer with ``mem`` = byte offsets into :attr:`data`.

        ``file`` carries data-stream positions in ``mem`` (ascending, covering
        ``[0, nbytes)``). Both piece lists are cut at each other's stream boundaries, so every
        resulting piece is contiguous in the file *and* in the buffer: engines then move bytes
        straight between the file and the caller's memory, with no packed copy.
        """
        if self.contiguous:
            return Extents(file.offsets, file.lengths, file.mem + self.start)
        file = file.compact()
        mem = self.mem
        if np.array_equal(file.mem, mem.mem):  # same cuts (e.g. hpio): pair them up
            return Extents(file.offsets, file.lengths, mem.offsets)
        # Both lists tile [0, nbytes) in stream order, so the pieces of the common refinement
        # start at the merged, deduplicated starts of both.
        starts = np.concatenate((file.mem, mem.mem))
        starts.sort(kind="stable")
        starts = starts[np.concatenate(([True], starts[1:] != starts[:-1]))]
        lengths = np.diff(starts, append=np.int64(self.nbytes))
        fi = np.searchsorted(file.mem, starts, side="right") - 1
        mi = np.searchsorted(mem.mem, starts, side="right") - 1
        offs = file.offsets[fi] + (starts - file.mem[fi])
        bufs = mem.offsets[mi] + (starts - mem.mem[mi])
        return Extents(offs, lengths, bufs).coalesce()


def _back_to_back_types() -> dict[int, int]:
    """Handle -> size of MPI's predefined datatypes whose instances lie back to back (no gap,
    lower bound 0): a buffer of ``count`` of them is one piece, known without flattening."""
    out = {}
    for name in dir(MPI):
        dt = getattr(MPI, name, None)
        if type(dt) is not MPI.Datatype or dt == MPI.DATATYPE_NULL or not dt.is_predefined:
            continue
        try:
            size = dt.Get_size()
            lb, extent = dt.Get_extent()
            tlb, textent = dt.Get_true_extent()
        except MPI.Exception:  # (a type this MPI library does not support)
            continue
        if size > 0 and lb == 0 and tlb == 0 and size == extent == textent:
            out[dt.handle] = size
    return out


#: see :func:`_back_to_back_types`; the handles of predefined types never change
_BACK_TO_BACK = _back_to_back_types()


def _datatype(dt: Any) -> MPI.Datatype:
    if type(dt) is MPI.Datatype or isinstance(dt, MPI.Datatype):
        return dt
    if isinstance(dt, str):
        try:
            return MPI.Datatype.fromcode(dt)  # a typecode, as mpi4py's buffer specs take
        except ValueError:
            pass
    raise StrataError(f"buffer specification: {dt!r} is not an MPI datatype")


def _check_committed(dt: MPI.Datatype) -> None:
    """Refuse a buffer datatype never committed (see the module docs); MPI.DATATYPE_NULL is
    left to :func:`~strataio.layout.datatypes.flatten`, which names it."""
    if dt != MPI.DATATYPE_NULL and not is_committed(dt):
        raise DatatypeError(
            f"buffer specification: the buffer's datatype ({describe(dt)}) has not been "
            "committed: MPI takes a buffer's datatype committed (call Commit() on it)"
        )


#: (mem, nbytes, contiguous, start) of buffer specs with a datatype: a code reads and writes
#: the same buffer type call after call, and flattening and checking it costs microseconds
_spec_layouts: LayoutMemo[tuple[Extents, int, bool, int]] = LayoutMemo()


_plans: LayoutMemo[tuple[CopyPlan, CopyPlan]] = LayoutMemo()


def _copy_plans(mem: Extents) -> tuple[CopyPlan, CopyPlan]:
    """The (pack, unpack) copies of memory pieces ``mem`` (memoized with the layout)."""
    return _plans.get(
        (mem,),
        (),
        lambda: (
            plan_copy(mem.mem, mem.offsets, mem.lengths),
            plan_copy(mem.offsets, mem.mem, mem.lengths),
        ),
    )


def parse_buffer(spec: Any, writable: bool) -> BufferSpec:
    """Resolve ``spec`` (see the module docstring) into a :class:`BufferSpec`.

    ``writable`` asks for a buffer that can be read into. Raises :class:`ShapeMismatchError`
    when the datatype reaches outside the buffer, :class:`ReadOnlyError` when a read targets a
    read-only buffer, :class:`~strataio.errors.DatatypeError` when the datatype was never
    committed.
    """
    parts = spec if type(spec) is list or isinstance(spec, (list, tuple)) else (spec,)
    nparts = len(parts)
    if not 1 <= nparts <= 3:
        raise StrataError(f"buffer specification has {nparts} entries; expected 1 to 3")
    obj = parts[0]
    count: int | None = None
    disp = 0
    dt: MPI.Datatype | None = None
    if nparts == 3:
        cd, dt = parts[1], _datatype(parts[2])
        if type(cd) is int:
            count = cd
        elif isinstance(cd, (list, tuple)) and len(cd) == 2:
            count, disp = _whole(cd[0], "count"), _whole(cd[1], "displacement")
        elif cd is not None:
            count = _whole(cd, "count")
    elif nparts == 2:
        if isinstance(parts[1], (int, np.integer)):
            count = int(parts[1])
        else:
            dt = _datatype(parts[1])
    if count is not None and count < 0:
        raise StrataError(f"buffer specification: negative count {count}")
    if obj is MPI.BOTTOM:
        return _bottom_spec(count, disp, dt)
    if obj is None and nparts > 1:  # (a rank with nothing to move, as mpi4py takes it)
        if count != 0:
            raise StrataError(f"buffer specification: buffer is None but count is {count}")
        return BufferSpec(np.empty(0, dtype=np.uint8), None, 0, True, 0)
    try:
        data = as_bytes(obj, writable=writable)
    except ValueError as exc:
        if "read-only" in str(exc):
            raise ReadOnlyError("cannot read into a read-only buffer") from None
        raise StrataError(f"buffer specification: {exc}") from None
    except TypeError:
        raise StrataError(f"buffer specification: {type(obj).__name__} is not a buffer") from None
    size = data.size
    if dt is None:
        itemsize = int(getattr(obj, "itemsize", 1) or 1)
        n = size if count is None else count * itemsize
        if n > size:
            raise ShapeMismatchError(
                f"buffer holds {size} bytes but {count} items of {itemsize} bytes were asked"
            )
        return BufferSpec(data, None, n, True, 0)
    unit = _BACK_TO_BACK.get(dt.handle)
    if unit is not None:  # (the usual case: count bytes, doubles, ... from a displacement)
        start = disp * unit
        nbytes = (size - start) // unit * unit if count is None else count * unit
        if start >= 0 and start + nbytes <= size:
            return BufferSpec(data, None, nbytes, True, start)
    mem, nbytes, contiguous, start = _spec_layouts.get(
        (dt,),
        (dt.handle, -1 if count is None else count, disp, size),
        lambda: _datatype_layout(dt, count, disp, size),
    )
    return BufferSpec(data, mem, nbytes, contiguous, start)


def _whole(value: Any, what: str) -> int:
    """A count or displacement of a buffer specification as an int; a float (a count worked
    out with ``/``) is refused, as mpi4py refuses it, rather than cut to fewer items."""
    try:
        return operator.index(value)
    except TypeError:
        raise StrataError(
            f"buffer specification: the {what} must be an integer, not {value!r}"
        ) from None


def _bottom_spec(count: int | None, disp: int, dt: MPI.Datatype | None) -> BufferSpec:
    """``[MPI.BOTTOM, count, dt]`` (``disp`` from a ``(count, disp)`` pair): the memory from the
    lowest to the highest address the datatype names, as one ``uint8`` array, and its pieces."""
    if count is None or dt is None:
        raise StrataError("MPI.BOTTOM needs the form [MPI.BOTTOM, count, datatype]")
    _check_committed(dt)
    flat = flatten(dt)
    ext = flatten_count(flat, count, disp * flat.extent).compact()
    if not len(ext):
        return BufferSpec(np.empty(0, dtype=np.uint8), None, 0, True, 0)
    lo, hi = ext.first, ext.last
    if lo <= 0:
        raise ShapeMismatchError(
            f"MPI.BOTTOM: the datatype names address {lo}; its displacements must be the "
            "absolute addresses of live memory (MPI.Get_address)"
        )
    data = np.ctypeslib.as_array((ctypes.c_uint8 * (hi - lo)).from_address(lo))
    mem = freeze(ext.shift(-lo).coalesce())
    return BufferSpec(data, mem, count * flat.size, len(mem) <= 1, int(mem.offsets[0]))


def _datatype_layout(
    dt: MPI.Datatype, count: int | None, disp: int, size: int
) -> tuple[Extents, int, bool, int]:
    """The memory pieces of ``count`` (None: as many as fit) ``dt`` at ``disp`` extents into a
    ``size``-byte buffer, checked to lie inside it and ``dt`` to be committed (a failure is
    not memoized, and a type once committed stays so: the check costs nothing on a hit)."""
    _check_committed(dt)
    flat = flatten(dt)
    if count is None:
        count = size // flat.extent if flat.extent > 0 else 0
    base = disp * flat.extent
    nbytes = count * flat.size
    if count and flat.size:
        # Bounds of the memory layout: first instance's true lb to last instance's true ub.
        lo = base + flat.true_lb + min(0, (count - 1) * flat.extent)
        hi = base + flat.true_lb + flat.true_extent + max(0, (count - 1) * flat.extent)
        if lo < 0 or hi > size:
            raise ShapeMismatchError(
                f"{count} × datatype (extent {flat.extent}, true extent {flat.true_extent}) "
                f"at displacement {base} reaches bytes [{lo}, {hi}) of a {size}-byte buffer"
            )
    if flat.is_contiguous and nbytes:  # whole instances back to back: one piece
        start = base + flat.lb
        return freeze(Extents.single(start, nbytes)), nbytes, True, start
    # for a type of many pieces (FLASH's interleaved variables) this costs milliseconds
    mem = freeze(
        flatten_count(flat, count, base).compact().coalesce() if nbytes else Extents.empty()
    )
    start = int(mem.offsets[0]) if len(mem) else 0
    return mem, nbytes, len(mem) <= 1, start
