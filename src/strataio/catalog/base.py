"""The Catalog contract: datasets, chunk residency, tiers and the performance database.

The catalog is the metadata store of the storage hierarchy (APRIL's meta-data database, the
multi-storage architecture's MDMS). It records which tiers exist, which datasets exist, and for
every chunk which tiers hold a copy of it. It is touched at open and close, never per chunk on a
hot path: :meth:`Catalog.residency` returns a whole dataset's residency in one query, and
:meth:`Catalog.commit` applies any number of residency changes in one transaction.

Value types are frozen, slotted dataclasses, but for the per-chunk rows (:class:`ChunkCopy`,
:class:`VerifiedCopy`): named tuples, as immutable, built at a tuple's cost (a frozen
dataclass's construction costs four times as much, and a dataset's first reads build one row
per chunk). Times are POSIX seconds (``time.time()``); sizes are bytes.
"""

from __future__ import annotations

import abc
import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple
from urllib.parse import unquote, urlsplit

from strataio.errors import MetadataError

#: tier roles, fastest first (the location hints of the multi-storage architecture)
TIER_ROLES = ("memory", "localdisk", "remotedisk", "remotetape")
#: tier health states
TIER_STATES = ("up", "down")
#: dataset states; a ``disabled`` dataset is catalogued but not stored anywhere new
DATASET_STATES = ("active", "disabled")
#: chunk-copy states: ``valid`` (durable, checksum verified), ``dirty`` (newer than the other
#: copies, not yet written back), ``in-transit`` (being copied; not yet readable)
COPY_STATES = ("valid", "dirty", "in-transit")


def _check(value: str, allowed: tuple[str, ...], what: str) -> None:
    if value not in allowed:
        raise MetadataError(f"{what} {value!r} is not one of {', '.join(allowed)}")


@dataclass(frozen=True, slots=True)
class TierRecord:
    """One storage tier. ``order`` ranks tiers fastest first (0 is the fastest).

    ``url`` locates the tier's storage (``posix:/path``, ``s3://bucket``, ``memory:``);
    ``capacity_bytes`` is ``None`` for unbounded; ``why``: the error that marked it down
    (empty while up).
    """

    name: str
    url: str
    role: str
    capacity_bytes: int | None
    order: int
    state: str = "up"
    why: str = ""

    def __post_init__(self) -> None:
        if not self.name:
            raise MetadataError("tier name is empty")
        _check(self.role, TIER_ROLES, f"tier {self.name!r}: role")
        _check(self.state, TIER_STATES, f"tier {self.name!r}: state")
        if self.capacity_bytes is not None and self.capacity_bytes < 0:
            raise MetadataError(f"tier {self.name!r}: negative capacity {self.capacity_bytes}")


@dataclass(frozen=True, slots=True)
class DatasetRecord:
    """One dataset. ``codec`` is the JSON text of the codec list; ``hint`` is a placement hint
    (``LOCALDISK``, ``REMOTEDISK``, ``REMOTETAPE``, ``AUTO``, ``DISABLE``).

    ``attrs`` is the JSON text of strataio's own annotations of the dataset (an AUTO dataset's
    placement decision, ``strataio.placement``; a superfile's marker, ``strataio.superfile``;
    the ``zarr.json`` of a tiered dataset's creation less its attributes, ``strataio.array``,
    and the checksums of the ``zarr.json`` versions its copies may hold, ``strataio.meta``:
    :mod:`strataio.tiers.meta`), never of the user's attributes: those live in the dataset's
    ``zarr.json`` only, which every Zarr reader sees and any process may change, so a copy
    here would go stale (rows written before this rule may still hold the attributes of
    their dataset's creation; nothing reads them as the dataset's)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    chunks: tuple[int, ...]
    codec: str = "[]"
    hint: str = "AUTO"
    attrs: str = "{}"
    state: str = "active"

    def __post_init__(self) -> None:
        if not self.name:
            raise MetadataError("dataset name is empty")
        # Accept lists (as decoded from JSON) but store tuples so records compare and hash.
        object.__setattr__(self, "shape", tuple(int(n) for n in self.shape))
        object.__setattr__(self, "chunks", tuple(int(n) for n in self.chunks))
        if len(self.shape) != len(self.chunks):
            raise MetadataError(
                f"dataset {self.name!r}: shape {self.shape} and chunks {self.chunks} differ in rank"
            )
        _check(self.state, DATASET_STATES, f"dataset {self.name!r}: state")


def committed_checksum(state: str, checksum: str, old_checksum: str) -> str:
    """The checksum of the committed bytes a row of ``state`` stands for: an announced
    rewrite's (``in-transit``) are its old ones, as its new ones may never be put."""
    return old_checksum if state == "in-transit" else checksum


