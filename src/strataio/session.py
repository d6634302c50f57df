"""Session: configuration + catalog + tiers, and datasets that live on the storage hierarchy.

``strataio.Session(config)`` builds the tiers of a configuration, opens the catalog and hands
out :class:`TieredDataset` objects: the array API of :class:`~strataio.arrays.dataset.Dataset`
over a :class:`~strataio.tiers.store.TieredChunkStore`, plus ``stage`` / ``prefetch`` /
``migrate`` / ``evict``. In an MPI job (``comm`` given) only rank 0 opens the catalog; it reads
what a dataset open needs in one round trip and broadcasts it, and at close gathers the other
ranks' residency changes and commits them in one transaction (APRIL's open/close discipline);
rank 0's own changes reach the catalog as a single process's do.

Each Session registers as a *writer* of its catalog (:mod:`strataio.catalog.liveness`): a
token the kernel or the database server releases when the process dies, and the datasets it
has open. Rewrites in place are announced in the catalog under that writer before they
happen, on every rank: a rank other than 0 opens its own catalog connection for that, the
first time it rewrites a catalogued chunk. So ``fsck`` after a crash resolves at once what a
dead job left, and leaves alone what a live one is doing.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import json
import math
import numbers
import os
import sys
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from strataio.agreed import agree, differs_in, same_on_every_rank
from strataio.arrays.codecs import CodecPipeline
from strataio.arrays.dataset import Dataset
from strataio.arrays.metadata import ArrayMetadata
from strataio.catalog.base import (
    Catalog,
    ChunkCopy,
    DatasetRecord,
    codec_json,
    open_catalog,
    redact_url,
)
from strataio.errors import (
    ArgumentError,
    BackendError,
    ExistsError,
    MetadataError,
    NotFoundError,
    StrataError,
)
from strataio.storage.base import validate_key
from strataio.storage.superfile import SuperfileError
from strataio.tiers.cache import DEFAULT_CACHE_BYTES, ChunkCache
from strataio.tiers.commit import Commit
from strataio.tiers.meta import META_ATTR
from strataio.tiers.mover import MoveHandle, Mover, MoveResult, Progress
from strataio.tiers.placement import AutoDecision, Placement
from strataio.tiers.remnants import Deletion, purge, purge_near, remnant_tiers
from strataio.tiers.residency import META_KEY, Residency
from strataio.tiers.row_memo import RowLoader, RowMemo
from strataio.tiers.store import TieredChunkStore, keys_of
from strataio.tiers.superfile import (
    DEFAULT_CONTAINER_BYTES,
    Superfile,
    container_key,
    is_superfile,
    record_container_bytes,
    superfile_record,
)
from strataio.tiers.tier import TierSet, checksum

#: key of an AUTO dataset's catalog annotations (the record's ``attrs``) holding its placement
#: decision (not in zarr.json)
PLACEMENT_ATTR = "strataio.placement"
#: the key, in a tiered dataset's catalog record, of its ``zarr.json`` as created less the
#: user attributes: what never changes (fill value, dimension names, key encoding), for an
#: open that reaches no tier holding the ``zarr.json`` itself
ARRAY_ATTR = "strataio.array"


class TieredDataset(Dataset):
    """A Dataset on the storage hierarchy: the array API plus asynchronous moves.

    ``section`` arguments take a :class:`~strataio.layout.sections.Section`, a numpy basic
    index (``np.s_[0:100, :80]``) or None (the whole array); each move returns a
    :class:`~strataio.tiers.mover.MoveHandle`.

    In a parallel job (``comm`` given) ``stage``, ``migrate`` and ``evict`` are collective:
    every rank calls them with the same arguments, rank 0 moves each chunk once and every rank
    returns when the move is over, with the same result and the same residency (a failure is
    raised on every rank). ``prefetch`` fills the calling rank's own chunk cache and is not
    collective.

    User attributes (``attrs``) live in the dataset's ``zarr.json`` only, the metadata every
    Zarr reader sees: the catalog record keeps none of them (its ``attrs`` hold strataio's
    own annotations, see :class:`~strataio.catalog.base.DatasetRecord`), only the checksum
    of the current ``zarr.json``, so a tier that was down while they were set, and holds the
    ``zarr.json`` before, is not read as holding them (:mod:`strataio.tiers.meta`: it is
    rewritten once read, and where no tier that answers holds the current one, an open or a
    set raises :class:`MetadataError` rather than start from the older). A set applies to
    the attributes ``zarr.json`` holds at that moment, as for a plain dataset, so handles in
    this or other processes setting different attributes keep each other's. A DISABLE
    dataset stores no ``zarr.json``: its attributes, like its data, are accepted and dropped
    (this handle shows them until it closes).
    """

    store: TieredChunkStore

    def __init__(
        self,
        store: TieredChunkStore,
        meta: ArrayMetadata,
        mode: str = "r",
        *,
        name: str = "",
        comm: Any = None,
    ) -> None:
        super().__init__(store, meta, mode, name=name, comm=comm)

    @property
    def hint(self) -> str:
        return self.store.hint

    def stage(self, section: Any = None, to: str | None = None) -> MoveHandle | FinishedMove:
        """Copy the chunks covering ``section`` to tier ``to`` (default: the fastest disk tier
        with room); chunks already on a tier that fast are not copied again."""
        self._check_open()
        keys = self._move_keys("stage", section, to)
        return self._move(lambda: self.store.stage(keys, to))

    def prefetch(self, section: Any = None) -> MoveHandle:
        """Read the chunks covering ``section`` into the in-process chunk cache (this rank's
        own cache in a parallel job: not collective)."""
        self._check_open()
        return self.store.prefetch(keys_of(self, section))

    def migrate(self, section: Any = None, to: str | None = None) -> MoveHandle | FinishedMove:
        """Move the chunks covering ``section`` to tier ``to`` (default: the slowest tier);
        their copies on faster tiers are deleted once the move is committed."""
        self._check_open()
        target = to if to is not None else self.store.placement.persistent()[-1].name
        keys = self._move_keys("migrate", section, target)
        return self._move(lambda: self.store.migrate(keys, target))

    def evict(self, section: Any = None, tier: str | None = None) -> MoveHandle | FinishedMove:
        """Drop the copies on ``tier`` (default: the fastest) of the chunks covering
        ``section``, writing back first any chunk whose only copy is there."""
        self._check_open()
        name = tier if tier is not None else self.store.placement.persistent()[0].name
        keys = self._move_keys("evict", section, name)
        return self._move(lambda: self.store.evict(keys, name))

    def _move_keys(self, op: str, section: Any, tier: str | None) -> list[str]:
        """The chunk keys of a move's ``section``. In a parallel job, raise on every rank
        unless each asked for the same move (a section that fits, the same chunks, the same
        tier, one the session knows): a move is collective, and rank 0 runs it for all, so a
        rank's other arguments would be silently ignored, or its error leave the others
        waiting."""
        if self.comm is None:
            return keys_of(self, section)
        keys: list[str] = []
        checked: BaseException | None = None
        try:
            keys = keys_of(self, section)
            if tier is not None:
                self.store.tiers[tier]  # (NotFoundError naming the tiers there are)
        except StrataError as exc:
            checked = exc
        agree(self.comm, checked)
        if differs_in(self.comm, "\n".join([op, tier or "", *keys]).encode(), len(keys)):
            raise ArgumentError(
                f"{op} of dataset {self.name!r} is collective, and the ranks asked for "
                f"different ones (this rank: {len(keys)} chunks, tier {tier or 'default'}): "
                "every rank must pass the same section and tier"
            )
        return keys

    def _move(self, start: Callable[[], MoveHandle]) -> MoveHandle | FinishedMove:
        """Start a move: at once in a single process; collectively in a parallel job.

        Collective protocol: (1) every rank makes its writes durable; (2) every rank hands its
        buffered residency changes to rank 0, which adopts and commits them, so the move sees
        every rank's chunks; (3) each rank deletes the objects its handed-over changes made
        stale, before anything moves (a move may put a new object under the same name) --
        steps 1-3 are :meth:`Commit.share`; (4) rank 0 runs the move to its end (committed by
        rank 0 as a single process's move is); (5) rank 0 broadcasts the result, any error and
        its residency, and the other ranks reload theirs from it
        (:meth:`Residency.reload`); where step (2) left writes out (their objects gone or
        replaced), no move starts and every rank raises them, as a flush does
        (:meth:`TieredChunkStore.report_lost_writes`). A failure anywhere raises on every
        rank; changes not yet handed over stay buffered (handed over at close), and
        handed-over ones that rank 0 could not commit stay buffered there.
        """
        if self.comm is None:
            return start()
        result = self._share(start)
        assert result is not None
        return FinishedMove(result)

    def _share(self, start: Callable[[], MoveHandle] | None) -> MoveResult | None:
        """Steps (1)-(5) of :meth:`_move`, the move left out where ``start`` is None."""
        comm, res = self.comm, self.store.res
        # (1)-(3): every rank's changes recorded by rank 0, stale objects deleted
        changed = self.store.commit.share(res)
        # writes the commit left out, the same on every rank: a move is not started then,
        # and every rank raises them (the move's flush would on rank 0 alone)
        lost = res.take_lost_writes() if start is not None else ({}, {}, set())
        result: MoveResult | None = None
        err: BaseException | None = None
        copies: list[ChunkCopy] | None = None
        if comm.Get_rank() == 0:
            try:
                if start is not None and not any(lost):
                    result = start().result()
            except BaseException as exc:
                err = exc
            copies = res.all_copies()
        result, err, copies = comm.bcast((result, err, copies), root=0)
        if comm.Get_rank() != 0:
            assert copies is not None
            changed = sorted(set(changed) | set(res.reload(copies)))
        # chunks another rank rewrote: no rank's prefetch cache may keep their old bytes
        self.store.cache.invalidate(self.name, changed)
        if err is not None:
            raise err
        if any(lost):
            res.lose_writes(*lost)
            self.store.report_lost_writes()
        return result

    def _check_stored_meta(self, raw: bytes | None) -> None:
        """Raise :class:`MetadataError` where no tier that answers holds ``zarr.json``
        (``raw`` None: every tier holding it down, say); the store's read raised already
        where they hold none of its current version (the tiers answering hold one from
        before a change they missed). Attributes set from what this handle or those tiers
        hold would drop the ones set since."""
        if raw is None and not self.store.disabled:
            raise MetadataError(
                f"{self._what()}: no tier that answers holds its zarr.json, so its attributes "
                "cannot be set now (set them once a tier holding it is up again)"
            )

    def _share_writes(self) -> None:
        # every rank's residency learns the chunks the owners of a collective write wrote
        self._share(None)

    def residency(self) -> dict[str, list[ChunkCopy]]:
        """Each stored chunk's copies, fastest tier first."""
        return self.store.residency_table()

    def write_chunks(
        self,
        keys: Sequence[str],
        need_old: Sequence[bool],
        make: Callable[[int, np.ndarray | None], np.ndarray],
    ) -> None:
        # DISABLE: the write was validated by the caller and is dropped here, before the
        # read-modify-write of partial chunks could ask the store for data it never kept
        if self.store.disabled:
            self._check_writable()
            return
        super().write_chunks(keys, need_old, make)


class FinishedMove:
    """A collective move that is over (see :meth:`TieredDataset._move`): the caller-side
    API of :class:`~strataio.tiers.mover.MoveHandle`, with the result rank 0 broadcast."""

    def __init__(self, result: MoveResult) -> None:
        self.op = result.op
        self._result = result

    def done(self) -> bool:
        return True

    @property
    def progress(self) -> Progress:
        r = self._result
        return Progress(r.done_count, r.total, r.nbytes)

    def wait(self, timeout: float | None = None) -> MoveResult:
        """The result; raises :class:`StrataError` if any chunk failed (as ``MoveHandle``)."""
        return self._result.checked()

    def result(self) -> MoveResult:
        """The result, failures included (never raises for chunk failures)."""
        return self._result

    def cancel(self) -> bool:
        return False

    @property
    def cancelled(self) -> bool:
        return False


#: bytes of UTF-8 a part of a dataset or superfile name may have (a file name's, NAME_MAX)
NAME_PART_BYTES = 255


def _check_name(name: str, *, new: bool = False) -> None:
    """Raise unless ``name`` can name a dataset or superfile in the catalog and on tiers
    (with ``new``, one to create or write: each part of it fits in a file name)."""
    validate_key(name)
    try:
        name.encode("utf-8")
    except UnicodeEncodeError as exc:  # (a lone surrogate: a file name's undecodable byte)
        raise ArgumentError(
            f"name {name!r} is not Unicode text the catalog can hold ({exc.reason} at "
            f"position {exc.start}); name datasets with valid characters"
        ) from None
    if name.split("/")[-1] == META_KEY:
        raise ArgumentError(f"name {name!r} ends in {META_KEY!r}, which is reserved")
    long = [n for p in name.split("/") if (n := len(p.encode("utf-8"))) > NAME_PART_BYTES]
    if new and long:
        # (a POSIX tier's put of such an object fails as if the tier had: every process
        # would find it down)
        raise ArgumentError(
            f"name {name[:40]!r}... has a part of {long[0]} bytes; each '/'-separated part "
            f"of a name is at most {NAME_PART_BYTES} bytes of UTF-8, as a file name is"
        )


def _check_fits(tiers: TierSet, name: str, keys: Sequence[str]) -> None:
    """Raise :class:`ArgumentError` unless every tier that may be written can hold the
    objects ``keys`` of ``name`` (its longest: each part of a name may fit a file name while
    the whole is over a path's or an S3 key's limit, with a tier's directory or prefix),
    naming the tier and the limit: a put of one would fail there, whichever tier the data
    is placed on or moved to."""
    for tier in tiers:
        if tier.read_only or not tier.configured:
            continue
        for key in keys:
            why = tier.backend.key_problem(f"{name}/{key}")
            if why:
                raise ArgumentError(
                    f"name {name[:40]!r}... is too long for tier {tier.name!r} "
                    f"({tier.backend.url[:60]}): its object {key!r}: {why}"
                )


class Session:
    """The storage hierarchy of one configuration.

    ``config``: a path to a configuration file, a :class:`strataio.config.Config`, or None
    (:func:`strataio.config.load_config` finds one). ``comm``: an mpi4py communicator for
    parallel jobs (None = a single process). ``tiers`` / ``catalog`` override what the
    configuration says (a :class:`TierSet`; a catalog URL or open :class:`Catalog`).
    Tiers built from the configuration are built once the catalog is open: a POSIX tier's
    missing directory is made only for a tier the catalog has never registered; one of a
    tier it knows (a volume not mounted, a directory removed) leaves that tier down, saying
    so, and is not made (:func:`~strataio.tiers.tier.tier_from_config`; ``strataio init``
    makes it, new and empty). Given ``tiers`` are used as they are. A tier the catalog
    knows that the configuration (or ``tiers``) lacks is a stand-in that is always down
    (:meth:`~strataio.tiers.tier.Tier.unconfigured`): its copies are copies on a tier that
    is down, kept for when it is configured again. In a parallel job every
    rank must have the same tiers (names, places, roles, capacities), whether from its
    configuration or given: ranks that differ raise :class:`ArgumentError` on every rank.
    ``cache_bytes`` bounds the prefetch cache; ``stage_on_read`` stages chunks read from an
    archive tier to disk, as APRIL does, in a single process only: in a parallel job a read
    stages nothing (it reads the archive copy), since a copy one rank made on its own would
    be unknown to another rank rewriting that chunk and would later be read as if current;
    moves there are collective calls (:meth:`TieredDataset.stage`).
    """

    def __init__(
        self,
        config: Any = None,
        comm: Any = None,
        *,
        tiers: TierSet | None = None,
        catalog: str | os.PathLike[str] | Catalog | None = None,
        cache_bytes: int | None = None,
        stage_on_read: bool = True,
    ) -> None:
        self.comm = comm
        self.rank = comm.Get_rank() if comm is not None else 0
        if tiers is None or catalog is None:
            loaded: BaseException | None = None
            try:
                config = _load(config)
            except BaseException as exc:  # (a rank whose file is missing, say: all raise)
                loaded = exc
            agree(comm, loaded)
        self.config = config
        built: TierSet | None = None  # (the tiers built here, closed if the session fails)
        self.stage_on_read = stage_on_read and comm is None
        self.catalog: Catalog | None = None
        self._own_catalog = False
        #: this session's writer id (the same on every rank of a job)
        self.writer = ""
        state: Any = None
        err: BaseException | None = None
        if self.rank == 0:
            try:
                if isinstance(catalog, Catalog):
                    self.catalog = catalog
                else:
                    url = catalog if catalog is not None else _catalog_url(config)
                    self.catalog = open_catalog(url)
                    self._own_catalog = True
                records = self.catalog.tiers()
                known = [r.name for r in records]
                if tiers is None:
                    tiers = built = TierSet.from_config(config, known)
                tiers.apply_states(records)
                self.catalog.register_tiers(tiers.records())
                # (a tier the catalog knows and the configuration lacks: a stand-in, down)
                tiers = tiers.with_unconfigured(records)
                # (the database's sums: not a scan of every catalogued copy in Python)
                tiers.account_usage(self.catalog.usage())
                self.writer = self.catalog.register_writer()
                tier_state = [(t.name, t.state, t.used) for t in tiers]
                state = (tier_state, self.writer, self.catalog.url, records)
            except BaseException as exc:
                if self.writer and self.catalog is not None:
                    self.catalog.release_writer(self.writer)
                if self._own_catalog and self.catalog is not None:
                    self.catalog.close()
                if built is not None:
                    built.close()
                err = exc
        state, err = self._agree(state, err)
        if err is not None:
            raise err
        tier_state, self.writer, catalog_url, records = state
        try:
            # (the other ranks of a job build theirs from the tiers rank 0's catalog knows)
            if self.rank != 0:
                if tiers is None:
                    tiers = built = TierSet.from_config(config, [r.name for r in records])
                tiers = tiers.with_unconfigured(records)
            self.tiers = tiers
            # every rank puts and reads each chunk where rank 0's catalog records it
            records = tiers.records()
            same_on_every_rank(
                comm,
                "Session",
                {
                    "tiers": [r.name for r in records],
                    **{f"place of tier {r.name!r}": r.url for r in records},
                    "tier roles": [r.role for r in records],
                    "tier capacities": [r.capacity_bytes for r in records],
                },
            )
        except BaseException:
            if self.rank == 0 and self.catalog is not None:
                with contextlib.suppress(StrataError):
                    self.catalog.release_writer(self.writer)
                if self._own_catalog:
                    self.catalog.close()
            if built is not None:
                built.close()
            raise
        # one commit object takes every change to the catalog (rank 0 holds the catalog; the
        # other ranks announce their rewrites through a connection of their own)
        self.commit = Commit(
            self.tiers, self.catalog, comm, writer=self.writer, catalog_url=catalog_url
        )
        for (_name, st, used), t in zip(tier_state, self.tiers):
            t.state, t.used = st, used
            t.commit = self.commit
        if cache_bytes is None:
            mem = self.tiers.by_role("memory")
            cache_bytes = mem[0].capacity if mem and mem[0].capacity else DEFAULT_CACHE_BYTES
        # eviction reaches datasets not open here only where this process commits residency
        self.placement = Placement(
            self.tiers, self.commit, catalog=self.catalog if comm is None else None
        )
        self.cache = ChunkCache(cache_bytes)
        #: the catalog rows this session's closed datasets learned (:mod:`row_memo`)
        self.row_memo = RowMemo()
        # the obsolete objects closed handles could not delete (their tier away), by
        # dataset: the next handle of the dataset takes them over (Residency.strand)
        self._stranded: dict[str, list[tuple[str, str]]] = {}
        self.mover = Mover(self.tiers, self.placement, self.cache, self.commit)
        self._open: list[TieredChunkStore] = []
        self._superfiles: list[Superfile] = []
        self._closed = False
        _UNCLOSED[id(self)] = self

    # ----------------------------------------------------------------- datasets
    def create_dataset(
        self,
        name: str,
        shape: Any,
        dtype: Any,
        chunks: Any = None,
        *,
        hint: str = "AUTO",
        codec: Any = None,
        fill_value: Any = 0,
        attrs: dict[str, Any] | None = None,
        dims: Any = None,
        expected_reads: int = 1,
        deadline_s: float | None = None,
    ) -> TieredDataset:
        """Create dataset ``name`` (catalogued, placed by ``hint``) and open it ``r+``.

        With hint ``AUTO`` the tier is chosen by prediction (:meth:`Placement.choose`): the
        least predicted time to write the dataset once and read it ``expected_reads`` times,
        or with ``deadline_s`` (seconds) the slowest tier meeting that; where no tier with
        room is calibrated, the slowest tier with room. The decision is recorded in the
        catalog (:func:`placement_decision`).

        Every argument is validated before anything is stored (a name some tier that may be
        written cannot hold, with its directory or prefix: a path over PATH_MAX, an S3 key
        over 1024 bytes, raises :class:`ArgumentError` naming the tier and the limit); a
        name already in the catalog
        raises :class:`~strataio.errors.ExistsError` (on every rank of a parallel job), and so
        does the name of a deleted dataset, or a name above or below one, whose objects remain
        on a tier that does not answer (:mod:`strataio.tiers.remnants`): those on tiers that
        answer are deleted first, so the new dataset never reads a value of the old one.

        In a parallel job the call is collective: ranks that passed different arguments
        (another name, dtype, shape, chunks, codec, fill value, attrs, dims, hint,
        ``expected_reads`` or ``deadline_s``, as normalized: ``"f4"`` and ``np.float32`` are
        one dtype) raise :class:`ArgumentError` on every rank, naming the arguments and the
        ranks, before anything is stored.
        """
        checked: BaseException | None = None
        try:
            self._check_open()
            _check_name(name, new=True)
            try:
                meta = ArrayMetadata.create(shape, dtype, chunks, codec, fill_value, attrs, dims)
                CodecPipeline(meta.codecs, meta.dtype, meta.chunks)
            except StrataError as exc:  # (named as a plain dataset's create names its path)
                raise type(exc)(f"dataset {name!r}: {exc}") from exc
            last = [max(0, -(-n // c) - 1) for n, c in zip(meta.shape, meta.chunks)]
            _check_fits(self.tiers, name, [META_KEY, meta.chunk_key(last)])
            h = self.placement.check_hint(hint)
            if not isinstance(expected_reads, numbers.Integral) or isinstance(expected_reads, bool):
                raise ArgumentError(f"expected_reads must be an integer, got {expected_reads!r}")
            if expected_reads < 0:
                raise ArgumentError(f"expected_reads must be >= 0, got {expected_reads}")
            if deadline_s is not None and (
                not isinstance(deadline_s, numbers.Real)
                or isinstance(deadline_s, bool)
                or not deadline_s > 0
            ):
                raise ArgumentError(f"deadline_s must be a positive number, got {deadline_s!r}")
        except Exception as exc:  # a bad argument on one rank raises on every rank
            checked = exc
        agree(self.comm, checked)
        # (rank 0 creates for all and every rank goes on with its own metadata: a rank that
        # passed another dtype would write chunks the catalog and zarr.json do not describe)
        where = {"name": name, **meta.arguments(), "hint": h}
        where.update(expected_reads=int(expected_reads), deadline_s=deadline_s)
        same_on_every_rank(self.comm, "create_dataset", where)
        # (the record holds no user attributes: zarr.json is their one home, see TieredDataset)
        notes: dict[str, Any] = {}
        raw = meta.to_json()
        if h != "DISABLE":
            notes[ARRAY_ATTR] = json.loads(dataclasses.replace(meta, attrs={}).to_json())
            notes[META_ATTR] = [checksum(raw)]  # (the version put below)
        record = DatasetRecord(
            name,
            meta.shape,
            meta.dtype.str,
            meta.chunks,
            codec_json(meta.codecs),
            h,
            json.dumps(notes, sort_keys=True),
            "disabled" if h == "DISABLE" else "active",
        )
        err: BaseException | None = None
        if self.rank == 0:
            try:
                assert self.catalog is not None
                if h == "AUTO":
                    decision = self._choose(meta, int(expected_reads), deadline_s)
                    notes[PLACEMENT_ATTR] = decision.to_json()
                    record = dataclasses.replace(record, attrs=json.dumps(notes, sort_keys=True))
                purge_near(self.catalog, self.tiers, name)  # (deleted datasets' objects)
                self.catalog.create_dataset(record)
                self._use_created(name)
            except BaseException as exc:
                err = exc
        record, err = self._agree(record, err)
        if err is not None:
            raise err
        self._stranded.pop(name, None)  # (the objects of a dataset deleted since)
        store = self._store(record, [])
        try:
            if self.rank == 0 and not store.disabled:
                try:
                    store.put_meta(raw)
                except BackendError as exc:  # (no tier took it: every rank raises it)
                    err = BackendError(
                        f"{exc}; the dataset stays in the catalog: open it with "
                        "open_dataset once a tier takes writes, or delete it"
                    )
                except BaseException as exc:
                    err = exc
            _, err = self._agree(None, err)
            if err is not None:
                raise err
        except BaseException:
            # (as in open_dataset: the dataset is no longer in use by this session)
            with contextlib.suppress(Exception):
                store.close()
            raise
        return TieredDataset(store, meta, "r+", name=name, comm=self.comm)

    def _choose(self, meta: ArrayMetadata, expected_reads: int, deadline_s: float | None):  # type: ignore[no-untyped-def]
        """Placement by prediction for a new AUTO dataset (rank 0, which holds the catalog).
        A tier configured otherwise since its calibration counts as not calibrated."""
        from strataio.predict.native import measured_settings
        from strataio.predict.perfdb import PerfTable

        assert self.catalog is not None
        rows = self.catalog.perf_rows()
        perf = PerfTable(rows)
        if self.config is not None:
            stale = {
                t.name
                for t in self.config.tiers
                if perf.changed_since(t.name, measured_settings(t))
            }
            if stale:
                perf = PerfTable([r for r in rows if r.tier not in stale])
        chunk_bytes = math.prod(meta.chunks) * meta.dtype.itemsize
        nchunks = math.prod(-(-n // c) for n, c in zip(meta.shape, meta.chunks))
        nprocs = self.comm.Get_size() if self.comm is not None else 1
        return self.placement.choose(
            perf,
            nchunks * chunk_bytes,
            chunk_bytes,
            nchunks,
            expected_reads=expected_reads,
            deadline_s=deadline_s,
            processes=nprocs,
        )

    def open_dataset(self, name: str, mode: str = "r") -> TieredDataset:
        """Open catalogued dataset ``name`` (``"r"`` or ``"r+"``); its residency is read from
        the catalog once, here. In a parallel job the call is collective: ranks that passed
        another name or mode raise :class:`ArgumentError` on every rank before anything is
        read."""
        checked: BaseException | None = None
        try:
            self._check_open()
            if mode not in ("r", "r+"):
                raise ArgumentError(f"mode must be one of ('r', 'r+'), got {mode!r}")
            _check_name(name)
        except Exception as exc:  # a bad argument on one rank raises on every rank
            checked = exc
        agree(self.comm, checked)
        same_on_every_rank(self.comm, "open_dataset", {"name": name, "mode": mode})
        got: Any = None
        err: BaseException | None = None
        if self.rank == 0:
            try:
                assert self.catalog is not None
                # (one process learns each chunk's rows when it first looks the chunk up;
                # a parallel job's ranks take all of them from rank 0 now)
                got = (*self._use_residency(name, every=self.comm is not None), None)
                if is_superfile(got[0]):
                    self.catalog.unuse_dataset(name, self.writer, linger=False)
                    raise SuperfileError(
                        f"{name!r} is a superfile, not an array dataset: open it with "
                        f"Session.superfile({name!r})"
                    )
            except BaseException as exc:
                err = exc
        got, err = self._agree(got, err)
        if err is not None:
            raise err
        record, copies, _ = got
        store = self._store(record, copies, lazy=self.comm is None)
        try:
            raw: bytes | None = None
            if self.rank == 0:
                try:
                    raw = store.get_meta(record)
                except BaseException as exc:  # (a MetadataError, say: every rank raises it)
                    err = exc
            raw, err = self._agree(raw, err)
            if err is not None:
                raise err
            if raw is None:
                meta = _meta_of_record(record)
            else:
                meta = ArrayMetadata.from_json(raw, where=f"{name}/{META_KEY}")
            return TieredDataset(store, meta, mode, name=name, comm=self.comm)
        except BaseException:
            # the dataset is no longer in use by this session once its store is closed
            # (raised on every rank alike: the close, collective in a parallel job, is too)
            with contextlib.suppress(Exception):
                store.close()
            raise

    def _use_residency(
        self, name: str, *, every: bool = True
    ) -> tuple[DatasetRecord, list[ChunkCopy]]:
        """Mark dataset ``name`` in use by this session, then read its record and its copies
        from the catalog; with ``every`` false no copies yet (its residency learns them chunk
        by chunk). In use first: other processes evict none of what is read, and delete
        none of it (:meth:`Catalog.delete_dataset` refuses, or was done before the record
        is read: :class:`NotFoundError`)."""
        assert self.catalog is not None
        self.catalog.use_dataset(name, self.writer)
        try:
            record = self.catalog.get_dataset(name)
            return record, self.catalog.residency(name) if every else []
        except BaseException:
            self.catalog.unuse_dataset(name, self.writer, linger=False)
            raise

    def _use_created(self, name: str) -> None:
        """Mark dataset ``name``, just created here, in use by this session: a deletion by
        another process between the creation and the mark is found (NotFoundError)."""
        assert self.catalog is not None
        self.catalog.use_dataset(name, self.writer)
        if self.catalog.generation(name) is None:
            self.catalog.unuse_dataset(name, self.writer, linger=False)
            raise NotFoundError(
                f"dataset {name!r} was deleted by another process as it was created"
            )

    def list_datasets(self) -> list[DatasetRecord]:
        self._check_open()
        out = self.catalog.list_datasets() if self.catalog is not None else None
        return self.comm.bcast(out, root=0) if self.comm is not None else out

    def delete_dataset(self, name: str) -> Deletion:
        """Remove dataset ``name``: its catalog record and rows first, then every object
        under its name on every tier that answers, those no row names included (a killed
        writer's unflushed chunks), and the folders they leave empty. Returns what was
        removed, per tier, and the tiers where objects stay as remnants (:class:`Deletion`).

        A dataset that a live process has open (this one included) is not deleted:
        :class:`~strataio.errors.DatasetInUseError` names it, and nothing changes; one that
        another process closed just now is waited for while its mark lingers (see
        :meth:`Catalog.delete_dataset`). Objects left on a tier that is down or read-only
        here, or that a failed deletion left, stay recorded as the dataset's remnants
        (:mod:`strataio.tiers.remnants`): until they are gone, which ``strataio fsck
        --repair`` or a later :meth:`create_dataset` of the name sees to once the tier
        answers, no dataset of that name can be created. In a parallel job the call is
        collective: rank 0 deletes, and an error there is raised on every rank, as is an
        :class:`ArgumentError` where the ranks passed different names."""
        self._check_open()
        same_on_every_rank(self.comm, "delete_dataset", {"name": name})
        _check_name(name)  # (the same name on every rank: each raises alike)
        err: BaseException | None = None
        done: Deletion | None = None
        if self.rank == 0:  # (in a parallel job, collective: rank 0 deletes for all)
            try:
                assert self.catalog is not None
                removed = self.catalog.delete_dataset(name, remnants=remnant_tiers(self.tiers))
                left = purge(self.catalog, self.tiers, name)
                done = Deletion(name, tuple(removed), tuple(left))
            except BaseException as exc:  # (every rank raises it: refused, not found)
                err = exc
        done, err = self._agree(done, err)
        if err is not None:
            raise err
        self.row_memo.forget(name)
        self._stranded.pop(name, None)  # (the deletion deals with every object of it)
        for t in self.tiers:
            if t.volatile and t.up:  # (this process's own cache level: no remnant)
                with contextlib.suppress(StrataError):
                    for key in t.call(lambda t=t: list(t.backend.list(name))):
                        t.call(t.backend.delete, key)
        self.cache.invalidate(name)
        assert done is not None
        return done

    # ----------------------------------------------------------------- superfiles
    def superfile(
        self,
        name: str,
        mode: str = "a",
        *,
        hint: str = "AUTO",
        container_bytes: int | None = None,
    ) -> Superfile:
        """Open superfile ``name``: many small members (bytes or numpy arrays) in few
        containers on the hierarchy (:mod:`strataio.tiers.superfile`).

        ``mode`` ``"a"`` creates it (catalogued, placed by ``hint``) if missing and allows
        ``put``; ``"r"`` only reads, and raises :class:`NotFoundError` if it does not exist.
        ``container_bytes`` closes containers at that many bytes of members (default: the
        size given at creation, else :data:`~strataio.tiers.superfile.DEFAULT_CONTAINER_BYTES`).
        A superfile belongs to one process: in an MPI job, open it from a Session without
        ``comm``.
        """
        self._check_open()
        if self.comm is not None:
            raise SuperfileError(
                f"superfile {name!r}: a superfile belongs to one process; open it from a "
                "Session made without comm"
            )
        if mode not in ("r", "a"):
            raise SuperfileError(f"superfile mode must be 'r' or 'a', got {mode!r}")
        if container_bytes is not None and (
            not isinstance(container_bytes, numbers.Integral)
            or isinstance(container_bytes, bool)
            or container_bytes <= 0
        ):
            raise SuperfileError(
                f"container_bytes must be a positive integer, got {container_bytes!r}"
            )
        _check_name(name, new=mode == "a")
        if mode == "a":
            _check_fits(self.tiers, name, [container_key(10**8 - 1)])
        assert self.catalog is not None
        try:
            record = self.catalog.get_dataset(name)
        except NotFoundError:
            if mode == "r":
                raise NotFoundError(f"no superfile {name!r} in the catalog") from None
            h = self.placement.check_hint(hint)
            record = superfile_record(name, h, container_bytes or DEFAULT_CONTAINER_BYTES)
            purge_near(self.catalog, self.tiers, name)  # (deleted datasets' objects)
            try:
                self.catalog.create_dataset(record)
            except ExistsError as exc:
                # (another process created it since the look: append to that one; a name
                # taken otherwise, above or below it or by remnants, still raises)
                try:
                    self.catalog.get_dataset(name)
                except NotFoundError:
                    raise exc from None
        record, copies = self._use_residency(name)
        if not is_superfile(record):
            self.catalog.unuse_dataset(name, self.writer, linger=False)
            raise SuperfileError(f"{name!r} is an array dataset, not a superfile")
        store = self._store(record, copies)
        size = container_bytes or record_container_bytes(record)
        sf = Superfile(store, mode=mode, container_bytes=size)
        self._superfiles = [f for f in self._superfiles if not f.closed] + [sf]
        return sf

    # ----------------------------------------------------------------- tiers
    def check_tiers(self) -> dict[str, bool]:
        """Probe every tier; record up/down in the catalog. Returns ``{name: up}``."""
        return {t.name: t.check() for t in self.tiers}

    def usage(self) -> dict[str, int]:
        """Bytes of catalogued chunk copies per tier (every dataset)."""
        if self.catalog is not None and all(s.closed for s in self._open):
            # with datasets open, the in-memory accounting includes their uncommitted changes
            self.tiers.account_usage(self.catalog.usage())
        return {t.name: t.used for t in self.tiers}

    # ----------------------------------------------------------------- lifecycle
    def close(self) -> None:
        """Close every dataset still open, the mover, the tiers and the catalog. Every
        superfile and dataset is closed even where another's close fails; the first failure
        is raised then, noting the others."""
        if self._closed:
            return
        _UNCLOSED.pop(id(self), None)
        errors: list[BaseException] = []
        try:
            # superfiles first: each seals its open container before its store closes
            for obj in [*self._superfiles, *self._open]:
                try:
                    obj.close()
                except Exception as exc:  # (the others still close: their data is kept)
                    errors.append(exc)
            if errors:
                for other in errors[1:]:
                    errors[0].add_note(f"closing the session also failed: {other}")
                raise errors[0]
        finally:
            self._closed = True
            self.mover.shutdown()
            self.tiers.close()
            self.commit.record_touches()
            self.commit.shutdown()
            if self.catalog is not None:
                # after the mover: nothing of this session is in flight any more
                with contextlib.suppress(StrataError):
                    self.catalog.release_writer(self.writer)
                if self._own_catalog:
                    self.catalog.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        url = getattr(self.catalog, "url", None)
        return f"Session(tiers={self.tiers.names}, catalog={redact_url(url) if url else '-'})"

    # ----------------------------------------------------------------- internals
    def _check_open(self) -> None:
        if self._closed:
            from strataio.errors import ClosedError

            raise ClosedError("the session is closed")

    def _agree(self, value: Any, err: BaseException | None) -> tuple[Any, BaseException | None]:
        """Broadcast rank 0's ``(value, error)`` so every rank succeeds or fails together."""
        if self.comm is None:
            return value, err
        value, msg = self.comm.bcast((value, None if err is None else err), root=0)
        return value, msg

    def _store(
        self,
        record: DatasetRecord,
        copies: list[ChunkCopy],
        *,
        lazy: bool = False,
    ) -> TieredChunkStore:
        """The store of dataset ``record`` whose residency holds ``copies``, or with ``lazy``
        learns its rows from the catalog chunk by chunk (:class:`Residency`), those the
        session's last handle of the dataset learned while they still hold
        (:class:`RowLoader`)."""
        load = None
        if lazy and self.catalog is not None:
            load = RowLoader(self.catalog, record.name, self.row_memo)
        res = Residency(record.name, copies, self.tiers, load=load)
        res.strand(self._stranded.pop(record.name, ()))
        store = TieredChunkStore(
            res,
            self.tiers,
            self.placement,
            self.mover,
            self.cache,
            self.commit,
            hint=record.hint,
            disabled=record.state == "disabled",
            stage_on_read=self.stage_on_read,
            chosen=(placement_decision(record) or AutoDecision(None, "", {}, [])).tier,
        )
        store.on_closed = functools.partial(self._closed_store, load)
        if load is not None:
            store.learned_since = lambda: load.first_generation
        self._open = [s for s in self._open if not s.closed] + [store]
        return store

    def _closed_store(self, load: RowLoader | None, store: TieredChunkStore) -> None:
        """Keep what ``store``, closing, leaves to a later handle of its dataset: the
        obsolete objects it could not delete (an outage leaves no orphans behind a running
        session, handles closed or not, their close failed or not) and, where it learned its
        rows on demand (``load``) and its close committed every change, what it learned
        (:meth:`_keep_learned`)."""
        left = store.res.hand_over_stranded()
        if left:
            self._stranded.setdefault(store.name, []).extend(left)
        if load is not None and store.closed_cleanly:
            self._keep_learned(load, store)

    def _keep_learned(self, load: RowLoader, store: TieredChunkStore) -> None:
        """Keep what ``store``, closing, learned of its catalog rows where they still hold
        (nothing to do where the memo gave it every row it has and it checked no copy)."""
        if not load.fetched and not store.checks_made:
            return
        got = store.res.learned_rows()
        if got is None:
            return
        rows, whole = got
        learned = load.learned(rows, store.verified(), whole=whole)
        if learned is not None:
            self.row_memo.keep(store.name, learned)


def _meta_of_record(record: DatasetRecord) -> ArrayMetadata:
    """The array as its catalog record describes it, with no user attributes, for an open
    that finds no ``zarr.json``: a DISABLE dataset (it stores none), or every tier holding it
    is down. The record keeps the ``zarr.json`` of the dataset's creation (:data:`ARRAY_ATTR`);
    one written before it did is opened only if DISABLE, since its fill value, which reads of
    unwritten chunks return, is not known."""
    kept = json.loads(record.attrs or "{}").get(ARRAY_ATTR)
    if kept is not None:
        return ArrayMetadata.from_json(json.dumps(kept), where=f"catalog record of {record.name!r}")
    if record.state != "disabled":
        raise MetadataError(
            f"dataset {record.name!r}: no tier that answers holds its zarr.json, and its catalog "
            "record (written by an older strataio) does not keep its fill value: open it once "
            "a tier holding its zarr.json answers again (strataio tiers --check)"
        )
    return ArrayMetadata.create(
        record.shape, record.dtype, record.chunks, json.loads(record.codec) or None, 0
    )


def placement_decision(record: DatasetRecord) -> AutoDecision | None:
    """The placement by prediction recorded for an AUTO dataset's catalog row (None for
    datasets placed by an explicit hint, or created before placement by prediction)."""
    got = json.loads(record.attrs or "{}").get(PLACEMENT_ATTR)
    return AutoDecision.from_json(got) if isinstance(got, dict) else None


def _load(config: Any) -> Any:
    from strataio.config import load_config

    if config is None:
        return load_config()
    if isinstance(config, str | os.PathLike):
        return load_config(config)
    return config


def _catalog_url(config: Any) -> str:
    url = getattr(getattr(config, "catalog", None), "url", None)
    if not url:
        raise MetadataError("the configuration names no catalog")
    return url


#: sessions not closed yet, by id (see _close_at_exit): held, so that a session a program
#: drops unclosed is not collected with its writes unrecorded, but closed at exit
_UNCLOSED: dict[int, Session] = {}


def _close_at_exit() -> None:
    """Close the sessions a program leaves open when the interpreter exits, as Python
    flushes an open file's buffers: their datasets' writes reach the catalog. Left open, the
    objects would stand on their tiers with no row naming them, and the chunks would read
    as never written until an fsck adopted them. A ``ResourceWarning`` says so, as for an
    unclosed file. A parallel job's sessions are not closed here (closing is collective,
    and the ranks may not all have left theirs open): a warning says their writes since
    their last flush are not recorded."""
    for session in list(_UNCLOSED.values()):
        if session._closed:
            continue
        if session.comm is not None:
            warnings.warn(
                f"{session!r} on rank {session.rank} was never closed: its datasets' writes "
                "since their last flush are not recorded (close a parallel job's session on "
                "every rank)",
                RuntimeWarning,
                stacklevel=1,
            )
            continue
        warnings.warn(f"{session!r} was never closed: closed at exit", ResourceWarning, 1)
        try:
            session.close()
        except Exception as exc:  # (at exit: said, not raised)
            print(
                f"strataio: closing {session!r} at exit failed: {exc}; writes since its "
                "datasets' last flush may not be recorded (strataio fsck --repair adopts them)",
                file=sys.stderr,
            )


# Before concurrent.futures shuts its pools down and while threads may still start (a close
# puts, syncs and commits through them): threading's own exit hooks, run in reverse order of
# registration, so this one before those of the modules imported first. A forked child
# holds none of its parent's sessions: closing them there would release the parent's.
_at_exit = getattr(threading, "_register_atexit", atexit.register)
_at_exit(_close_at_exit)
os.register_at_fork(after_in_child=_UNCLOSED.clear)
