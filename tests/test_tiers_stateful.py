"""A stateful property test of the storage hierarchy under capacity pressure.

Rules write random sections (also while a stage of the same dataset runs), read, stage,
prefetch, migrate, evict, close a dataset while a move of it runs, flush and reopen the
Session, over
a memory tier, a fast disk, a slower disk (all with room for a few chunks only) and an
archive, with several datasets open at once. After every step:

- every chunk ever written reads back its last value (a numpy oracle);
- each tier's usage equals the bytes of the copies recorded on it, within its capacity, and
  nothing stays reserved;
- every recorded copy, and every copy the catalog names, is present with its size and
  checksum (nothing catalogued is missing; an announced rewrite whose put failed keeps its
  row until the next commit deletes it);
- ``fsck`` reports nothing to fix; after a flush or a reopen, with nothing in flight at all,
  and the objects on each persistent tier are exactly those the catalog names.

:class:`Outages` takes a disk tier away during writes (it answers again after each), or makes
its device full for a write, or has its storage refuse one chunk's object for what it is
(its name too long, its size too large): copies the writes made obsolete there are deleted
once it answers, moves to it probe it again, a full device's tier stays up and read, and a
tier that refuses one object stays up and takes the write's other chunks; a Session
whose configuration lacks the archive writes and closes its datasets, and once it is
configured again, the copies the writes made obsolete there are deleted by fsck.
:class:`FullHierarchy` bounds the archive too: writes of new chunks are then refused chunk by
chunk (each refused chunk keeps its previous value whole), and a write that only rewrites
chunks stored already is never refused.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import strataio
import strataio.arrays.chunk_cache as chunk_cache_module
from hunt import examples
from strataio.errors import BackendError, ObjectError, StrataError
from strataio.storage.memory import MemoryBackend
from strataio.storage.posix import PosixBackend
from strataio.tiers.fsck import fsck
from strataio.tiers.tier import Tier, TierSet, checksum

SHAPE = (16, 16)
CHUNKS = (4, 4)  # 16 chunks of 64 bytes (int32, no compression)
CHUNK = 64
#: (name, role, capacity in chunks; None = unbounded)
LEVELS = [
    ("mem", "memory", 3),
    ("fast", "localdisk", 4),
    ("slow", "remotedisk", 10),
    ("archive", "remotetape", None),
]
DATASETS = {"a": "LOCALDISK", "b": "LOCALDISK", "c": "REMOTEDISK"}
# tmpfs where there is one: the rules are about order and bookkeeping, not fsync latency
TMP = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None

box = st.tuples(st.integers(0, SHAPE[0] - 1), st.integers(0, SHAPE[1] - 1)).flatmap(
    lambda lo: st.tuples(
        st.just(lo), st.tuples(st.integers(lo[0] + 1, SHAPE[0]), st.integers(lo[1] + 1, SHAPE[1]))
    )
)
names = st.sampled_from(sorted(DATASETS))


def index(b) -> tuple[slice, slice]:
    (r0, c0), (r1, c1) = b
    return np.s_[r0:r1, c0:c1]


class TieredHierarchy(RuleBasedStateMachine):
    levels = LEVELS

    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="strataio-stateful-", dir=TMP))
        self.oracle = {n: np.zeros(SHAPE, "i4") for n in DATASETS}
        self.session: strataio.Session | None = None
        self.ds: dict[str, strataio.Dataset] = {}
        self._open(create=True)

    # ----------------------------------------------------------------- plumbing
    def _open(self, *, create: bool = False, datasets: bool = True) -> None:
        tiers = TierSet(
            [
                Tier(
                    n,
                    MemoryBackend(n) if role == "memory" else PosixBackend(self.root / n),
                    role,
                    capacity=None if cap is None else cap * CHUNK,
                    order=i,
                )
                for i, (n, role, cap) in enumerate(self.levels)
            ]
        )
        self.session = strataio.Session(tiers=tiers, catalog=self.root / "cat.db")
        for n, hint in DATASETS.items() if datasets else ():
            if create:
                self.ds[n] = self.session.create_dataset(
                    n, SHAPE, "i4", CHUNKS, hint=hint, codec=[]
                )
            else:
                self.ds[n] = self.session.open_dataset(n, "r+")

    def teardown(self) -> None:
        if self.session is not None:
            self.session.close()
        shutil.rmtree(self.root, ignore_errors=True)

    @property
    def tiers(self) -> TierSet:
        assert self.session is not None
        return self.session.tiers

    def _wait(self, handle) -> None:
        """Wait for a move; every move here has room to succeed."""
        handle.wait()

    # ----------------------------------------------------------------- rules
    @rule(name=names, where=box, value=st.integers(0, 4))
    def write(self, name, where, value):
        # few distinct values: identical bytes rewritten over a copy are common
        self.ds[name][index(where)] = value
        self.oracle[name][index(where)] = value

    @rule(name=names, where=box)
    def read(self, name, where):
        np.testing.assert_array_equal(self.ds[name][index(where)], self.oracle[name][index(where)])

    @rule(name=names, where=box, to=st.sampled_from([None, "mem", "fast", "slow"]))
    def stage(self, name, where, to):
        ds = self.ds[name]
        h = ds.stage(index(where), to=to)
        self._wait(h)
        if to is not None:
            # a stage of more than the tier holds never evicts what it placed there: each
            # chunk it says it moved is there once it ends
            (r0, c0), (r1, c1) = where
            section = {
                ds.chunk_key((i, j))
                for i in range(r0 // CHUNKS[0], (r1 - 1) // CHUNKS[0] + 1)
                for j in range(c0 // CHUNKS[1], (c1 - 1) // CHUNKS[1] + 1)
            }
            there = [k for k in section if ds.store.res.copy_on(k, to) is not None]
            assert h.result().moved <= len(there), (h.result(), sorted(there))

    @rule(
        name=names,
        moved=box,
        to=st.sampled_from([None, "mem", "fast"]),
        written=box,
        value=st.integers(0, 4),
    )
    def write_while_staging(self, name, moved, to, written, value):
        # the stage runs on the mover's threads while the write evicts and puts
        h = self.ds[name].stage(index(moved), to=to)
        self.write(name, written, value)
        self._wait(h)

    @rule(name=names, where=box, to=st.sampled_from([None, "mem", "fast"]), fetch=st.booleans())
    def close_while_moving(self, name, where, to, fetch):
        # a close ends the dataset's moves (a prefetch cancelled, a stage to storage finished):
        # none runs on, or puts a copy, after it
        ds = self.ds[name]
        h = ds.prefetch(index(where)) if fetch else ds.stage(index(where), to=to)
        ds.close()
        assert h.done()
        if not fetch and to != "mem":
            assert h._result.cancelled == 0  # (read as it stands: a refused move raises)
        self._wait(h)
        self.ds[name] = self.session.open_dataset(name, "r+")

    @rule(name=names, where=box)
    def prefetch(self, name, where):
        self._wait(self.ds[name].prefetch(index(where)))

    @rule(name=names, where=box, to=st.sampled_from(["slow", "archive"]))
    def migrate(self, name, where, to):
        self._wait(self.ds[name].migrate(index(where), to=to))

    @rule(name=names, where=box, tier=st.sampled_from(["mem", "fast", "slow"]))
    def evict(self, name, where, tier):
        self._wait(self.ds[name].evict(index(where), tier=tier))

    @rule(name=names, data=st.data())
    def evict_for_room_after_a_copy_was_lost(self, name, data):
        # a chunk's copy on a slower tier lost behind strataio's back, then an eviction round
        # that empties the fast tier (as a write needing its room runs): the lost copy is
        # forgotten (and the chunk written back), never counted on to drop the only good one
        ds = self.ds[name]
        both = {
            k: slower
            for k, cs in sorted(ds.residency().items())
            if any(c.tier == "fast" and c.state == "valid" for c in cs)
            and (slower := [c for c in cs if c.tier in ("slow", "archive") and c.state == "valid"])
        }
        if not both:
            return
        key = data.draw(st.sampled_from(sorted(both)))
        lost = data.draw(st.sampled_from(both[key]))
        (self.root / lost.tier / name / key).unlink()
        fast = self.tiers["fast"]
        assert self.session is not None
        self.session.placement.make_room(fast, fast.capacity)
        event("an eviction after a copy was lost")

    @rule()
    def flush(self):
        for ds in self.ds.values():
            ds.flush()
        self._check_settled()

    @precondition(lambda self: self.session is not None)
    @rule()
    def reopen(self):
        assert self.session is not None
        self.session.close()
        self._open()
        self._check_settled()

    # ----------------------------------------------------------------- invariants
    @invariant()
    def every_chunk_reads_its_last_value(self):
        for n, ds in self.ds.items():
            np.testing.assert_array_equal(ds[...], self.oracle[n], err_msg=n)

    @invariant()
    def usage_equals_the_bytes_recorded(self):
        copies = [c for ds in self.ds.values() for cs in ds.residency().values() for c in cs]
        for t in self.tiers:
            mine = [c for c in copies if c.tier == t.name]
            assert t.reserved == 0, t.name
            assert t.used == sum(c.nbytes for c in mine), t.name
            assert t.capacity is None or t.used <= t.capacity, t.name
            for c in mine:
                obj = f"{c.dataset}/{c.key}"
                got = bytes(t.backend.get(obj))
                assert (len(got), checksum(got)) == (c.nbytes, c.checksum), (t.name, obj)

    @invariant()
    def nothing_catalogued_is_missing(self):
        # (but an announced rewrite whose put failed, which the Session holds no copy of:
        # the next commit deletes its row, as _check_settled sees)
        assert self.session is not None
        held = {
            (n, c.key, c.tier)
            for n, ds in self.ds.items()
            for cs in ds.residency().values()
            for c in cs
        }
        for c in self.session.catalog.all_residency():
            assert not self.tiers[c.tier].volatile
            if c.state == "in-transit" and (c.dataset, c.key, c.tier) not in held:
                continue
            obj = f"{c.dataset}/{c.key}"
            assert self.tiers[c.tier].backend.exists(obj), (c.tier, obj)

    @invariant()
    def fsck_finds_nothing_to_fix(self):
        assert self.session is not None
        report = fsck(self.session.catalog, self.tiers)
        assert report.clean, report.problems

    def _check_settled(self):
        """With every change committed: fsck is clean even with no grace period, and the
        objects on each persistent tier are exactly the catalogued copies."""
        assert self.session is not None
        report = fsck(self.session.catalog, self.tiers)
        assert report.clean, report.problems
        assert not report.in_flight, report.in_flight  # nothing is left for a writer to finish
        rows = self.session.catalog.all_residency()
        for t in self.tiers:
            if t.volatile:
                continue
            present = {k for k in t.backend.list() if not k.endswith("zarr.json")}
            named = {f"{c.dataset}/{c.key}" for c in rows if c.tier == t.name}
            assert present == named, (t.name, sorted(present ^ named))


def _runs(runs: int, steps: int) -> settings:
    """Hypothesis settings of a state machine here: ``runs`` runs of ``steps`` steps."""
    return settings(
        max_examples=runs,
        stateful_step_count=steps,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )


TieredHierarchy.TestCase.settings = _runs(examples(70), 8)
test_tiers_stateful = TieredHierarchy.TestCase


class LongerRuns(TieredHierarchy):
    pass


LongerRuns.TestCase.settings = _runs(examples(1000), 30)
test_tiers_stateful_long = pytest.mark.slow(LongerRuns.TestCase)


class EverythingCached(TieredHierarchy):
    """The same rules with the decoded-chunk cache keeping every chunk as soon as it is read
    (no settling time): a cached chunk must never outlive the copy it was read from, whatever
    writes, stages, migrations and evictions do to it."""

    def __init__(self) -> None:
        self._settle = chunk_cache_module.SETTLE_NS
        chunk_cache_module.SETTLE_NS = -(1 << 62)
        super().__init__()

    def teardown(self) -> None:
        try:
            super().teardown()
        finally:
            chunk_cache_module.SETTLE_NS = self._settle


EverythingCached.TestCase.settings = _runs(examples(50), 8)
test_tiers_stateful_everything_cached = EverythingCached.TestCase


class FullHierarchy(TieredHierarchy):
    """The same rules over a hierarchy whose archive is bounded too, with room for about half
    of the chunks the datasets can hold: writes of new chunks fill it and are then refused,
    chunk by chunk. A refused chunk keeps its previous value whole, and a write that only
    rewrites chunks stored already is never refused (it needs no more room)."""

    levels = [*LEVELS[:-1], ("archive", "remotetape", 8)]

    def _wait(self, handle) -> None:
        """Wait for a move, which a full tier may refuse (saying so)."""
        try:
            handle.wait()
        except StrataError as exc:
            if "full" not in str(exc) and "no slower tier" not in str(exc):
                raise
            event("a move refused for want of room")

    @rule(name=names, where=box, value=st.integers(0, 4))
    def write(self, name, where, value):
        ds = self.ds[name]
        stored = set(ds.residency())
        new = self.oracle[name].copy()
        new[index(where)] = value
        (r0, c0), (r1, c1) = where
        chunks = [
            (i, j)
            for i in range(r0 // CHUNKS[0], (r1 - 1) // CHUNKS[0] + 1)
            for j in range(c0 // CHUNKS[1], (c1 - 1) // CHUNKS[1] + 1)
        ]
        try:
            ds[index(where)] = value
        except BackendError as exc:
            event("a write refused for want of room")
            touched = {ds.chunk_key(c) for c in chunks}
            assert not touched <= stored, (str(exc), sorted(touched))
            got = ds[...]
            for i, j in chunks:
                sl = np.s_[i * CHUNKS[0] : (i + 1) * CHUNKS[0], j * CHUNKS[1] : (j + 1) * CHUNKS[1]]
                if not np.array_equal(got[sl], new[sl]):  # refused whole: the old value stands
                    np.testing.assert_array_equal(got[sl], self.oracle[name][sl], str((i, j)))
                    new[sl] = self.oracle[name][sl]
        else:
            if set(ds.residency()) == stored and all(
                t.capacity is not None and t.used + CHUNK > t.capacity
                for t in self.tiers
                if not t.volatile
            ):
                event("a rewrite taken by a full hierarchy")
        self.oracle[name] = new


FullHierarchy.TestCase.settings = _runs(examples(60), 10)
test_tiers_stateful_full_hierarchy = FullHierarchy.TestCase


def _whole_chunks(where):
    """The section of whole chunks that covers ``where``."""
    (r0, c0), (r1, c1) = where
    up = lambda n, c: -(-n // c) * c  # noqa: E731
    return (
        (r0 - r0 % CHUNKS[0], c0 - c0 % CHUNKS[1]),
        (up(r1, CHUNKS[0]), up(c1, CHUNKS[1])),
    )


class Outages(TieredHierarchy):
    """The same rules, and a disk tier that stops answering during a write or a read and
    answers again after it: they fail over to the tiers that answer, and the Session's next
    reads and writes probe the tier again (``Tier.RECHECK_S`` 0 here) and use it once more. Every
    invariant holds after each step, the tier back."""

    def __init__(self) -> None:
        self._recheck = Tier.RECHECK_S
        Tier.RECHECK_S = 0.0
        super().__init__()

    def teardown(self) -> None:
        try:
            super().teardown()
        finally:
            Tier.RECHECK_S = self._recheck

    @rule(name=names, where=box, value=st.integers(0, 4), tier=st.sampled_from(["fast", "slow"]))
    def write_during_an_outage(self, name, where, value, tier):
        # (whole chunks: a partial write would read the old bytes, which may be on that tier;
        # and nothing unflushed on it: writes not yet durable where a tier fails are not)
        for ds in self.ds.values():
            ds.flush()
        with self._away(tier):
            self.write(name, _whole_chunks(where), value)

    @contextlib.contextmanager
    def _away(self, tier: str):
        """Tier ``tier``'s directory replaced by a file meanwhile: the tier does not answer."""
        root = self.root / tier
        away = root.with_name(tier + ".away")
        root.rename(away)
        root.write_bytes(b"")
        try:
            yield
        finally:
            root.unlink()
            away.rename(root)

    @rule(name=names, where=box, tier=st.sampled_from(["fast", "slow"]))
    def read_during_an_outage(self, name, where, tier):
        # chunks staged to the tier (a copy there besides a slower one) are read while it is
        # away: the read fails over to other copies; once the tier answers, the next read of
        # a chunk whose fastest copy is there probes it and reads there again
        (r0, c0), (r1, c1) = where
        rows = range(r0 // CHUNKS[0], -(-r1 // CHUNKS[0]))
        keys = [f"c/{i}/{j}" for i in rows for j in range(c0 // CHUNKS[1], -(-c1 // CHUNKS[1]))]
        store = self.ds[name].store
        self._wait(self.ds[name].stage(index(where), to=tier))
        for ds in self.ds.values():
            ds.flush()
        with self._away(tier), contextlib.suppress(BackendError):
            store.get_chunks(keys)  # (BackendError: a chunk whose only copies are there)
        # (and not from memory: a read the decoded-chunk cache serves asks no tier anything)
        self.session.cache.invalidate(name)
        self.ds[name].clear_cache()
        self.read(name, where)
        fastest = [next(iter(store.res.readable(k, up_only=False)), None) for k in keys]
        if any(c is not None and c.tier == tier for c in fastest):
            event("a read after an outage found the fastest copy there")
            assert self.tiers[tier].up, tier

    @rule(name=names, row=st.integers(0, 3), col=st.integers(0, 3), value=st.integers(0, 4))
    def write_with_the_archive_out_of_the_configuration(self, name, row, col, value):
        # a Session whose configuration lacks the archive: the tier is down (not configured),
        # never probed; a chunk written goes to a disk (or is refused where they are full,
        # keeping its value), a copy the write makes obsolete on the archive stays there,
        # and closing works; with the archive configured again and the datasets closed, fsck
        # --repair deletes it
        assert self.session is not None
        self.session.close()
        levels, self.levels = self.levels, [lv for lv in self.levels if lv[0] != "archive"]
        where = ((row * CHUNKS[0], col * CHUNKS[1]), ((row + 1) * CHUNKS[0], (col + 1) * CHUNKS[1]))
        try:
            self._open()
            archive = self.tiers["archive"]
            assert archive.condition == "down (not configured)" and not archive.recheck()
            try:
                self.write(name, where, value)
            except StrataError:
                event("a chunk refused with the archive out of the configuration")
            else:
                self.read(name, where)
        finally:
            self.session.close()
            self.levels = levels
        # (what a handle closed before it could delete is fsck's, once no one has it open)
        self._open(datasets=False)
        fsck(self.session.catalog, self.tiers, repair=True)
        self.session.close()
        self._open()
        self._check_settled()

    @rule(name=names, where=box, value=st.integers(0, 4), tier=st.sampled_from(["fast", "slow"]))
    def write_while_a_device_is_full(self, name, where, value, tier):
        # puts to the tier fail as on a full device (ENOSPC): the tier stays up and read,
        # and the write's chunks go on to the next tier
        backend = self.tiers[tier].backend

        def full(*args, **kwargs):
            raise OSError(errno.ENOSPC, "No space left on device")

        puts = [n for n in ("put", "put_new", "put_versioned", "put_if") if hasattr(backend, n)]
        for n in puts:
            setattr(backend, n, full)
        try:
            self.write(name, where, value)
        finally:
            for n in puts:
                delattr(backend, n)
        assert self.tiers[tier].up

    @rule(
        name=names,
        where=box,
        value=st.integers(0, 4),
        tier=st.sampled_from(["fast", "slow"]),
        err=st.sampled_from([errno.ENAMETOOLONG, errno.EFBIG, errno.EINVAL]),
    )
    def write_with_one_object_refused(self, name, where, value, tier, err):
        # the tier's storage refuses the put of one chunk's object for what it is (its name
        # too long, its size too large): the write raises ObjectError naming that chunk,
        # which keeps its previous value whole, stores its other chunks, and the tier stays up
        ds = self.ds[name]
        (r0, c0), _ = where
        key = ds.chunk_key((r0 // CHUNKS[0], c0 // CHUNKS[1]))
        backend = self.tiers[tier].backend
        obj = f"{name}/{key}"

        def refusing(put):
            def refused(k, *args, **kwargs):
                if k == obj:
                    raise OSError(err, os.strerror(err), backend.path(k))
                return put(k, *args, **kwargs)

            return refused

        puts = [n for n in ("put", "put_new", "put_versioned", "put_if") if hasattr(backend, n)]
        for n in puts:
            setattr(backend, n, refusing(getattr(backend, n)))
        new = self.oracle[name].copy()
        new[index(where)] = value
        try:
            ds[index(where)] = value
        except ObjectError as exc:
            event("a write with one object refused by its tier")
            assert exc.keys == [key], (exc.keys, key, str(exc))
            assert obj in str(exc) and tier in str(exc), str(exc)
            i, j = r0 // CHUNKS[0], c0 // CHUNKS[1]
            sl = np.s_[i * CHUNKS[0] : (i + 1) * CHUNKS[0], j * CHUNKS[1] : (j + 1) * CHUNKS[1]]
            new[sl] = self.oracle[name][sl]
        finally:
            for n in puts:
                delattr(backend, n)
        self.oracle[name] = new
        assert self.tiers[tier].up


Outages.TestCase.settings = _runs(examples(60), 8)
test_tiers_stateful_outages = Outages.TestCase
