"""``strataio.File``: an MPI-IO-shaped file handle over the two-phase engine.

Semantics are MPI-IO's. A *view* ``(disp, etype, filetype)`` tiles ``filetype`` from byte
``disp`` (tile ``k`` at ``disp + k * extent(filetype)``); the data stream of a transfer fills
the view's data bytes in order. Offsets, counts and the individual file pointer are in etypes
of the view. Buffers are mpi4py buffer specifications (:mod:`strataio.collective.bufspec`),
including noncontiguous memory datatypes.

Collective calls (``open``, ``set_view``, ``*_all``, ``set_size``, ``sync``, ``close``) agree
on errors: a bad argument on any rank raises the same :class:`~strataio.errors.StrataError`
subclass on every rank, before any byte is written, and no rank is left waiting. A failure of
another kind on one rank (a ``MemoryError`` while planning) raises it there and a
``StrataError`` naming that rank on the others; only one that breaks off a two-phase exchange
midway aborts the job (see :func:`strataio.collective.twophase.two_phase`).

With ``romio_cb_pfr=enable`` the file fixes persistent striped realms
(:class:`~strataio.collective.realms.StripedRealms`, :attr:`File.realms`) at its first
two-phase call and keeps them until close (``strataio_realms=dynamic``: until a rank's view or
memory layout changes); otherwise every two-phase call cuts its own realms.

The file is reached through a storage driver (:mod:`strataio.collective.driver`, chosen by the
``strataio_driver`` hint); with ``romio_no_indep_rw=true`` only the aggregators open it, as in
ROMIO, and independent reads and writes raise :class:`~strataio.errors.HintError`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import operator
import os
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np
from mpi4py import MPI

from strataio.agreed import agree as _agree
from strataio.agreed import raise_agreed as _raise_agreed
from strataio.collective import commpool, irregular, node, twophase
from strataio.collective.access import FIRST, LAST, NBYTES, Access, AccessPlan
from strataio.collective.agreement import Agreement, agreement_row
from strataio.collective.bufspec import BufferSpec, parse_buffer
from strataio.collective.cache_window import SharedCaches, owners_of, room_error
from strataio.collective.choice import use_two_phase
from strataio.collective.driver import MAX_READ_THREADS, Driver, PosixDriver, open_driver
from strataio.collective.hints import (
    AUTOMATIC,
    Hints,
    differences,
    parse_hints,
    shared_digest,
)
from strataio.collective.independent import IndependentIO
from strataio.collective.packed import PackedBlocks
from strataio.collective.realm_cache import DEFAULT_PAGE, RealmCache
from strataio.collective.realms import (
    DYNAMIC,
    RealmPolicy,
    StripedRealms,
    config_aggregators,
    persistent,
    policy_from_hints,
    realm_alignment,
    stripe_size,
)
from strataio.errors import (
    ArgumentError,
    BackendError,
    ClosedError,
    ExistsError,
    HintError,
    NotFoundError,
    ReadOnlyError,
    StrataError,
    ViewError,
)
from strataio.layout.datatypes import FlatType, describe, flatten, is_committed
from strataio.layout.extents import Extents
from strataio.layout.memo import LayoutMemo, freeze
from strataio.layout.pieces import scratch

_I64 = np.int64
_MASK62 = (1 << 62) - 1
_MODES = {
    "r": MPI.MODE_RDONLY,
    "r+": MPI.MODE_RDWR,
    "w": MPI.MODE_RDWR | MPI.MODE_CREATE,
    "x": MPI.MODE_RDWR | MPI.MODE_CREATE | MPI.MODE_EXCL,
}


#: file layouts of views and their pairings with memory layouts, remembered across calls and
#: File objects (a time-stepping code repeats the same view and buffer type every step)
_file_layouts: LayoutMemo[Extents] = LayoutMemo()
_access_plans: LayoutMemo[tuple[AccessPlan, PackedBlocks | None]] = LayoutMemo(16)  # (large)

#: the stream of a packed access until its path is known (independent paths pack block by
#: block; two-phase packs the whole stream)
_UNPACKED = np.empty(0, dtype=np.uint8)


def _os_error(exc: OSError, path: str) -> StrataError:
    """``exc`` as the StrataError of a call on the file at ``path``, naming it; strataio's own
    errors (a BackendError of the engines, which names the file already) pass unchanged."""
    if isinstance(exc, StrataError):
        return exc
    if isinstance(exc, FileNotFoundError):
        return NotFoundError(f"{path}: no such file")
    if isinstance(exc, FileExistsError):
        return ExistsError(f"{path}: exists (opened with exclusive create)")
    return BackendError(f"{path}: {exc.strerror or exc}")


#: the largest file offset, MPI_Offset's (a signed 64-bit integer)
_MAX_OFFSET = 2**63 - 1


def _integral(value: Any, what: str, error: type[StrataError] = ViewError) -> int:
    """``value`` as an int (Python or numpy integer) that fits an MPI_Offset; a float or
    string is a caller's mistake that truncating would hide (raised as ``error``)."""
    try:
        n = operator.index(value)
    except TypeError:
        raise error(f"{what} must be an integer, not {value!r}") from None
    if not -_MAX_OFFSET - 1 <= n <= _MAX_OFFSET:
        raise error(f"{what} {n} does not fit an MPI_Offset (a signed 64-bit integer)")
    return n


def _same_layout(a: Extents | None, b: Extents | None) -> bool:
    """Whether two memory layouts are one (None: a contiguous buffer, any size)."""
    if a is None or b is None:
        return a is b
    return a is b or (a.offsets.size == b.offsets.size and a == b)


def _check_etype_alignment(ext: Extents, etype: FlatType) -> None:
    """Raise :class:`ViewError` if one tile of a filetype (pieces ``ext``, in type-map order)
    breaks an etype across a hole where the etype has none. MPI builds a filetype from whole
    etypes; a view whose data breaks off mid-etype (a 4-byte etype over 2-byte runs, say) is a
    mistake in its construction. An etype with holes of its own (two ints 8 bytes apart) breaks
    off where they are. (The displacement itself may be any byte, as in MPI and ROMIO: a
    header of any length may precede the data.)"""
    esize = etype.size
    if esize <= 1 or len(ext) < 2:
        return
    runs = ext.coalesce()
    ends = np.cumsum(runs.lengths[:-1])
    own = etype.extents.coalesce()  # where the etype itself breaks off, in its data bytes
    allowed = np.cumsum(own.lengths)[:-1] if len(own) > 1 else np.zeros(0, np.int64)
    split = np.flatnonzero(~np.isin(ends % esize, allowed) & (ends % esize != 0))
    if split.size:
        k = int(split[0])
        raise ViewError(
            f"filetype is misaligned with its {esize}-byte etype: its data breaks off at file "
            f"byte {int(runs.ends[k])} (relative to the displacement) after {int(ends[k])} "
            f"bytes, inside an etype; a filetype must consist of whole etypes"
        )