class ChunkCopy(NamedTuple):
    """One copy of one chunk (``key``, e.g. ``"c/0/3"``) of ``dataset`` on ``tier``.

    ``nbytes`` is the stored (encoded) size; ``checksum`` a hex digest of the stored bytes
    (empty if unknown); ``last_access`` POSIX seconds, for LRU eviction.

    An ``in-transit`` copy is an announced rewrite in place: ``checksum`` is the new bytes',
    ``old_checksum`` the replaced bytes', and the object holds one or the other whole (puts
    are atomic), so a copy matching either is intact (:meth:`accepts`). ``writer`` names the
    writer (see :mod:`strataio.catalog.liveness`) that announced it.
    """

    dataset: str
    key: str
    tier: str
    nbytes: int
    checksum: str = ""
    state: str = "valid"
    last_access: float = 0.0
    old_checksum: str = ""
    writer: str = ""

    @property
    def committed_checksum(self) -> str:
        """The checksum of the bytes this row stands for as committed (see
        :func:`committed_checksum`)."""
        return committed_checksum(self.state, self.checksum, self.old_checksum)

    def accepts(self, digest: str) -> bool:
        """True if stored bytes with checksum ``digest`` are an intact version of this copy
        (any bytes, where no checksum is catalogued)."""
        if not self.checksum:
            return True
        return digest == self.checksum or (
            self.state == "in-transit" and digest == self.old_checksum != ""
        )

    def rewritten_by_other(self, writer: str) -> bool:
        """True if this row announces a rewrite by a writer other than ``writer``: its
        object may be written right now, and only that writer's commit settles it."""
        return self.state == "in-transit" and bool(self.writer) and self.writer != writer


class VerifiedCopy(NamedTuple):
    """A read found the copy of chunk ``key`` on ``tier`` intact: its bytes matched
    ``checksum`` when the tier's object had ``version`` (:meth:`Backend.versions`). Advisory:
    a reader trusts it only while the copy's row still accepts ``checksum`` and the object
    still has ``version`` (see :class:`strataio.tiers.store.TieredChunkStore`)."""

    key: str
    tier: str
    checksum: str
    version: tuple[int | str, ...]


class OvertakenRewrite(NamedTuple):
    """A rewrite of chunk ``key`` on ``tier`` that ``writer`` announced (new bytes
    ``checksum``) and another writer's announcement replaced before this one's put. That
    put may land after the other writer's commit settled the row to its own bytes; the
    object then holds these bytes, which no row names (see :meth:`Catalog.overtaken`)."""

    dataset: str
    key: str
    tier: str
    writer: str
    checksum: str


@dataclass(frozen=True, slots=True)
class WriterRecord:
    """A registered writer: a Session that may leave rows and objects in flight.

    ``alive`` says whether its liveness token is held (by a live process); ``datasets`` are
    the datasets it has in use (open, or being evicted from), by name.
    """

    id: str
    host: str
    pid: int
    started: float
    alive: bool = True
    datasets: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PerfRow:
    """One measurement of the performance database: ``op`` (``"read"``, ``"write"``, ...) of
    ``nbytes`` bytes on ``tier`` took ``seconds`` with ``concurrency`` simultaneous requests,
    measured at ``when`` (POSIX seconds), the tier configured as ``settings`` says
    (:func:`strataio.predict.native.measured_settings`; empty: not recorded)."""

    tier: str
    op: str
    nbytes: int
    seconds: float
    concurrency: int = 1
    when: float = 0.0
    settings: str = ""


@dataclass(frozen=True, slots=True)
class TierUsage:
    """What one dataset holds on one tier: ``copies`` chunk copies totalling ``nbytes``."""

    dataset: str
    tier: str
    copies: int
    nbytes: int


CopyId = tuple[str, str, str]  # (dataset, key, tier)


