"""A stateful property test of deleting datasets and creating them again, from two Sessions
(two processes' worth: each its own catalog connection, writer, residency and tiers) over a
fast disk tier and an archive that stops answering and answers again.

Rules create a dataset of one of a few names from either session, open and close handles,
write a section and flush (refused whole, the archive away, where it rewrites a part of a
chunk whose copies are all there), migrate chunks to the archive, delete a dataset (refused
while the other session has it open: its data stays), take the archive away and back, and
run ``fsck --repair``. After every step:

- every live dataset reads back the last values written, chunk by chunk, from a fresh handle
  in either session (a dataset deleted and created again reads its fill value, never a value
  of the one before); while the archive is away only a chunk whose copies are all there may
  fail to read;
- ``fsck`` finds no lost, missing or damaged copy of a live dataset;
- after ``fsck --repair`` with the archive up, no object of a deleted dataset is left on any
  tier, and no remnant of one in the catalog.

A migration to the archive may be refused for a chunk whose superseded copy there a commit
could not delete while the archive was away (its object stays, no catalogued copy naming it;
the handle that made it obsolete deletes it at its next commit); the refusal names that
object, and the data stays. So may it where that handle was closed while the archive was
away: its copy is then left for ``fsck --repair`` (a known defect, see
:func:`test_a_copy_stranded_by_a_closed_handle_goes_at_the_next_commit`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

import strataio
from hunt import examples
from strataio.errors import DatasetInUseError, ExistsError, NotFoundError, StrataError
from strataio.session import TieredDataset
from strataio.storage.posix import PosixBackend
from strataio.tiers.fsck import Kind, fsck
from strataio.tiers.tier import Tier, TierSet

SHAPE = (8, 8)
CHUNKS = (4, 4)  # 4 chunks
LEVELS = [("fast", "localdisk"), ("archive", "remotetape")]
#: names of datasets: "a/b" cannot live beside "a", nor be created while remnants of "a"
#: stay (nor the other way round)
NAMES = ("a", "a/b", "b")
WHO = ("A", "B")
#: what fsck must never find of a live dataset
DAMAGE = {Kind.MISSING, Kind.SIZE, Kind.CHECKSUM, Kind.CORRUPT, Kind.LOST, Kind.DIVERGED}
#: the refusal of a move onto an object no catalogued copy names (see the module doc)
IN_THE_WAY = "holds an object of it that no copy known here names"
#: what the rules meet that the invariants allow (:meth:`DeleteAndCreateAgain._note`)
CREATE_REFUSED = "a create refused: remnants on the archive, away"
WRITE_REFUSED = "a write refused: a chunk to rewrite in part is away"
MIGRATE_AWAY = "a migration refused: the archive is away"
MIGRATE_STRANDED = "a migration refused: a copy stranded on the archive by an open handle"
DELETE_REFUSED = "a deletion refused: open in the other session"
# tmpfs where there is one: the rules are about order and bookkeeping, not fsync latency
TMP = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None

who_ = st.sampled_from(WHO)
names = st.sampled_from(NAMES)
box = st.tuples(st.integers(0, SHAPE[0] - 1), st.integers(0, SHAPE[1] - 1)).flatmap(
    lambda lo: st.tuples(
        st.just(lo), st.tuples(st.integers(lo[0] + 1, SHAPE[0]), st.integers(lo[1] + 1, SHAPE[1]))
    )
)
chunk_sets = st.lists(st.tuples(st.integers(0, 1), st.integers(0, 1)), min_size=1, max_size=4)


def _chunk(r: int, c: int) -> tuple[slice, slice]:
    return np.s_[r * CHUNKS[0] : (r + 1) * CHUNKS[0], c * CHUNKS[1] : (c + 1) * CHUNKS[1]]


class DeleteAndCreateAgain(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        # a tier marked down is probed again at its next use: the archive back is used at once
        self._recheck = Tier.RECHECK_S
        Tier.RECHECK_S = 0.0
        self.root = Path(tempfile.mkdtemp(prefix="strataio-delete-", dir=TMP))
        for n, _ in LEVELS:
            (self.root / n).mkdir()
        self.sessions = {w: self._session() for w in WHO}
        #: the live datasets' last values, by name
        self.live: dict[str, np.ndarray] = {}
        #: each session's open handle of a dataset, by (session, name)
        self.handles: dict[tuple[str, str], TieredDataset] = {}
        self.archive_down = False
        self.value = 0
        #: what the rules met that the invariants allow (see _note)
        self.notes: list[str] = []

    # ----------------------------------------------------------------- plumbing
    def _session(self) -> strataio.Session:
        # (create=None: a session made while the archive is away finds it away, as one made
        # from a configuration does)
        backends = {n: PosixBackend(self.root / n, create=None) for n, _ in LEVELS}
        tiers = TierSet([Tier(n, backends[n], role, order=i) for i, (n, role) in enumerate(LEVELS)])
        s = strataio.Session(tiers=tiers, catalog=self.root / "cat.db")
        s.catalog.MARK_LINGER_S = 0.0  # (a closed dataset's mark goes at once)
        return s

    def _note(self, what: str) -> None:
        """Keep ``what`` in :attr:`notes`, and count it in the statistics of a test."""
        self.notes.append(what)
        if currently_in_test_context():
            event(what)

    def _other(self, who: str) -> str:
        return WHO[1 - WHO.index(who)]

    def _handle(self, who: str, name: str) -> tuple[TieredDataset, bool]:
        """``who``'s open handle of ``name``, or a new one; and whether it is new."""
        ds = self.handles.get((who, name))
        if ds is not None:
            return ds, False
        return self.sessions[who].open_dataset(name, "r+"), True

    def _close(self, who: str, name: str) -> None:
        self.handles.pop((who, name)).close()

    def _objects(self, name: str) -> list[str]:
        """The files of dataset ``name`` on each tier, as ``tier/key`` (not those of a live
        dataset below it)."""
        below = [n[len(name) + 1 :] + "/" for n in self.live if n.startswith(f"{name}/")]
        out = []
        for tier, _ in LEVELS:
            base = self.root / tier / name
            if not base.is_dir():
                continue
            for p in base.rglob("*"):
                key = p.relative_to(base).as_posix()
                if p.is_file() and not any(key.startswith(b) for b in below):
                    out.append(f"{tier}/{key}")
        return sorted(out)

    def _clash(self, name: str) -> bool:
        """True if a live dataset has ``name``, or one above or below it."""
        return any(
            n == name or n.startswith(f"{name}/") or name.startswith(f"{n}/") for n in self.live
        )

    # ----------------------------------------------------------------- rules
    @rule(who=who_, name=names)
    def create(self, who: str, name: str) -> None:
        s = self.sessions[who]
        if self._clash(name):
            with pytest.raises(ExistsError):
                s.create_dataset(name, SHAPE, "i4", CHUNKS, hint="LOCALDISK")
            return
        remnants = s.catalog.remnants(name, near=True)
        try:
            ds = s.create_dataset(name, SHAPE, "i4", CHUNKS, hint="LOCALDISK")
        except ExistsError as exc:
            # objects of a deleted dataset of this name (or one above or below it) may remain
            # on the archive, away
            assert self.archive_down, (str(exc), remnants)
            assert {t for _, t in remnants} == {"archive"}, (str(exc), remnants)
            assert "'archive'" in str(exc), str(exc)
            self._note(CREATE_REFUSED)
            return
        assert s.catalog.remnants(name, near=True) == []
        self.live[name] = np.zeros(SHAPE, "i4")
        self.handles[who, name] = ds

    @rule(who=who_, name=names)
    def open_or_close(self, who: str, name: str) -> None:
        if (who, name) in self.handles:
            self._close(who, name)
        elif name in self.live:
            self.handles[who, name] = self.sessions[who].open_dataset(name, "r+")
        else:
            with pytest.raises(NotFoundError):
                self.sessions[who].open_dataset(name, "r+")

    @rule(who=who_, name=names, where=box)
    def write(self, who: str, name: str, where) -> None:
        if name not in self.live:
            return
        (r0, c0), (r1, c1) = where
        ds, new = self._handle(who, name)
        self.value += 1
        try:
            ds[r0:r1, c0:c1] = self.value
            ds.flush()
        except StrataError as exc:
            # a part of a chunk whose copies are all away: its old value cannot be read, and
            # nothing of the write is stored (the invariant reads the values before it)
            assert self.archive_down and "tiers that are down" in str(exc), str(exc)
            self._note(WRITE_REFUSED)
            return
        finally:
            if new:
                ds.close()
        self.live[name][r0:r1, c0:c1] = self.value

    @rule(who=who_, name=names, chunks=chunk_sets)
    def migrate(self, who: str, name: str, chunks) -> None:
        if name not in self.live:
            return
        ds, new = self._handle(who, name)
        try:
            failed = []
            for r, c in sorted(set(chunks)):
                failed += ds.migrate(_chunk(r, c), to="archive").result().failed
            if not failed:
                return
            if self.archive_down:
                self._note(MIGRATE_AWAY)
                return
            rows = self.sessions[who].catalog.residency(name)
            for key, msg in failed:
                # an object there no catalogued copy names: one a commit made obsolete and
                # could not delete while the archive was away
                assert IN_THE_WAY in msg and "'archive'" in msg, (key, msg)
                assert (self.root / "archive" / name / key).is_file(), (key, msg)
                assert not [c for c in rows if c.key == key and c.tier == "archive"], (key, msg)
                # that handle's next commit deletes it, or where the handle closed since,
                # the next commit of a handle of the dataset in that session
                assert any(
                    n == name and h.store.res.holds_object(key, "archive")
                    for (_, n), h in self.handles.items()
                ) or any(
                    ("archive", key) in s._stranded.get(name, ()) for s in self.sessions.values()
                ), (key, msg)
                self._note(MIGRATE_STRANDED)
        finally:
            if new:
                ds.close()

    @rule(who=who_, name=names, while_open=st.booleans())
    def delete(self, who: str, name: str, while_open: bool) -> None:
        s, other = self.sessions[who], self._other(who)
        if (who, name) in self.handles:
            with pytest.raises(DatasetInUseError, match="open in this process"):
                s.delete_dataset(name)
            self._close(who, name)
        if name not in self.live:
            with pytest.raises(NotFoundError):
                s.delete_dataset(name)
            return
        if (other, name) in self.handles:
            if not while_open:
                self._close(other, name)
            else:
                # (a deletion waits out the marks other processes leave lingering for
                # MARK_LINGER_S and a second more; none linger here, and the other session's
                # mark stays: it is refused at its first look)
                s.catalog.MARK_LINGER_S = -1.0
                try:
                    with pytest.raises(DatasetInUseError, match="in use by another process") as e:
                        s.delete_dataset(name)
                finally:
                    s.catalog.MARK_LINGER_S = 0.0
                assert self.sessions[other].writer in str(e.value)
                self._note(DELETE_REFUSED)
                return
        s.delete_dataset(name)
        del self.live[name]
        left = self._objects(name)
        if self.archive_down:
            assert s.catalog.remnants(name) == [(name, "archive")]
            assert not [o for o in left if not o.startswith("archive/")], left
        else:
            assert s.catalog.remnants(name) == []
            assert left == [], left

    @rule()
    def archive_away_or_back(self) -> None:
        root = self.root / "archive"
        away = root.with_name("archive.away")
        if self.archive_down:
            root.unlink()
            away.rename(root)
        else:
            # a file in its place: every call there fails (the tier stops answering)
            root.rename(away)
            root.write_bytes(b"")
        self.archive_down = not self.archive_down

    @rule()
    def fsck_repair(self) -> None:
        """``strataio fsck --repair`` from a third session, beside the two."""
        with self._session() as s:
            report = fsck(s.catalog, s.tiers, repair=True)
        damage = [f for f in report.problems if f.dataset in self.live and f.kind in DAMAGE]
        assert damage == [], damage
        if self.archive_down:
            return
        assert self.sessions["A"].catalog.remnants() == []
        for name in NAMES:
            if name not in self.live:
                assert self._objects(name) == [], name

    # ----------------------------------------------------------------- invariants
    def _check_reads(self, ds: TieredDataset, what: str) -> None:
        """``ds`` reads the last values, chunk by chunk (but those away with the archive).
        The reads stage nothing: chunks stay where the rules put them."""
        want = self.live[ds.name]
        stage, ds.store.stage_on_read = ds.store.stage_on_read, False
        try:
            for r in range(SHAPE[0] // CHUNKS[0]):
                for c in range(SHAPE[1] // CHUNKS[1]):
                    try:
                        got = ds[_chunk(r, c)]
                    except StrataError:
                        assert self.archive_down, (what, r, c)
                        continue
                    np.testing.assert_array_equal(
                        got, want[_chunk(r, c)], err_msg=f"{what} {r},{c}"
                    )
        finally:
            ds.store.stage_on_read = stage

    @invariant()
    def each_session_reads_the_last_values(self) -> None:
        for who in WHO:
            for name in self.live:
                ds = self.sessions[who].open_dataset(name)
                try:
                    self._check_reads(ds, f"{who}: {name}, a fresh handle")
                finally:
                    ds.close()
        for (who, name), ds in self.handles.items():
            self._check_reads(ds, f"{who}: {name}, open since")

    @invariant()
    def fsck_finds_no_damage(self) -> None:
        s = self.sessions["A"]
        report = fsck(s.catalog, s.tiers)
        damage = [f for f in report.problems if f.dataset in self.live and f.kind in DAMAGE]
        assert damage == [], damage

    def teardown(self) -> None:
        try:
            if self.archive_down:
                self.archive_away_or_back()
            for who, name in list(self.handles):
                self._close(who, name)
            for s in self.sessions.values():
                s.close()
            with self._session() as s:
                report = fsck(s.catalog, s.tiers, repair=True)
                assert not [f for f in report.problems if f.kind in DAMAGE], report.problems
                for name, want in self.live.items():
                    ds = s.open_dataset(name)
                    np.testing.assert_array_equal(ds[...], want, err_msg=name)
                    ds.close()
                report = fsck(s.catalog, s.tiers)
                assert report.clean, report.problems
                assert s.catalog.remnants() == []
                for name in NAMES:
                    if name not in self.live:
                        assert self._objects(name) == [], name
        finally:
            Tier.RECHECK_S = self._recheck
            shutil.rmtree(self.root, ignore_errors=True)


DeleteAndCreateAgain.TestCase.settings = settings(
    max_examples=examples(30),
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_delete_and_create_again = pytest.mark.filterwarnings("ignore::ResourceWarning")(
    DeleteAndCreateAgain.TestCase
)

WHOLE = ((0, 0), (8, 8))
FIRST = ((0, 0), (4, 4))  # chunk c/0/0
LAST = ((4, 4), (8, 8))  # chunk c/1/1

# Interleavings the random steps reach rarely, each run whole in every test run: (rule,
# *arguments) steps, the invariants checked after each, and what the rules are to meet.
SCENARIOS = {
    # B's migration finds the copy A's rewrite made obsolete while the archive was away,
    # which A deletes at its next commit; B's migration then goes through
    "migrate-onto-a-copy-stranded-by-an-open-handle": (
        [
            ("create", "A", "a"),
            ("write", "A", "a", WHOLE),
            ("migrate", "A", "a", [(0, 0)]),
            ("archive_away_or_back",),
            ("write", "A", "a", FIRST),
            ("archive_away_or_back",),
            ("migrate", "B", "a", [(0, 0)]),
            ("write", "A", "a", LAST),
            ("migrate", "B", "a", [(0, 0)]),
        ],
        [MIGRATE_STRANDED],
    ),
    # the same with A's handle closed while the archive is away: A's session keeps the
    # copy to delete, and the next commit of a handle of the dataset there (the
    # invariants' fresh handles) deletes it once the archive is back
    "migrate-onto-a-copy-left-by-a-closed-handle": (
        [
            ("create", "A", "a"),
            ("write", "A", "a", WHOLE),
            ("migrate", "A", "a", [(0, 0)]),
            ("archive_away_or_back",),
            ("write", "A", "a", FIRST),
            ("open_or_close", "A", "a"),
            ("archive_away_or_back",),
            ("migrate", "B", "a", [(0, 0)]),
            ("fsck_repair",),
            ("migrate", "B", "a", [(0, 0)]),
        ],
        [],
    ),
    # a part of a chunk whose only copy is away is not rewritten (nothing of the write is);
    # once the archive is back it is
    "rewrite-a-part-of-a-chunk-away": (
        [
            ("create", "B", "a"),
            ("write", "B", "a", WHOLE),
            ("migrate", "A", "a", [(0, 0), (1, 1)]),
            ("archive_away_or_back",),
            ("write", "A", "a", ((2, 2), (6, 6))),
            ("write", "B", "a", ((4, 0), (8, 4))),
            ("archive_away_or_back",),
            ("write", "A", "a", ((2, 2), (6, 6))),
        ],
        [WRITE_REFUSED],
    ),
    # deleted while the archive is away (refused first, B having it open): the name is
    # refused until the archive is back, and the dataset created again reads its fill value
    "delete-while-away-create-again-when-back": (
        [
            ("create", "A", "a"),
            ("write", "A", "a", WHOLE),
            ("open_or_close", "B", "a"),
            ("migrate", "B", "a", [(0, 0), (0, 1), (1, 0)]),
            ("archive_away_or_back",),
            ("delete", "A", "a", True),
            ("delete", "A", "a", False),
            ("create", "B", "a"),
            ("archive_away_or_back",),
            ("create", "B", "a"),
            ("write", "A", "a", ((1, 1), (3, 7))),
            ("fsck_repair",),
        ],
        [DELETE_REFUSED, CREATE_REFUSED],
    ),
    # remnants of "a/b" keep "a" from being created, and fsck --repair deletes them
    "remnants-of-a-name-below": (
        [
            ("create", "A", "a/b"),
            ("write", "B", "a/b", WHOLE),
            ("migrate", "B", "a/b", [(1, 1)]),
            ("archive_away_or_back",),
            ("delete", "B", "a/b", False),
            ("create", "A", "a"),
            ("fsck_repair",),
            ("archive_away_or_back",),
            ("fsck_repair",),
            ("create", "A", "a"),
            ("write", "B", "a", FIRST),
        ],
        [CREATE_REFUSED],
    ),
}


def _run(steps) -> DeleteAndCreateAgain:
    """A machine that has run ``steps``, the invariants checked after each (and before)."""
    machine = DeleteAndCreateAgain()
    machine.each_session_reads_the_last_values()
    machine.fsck_finds_no_damage()
    for rule_name, *args in steps:
        getattr(machine, rule_name)(*args)
        machine.each_session_reads_the_last_values()
        machine.fsck_finds_no_damage()
    return machine


@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.parametrize(("steps", "met"), list(SCENARIOS.values()), ids=list(SCENARIOS))
def test_scenarios(steps, met):
    machine = None
    try:
        machine = _run(steps)
        assert machine.notes == met
    finally:
        if machine is not None:
            machine.teardown()


@pytest.mark.filterwarnings("ignore::ResourceWarning")
def test_a_copy_stranded_by_a_closed_handle_goes_at_the_next_commit():
    """A copy a rewrite made obsolete on the archive while it was away stays the session's
    to delete (see the README: an outage leaves no orphans behind a running job), also once
    the handle is closed: its next commit of the dataset, the archive back, deletes it, and
    a migration of the chunk to the archive is not refused."""
    machine = _run(SCENARIOS["migrate-onto-a-copy-left-by-a-closed-handle"][0][:7])
    try:
        machine.write("A", "a", LAST)  # a commit of A's, the archive back
        assert not (machine.root / "archive" / "a" / "c" / "0" / "0").exists()
        machine.migrate("B", "a", [(0, 0)])
        assert machine.notes == []
    finally:
        machine.teardown()