#: what open makes of the hints, by (the user's hints, ranks, node layout): parsing them and
#: placing the aggregators costs ~0.3 ms of cold Python per open, while a program opens file
#: after file with the same hints
_open_memo: dict[tuple[Any, ...], tuple[Hints, np.ndarray, int]] = {}
_OPEN_MEMO_SIZE = 64
#: guards the two memos' evictions (threads may open files and set views at once)
_memo_lock = threading.Lock()


def _open_hints(
    user: Mapping[str, Any] | MPI.Info | None, nprocs: int, nodes: node.NodeLayout
) -> tuple[Hints, np.ndarray, int]:
    """The hints an open puts in force for the user's ``user`` on ``nprocs`` ranks laid out as
    ``nodes``, the aggregators' ranks (read-only) and the hints' :func:`shared_digest`.
    Raises :class:`~strataio.errors.HintError` (and the like) for unusable hints."""
    key: tuple[Any, ...] | None = None
    if user is None or isinstance(user, Mapping):
        # (in the user's order, which decides between aliases, and with the value's type:
        # True and "True" parse differently)
        items = (
            ()
            if user is None
            else tuple((str(k), type(v).__qualname__, str(v)) for k, v in user.items())
        )
        key = (items, nprocs, nodes)
        found = _open_memo.get(key)
        if found is not None:
            return found
    hinted = parse_hints(user, nprocs, nodes=nodes.nodes)
    policy_from_hints(hinted)  # an unknown realm policy fails here, before any open
    names = nodes.names or (MPI.Get_processor_name(),) * nprocs
    aggregators = config_aggregators(hinted.cb_config_list, names, hinted.cb_nodes)
    aggregators = np.asarray(aggregators, dtype=_I64)
    aggregators.flags.writeable = False
    hinted = dataclasses.replace(
        hinted,
        cb_nodes=int(aggregators.size),
        strataio_pipeline_groups=min(hinted.strataio_pipeline_groups, aggregators.size),
    )
    if not persistent(hinted):  # (a realm cache needs realms that persist)
        hinted = dataclasses.replace(hinted, strataio_realm_cache=0)
    found = (hinted, aggregators, shared_digest(hinted))
    if key is not None:
        with _memo_lock:
            if len(_open_memo) >= _OPEN_MEMO_SIZE:
                _open_memo.pop(next(iter(_open_memo)))
            _open_memo[key] = found
    return found


def _caches_on_node(
    hints: Hints, aggregators: np.ndarray, nodes: node.NodeLayout, rank: int
) -> int:
    """The bytes the realm caches of the aggregators on ``rank``'s node take together."""
    held = set(np.asarray(aggregators).tolist())
    names = nodes.names
    here = sum(names[a] == names[rank] for a in held) if names else len(held)
    return here * hints.strataio_realm_cache


def _checked_together(comm: MPI.Comm, err: Exception | None, values: list[int]) -> bool:
    """Agree on ``err`` and compare ``values`` across the ranks in one ``Allreduce`` (the
    collective steps of open and set_view): raises on every rank when any rank failed (as
    :func:`strataio.agreed.agree`), else returns whether every rank passed the same values
    (non-negative ints below 2**62). Nothing is sent with one rank."""
    if comm.Get_size() == 1:
        if err is not None:
            raise err
        return True
    values = [0] * len(values) if err is not None else [x & _MASK62 for x in values]
    mine = np.array([err is not None] + [v for x in values for v in (x, -x)], dtype=_I64)
    most = np.empty_like(mine)
    comm.Allreduce(mine, most, op=MPI.MAX)
    if most[0]:
        _raise_agreed(comm, err)
    return bool(np.all(most[1::2] == -most[2::2]))


#: what a file works out from its hints once, by the hints' identity (open hands every file
#: opened with the same hints the same Hints object; held here, so an id is not reused while
#: its entry lives): ~13 us of cold Python per open otherwise
_derived_memo: dict[int, tuple[Hints, RealmPolicy, IndependentIO]] = {}


def _derived(hints: Hints) -> tuple[RealmPolicy, IndependentIO]:
    """The realm policy and the independent I/O of a file with ``hints`` (both immutable)."""
    known = _derived_memo.get(id(hints))
    if known is not None and known[0] is hints:
        return known[1], known[2]
    policy, independent = policy_from_hints(hints), IndependentIO(hints)
    with _memo_lock:
        if len(_derived_memo) >= _OPEN_MEMO_SIZE:
            _derived_memo.pop(next(iter(_derived_memo)))
        _derived_memo[id(hints)] = (hints, policy, independent)
    return policy, independent


#: views found valid, by identity of their flattened etype and filetype (held here, so an
#: id is not reused while its entry lives): a time-stepping code sets the same view every step
_valid_views: dict[tuple[int, int], tuple[FlatType, FlatType, int]] = {}


def _checked_view(etype: FlatType, ft: FlatType) -> int:
    """The etype's size if ``etype`` and ``ft`` make a valid view (see :meth:`File.set_view`),
    else raise :class:`ViewError`."""
    known = _valid_views.get((id(etype), id(ft)))
    if known is not None and known[0] is etype and known[1] is ft:
        return known[2]
    esize = etype.size
    if esize <= 0:
        raise ViewError("etype has size 0")
    if ft.size % esize:
        raise ViewError(
            f"filetype holds {ft.size} bytes, not a whole number of {esize}-byte etypes"
        )
    ext = ft.extents
    if len(ext) and int(ext.offsets.min()) < 0:
        raise ViewError("filetype displacements must be non-negative (MPI-IO file views)")
    later = ext.offsets[1:] < ext.ends[:-1] if len(ext) else np.zeros(0, bool)
    if bool(np.any(later)):
        i = int(np.argmax(later))
        raise ViewError(
            f"filetype pieces must not overlap and must go forward in the file (MPI-IO file "
            f"views): the piece at byte {int(ext.offsets[i + 1])} starts before the one at "
            f"byte {int(ext.offsets[i])} ends ({int(ext.ends[i])})"
        )
    _check_etype_alignment(ext, etype)
    if ft.size and ft.extent <= 0:
        raise ViewError(f"filetype extent {ft.extent} must be positive")
    if ft.size and int(ext.offsets[0]) + ft.extent < int(ext.ends[-1]):
        # the view repeats the filetype every extent bytes: a tile may not reach into the
        # next one (the view's displacements would go backwards)
        raise ViewError(
            f"filetype tiles overlap: its data ends at byte {int(ext.ends[-1])} but the next "
            f"tile starts at byte {int(ext.offsets[0]) + ft.extent} (extent {ft.extent})"
        )
    with _memo_lock:
        if len(_valid_views) >= 64:
            _valid_views.pop(next(iter(_valid_views)))
        _valid_views[(id(etype), id(ft))] = (etype, ft, esize)
    return esize