@dataclass(frozen=True, slots=True)
class CommitOutcome:
    """What :meth:`Catalog.commit` did besides what it was asked: ``superseded``, the copies
    it removed for superseding writes that its ``deletes`` did not name (their objects are
    the caller's to delete); ``kept``, the copies among ``deletes`` it left because they
    were the last of their chunk or not what the caller expected (their objects must
    stay); ``orphaned``, the copies among ``copied`` it left out because no other row of
    their chunk holds their bytes any more (their objects are the caller's to delete);
    ``overtaken``, the copies among ``copied`` it left out because another writer has
    announced a rewrite of that very copy since, and those among ``revalidated`` whose row
    changed since (their objects are not the caller's to delete)."""

    superseded: list[CopyId]
    kept: list[CopyId]
    orphaned: list[CopyId] = field(default_factory=list)
    overtaken: list[CopyId] = field(default_factory=list)


class Catalog(abc.ABC):
    """The metadata store. Implementations: SQLite (embedded) and PostgreSQL.

    Methods are safe to call from several threads of one process (the mover commits from its
    worker threads). Several processes may open the same catalog; each commit is atomic.
    """

    #: the schema version this catalog's database is at (after migrations)
    schema_version: int

    #: the URL the catalog was opened with
    url: str = ""

    #: seconds :meth:`use_dataset` waits out another process's eviction round of the dataset
    EVICTION_WAIT: float = 600.0

    #: seconds a writer's mark on a dataset stays after its last :meth:`unuse_dataset`: a
    #: dataset opened again meanwhile (open → read → close in a loop) costs no catalog write
    #: at either end; 0 drops each mark at once
    MARK_LINGER_S: float = 2.0

    # -- tiers --------------------------------------------------------------------------

    @abc.abstractmethod
    def register_tiers(self, tiers: Sequence[TierRecord]) -> None:
        """Insert or update (by name) each tier, in one transaction."""

    @abc.abstractmethod
    def tiers(self) -> list[TierRecord]:
        """All tiers, by ``order`` (fastest first)."""

    @abc.abstractmethod
    def set_tier_state(self, name: str, state: str, why: str = "") -> None:
        """Mark a tier ``"up"`` or ``"down"``, ``why`` being the error that made it down (for
        other processes to say); :class:`NotFoundError` if unknown."""

    # -- datasets -----------------------------------------------------------------------

    @abc.abstractmethod
    def create_dataset(self, record: DatasetRecord) -> None:
        """Add a dataset; :class:`ExistsError` if one of that name exists, or one whose name
        lies above or below it (``a`` and ``a/b``), or if :meth:`remnants` of a deleted
        dataset of such a name remain (its objects would be taken for the new one's)."""

    @abc.abstractmethod
    def update_dataset(self, record: DatasetRecord) -> None:
        """Replace the dataset row of ``record.name`` (hint, state, attrs...); its residency is
        kept. :class:`NotFoundError` if it does not exist."""

    @abc.abstractmethod
    def annotate_dataset(self, name: str, key: str, change: Callable[[Any], Any]) -> Any:
        """Set annotation ``key`` of dataset ``name`` (a JSON value in its record's ``attrs``)
        to ``change(value now)`` (None where absent; a result of None removes it), in one
        transaction that no other annotation of the dataset interleaves with; return the
        value set. Nothing is written where ``change`` returns the value unchanged. The
        dataset's :meth:`generation` stays: annotations are no residency.
        :class:`NotFoundError` if the dataset does not exist."""

    @abc.abstractmethod
    def get_dataset(self, name: str) -> DatasetRecord:
        """The dataset of that name; :class:`NotFoundError` if none."""

    @abc.abstractmethod
    def generation(self, name: str) -> int | None:
        """Dataset ``name``'s generation (None: no such dataset): a number that every commit
        changing its residency rows, and every update of its record, moves on (one small
        query). Rows read at one generation are still the catalog's while it holds."""

    @abc.abstractmethod
    def list_datasets(self) -> list[DatasetRecord]:
        """All datasets, by name."""

    @abc.abstractmethod
    def delete_dataset(
        self, name: str, *, remnants: Iterable[str] | None = None
    ) -> list[TierUsage]:
        """Remove a dataset and all its residency rows, in one transaction;
        :class:`NotFoundError` if it does not exist. Returns what those rows named, per tier
        in tier order: its chunk copies there and their bytes.

        A dataset some live process has in use (open, or evicting from it: its mark,
        :meth:`use_dataset`) is not deleted: :class:`~strataio.errors.DatasetInUseError`
        names that process's writer, or says that this process has it open. The marks
        other processes leave lingering when they close it (:attr:`MARK_LINGER_S`) are
        waited out, for that long and a second more. The deletion claims the dataset first
        (:meth:`claim_eviction`) and looks for marks second, and a process opening it marks
        it first and reads its record second: of the two, the open either is seen and the
        deletion refused, or finds no dataset. So no process writes a deleted dataset's
        objects after its deletion.

        Stored bytes are not touched. ``remnants`` names the tiers where its objects may
        remain besides those its rows name (None: no remnant is recorded, not even those):
        each of these tiers is recorded (:meth:`remnants`) in the same transaction, and
        stays until :meth:`clear_remnants` says the objects are gone from that tier; no
        dataset of that name can be created meanwhile (:meth:`create_dataset`), so none
        takes another's objects for its own."""

    @abc.abstractmethod
    def remnants(self, name: str | None = None, *, near: bool = False) -> list[tuple[str, str]]:
        """``(dataset, tier)`` of each tier where objects of a deleted dataset may remain
        (:meth:`delete_dataset`), of dataset ``name`` (None: of every one), by dataset and
        tier. ``near``: of ``name`` and of the names that lie above or below it (``a`` and
        ``a/b/c`` of ``a/b``): those that keep a dataset ``name`` from being created
        (:meth:`create_dataset`)."""

    @abc.abstractmethod
    def clear_remnants(self, name: str, tiers: Iterable[str]) -> None:
        """Forget the remnants of deleted dataset ``name`` on ``tiers``: none of its objects
        is left there (the caller removed them, holding a claim of the name)."""

    # -- residency ----------------------------------------------------------------------

    @abc.abstractmethod
    def residency(self, dataset: str, keys: Iterable[str] | None = None) -> list[ChunkCopy]:
        """Every chunk copy of ``dataset`` (one query), ordered by key then tier order; with
        ``keys``, those of these chunk keys only (one query per few hundred keys)."""

    @abc.abstractmethod
    def all_residency(self) -> list[ChunkCopy]:
        """Every chunk copy of every dataset (one query)."""

    @abc.abstractmethod
    def commit(
        self,
        upserts: Iterable[ChunkCopy] = (),
        deletes: Iterable[CopyId] = (),
        *,
        durable: bool = True,
        supersede: Sequence[CopyId] = (),
        stale: Callable[[Sequence[CopyId]], set[CopyId]] | None = None,
        dropped: Iterable[tuple[str, str]] | None = None,
        expect: Mapping[CopyId, tuple[str, str] | None] | None = None,
        copied: Iterable[CopyId] = (),
        revalidated: Iterable[CopyId] = (),
        writer: str = "",
        present: Callable[[Sequence[CopyId]], set[CopyId]] | None = None,
        sizes: Callable[[Sequence[CopyId]], Mapping[CopyId, int]] | None = None,
    ) -> CommitOutcome:
        """Apply residency changes atomically, in ONE transaction: insert or replace each
        copy in ``upserts`` (keyed by dataset, key, tier), then remove each
        ``(dataset, key, tier)`` in ``deletes`` (missing rows are fine). Copies naming an
        unknown dataset or tier raise :class:`MetadataError` and nothing is applied.

        ``supersede`` names copies among ``upserts`` that hold new content of their chunk (a
        write): every other copy of the same chunk is removed too (but another writer's
        announced rewrite, its state ``in-transit``), also those the caller never knew of
        (another process may have copied or moved the chunk since the caller loaded its
        rows). ``stale``, called inside the transaction (no other commit runs meanwhile)
        with every copy of ``upserts``, names those whose object another process has
        replaced (or deleted) since it was put: they are left out, row and all (superseding
        too, and the deletes of their chunk's other copies, which are reported as ``kept``),
        as that process's commit records the object.

        ``dropped`` (``(dataset, key)`` of chunks deleted on purpose), where given, keeps
        every other chunk from losing its last copy: a delete that would leave one without
        any row is left out (the caller's view of its other copies was stale: another
        process moved or rewrote the chunk); but not one of ``writer``'s own announced
        rewrite naming no old bytes (withdrawn, its put failed: it stands for no value).

        ``expect`` maps copies among ``deletes`` to the ``(state, checksum)`` the caller saw
        in their row (None: it saw none): a delete of a row that now holds another state or
        checksum, or is gone, or exists where none was seen, is left out and reported in
        ``kept`` (another process changed that copy since, and the object may be its own);
        but of a chunk this commit supersedes, only another writer's announced rewrite (an
        ``in-transit`` row changed since) or a row gone is left: the write is newer than any
        other row. Copies among ``upserts`` that ``expect`` names are written only while the
        row at their place still holds what the caller saw (None: no row there): else they
        are left out and reported in ``overtaken`` (another process announced a rewrite
        there, or recorded a copy, since the caller looked).

        ``copied`` names copies among ``upserts`` that a move made of another copy of their
        chunk: one is left out (``orphaned``) where no other row of the chunk holds its
        checksum any more (a settled row's checksum, or the old one of an announced rewrite):
        another process rewrote the chunk since the move read it, and the copy holds an old
        value; and one is left out (``overtaken``) where the row at its own place is a
        rewrite another writer than ``writer`` (the caller's) has announced since, with the
        deletes of its chunk's other copies (reported as ``kept``: they are the chunk's
        last committed value should that writer die).

        ``revalidated`` names copies among ``upserts`` that only mark a copy valid (it reached
        its chunk's home): one is left out (``overtaken``) unless the row at its place still
        holds its checksum, settled (another process may have rewritten or moved the chunk
        since the caller loaded that row).

        ``present``, where given, is called inside the transaction (once the rows of the
        datasets it deletes from are this transaction's alone: no other commit records a
        row there meanwhile) with every copy of ``deletes``, and names those whose object is
        there: their deletes are left out and reported in ``kept``. A caller dropping the
        row of a copy whose object it found missing passes it: another process may have put
        a copy at that place since, and recorded it in a row that looks like the one the
        caller saw (the same state and checksum); that row names an object, and stays.

        ``sizes``, where given, is called inside the transaction with copies among
        ``upserts`` that ``stale`` named, that ``expect`` maps to an announcement of their
        own bytes (``in-transit``, their checksum) and whose row is still that announcement,
        and gives the size of each one's object now: such a row is settled to its old bytes,
        at that size. The announcement took over another writer's, whose bytes it kept as its
        old ones; that writer's put is the one that replaced the object, and its commit,
        already made or to come, leaves this row to this one (see ``expect``).

        ``durable=False`` returns before the transaction reaches the disk: it is visible to
        every process at once and survives this process's death, but an OS crash or power
        cut can lose it until the next durable commit, which makes it durable too (the
        database's log is sequential)."""

    def drop_cached_pages(self) -> None:
        """Empty what this object keeps in the process of the database's pages (a
        connection's page cache), so that the next statements read them from the database
        as a process opening the catalog anew does (a benchmark's first and cold reads).
        Nothing where the database keeps no pages in the process (a server's)."""
        return None

    @abc.abstractmethod
    def sync_log(self) -> None:
        """Make every commit so far durable, those made with ``durable=False`` included
        (one flush of the database's log): what must reach the disk before anything the
        catalog says may depend on it does."""

    @abc.abstractmethod
    def verified_copies(
        self, dataset: str, keys: Iterable[str] | None = None
    ) -> list[VerifiedCopy]:
        """The copies of ``dataset``'s chunks that reads found intact (one query); with
        ``keys``, those of these chunk keys only (one query per few hundred keys)."""

    def residency_checked(
        self, dataset: str, keys: Iterable[str] | None = None
    ) -> tuple[list[ChunkCopy], list[VerifiedCopy], int | None]:
        """:meth:`residency` and :meth:`verified_copies` of the same chunks together: the
        rows (in no particular order), the checks recorded for the copies those rows name,
        and the dataset's :meth:`generation` no later than the rows (None: unknown).
        Implementations take them in one query (a chunk's first lookup costs one round
        trip, not three)."""
        generation = self.generation(dataset)
        rows = self.residency(dataset, keys)
        named = {(c.key, c.tier) for c in rows}
        keys = None if keys is None else {c.key for c in rows}
        checks = self.verified_copies(dataset, keys) if keys is None or keys else []
        return rows, [v for v in checks if (v.key, v.tier) in named], generation

    @abc.abstractmethod
    def record_verified(self, dataset: str, copies: Iterable[VerifiedCopy]) -> None:
        """Record copies a read found intact (replacing earlier records of the same copies;
        one transaction, not synced on its own: a crash may lose it, and nothing depends
        on it but the speed of later first reads)."""

    @abc.abstractmethod
    def touch(self, dataset: str, keys: Iterable[str], when: float) -> None:
        """Set ``last_access = when`` on every copy of the given chunks (one statement batch)."""

    def lru_copies(self, tier: str, limit: int, *, exclude: Iterable[str] = ()) -> list[ChunkCopy]:
        """Up to ``limit`` copies on ``tier``, least recently used first (``last_access``
        ascending, then dataset and key), skipping datasets named in ``exclude``: the
        eviction candidates of datasets no open residency holds.

        Implementations answer from the ``(tier, last_access)`` index; this default sorts
        :meth:`all_residency`.
        """
        skip = set(exclude)
        got = [c for c in self.all_residency() if c.tier == tier and c.dataset not in skip]
        got.sort(key=lambda c: (c.last_access, c.dataset, c.key))
        return got[: max(0, int(limit))]

    def usage(self) -> list[TierUsage]:
        """Stored bytes and copy counts per (dataset, tier), by dataset then tier order.

        Implementations aggregate in the database; this default sums :meth:`all_residency`.
        """
        order = {t.name: t.order for t in self.tiers()}
        acc: dict[tuple[str, str], list[int]] = {}
        for c in self.all_residency():
            slot = acc.setdefault((c.dataset, c.tier), [0, 0])
            slot[0] += 1
            slot[1] += c.nbytes
        keys = sorted(acc, key=lambda k: (k[0], order.get(k[1], 1 << 30), k[1]))
        return [TierUsage(d, t, acc[d, t][0], acc[d, t][1]) for d, t in keys]

    # -- writers (liveness) -------------------------------------------------------------

    @abc.abstractmethod
    def register_writer(self) -> str:
        """Register this process as a writer, take its liveness token (released by the kernel
        or the database server when the process dies) and return its id. The first writer
        registered through this catalog object is its default writer."""

    @abc.abstractmethod
    def release_writer(self, writer: str) -> None:
        """Drop ``writer``'s row and token (a writer registered through this object)."""

    @abc.abstractmethod
    def use_dataset(self, name: str, writer: str | None = None) -> None:
        """Mark dataset ``name`` in use by ``writer``, a writer registered through this object
        and not released (default: the first such; nothing happens without one). Counted:
        each call needs one :meth:`unuse_dataset`.

        The first mark waits while another live writer evicts from the dataset
        (:meth:`claim_eviction`): what the caller reads from the catalog next is then whole,
        and no eviction round of another process deletes an object it is about to write.
        Raises :class:`~strataio.errors.BackendError` if that round outlasts
        :attr:`EVICTION_WAIT` seconds."""

    @abc.abstractmethod
    def unuse_dataset(self, name: str, writer: str | None = None, *, linger: bool = True) -> None:
        """Undo one :meth:`use_dataset`. The last one leaves the mark in place for
        :attr:`MARK_LINGER_S` seconds (``linger``), then drops it: a :meth:`use_dataset` of
        that writer meanwhile takes it back with no catalog write and no wait (no claim of
        another process can have begun while the mark stood), and other processes go on
        seeing the dataset in use until it goes."""

    @abc.abstractmethod
    def end_lingering(self, *, due_only: bool = False) -> None:
        """Drop the marks left lingering by :meth:`unuse_dataset` (those whose time is up,
        with ``due_only``); a timer does this on its own once their time is up."""

    @abc.abstractmethod
    def lingering_marks(self) -> set[tuple[str, str]]:
        """``(writer, dataset)`` of the marks left lingering here, not yet dropped."""

    @abc.abstractmethod
    def claim_eviction(self, name: str, writer: str | None = None) -> bool:
        """Mark dataset ``name`` as being evicted from by ``writer`` (default as for
        :meth:`use_dataset`), unless another live writer has it in use or is evicting from
        it: then nothing is marked and False is returned. With a claim held, no other process
        opens the dataset until :meth:`release_eviction` (its :meth:`use_dataset` waits).
        ``writer``'s own lingering mark (:meth:`unuse_dataset`) becomes the claim.

        Mark first, look second, on both sides (the mark is committed before the look): of
        a process opening the dataset and one claiming it at the same moment, at least one
        sees the other's mark, so they never both go ahead."""

    @abc.abstractmethod
    def release_eviction(self, name: str, writer: str | None = None) -> None:
        """End a claim of :meth:`claim_eviction` (after the round's commits and deletes)."""

    @abc.abstractmethod
    def writers(self) -> list[WriterRecord]:
        """Every registered writer, with ``alive`` from its token, by id."""

    @abc.abstractmethod
    def forget_writers(self, writers: Iterable[str]) -> None:
        """Remove the rows (and leftover tokens) of writers found dead."""

    @abc.abstractmethod
    def overtaken(self) -> list[OvertakenRewrite]:
        """The announced rewrites another writer's announcement replaced, whose writer has
        not recorded its own rewrite of that copy since (nor released its registration), by
        dataset, key, tier and writer. :func:`strataio.tiers.fsck.fsck` settles a copy
        holding such a gone writer's bytes to them, and clears the record once it has judged
        the chunk."""

    @abc.abstractmethod
    def clear_overtaken(self, entries: Iterable[OvertakenRewrite]) -> None:
        """Remove ``entries`` (those still as given: one made again since stays)."""

    @abc.abstractmethod
    def alive(self, writers: Iterable[str]) -> set[str]:
        """The writers among ``writers`` whose liveness token some live process holds (see
        :mod:`strataio.catalog.liveness`); an unknown or forgotten writer is not alive."""

    def datasets_in_use(self) -> set[str]:
        """Names of the datasets some live writer has in use: their copies are not evicted by
        other processes, and fsck leaves their unnamed objects to their writer. A mark this
        object keeps lingering (:meth:`unuse_dataset`) counts only for other processes."""
        mine = self.lingering_marks()
        return {d for w in self.writers() if w.alive for d in w.datasets if (w.id, d) not in mine}

    # -- performance database -----------------------------------------------------------

    @abc.abstractmethod
    def record_perf(self, rows: Iterable[PerfRow]) -> None:
        """Append measurements, in one transaction."""

    @abc.abstractmethod
    def perf_rows(self, tier: str | None = None) -> list[PerfRow]:
        """Measurements (of one tier, or all), oldest first."""

    # -- lifetime -----------------------------------------------------------------------

    @abc.abstractmethod
    def close(self) -> None:
        """Release the connection; further calls raise :class:`ClosedError`. Idempotent."""

    def __enter__(self) -> Catalog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def codec_json(codecs: Any) -> str:
    """The canonical JSON text of a codec list, as stored in :attr:`DatasetRecord.codec`."""
    return json.dumps(codecs, sort_keys=True, separators=(",", ":"))


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***``, for messages and listings: the one in
    its user part and any given as a query parameter (libpq's ``?password=``)."""
    parts = urlsplit(url)
    netloc, query = parts.netloc, parts.query
    if parts.password:
        netloc = f"{parts.username or ''}:***@{netloc.rsplit('@', 1)[1]}"
    if query:
        query = "&".join(
            f"{k}=***" if v and unquote(k).strip().lower() == "password" else f"{k}{eq}{v}"
            for k, eq, v in (pair.partition("=") for pair in query.split("&"))
        )
    if (netloc, query) == (parts.netloc, parts.query):
        return url
    # (not urlunsplit, which drops the "//" of an empty host: postgresql:///db?host=/socket)
    return (
        f"{parts.scheme}://{netloc}{parts.path}"
        + (f"?{query}" if query else "")
        + (f"#{parts.fragment}" if parts.fragment else "")
    )


def open_catalog(url: str | os.PathLike[str]) -> Catalog:
    """Open (creating and migrating as needed) the catalog at ``url``.

    A filesystem path or ``sqlite:///abs/path`` (file-URL form) opens an SQLite catalog (WAL
    mode; the parent directory is created); ``postgresql://...`` or ``postgres://...`` opens a PostgreSQL
    catalog through psycopg 3.
    """
    text = os.fspath(url)
    if text.startswith(("postgresql://", "postgres://")):
        from strataio.catalog.postgres import PostgresCatalog

        return PostgresCatalog(text)
    if text.startswith("sqlite://"):
        # Like file URLs: sqlite:///abs/cat.db is /abs/cat.db; sqlite://rel/cat.db is relative.
        text = text[len("sqlite://") :]
    elif "://" in text:
        raise MetadataError(
            f"catalog URL {text!r}: unsupported scheme (use a path, sqlite:///path or "
            "postgresql://...)"
        )
    if not text:
        raise MetadataError("catalog URL names no database file")
    from strataio.catalog.sqlite import SQLiteCatalog

    return SQLiteCatalog(text)