#: beside the MPI flags of an open's mode, compared across the ranks: mode "w" (which
#: truncates the file, where the same flags given as an int do not)
_TRUNCATES = 1 << 40


def _mode_text(amode: int) -> str:
    """An open's mode as compared across the ranks (:data:`_TRUNCATES` spelled out)."""
    if amode & _TRUNCATES:
        return f"'w' ({amode & ~_TRUNCATES:#x}, truncating)"
    return f"{amode:#x}"


def _same_everywhere(
    comm: MPI.Comm, amode: int, hints: Hints, path: str | None = None
) -> StrataError | None:
    """This rank's error if its file (``path``, absolute), open mode or hints differ from rank
    0's (one broadcast; the caller agrees on the outcome). As in ROMIO, they must match: they
    choose the collective path of every call, and aggregators write other ranks' bytes into
    their own file. (Asked only once :func:`_checked_together` found a difference: it names
    the difference.)"""
    reference = comm.bcast((path, amode, hints))
    if reference is None:  # rank 0 failed already; the agreement reports it
        return None
    if reference[0] != path:
        return ArgumentError(
            f"open: this rank names the file {path!r}, rank 0 {reference[0]!r}: every rank "
            "must open the same file"
        )
    if reference[1] != amode:
        return StrataError(
            f"open mode {_mode_text(amode)} differs from rank 0's ({_mode_text(reference[1])})"
        )
    differ = differences(hints, reference[2])
    return HintError(f"hints differ from rank 0's: {differ}") if differ else None


def _path_digest(path: str) -> int:
    """A 62-bit digest of ``path``, compared across the ranks at open."""
    digest = hashlib.blake2b(os.fsencode(path), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 2


class File:
    """An open file shared by the ranks of a communicator. Create with :meth:`File.open`."""

    def __init__(
        self,
        comm: MPI.Comm,
        path: str,
        driver: Driver | None,
        amode: int,
        hints: Hints,
        nodes: node.NodeLayout | None = None,
        aggregators: np.ndarray | None = None,
        digest: int | None = None,
        agreement: Agreement | None = None,
    ) -> None:
        self._comm = comm
        # (collective when made here: every rank constructs a File)
        self._agreement = Agreement(comm) if agreement is None else agreement
        self._parent: MPI.Comm | None = None  # where the duplicate goes back at close
        self._nodes = nodes or node.NodeLayout(nodes=1, spare_cores=0)
        self._aggregators = (
            np.zeros(1, dtype=_I64) if aggregators is None else np.asarray(aggregators, _I64)
        )
        self._path = path
        self._driver = driver  # None: a rank that did not open the file (romio_no_indep_rw)
        if isinstance(driver, PosixDriver):  # large reads shared with this rank's spare cores
            wanted = hints.strataio_read_threads
            if wanted == AUTOMATIC:
                wanted = 1 + self._nodes.spare_per_rank(comm.Get_rank())
            driver.threads = min(MAX_READ_THREADS, int(wanted))
        self._amode = amode
        # transfers the mode forbids: [reads, writes]
        self._forbidden = (bool(amode & MPI.MODE_WRONLY), bool(amode & MPI.MODE_RDONLY))
        self._hints = hints
        # (set_view compares it across the ranks)
        self._digest = shared_digest(hints) if digest is None else digest
        self._policy, self._independent = _derived(hints)
        # persistent file realms (romio_cb_pfr=enable): fixed at the first two-phase call
        self._realms: StripedRealms | None = None
        self._fr_type = hints.romio_cb_fr_types  # as given: the hints show the size chosen
        self._pattern: tuple[Any, ...] | None = None  # what dynamic realms were computed for
        self._closed = False
        self._pos = 0
        # Bytes the file holds at least: it only grows (by any rank's writes) except through
        # set_size, which every rank calls, so a read ending below it cannot reach end-of-file.
        # the aggregator realm cache (strataio_realm_cache, with persistent realms): every
        # cache's memory sits in one window from open to close; an aggregator's cache itself
        # starts when the realms are fixed
        self._cache: RealmCache | None = None
        self._shared: SharedCaches | None = None
        self._cached_end = 0  # end of the collective writes that caches may still hold
        if hints.strataio_realm_cache:  # (the node's room for them agreed at open)
            mine = driver is not None and comm.Get_rank() in set(self._aggregators.tolist())
            self._shared = SharedCaches(comm, hints.strataio_realm_cache if mine else 0)
        self._size_floor = self._size()
        self.last_path = ""
        """How the last transfer ran: ``"two-phase"`` or ``"independent"`` (for benchmarks)."""
        self._view: tuple[int, MPI.Datatype, MPI.Datatype] = (0, MPI.BYTE, MPI.BYTE)
        self._disp = 0
        self._esize = 1
        self._ft: FlatType = flatten(MPI.BYTE)
        if amode & MPI.MODE_APPEND:
            self._pos = self.get_size()

    # ------------------------------------------------------------------ open / close
    @classmethod
    def open(
        cls,
        comm: MPI.Comm | None,
        path: str | os.PathLike[str],
        mode: str | int = "r",
        hints: Mapping[str, Any] | MPI.Info | None = None,
    ) -> File:
        """Open ``path`` on every rank of ``comm`` (collective; ``None`` = this process alone).

        ``mode``: ``"r"`` read-only, ``"r+"`` read-write, ``"w"`` create or truncate,
        ``"x"`` create and fail if it exists, or an int of ``MPI.MODE_*`` flags; every rank
        must pass the same mode (``"w"`` and its flags as an int differ: only ``"w"``
        truncates) and name the same file (paths compared made absolute, each
        from its rank's working directory). Raises :class:`NotFoundError`,
        :class:`ExistsError`, :class:`BackendError`, :class:`~strataio.errors.HintError`,
        :class:`ArgumentError` (paths that differ, or a name that is no path) or
        :class:`StrataError` (modes that differ) on every rank when any rank fails.

        The arguments are agreed on before anything touches the file, and then every rank
        opens it at once (as few collective steps as ROMIO takes: one for a file that exists,
        two to create one, three with ``"x"``); so when creating fails on rank 0 alone,
        another rank may already have created the empty file.
        """
        comm = MPI.COMM_SELF if comm is None else comm
        nodes = node.layout(comm)  # (collective; ROMIO's default is one aggregator per node)
        err: Exception | None = None
        truncate = mode == "w"
        amode = digest = 0
        hinted = None
        aggregators = np.zeros(0, dtype=_I64)
        where = ""
        try:
            try:
                path = os.fsdecode(os.fspath(path))
            except TypeError:
                raise ArgumentError(
                    f"open: the file must be a str or path-like, not {type(path).__name__}"
                ) from None
            where = os.path.abspath(path)  # (compared across the ranks: one file for all)
            if isinstance(mode, str):
                if mode not in _MODES:
                    raise StrataError(
                        f"open mode {mode!r}: expected one of r, r+, w, x or MPI flags"
                    )
                amode = _MODES[mode]
            else:
                try:
                    amode = operator.index(mode)  # (a float would be cut to other flags)
                except TypeError:
                    raise StrataError(
                        f"open mode {mode!r}: expected one of r, r+, w, x or MPI flags"
                    ) from None
            access = [amode & f != 0 for f in (MPI.MODE_RDONLY, MPI.MODE_RDWR, MPI.MODE_WRONLY)]
            if sum(access) != 1:
                raise StrataError(
                    "open mode needs exactly one of MODE_RDONLY, MODE_RDWR, MODE_WRONLY"
                )
            if amode & MPI.MODE_RDONLY and amode & (MPI.MODE_CREATE | MPI.MODE_EXCL):
                raise StrataError("MODE_RDONLY cannot be combined with MODE_CREATE or MODE_EXCL")
            if amode & MPI.MODE_SEQUENTIAL:
                raise StrataError(
                    "MODE_SEQUENTIAL files allow only shared file pointers, which strataio.File "
                    "does not provide; open without it"
                )
            hinted, aggregators, digest = _open_hints(hints, comm.Get_size(), nodes)
            if hinted.strataio_realm_cache:  # (refused before a file is created or cut)
                on_node = _caches_on_node(hinted, aggregators, nodes, comm.Get_rank())
                too_large = room_error(hinted.strataio_realm_cache, on_node)
                if too_large is not None:
                    raise too_large
        except Exception as exc:  # any failure here must reach the other ranks
            err = exc
        rank = comm.Get_rank()
        flags = os.O_RDONLY if amode & MPI.MODE_RDONLY else os.O_RDWR
        driver: Driver | None = None
        opens = False
        if err is None:
            # (romio_no_indep_rw: only aggregators open the file; rank 0 still creates it)
            opens = not hinted.romio_no_indep_rw or rank in set(aggregators.tolist())
            if opens and not amode & MPI.MODE_CREATE:
                # Nothing to create: every rank opens at once and one agreement covers the
                # arguments and the opens (opening changes no byte of the file).
                try:
                    driver = cls._open_driver(path, flags, amode, hinted)
                except OSError as exc:
                    err = _os_error(exc, path)
        try:
            # ("w" truncates, the same flags as an int do not: a difference to agree on)
            given = amode | (_TRUNCATES if truncate else 0)
            if not _checked_together(comm, err, [given, digest, _path_digest(where)]):
                _agree(comm, _same_everywhere(comm, given, hinted, where))
        except BaseException:
            if driver is not None:
                driver.close()
            raise
        assert hinted is not None
        parent = comm
        agreement = commpool.take(parent)
        comm = agreement.comm
        try:
            if amode & MPI.MODE_CREATE:  # (only now: creating or truncating changes the file)
                # Every rank opens at once, creating the file if it is missing (rank 0 also
                # truncates); with MODE_EXCL rank 0 alone creates it and the others open it
                # after hearing that it did.
                exclusive = bool(amode & MPI.MODE_EXCL)
                if rank == 0:
                    create = flags | os.O_CREAT | (os.O_EXCL if exclusive else 0)
                    try:
                        driver = open_driver(
                            path, create | (os.O_TRUNC if truncate else 0), 0o666, hinted
                        )
                    except OSError as exc:
                        err = _os_error(exc, path)
                    if driver is not None and not opens:
                        driver.close()
                        driver = None
                if exclusive:
                    _agree(comm, err)
                if driver is None and opens and rank > 0:
                    extra = 0 if exclusive else os.O_CREAT
                    try:
                        driver = cls._open_driver(path, flags | extra, amode, hinted)
                    except OSError as exc:
                        err = _os_error(exc, path)
                _agree(comm, err)
            file = cls(comm, path, driver, amode, hinted, nodes, aggregators, digest, agreement)
            file._parent = parent
            return file
        except BaseException:  # (freed, not kept: a failure on one rank may leave it in use)
            if driver is not None:
                driver.close()
            agreement.free()
            comm.Free()
            raise

    @staticmethod
    def _open_driver(path: str, flags: int, amode: int, hints: Hints) -> Driver:
        """This rank's driver of an existing file (``OSError`` as the system raises it)."""
        try:
            return open_driver(path, flags, 0o666, hints)
        except PermissionError:
            if not amode & MPI.MODE_WRONLY:
                raise
            return open_driver(path, os.O_WRONLY, 0o666, hints)  # (no sieving reads then)

    def close(self) -> None:
        """Close on every rank (collective); ``MODE_DELETE_ON_CLOSE`` removes the file. Closing
        a closed file does nothing (as Python's files; every other call raises
        :class:`~strataio.errors.ClosedError`). The realm caches are written back first; if
        that fails on any rank, every rank raises and the file stays open (the data cached)."""
        if self._closed:
            return
        if self._shared is not None:  # (realm caches: on every rank or on none)
            _agree(self._comm, self._write_back())
        err: Exception | None = None
        try:
            if self._shared is not None:
                self._shared.free()
                self._shared = self._cache = None
            if self._driver is not None:
                self._driver.close()
        except Exception as exc:  # (agreed below: every rank raises it, none waits alone)
            err = exc
        self._closed = True
        comm = self._comm
        self._comm = MPI.COMM_NULL  # (the duplicate goes to the next file opened there)
        try:
            _agree(comm, err)
            if self._amode & MPI.MODE_DELETE_ON_CLOSE:
                # once every rank has closed it (the agreement above), rank 0 deletes the file
                # and no rank returns before it is gone, as in ROMIO; a failed delete raises
                # on every rank
                _agree(comm, self._delete() if comm.Get_rank() == 0 else None)
        except BaseException:
            # kept nowhere: each rank frees its own, so no rank later takes a duplicate that
            # another rank dropped
            self._agreement.free()
            comm.Free()
            raise
        if self._parent is not None:
            commpool.give_back(self._parent, self._agreement)
        else:
            self._agreement.free()
            comm.Free()

    def _delete(self) -> StrataError | None:
        """Remove the file (``MODE_DELETE_ON_CLOSE``); the failure, for the caller to agree
        on. A file already gone is not one."""
        try:
            os.unlink(self._path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            return BackendError(f"{self._path}: cannot delete on close: {exc.strerror or exc}")
        return None

    def __enter__(self) -> File:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ properties
    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def path(self) -> str:
        return self._path

    @property
    def amode(self) -> int:
        """The ``MPI.MODE_*`` flags the file was opened with."""
        return self._amode

    @property
    def comm(self) -> MPI.Comm:
        """The file's communicator: a duplicate of the one it was opened on, private to the
        file while it is open (``MPI.COMM_NULL`` once closed: the duplicate goes to the next
        file opened on that communicator, :mod:`strataio.collective.commpool`, or is freed)."""
        return self._comm

    @property
    def driver(self) -> Driver | None:
        """The storage driver this rank reaches the file through (None on a rank that did not
        open it: ``romio_no_indep_rw=true`` and not an aggregator)."""
        return self._driver

    @property
    def aggregators(self) -> list[int]:
        """The ranks that aggregate two-phase calls, in realm order (ROMIO's
        ``romio_aggregator_list``)."""
        return self._aggregators.tolist()

    @property
    def realms(self) -> StripedRealms | None:
        """The persistent file realms in force (``romio_cb_pfr=enable``), fixed at the first
        two-phase call until close (with ``strataio_realms=dynamic`` until the view or the
        memory layout changes); None before that call or without persistent realms."""
        return self._realms

    @property
    def hints(self) -> dict[str, str]:
        """Every hint in force, with string values (as ``MPI_File_get_info``)."""
        self._check_open()
        return self._hints.as_dict()

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"{self._path}: file is closed")

    def _check_writable(self) -> None:
        if self._amode & MPI.MODE_RDONLY:
            raise ReadOnlyError(f"{self._path}: opened read-only")

    def _check_readable(self) -> None:
        if self._amode & MPI.MODE_WRONLY:
            raise ReadOnlyError(f"{self._path}: opened write-only; reads are not allowed")

    # ------------------------------------------------------------------ view
    def set_view(
        self,
        disp: int = 0,
        etype: MPI.Datatype = MPI.BYTE,
        filetype: MPI.Datatype | None = None,
        datarep: str = "native",
        info: Mapping[str, Any] | MPI.Info | None = None,
    ) -> None:
        """Set this rank's view (collective); resets the individual file pointer to 0.

        ``disp`` is in bytes and must be >= 0; ``filetype`` (default ``etype``) must hold a
        whole number of etypes, with non-negative, non-decreasing type-map displacements, and
        its tiles (one per extent) must not overlap; all ranks must use etypes of the same
        size. ``etype`` and ``filetype`` must be committed, as MPI requires (a derived datatype
        after its ``Commit()``): an uncommitted one is found through MPI, by
        :func:`~strataio.layout.datatypes.is_committed`, where the MPI library checks
        datatypes (MPICH does), and named in the error. Raises :class:`ViewError` on every
        rank.
        ``info`` adds hints to those in force (the same on every rank, as at open; else
        :class:`~strataio.errors.HintError` on every rank).
        """
        self._check_open()
        err: Exception | None = None
        filetype = etype if filetype is None else filetype
        esize = -1
        hinted, policy = self._hints, self._policy
        try:
            if info is not None:
                hinted = parse_hints(info, self._comm.Get_size(), base=self._hints)
                policy = policy_from_hints(hinted)
            for what, t in (("etype", etype), ("filetype", filetype)):
                if not isinstance(t, MPI.Datatype):
                    raise ViewError(f"{what} must be an MPI datatype, not {t!r}")
                if t == MPI.DATATYPE_NULL:
                    raise ViewError(f"{what} is MPI.DATATYPE_NULL, not a datatype of a view")
                if not is_committed(t):
                    raise ViewError(
                        f"{what} ({describe(t)}) has not been committed: MPI-IO takes a "
                        "view's etype and filetype committed (call Commit() on it)"
                    )
            if datarep != "native":
                raise ViewError(f"data representation {datarep!r} is not supported (native only)")
            disp = _integral(disp, "view displacement")
            if disp < 0:
                raise ViewError(f"view displacement {disp} is negative")
            ft = flatten(filetype)
            esize = _checked_view(flatten(etype), ft)
        except Exception as exc:  # any failure here must reach the other ranks
            err = exc
        digest = self._digest if hinted is self._hints else shared_digest(hinted)
        if not _checked_together(self._comm, err, [digest, esize]):
            err = _same_everywhere(self._comm, self._amode, hinted)
            sizes = self._comm.allgather(esize)
            if err is None and len(set(sizes)) > 1:
                err = ViewError(f"ranks use etypes of different sizes: {sizes}")
            _agree(self._comm, err)
        if hinted is not self._hints:
            self._digest = digest
            self._independent = IndependentIO(hinted)
        self._hints, self._policy = hinted, policy
        self._disp, self._esize, self._ft = disp, esize, ft
        self._view = (disp, etype, filetype)
        self._pos = 0

    def get_view(self) -> tuple[int, MPI.Datatype, MPI.Datatype]:
        """``(disp, etype, filetype)`` of the current view."""
        self._check_open()
        return self._view

    def _file_extents(self, start: int, nbytes: int) -> Extents:
        """File pieces of view-stream bytes ``[start, start + nbytes)``; ``mem`` from 0."""
        ft, disp = self._ft, self._disp
        if nbytes == 0:
            return Extents.empty()
        if ft.size == 0:
            raise ViewError("the view's filetype holds no data")
        if ft.is_contiguous:
            return Extents.single(disp + int(ft.extents.offsets[0]) + start, nbytes)
        return _file_layouts.get(
            (ft,), (disp, start, nbytes), lambda: freeze(self._tile_view(start, nbytes))
        )

    def _tile_view(self, start: int, nbytes: int) -> Extents:
        """:meth:`_file_extents` of a noncontiguous filetype, computed."""
        ft, disp = self._ft, self._disp
        size = ft.size
        k0 = start // size
        k1 = (start + nbytes - 1) // size
        tiled = ft.extents.tile(k1 - k0 + 1, ft.extent)
        a = start - k0 * size
        b = a + nbytes
        ms = np.maximum(tiled.mem, a)
        me = np.minimum(tiled.mem + tiled.lengths, b)
        keep = me > ms
        ms, me = ms[keep], me[keep]
        off = tiled.offsets[keep] + (ms - tiled.mem[keep]) + _I64(disp + k0 * ft.extent)
        return Extents(off, me - ms, ms - a).coalesce()

    def _view_bytes_below(self, size: int) -> int:
        """Bytes of the view's data stream that lie below file byte ``size``."""
        ft = self._ft
        rel = size - self._disp
        if rel <= 0 or ft.size == 0:
            return 0
        k, rem = divmod(rel, ft.extent)
        ext = ft.extents
        part = np.clip(rem - ext.offsets, 0, ext.lengths).sum()
        return int(k * ft.size + part)

    # ------------------------------------------------------------------ pointer, size
    def seek(self, offset: int, whence: int = MPI.SEEK_SET) -> None:
        """Move the individual file pointer (etypes); ``MPI.SEEK_SET``, ``SEEK_CUR``,
        ``SEEK_END`` (end of file in the view, rounded up to a whole etype)."""
        self._check_open()
        offset = _integral(offset, "seek offset")
        if whence == MPI.SEEK_SET:
            pos = offset
        elif whence == MPI.SEEK_CUR:
            pos = self._pos + offset
        elif whence == MPI.SEEK_END:
            pos = -(-self._view_bytes_below(self.get_size()) // self._esize) + offset
        else:
            raise StrataError(f"seek: unknown whence {whence}")
        if pos < 0:
            raise ViewError(f"seek to negative position {pos}")
        self._pos = int(pos)

    def get_position(self) -> int:
        """The individual file pointer, in etypes of the view."""
        self._check_open()
        return self._pos

    def get_size(self) -> int:
        """The file's size in bytes."""
        self._check_open()
        return self._size()

    def _size(self) -> int:
        try:
            if self._driver is not None:
                return max(self._driver.size(), self._cached_end)
            return max(os.stat(self._path).st_size, self._cached_end)
        except OSError as exc:
            raise _os_error(exc, self._path) from exc

    def set_size(self, size: int) -> None:
        """Truncate or extend the file to ``size`` bytes (collective; every rank must pass the
        same size, as in MPI). The size is checked on every rank before rank 0 changes the
        file; a bad or differing size raises on every rank."""
        self._check_open()
        err: Exception | None = None
        try:
            self._check_writable()
            size = _integral(size, "set_size: size", StrataError)
            if size < 0:
                raise StrataError(f"set_size: negative size {size}")
        except Exception as exc:  # a size that is not a number, say: every rank must hear it
            err = exc
        sizes = self._comm.allgather(None if err is not None else size)
        if err is None and len({s for s in sizes if s is not None}) > 1:
            err = StrataError(f"set_size: ranks pass different sizes {sizes}")
        _agree(self._comm, err)
        err = self._write_back(discard_from=size)  # (before the file changes)
        _agree(self._comm, err)
        if self._comm.Get_rank() == 0:
            try:
                if self._driver is not None:
                    self._driver.truncate(size)
                else:
                    os.truncate(self._path, size)
            except OSError as exc:
                err = _os_error(exc, self._path)
        _agree(self._comm, err)
        self._size_floor = size
        self._cached_end = min(self._cached_end, size)

    def sync(self) -> None:
        """Flush written data to storage on every rank (collective). Afterwards reads see the
        file as it is now: another handle or process may have written or cut it (MPI's
        sync-barrier-sync makes such changes visible), so the realm caches forget their pages
        once written back."""
        self._check_open()
        err = self._write_back(forget=True)
        try:
            if not self._amode & MPI.MODE_RDONLY and self._driver is not None:
                self._driver.sync()
        except OSError as exc:
            err = _os_error(exc, self._path)
        held = self._cached_end
        if err is None:
            self._cached_end = 0  # (the caches are empty now: the size is the file's own)
            try:
                self._size_floor = self._size()
            except StrataError as exc:
                err = exc
        try:
            _agree(self._comm, err)
        except BaseException:
            self._cached_end = held  # (a cache that failed to write back still holds bytes)
            raise

    # ------------------------------------------------------------------ transfers
    def read_at(self, offset: int, buf: Any) -> int:
        """Read at ``offset`` etypes of the view into ``buf`` (independent). Returns the bytes
        read: fewer than ``buf`` holds when the file ends first (the rest reads as zeros)."""
        return self._transfer(buf, offset, write=False, collective=False)

    def write_at(self, offset: int, buf: Any) -> int:
        """Write ``buf`` at ``offset`` etypes of the view (independent). Returns the bytes
        written."""
        return self._transfer(buf, offset, write=True, collective=False)

    def read_at_all(self, offset: int, buf: Any) -> int:
        """Collective :meth:`read_at`."""
        return self._transfer(buf, offset, write=False, collective=True)

    def write_at_all(self, offset: int, buf: Any) -> int:
        """Collective :meth:`write_at`."""
        return self._transfer(buf, offset, write=True, collective=True)

    def read(self, buf: Any) -> int:
        """Read at the individual file pointer and advance it by the whole etypes read
        (independent)."""
        return self._transfer(buf, None, write=False, collective=False)

    def write(self, buf: Any) -> int:
        """Write at the individual file pointer and advance it (independent)."""
        return self._transfer(buf, None, write=True, collective=False)

    def read_all(self, buf: Any) -> int:
        """Collective :meth:`read`."""
        return self._transfer(buf, None, write=False, collective=True)

    def write_all(self, buf: Any) -> int:
        """Collective :meth:`write`."""
        return self._transfer(buf, None, write=True, collective=True)

    def read_items(self, sched: irregular.IndexSchedule, out: Any) -> irregular.ItemsIO:
        """Read the items of an index schedule into ``out`` (collective; a C-contiguous array
        of ``sched.n * sched.itemsize`` bytes, in this rank's index order). Items are records
        of ``sched.itemsize`` bytes from byte 0 of the file, whatever the view; see
        :mod:`strataio.collective.irregular`.

        As :meth:`read_at` returns fewer bytes when the file ends first, the result counts
        the items read: ``items`` (this rank's, repeats once) lay wholly before the end of
        the file, and ``file_items`` is where it ended; the records of ``out`` whose index
        is ``file_items`` or more were not read, and are zeros."""
        self._check_open()
        self.last_path = "irregular"
        self._settle_caches(drop=False)  # (items go straight to the driver)
        return irregular.read_items(
            self._comm,
            self._driver,
            sched,
            out,
            self._hints,
            self._path,
            self._forbidden[0],
            self._size,
        )

    def write_items(self, sched: irregular.IndexSchedule, values: Any) -> irregular.ItemsIO:
        """Write ``values`` (``sched.n`` items of ``sched.itemsize`` bytes, in this rank's
        index order) to the items of an index schedule (collective); see
        :meth:`read_items`. An index on two ranks raises
        :class:`~strataio.errors.DuplicateWriteError` everywhere unless the hint
        ``strataio_duplicate_writes=last-rank`` is in force."""
        self._check_open()
        self.last_path = "irregular"
        self._settle_caches(drop=True)
        ret = irregular.write_items(
            self._comm, self._driver, sched, values, self._hints, self._path, self._forbidden[1]
        )
        end = sched.nitems * sched.itemsize  # (at most: the highest index written)
        self._size_floor = max(self._size_floor, min(end, self._size()))
        return ret

    def _prepare(
        self, buf: Any, offset: int | None, write: bool
    ) -> tuple[Any, Access, PackedBlocks | None]:
        """Validate and map a transfer; the blocks are those of a packed transfer, whose
        ``access.stream`` is not filled in yet (see :mod:`strataio.collective.packed`)."""
        if self._closed:  # (the checks inlined: every call pays for them)
            self._check_open()
        if self._forbidden[write]:
            if write:
                self._check_writable()
            else:
                self._check_readable()
        spec = parse_buffer(buf, writable=not write)
        if spec.nbytes % self._esize:
            raise ViewError(
                f"buffer holds {spec.nbytes} bytes, not a whole number of {self._esize}-byte etypes"
            )
        pos = self._pos if offset is None else _integral(offset, "file offset")
        if pos < 0:
            raise ViewError(f"negative file offset {pos}")
        start = pos * self._esize
        ft = self._ft  # (whole filetypes up to the access's end, and one more: past its end)
        if self._disp + ((start + spec.nbytes) // max(ft.size, 1) + 1) * ft.extent > _MAX_OFFSET:
            raise ViewError(
                f"an access of {spec.nbytes} bytes at offset {pos} of this view reaches past "
                f"the largest file offset (2**63 - 1 bytes)"
            )
        plan, blocks = _access_plans.get(
            (self._ft, None if spec.contiguous else spec.mem),
            (self._disp, start, spec.nbytes, spec.start if spec.contiguous else -1),
            lambda: self._plan_access(spec, start),
        )
        if blocks is None:
            return spec, Access(plan.file, spec.data, plan), None
        return spec, Access(plan.file, _UNPACKED, plan), blocks

    def _plan_access(self, spec: BufferSpec, start: int) -> tuple[AccessPlan, PackedBlocks | None]:
        """The file pieces of a transfer of ``spec`` from view-stream byte ``start``, paired with
        the caller's memory, or with a packed stream (then also its blocks)."""
        ext = self._file_extents(start, spec.nbytes)
        # Zero-copy (file <-> caller memory) unless the memory layout splits the file pieces
        # much further (e.g. FLASH: variables interleaved in memory, contiguous in file):
        # then one vectorized pack keeps the file side in few large pieces.
        limit = 2 * len(ext) + 16
        if len(spec.mem) <= limit:
            placed = spec.place(ext)
            if len(placed) <= limit:
                return AccessPlan(freeze(placed)), None
        return AccessPlan(ext), PackedBlocks(spec.mem, ext, spec.nbytes)

    def _independent_transfer(
        self, spec: BufferSpec, access: Access, blocks: PackedBlocks | None, write: bool
    ) -> None:
        """This rank's part moved by itself (an independent call, or a collective one whose
        ranks chose not to aggregate); OS errors come back as :class:`StrataError`."""
        driver = self._driver
        if driver is None:  # (a collective call with no bytes anywhere: nothing to move)
            return
        try:
            self._clean_caches(access.file, drop=write)
            if blocks is not None:
                if write:
                    blocks.write(self._independent, driver, spec.data)
                else:
                    blocks.read(self._independent, driver, spec.data)
            elif write:
                self._independent.write(driver, access)
            else:
                self._independent.read(driver, access)
        except OSError as exc:
            raise _os_error(exc, self._path) from exc

    def _transfer(self, buf: Any, offset: int | None, write: bool, collective: bool) -> int:
        if not collective:
            if self._hints.romio_no_indep_rw:
                self._check_open()
                raise HintError(
                    f"{self._path}: opened with romio_no_indep_rw=true, a promise of collective "
                    f"I/O only; an independent {'write' if write else 'read'} breaks it"
                )
            spec, access, blocks = self._prepare(buf, offset, write)
            self.last_path = "independent"
            self._independent_transfer(spec, access, blocks, write)
        else:
            if self._closed:
                self._check_open()
            err: Exception | None = None
            spec = access = blocks = None
            try:
                spec, access, blocks = self._prepare(buf, offset, write)
            except Exception as exc:  # any failure here must reach the other ranks
                err = exc
            rows = self._agreement(agreement_row(access, 0 if err is None else 1))
            if any(self._agreement.errors):
                _raise_agreed(self._comm, err)
            assert access is not None and spec is not None
            self._collective(spec, access, blocks, rows, write)
        n = spec.nbytes
        end = access.plan.summary[1]  # one past the last file byte of the transfer
        if end > self._size_floor:
            if write:
                self._size_floor = end
            else:
                n = self._read_count(access.file, n, end)
        if offset is None:
            self._pos += n // self._esize
        return n

    def _read_count(self, file: Extents, nbytes: int, end: int) -> int:
        """The count of a read of ``file`` pieces (``nbytes`` requested) that ends at file byte
        ``end``: all of it unless the file ends first, else the bytes that lie before its end
        (a prefix of the view's stream, whose file offsets never decrease)."""
        self._size_floor = size = self._size()
        if end <= size:
            return nbytes
        return int(np.clip(size - file.offsets, 0, file.lengths).sum())

    def _collective(
        self,
        spec: BufferSpec,
        access: Access,
        blocks: PackedBlocks | None,
        rows: list[list[int]],
        write: bool,
    ) -> None:
        """Run a collective transfer whose agreement gave ``rows`` (every rank's numbers)."""
        hints = self._hints
        mode = hints.romio_cb_write if write else hints.romio_cb_read
        err: Exception | None = None
        two = use_two_phase(rows, mode, write, self._nodes.crowded)
        self.last_path = "two-phase" if two else "independent"
        if not two:
            # Every rank already knows the call is valid; an I/O failure now is this rank's
            # own, agreed on as a two-phase call's is: every rank raises it once its own part
            # is done, none returns as if the call had succeeded (and goes on alone).
            try:
                self._independent_transfer(spec, access, blocks, write)
            except Exception as exc:
                err = exc
            _agree(self._comm, err)
            return
        pack = None
        if blocks is not None:

            def pack() -> None:  # every rank's exchange moves its whole packed stream
                access.stream = scratch(spec.nbytes, "stream")
                if write:
                    spec.pack(out=access.stream)

        stats = self._agreement.table
        policy = self._realms_for(spec, stats) if persistent(hints) else self._policy
        driver: Driver | None = self._driver
        if self._cache is not None and policy is self._realms:
            # window I/O through the realm cache, in this thread (it holds the cache's lock)
            driver = self._cache
            hints = dataclasses.replace(hints, strataio_cb_overlap="disable")
        try:
            twophase.two_phase(
                self._comm, driver, access, stats, hints, policy,
                self._aggregators, write, self._nodes, pack,
            )  # fmt: skip
        except twophase.PeerFailure:
            err = None  # the agreement raises the failing rank's own error here
        except StrataError as exc:
            err = exc
        except OSError as exc:
            err = _os_error(exc, self._path)
        except Exception as exc:  # (planning failures of any kind are agreed on)
            err = exc
        finally:
            if self._shared is not None:  # (no rank can start an independent call before
                self._shared.release()  # the agreement below, which this rank enters now)
        if write and self._shared is not None:
            self._cached_end = max(self._cached_end, int(stats[stats[:, NBYTES] > 0, LAST].max()))
        _agree(self._comm, err)  # an aggregator's failure concerns every rank's data
        if blocks is not None and not write:
            spec.unpack(access.stream)

    # ------------------------------------------------------------------ persistent realms
    def _realms_for(self, spec: BufferSpec, stats: np.ndarray) -> RealmPolicy:
        """The persistent realms of a two-phase call (collective: every rank reaches it in the
        same call), fixed now if not yet (thesis §3.4). With ``strataio_realms=dynamic`` a
        change of any rank's view or memory layout since they were fixed retires them and fixes
        new ones for this call's access (§3.4.4)."""
        pattern = (self._disp, self._ft, None if spec.contiguous else spec.mem)
        if self._realms is not None and self._hints.strataio_realms == DYNAMIC:
            changed = pattern[:2] != self._pattern[:2] or not _same_layout(
                pattern[2], self._pattern[2]
            )
            if self._comm.allreduce(changed, op=MPI.LOR):
                self._retire_realms()
        if self._realms is None:
            active = stats[stats[:, NBYTES] > 0]
            lo, hi = int(active[:, FIRST].min()), int(active[:, LAST].max())
            # the file's size as every rank knows it at least (the same number everywhere)
            size = int(self._comm.allreduce(self._size_floor, op=MPI.MAX))
            naggr = int(self._aggregators.size)
            align = realm_alignment(self._hints)
            stripe = stripe_size(self._fr_type, lo, hi, size, naggr, align)
            self._realms = StripedRealms(stripe, naggr)
            self._start_cache(stripe)
            # ROMIO writes the size it chose back into the file's info
            self._hints = dataclasses.replace(self._hints, romio_cb_fr_types=str(stripe))
            self._pattern = pattern
        return self._realms

    def _retire_realms(self) -> None:
        """Drop the persistent realms (collective); the next two-phase call fixes new ones.
        What the old realms cached is written back and forgotten first; a cache that fails to
        write back is kept, with the realms, for the next call to retire again."""
        err = self._settle_caches(drop=True, agree=False)
        if err is None:  # (else its dirty pages are still the only copy of those bytes)
            self._cache = None
        _agree(self._comm, err)
        self._realms = None
        self._hints = dataclasses.replace(self._hints, romio_cb_fr_types=self._fr_type)

    # ------------------------------------------------------------------ the realm cache
    def _start_cache(self, stripe: int) -> None:
        """This aggregator's realm cache over realms of ``stripe`` bytes (in the window's
        memory); nothing on other ranks or without the cache."""
        shared = self._shared
        if shared is None or not shared.memory.size or self._driver is None:
            return
        cap = self._hints.strataio_realm_cache
        self._cache = RealmCache(self._driver, cap, DEFAULT_PAGE, stripe, shared.memory)
        self._cache.guard = shared.hold

    @property
    def realm_cache(self) -> RealmCache | None:
        """This rank's realm cache (an aggregator's, once persistent realms are fixed, with
        ``strataio_realm_cache`` > 0), else None."""
        return self._cache

    def _write_back(
        self, discard_from: int | None = None, forget: bool = False
    ) -> Exception | None:
        """Write this rank's realm cache back (with ``forget`` dropping every page after), then
        forget what lies from ``discard_from`` on; the failure, for the caller to agree on. A
        cache that fails to write back forgets nothing: the bytes past ``discard_from`` are
        dropped only once they are on storage too, so a ``set_size`` that fails loses none."""
        if self._cache is None:
            return None
        assert self._shared is not None
        try:
            with self._shared.own():
                (self._cache.invalidate if forget else self._cache.flush)()
                if discard_from is not None:
                    self._cache.discard_from(discard_from)
        except OSError as exc:
            return _os_error(exc, self._path)
        except Exception as exc:  # any failure must reach the other ranks' agreement
            return exc
        return None

    def _settle_caches(self, *, drop: bool, agree: bool = True) -> Exception | None:
        """Write this rank's realm cache back, and with ``drop`` forget its pages, so that a
        transfer bypassing the caches finds the file current and leaves none stale.
        Collective: with ``agree`` a failure on any rank raises on every rank; without, the
        failure is returned for the caller to agree on."""
        err: Exception | None = None
        if self._cache is not None:
            assert self._shared is not None
            try:
                with self._shared.own():
                    if drop:
                        self._cache.invalidate()
                    else:
                        self._cache.flush()
            except OSError as exc:
                err = _os_error(exc, self._path)
            except Exception as exc:  # any failure must reach the other ranks' agreement
                err = exc
        if agree:
            _agree(self._comm, err)
        return err

    def _clean_caches(self, file: Extents, drop: bool) -> None:
        """Before an independent transfer of ``file`` pieces: write back the realm caches'
        dirty pages holding its bytes, and before a write (``drop``) forget those pages, on
        every aggregator owning some (:mod:`strataio.collective.cache_window`)."""
        shared, realms = self._shared, self._realms
        if shared is None or realms is None or self._driver is None or not len(file):
            return
        runs = file.union()
        cap = self._hints.strataio_realm_cache
        slot, nslots = RealmCache.shape(cap, DEFAULT_PAGE, realms.stripe)
        shape = (slot, nslots, realms.stripe)
        me = self._comm.Get_rank()
        for agg in owners_of(runs, realms.stripe, realms.naggr).tolist():
            rank = int(self._aggregators[agg])
            if rank == me and self._cache is not None:
                with shared.own():
                    (self._cache.invalidate if drop else self._cache.flush)(runs)
            elif rank != me:
                shared.clean(rank, runs, self._driver, drop, shape)

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{self._comm.Get_size()} ranks"
        return f"<strataio.File {self._path!r} ({state})>"
