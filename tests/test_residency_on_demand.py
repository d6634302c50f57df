"""A dataset opened by one process learns each chunk's catalog rows when it first looks the
chunk up: opening reads none, a section read asks for its own chunks in one query, and a
chunk's checks come with its rows. A parallel job's ranks still take every row at open."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

import strataio
from hunt import examples
from strataio.catalog.base import ChunkCopy
from strataio.storage.posix import PosixBackend
from strataio.tiers.fsck import fsck
from strataio.tiers.residency import Residency
from strataio.tiers.row_memo import LearnedRows, RowLoader, RowMemo
from strataio.tiers.tier import Tier, TierSet

SHAPE = (40, 40)
CHUNKS = (4, 4)  # 100 chunks


def _session(root: Path) -> strataio.Session:
    tiers = TierSet([Tier("fast", PosixBackend(root / "fast"), "localdisk", order=0)])
    return strataio.Session(tiers=tiers, catalog=root / "cat.db")


def _model_tiers() -> TierSet:
    """Two tiers whose backends a residency alone never touches (models, unit tests)."""
    return TierSet(
        [
            Tier("fast", PosixBackend("/nonexistent/fast"), "localdisk", order=0),
            Tier("slow", PosixBackend("/nonexistent/slow"), "remotedisk", order=1),
        ]
    )


def _asked(session: strataio.Session) -> list[list[str] | None]:
    """Record the chunk keys of every residency query of ``session``'s catalog (None: all),
    with or without the checks."""
    asked: list[list[str] | None] = []

    def counting(query):
        def counted(dataset, keys=None):
            asked.append(None if keys is None else sorted(keys))
            return query(dataset, keys)

        return counted

    session.catalog.residency = counting(session.catalog.residency)
    session.catalog.residency_checked = counting(session.catalog.residency_checked)
    return asked


@pytest.fixture
def data(tmp_path) -> np.ndarray:
    values = np.arange(np.prod(SHAPE), dtype="f4").reshape(SHAPE)
    with _session(tmp_path) as s:
        s.create_dataset("d", SHAPE, "f4", CHUNKS, hint="LOCALDISK", codec=None)[...] = values
    return values


def test_opening_reads_no_row_and_a_section_asks_for_its_chunks_once(tmp_path, data):
    with _session(tmp_path) as s:
        asked = _asked(s)
        with s.open_dataset("d") as ds:
            assert asked == []
            np.testing.assert_array_equal(ds[3:9, 5:7], data[3:9, 5:7])
            assert asked == [["c/0/1", "c/1/1", "c/2/1"]]
            ds.clear_cache()
            np.testing.assert_array_equal(ds[3:9, 5:7], data[3:9, 5:7])
            np.testing.assert_array_equal(ds[30:32, 30:32], data[30:32, 30:32])
            assert asked[1:] == [["c/7/7"]]  # (learned chunks are not asked for again)
            table = ds.store.residency_table()  # every chunk: one query of all rows
            assert asked[2:] == [None] and len(table) == 100
            np.testing.assert_array_equal(ds[...], data)
            assert len(asked) == 3


def test_a_chunk_never_written_is_asked_for_once(tmp_path):
    with _session(tmp_path) as s:
        s.create_dataset("e", SHAPE, "f4", CHUNKS, hint="LOCALDISK", fill_value=7).close()
        asked = _asked(s)
        with s.open_dataset("e") as ds:
            for _ in range(3):
                np.testing.assert_array_equal(ds[0:2, 0:2], 7)
                ds.clear_cache()
            assert asked == [["c/0/0"]]


def test_a_rewrite_committed_by_another_process_after_the_open_is_what_a_read_finds(tmp_path, data):
    with _session(tmp_path) as a, _session(tmp_path) as b:
        reader = a.open_dataset("d")
        with b.open_dataset("d", "r+") as writer:
            writer[0:8, 0:8] = -data[0:8, 0:8]
        # the reader never looked at these chunks: it learns the rows recorded now
        np.testing.assert_array_equal(reader[0:8, 0:8], -data[0:8, 0:8])
        copies = reader.store.res.copies("c/0/0")
        assert [(c.tier, c.state) for c in copies] == [("fast", "valid")]
        reader.close()


def test_a_write_of_a_chunk_not_looked_up_yet_is_announced_as_the_rewrite_it_is(tmp_path, data):
    """A write learns the chunk's rows first: the copy it replaces is catalogued, so the
    write is announced and its commit replaces that row (no second row, no orphan)."""
    with _session(tmp_path) as s:
        with s.open_dataset("d", "r+") as ds:
            announced = []
            announce = ds.store.commit.announce
            ds.store.commit.announce = lambda res, rows, *a, **kw: (
                announced.extend(c.key for c in rows) or announce(res, rows, *a, **kw)
            )
            ds[0:4, 0:4] = 1.0
            assert announced == ["c/0/0"]
        rows = [c for c in s.catalog.residency("d") if c.key == "c/0/0"]
        assert [(c.tier, c.state) for c in rows] == [("fast", "valid")]
        with s.open_dataset("d") as ds:
            np.testing.assert_array_equal(ds[0:4, 0:4], 1.0)
            np.testing.assert_array_equal(ds[4:40, :], data[4:40, :])
        assert fsck(s.catalog, s.tiers).clean


def test_the_checks_of_a_chunk_come_with_its_rows(tmp_path, data):
    with _session(tmp_path) as s, s.open_dataset("d") as ds:
        np.testing.assert_array_equal(ds[...], data)  # every copy read whole and checked
    with _session(tmp_path) as s:
        asked = _asked(s)
        checks_asked = []
        s.catalog.verified_copies = lambda *a: checks_asked.append(a)
        with s.open_dataset("d") as ds:
            store = ds.store
            assert store._checked == {}
            np.testing.assert_array_equal(ds[0:4, 0:8], data[0:4, 0:8])
            assert set(store._checked) == {"c/0/0", "c/0/1"}  # read in range, as checked before
            assert asked == [["c/0/0", "c/0/1"]] and checks_asked == []  # (in one query)


def test_lookups_of_every_kind_learn_the_rows_they_need():
    """The copy map learns on any lookup, not only through :meth:`Residency.learn`."""
    tiers = _model_tiers()
    rows = {
        k: ChunkCopy("d", k, "fast", 16, "crc32c:00000001", "valid", 0.0)
        for k in ("c/0", "c/1", "c/2")
    }
    asked: list[list[str] | None] = []

    def load(keys):
        asked.append(None if keys is None else list(keys))
        return [rows[k] for k in (rows if keys is None else keys) if k in rows], None

    res = Residency("d", [], tiers, load=load)
    assert res.copy_on("c/1", "fast") == rows["c/1"]
    assert res.copies("c/9") == [] and res.copies("c/9") == []
    assert res.fastest_readable_many(["c/0", "c/1", "c/9"])[0][0] == rows["c/0"]
    assert asked == [["c/1"], ["c/9"], ["c/0"]]
    assert res.learned_keys() == ["c/0", "c/1", "c/9"]
    assert res.chunk_keys() == ["c/0", "c/1", "c/2"]
    assert asked[3:] == [None] and res.learned_keys() is None
    res.learn(["c/5"])
    assert len(asked) == 4  # (all rows are held: nothing more to ask)


def test_a_session_takes_tier_usage_from_the_catalog_s_sums(tmp_path, data, monkeypatch):
    """Starting a session reads no copy row (a catalog of millions of rows would take
    seconds): the catalog sums the bytes per tier, and they are the copies' bytes."""
    from strataio.catalog.sqlite import SQLiteCatalog

    scans = []
    all_residency = SQLiteCatalog.all_residency
    monkeypatch.setattr(
        SQLiteCatalog, "all_residency", lambda self: scans.append(1) or all_residency(self)
    )
    with _session(tmp_path) as s:
        assert s.tiers["fast"].used == data.nbytes  # 100 raw chunks of 64 bytes
        assert s.usage() == {"fast": data.nbytes}
        s.create_dataset("f", (4, 4), "f4", (2, 2), hint="LOCALDISK")[...] = 1
        assert s.usage() == {"fast": data.nbytes + 64}
    assert scans == []


KEYS = [f"c/{i}" for i in range(4)]
TIERS = ["fast", "slow"]


class OnDemandResidency(RuleBasedStateMachine):
    """A residency learning rows on demand against a model: a chunk's rows are those the
    catalog held at its first lookup (of any kind), changed since only by this process;
    each chunk is asked for at most once (until it is unlearned); iterating learns every
    chunk not learned yet, and then nothing is asked for again. Another process changes the
    catalog between steps."""

    def __init__(self) -> None:
        super().__init__()
        self.tiers = _model_tiers()
        self.catalog: dict[str, dict[str, ChunkCopy]] = {}
        self.asked: list[str | None] = []
        self.view: dict[str, dict[str, ChunkCopy]] = {}  # the model of what res holds
        self.changed: set[str] = set()  # chunks with a change buffered here
        self.whole = False
        self.res = Residency("d", [], self.tiers, load=self._load)

    def _load(self, keys):
        self.asked.extend([None] if keys is None else keys)
        return self._rows(keys), None

    def _rows(self, keys):
        wanted = self.catalog if keys is None else {k: self.catalog.get(k, {}) for k in keys}
        return [c for per in wanted.values() for c in per.values()]

    def _looked_up(self, keys) -> None:
        for k in keys:
            if k not in self.view:
                self.view[k] = dict(self.catalog.get(k, {}))

    @rule(key=st.sampled_from(KEYS), tier=st.sampled_from(TIERS), n=st.integers(1, 9))
    def another_process_records(self, key, tier, n):
        self.catalog.setdefault(key, {})[tier] = ChunkCopy("d", key, tier, n, f"crc32c:{n:08x}")

    @rule(key=st.sampled_from(KEYS), tier=st.sampled_from(TIERS))
    def another_process_drops(self, key, tier):
        self.catalog.get(key, {}).pop(tier, None)

    @rule(
        keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=4),
        how=st.sampled_from(["learn", "many", "copies", "copy_on", "elsewhere", "catalogued"]),
    )
    def look_up(self, keys, how):
        res = self.res
        if how == "learn":
            res.learn(keys)
        elif how == "many":
            res.fastest_readable_many(keys)
        elif how == "elsewhere":
            res.elsewhere_only(keys, "slow")
        else:
            for k in keys:
                if how == "copies":
                    res.copies(k)
                elif how == "copy_on":
                    res.copy_on(k, "fast")
                else:
                    res.catalogued(k, "fast")
        self._looked_up(keys)

    @rule(key=st.sampled_from(KEYS), tier=st.sampled_from(TIERS), n=st.integers(10, 19))
    def this_process_records(self, key, tier, n):
        self._looked_up([key])  # (a change learns the chunk's rows first)
        copy = ChunkCopy("d", key, tier, n, f"crc32c:{n:08x}")
        self.res.add(copy)
        self.view[key][tier] = copy
        self.changed.add(key)

    @rule(keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=4))
    def refresh_from_the_catalog(self, keys):
        """A chunk not learned yet is learned from the rows the refresh read; a learned one
        takes them unless this process changed it (its rows here are newer)."""

        class Catalog:
            residency = staticmethod(lambda name, ks: self._rows(ks))

        asked = len(self.asked)
        self.res.refresh_from(Catalog(), keys)
        assert len(self.asked) == asked  # (it learns from the rows it read: no query more)
        for k in dict.fromkeys(keys):
            if k not in self.view or k not in self.changed:
                self.view[k] = dict(self.catalog.get(k, {}))

    @rule()
    def unlearn(self):
        """Every chunk learned but those this process changed is forgotten (asked for again
        at its next lookup, as by a process opening the dataset anew)."""
        forgotten = set(self.res.unlearn())
        expect = set(self.view) - self.changed
        # (a whole map also forgets that the chunks it holds no rows of have none)
        assert forgotten <= expect and (self.whole or forgotten == expect)
        for k in expect:
            del self.view[k]
        self.asked = [k for k in self.asked if k is not None and k not in expect]
        self.whole = False

    @rule()
    def iterate(self):
        self.res.chunk_keys()
        self._looked_up(KEYS)  # (every chunk, as it was then: a whole map learns no more)
        self.whole = True

    @invariant()
    def holds_what_the_catalog_held_at_the_first_lookup(self):
        held = {k: dict(v) for k, v in dict.items(self.res._copies) if v}
        assert held == {k: v for k, v in self.view.items() if v}

    @invariant()
    def asks_for_each_chunk_once(self):
        named = [k for k in self.asked if k is not None]
        assert len(named) == len(set(named))
        assert self.asked.count(None) <= 1
        assert None not in self.asked or self.asked[-1] is None  # (then nothing more)
        assert (self.res.learned_keys() is None) == self.whole


OnDemandResidency.TestCase.settings = settings(
    max_examples=examples(150), stateful_step_count=30, deadline=None
)
test_on_demand_residency = OnDemandResidency.TestCase


def test_closing_a_dataset_only_read_writes_nothing_to_the_catalog(tmp_path, data, monkeypatch):
    """Access times of chunks only read wait (Commit.TOUCH_DELAY_S) and are recorded
    together: by a timer once the oldest has waited, at the session's close, or before an
    eviction round of this process."""
    with _session(tmp_path) as s:
        monkeypatch.setattr(s.commit, "TOUCH_DELAY_S", 0.5)
        touched = []
        touch = s.catalog.touch
        s.catalog.touch = lambda ds, keys, when: (
            touched.append((ds, list(keys))) or touch(ds, keys, when)
        )
        for box in (np.s_[0:4, 0:4], np.s_[4:8, 0:4]):
            with s.open_dataset("d") as ds:
                np.testing.assert_array_equal(ds[box], data[box])
        assert touched == []
        deadline = time.monotonic() + 10  # (the timer: TOUCH_DELAY_S after the first close)
        while not touched and time.monotonic() < deadline:
            time.sleep(0.05)
        assert touched == [("d", ["c/0/0", "c/1/0"])]
        monkeypatch.setattr(s.commit, "TOUCH_DELAY_S", 0.0)
        with s.open_dataset("d") as ds:
            np.testing.assert_array_equal(ds[8:12, 0:4], data[8:12, 0:4])
        assert touched[1:] == [("d", ["c/2/0"])]
        rows = {c.key: c.last_access for c in s.catalog.residency("d")}
        assert rows["c/2/0"] >= rows["c/0/0"] > rows["c/3/0"]
        monkeypatch.setattr(s.commit, "TOUCH_DELAY_S", 3600.0)
        with s.open_dataset("d") as ds:
            ds[12:16, 0:4]
        assert len(touched) == 2
    assert touched[2:] == [("d", ["c/3/0"])]  # at the session's close


def test_an_eviction_round_records_the_access_times_kept_back_first(tmp_path, data):
    tiers = TierSet(
        [
            Tier("fast", PosixBackend(tmp_path / "fast"), "localdisk", order=0),
            Tier("slow", PosixBackend(tmp_path / "slow"), "remotedisk", order=1),
        ]
    )
    with strataio.Session(tiers=tiers, catalog=tmp_path / "cat.db") as s:
        touched = []
        touch = s.catalog.touch
        s.catalog.touch = lambda ds, keys, when: touched.append(list(keys)) or touch(ds, keys, when)
        with s.open_dataset("d") as ds:
            ds[0:4, 0:4]
        assert touched == []
        fast = s.tiers["fast"]
        fast.capacity = fast.used  # (full: a round has something to do)
        s.placement.make_room(fast, 64)
        assert touched == [["c/0/0"]]


def _two_tiers(root: Path) -> TierSet:
    return TierSet(
        [
            Tier("fast", PosixBackend(root / "fast"), "localdisk", order=0),
            Tier("slow", PosixBackend(root / "slow"), "remotedisk", order=1),
        ]
    )


def test_a_dataset_opened_again_while_its_mark_lingers_writes_nothing_to_the_catalog(
    tmp_path, data, monkeypatch
):
    """Closing leaves the dataset's in-use mark for Catalog.MARK_LINGER_S: opening it again
    meanwhile, reading and closing cost no catalog write; then the mark goes."""
    with _session(tmp_path) as s:
        monkeypatch.setattr(s.catalog, "MARK_LINGER_S", 3600.0)
        monkeypatch.setattr(s.commit, "TOUCH_DELAY_S", 3600.0)
        with s.open_dataset("d") as ds:
            np.testing.assert_array_equal(ds[...], data)  # (every copy's check recorded)
        writes = []
        write = s.catalog._write
        monkeypatch.setattr(s.catalog, "_write", lambda **kw: writes.append(kw) or write(**kw))
        for box in (np.s_[0:4, 0:4], np.s_[9:30, 2:3], np.s_[...]):
            with s.open_dataset("d") as ds:
                np.testing.assert_array_equal(ds[box], data[box])
        assert writes == []
        assert s.catalog.lingering_marks() == {(s.writer, "d")}
        assert [w.datasets for w in s.catalog.writers()] == [("d",)]
        s.catalog.end_lingering()
        assert len(writes) == 1 and s.catalog.lingering_marks() == set()
        assert [w.datasets for w in s.catalog.writers()] == [()]


def test_a_lingering_mark_keeps_other_processes_eviction_rounds_off_but_not_this_one(
    tmp_path, data
):
    """Another session (its own catalog object and writer) sees a dataset closed here as in
    use while its mark lingers: it claims nothing of it for eviction, and opens it without
    waiting. This session's own eviction round takes the lingering mark as its claim."""
    with (
        strataio.Session(tiers=_two_tiers(tmp_path), catalog=tmp_path / "cat.db") as mine,
        strataio.Session(tiers=_two_tiers(tmp_path), catalog=tmp_path / "cat.db") as other,
    ):
        mine.catalog.MARK_LINGER_S = 3600.0
        with mine.open_dataset("d") as ds:
            np.testing.assert_array_equal(ds[...], data)
        assert "d" in other.catalog.datasets_in_use()
        assert "d" not in mine.catalog.datasets_in_use()
        assert other.catalog.claim_eviction("d") is False
        t0 = time.monotonic()
        with other.open_dataset("d") as theirs:  # (a lingering mark is no claim: no wait)
            np.testing.assert_array_equal(theirs[0:4, 0:4], data[0:4, 0:4])
        assert time.monotonic() - t0 < 1.0
        other.catalog.end_lingering()
        fast = mine.tiers["fast"]
        fast.capacity = fast.used  # full: a round must evict something of "d"
        assert mine.placement.make_room(fast, 4 * 4 * 4)
        assert mine.catalog.lingering_marks() == set()  # became the claim, released after
        assert [w.datasets for w in mine.catalog.writers() if w.id == mine.writer] == [()]
        assert {c.tier for c in mine.catalog.residency("d")} == {"fast", "slow"}
        with mine.open_dataset("d") as ds:
            np.testing.assert_array_equal(ds[...], data)


def test_a_store_left_as_a_new_process_finds_it_learns_its_chunks_again(tmp_path, data):
    """``forget_learned``: the checks found so far go to the catalog and the rows learned
    are forgotten, but those of chunks with a change of this process still in flight; the
    next read learns its chunks' rows with their checks in one query and reads in range."""
    with _session(tmp_path) as s, s.open_dataset("d", "r+") as ds:
        np.testing.assert_array_equal(ds[...], data)  # every copy read whole and checked
        ds[0:4, 0:4] = -1.0  # c/0/0 rewritten: its new row is not committed yet
        want = data.copy()
        want[0:4, 0:4] = -1.0
        asked = []
        copies = ds.store.res._copies
        load = copies.load
        copies.load = lambda keys: asked.append(sorted(keys)) or load(keys)
        ds.store.forget_learned()
        ds.clear_cache()
        assert ds.store._checked == {}
        np.testing.assert_array_equal(ds[0:8, 0:4], want[0:8, 0:4])
        assert asked == [["c/1/0"]]  # (c/0/0's rows here are newer than the catalog's)
        assert "c/1/0" in ds.store._checked  # checked before: read in range at once
    with _session(tmp_path) as s, s.open_dataset("d") as ds:
        np.testing.assert_array_equal(ds[...], want)


def test_a_dataset_opened_again_takes_the_rows_its_last_handle_learned_while_they_hold(
    tmp_path, data
):
    """A closed dataset leaves the rows it learned to its session (``Session.row_memo``):
    the next handle takes a chunk's rows from there while the catalog's generation of the
    dataset is the one they were learned at (a small query per section, no rows), and asks
    for them again once another process's commit has moved it on."""
    box = np.s_[3:9, 5:7]  # c/0/1, c/1/1, c/2/1
    with _session(tmp_path) as s:
        with s.open_dataset("d") as ds:
            np.testing.assert_array_equal(ds[box], data[box])
        assert len(s.row_memo) == 1
        asked = _asked(s)
        with s.open_dataset("d") as ds:
            ds.clear_cache()
            np.testing.assert_array_equal(ds[box], data[box])
            assert asked == []
            np.testing.assert_array_equal(ds[30:32, 30:32], data[30:32, 30:32])
            assert asked == [["c/7/7"]]  # (not learned before: asked for)
            assert "c/0/1" in ds.store.verified_chunks()  # (its check came along too)
        with _session(tmp_path) as other, other.open_dataset("d", "r+") as theirs:
            theirs[4:8, 4:8] = -1.0  # c/1/1 rewritten: the generation moves on
        want = data.copy()
        want[4:8, 4:8] = -1.0
        with s.open_dataset("d") as ds:
            ds.clear_cache()
            np.testing.assert_array_equal(ds[box], want[box])
            assert asked[1:] == [["c/0/1", "c/1/1", "c/2/1"]]


def test_a_handle_that_wrote_leaves_no_rows_behind(tmp_path, data):
    """Its own commit moved the generation on: what it learned before is not the catalog's
    any more, and the next handle asks for its rows."""
    with _session(tmp_path) as s:
        with s.open_dataset("d", "r+") as ds:
            ds[0:4, 0:4] = 5.0
        assert len(s.row_memo) == 0
        with s.open_dataset("d") as ds:
            np.testing.assert_array_equal(ds[0:4, 0:4], 5.0)
        assert len(s.row_memo) == 1


def test_the_row_memo_keeps_at_most_its_chunks():
    memo = RowMemo()
    memo.MAX_CHUNKS = 5

    def learned(n: int) -> LearnedRows:
        return LearnedRows(1, {f"c/{i}": {} for i in range(n)}, {})

    memo.keep("a", learned(2))
    memo.keep("b", learned(3))
    assert memo.get("a") is not None and memo.get("b") is not None
    memo.keep("c", learned(2))  # 7 > 5: "a", closed longest ago, goes
    assert memo.get("a") is None and memo.get("b") is not None and memo.get("c") is not None
    memo.keep("d", learned(6))  # more than it keeps at all: not kept
    assert memo.get("d") is None and len(memo) == 2
    memo.forget("b")
    assert len(memo) == 1
    memo.forget()
    assert len(memo) == 0
    # rows of one generation add up; another generation's take their place
    memo.keep("a", LearnedRows(1, {"c/0": {}}, {}))
    memo.keep("a", LearnedRows(1, {"c/1": {}}, {}))
    assert sorted(memo.get("a").rows) == ["c/0", "c/1"]
    assert memo.take("a", 1, ["c/1", "c/9"]) == ([], {}, ["c/9"])
    assert memo.take("a", 2, ["c/1"]) is None  # (the catalog moved on: dropped)
    assert memo.get("a") is None and len(memo) == 0
    memo.keep("a", LearnedRows(1, {"c/0": {}}, {}))
    memo.keep("a", LearnedRows(2, {"c/2": {}}, {}))
    assert sorted(memo.get("a").rows) == ["c/2"]


class _GenerationCatalog:
    """The two queries a :class:`RowLoader` asks, over rows in a dict, with a generation
    that every change moves on."""

    def __init__(self) -> None:
        self.rows: dict[str, dict[str, ChunkCopy]] = {}
        self.gen = 17
        self.queries = 0

    def generation(self, name):
        return self.gen

    def residency_checked(self, name, keys):
        self.queries += 1
        wanted = self.rows if keys is None else {k: self.rows.get(k, {}) for k in keys}
        return [c for per in wanted.values() for c in per.values()], [], self.gen


class ReopenedResidency(RuleBasedStateMachine):
    """Handles of one dataset opened and closed in turn, each learning rows on demand
    through a RowLoader over a session's RowMemo, while another process changes the
    catalog: a handle's rows are always those the catalog held at the chunk's first lookup
    in that handle, and the memo, while its generation is the catalog's, holds the
    catalog's rows."""

    def __init__(self) -> None:
        super().__init__()
        self.tiers = _model_tiers()
        self.catalog = _GenerationCatalog()
        self.memo = RowMemo()
        self.res: Residency | None = None
        self.loader: RowLoader | None = None
        self.view: dict[str, dict[str, ChunkCopy]] = {}

    @rule(key=st.sampled_from(KEYS), tier=st.sampled_from(TIERS), n=st.integers(1, 9))
    def another_process_records(self, key, tier, n):
        self.catalog.rows.setdefault(key, {})[tier] = ChunkCopy(
            "d", key, tier, n, f"crc32c:{n:08x}"
        )
        self.catalog.gen += 1

    @rule(key=st.sampled_from(KEYS), tier=st.sampled_from(TIERS))
    def another_process_drops(self, key, tier):
        if self.catalog.rows.get(key, {}).pop(tier, None) is not None:
            self.catalog.gen += 1

    @rule()
    def open(self):
        if self.res is None:
            self.loader = RowLoader(self.catalog, "d", self.memo)
            self.res = Residency("d", [], self.tiers, load=self.loader)
            self.view = {}

    @rule(keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=4), many=st.booleans())
    def look_up(self, keys, many):
        if self.res is None:
            return
        if many:
            self.res.learn(keys)
        else:
            for k in keys:
                self.res.copies(k)
        for k in keys:
            if k not in self.view and not self._whole():
                self.view[k] = dict(self.catalog.rows.get(k, {}))

    def _whole(self) -> bool:
        return self.res is not None and self.res.learned_keys() is None

    @rule()
    def iterate(self):
        if self.res is None or self._whole():
            return
        self.res.chunk_keys()
        for k in KEYS:
            self.view.setdefault(k, dict(self.catalog.rows.get(k, {})))

    @rule()
    def close(self):
        if self.res is None:
            return
        rows, whole = self.res.learned_rows()
        learned = self.loader.learned(rows, {}, whole=whole)
        if learned is not None:
            self.memo.keep("d", learned)
        self.res = self.loader = None

    @rule()
    def forget(self):
        self.memo.forget()

    @invariant()
    def a_handle_holds_what_the_catalog_held_at_each_first_lookup(self):
        if self.res is not None:
            held = {k: dict(v) for k, v in dict.items(self.res._copies) if v}
            assert held == {k: v for k, v in self.view.items() if v}

    @invariant()
    def the_memo_holds_the_catalog_s_rows_while_its_generation_holds(self):
        kept = self.memo.get("d")
        if kept is not None and kept.generation == self.catalog.gen:
            for key, rows in kept.rows.items():
                assert rows == self.catalog.rows.get(key, {})
            if kept.whole:
                assert {k for k, v in self.catalog.rows.items() if v} <= set(kept.rows)


ReopenedResidency.TestCase.settings = settings(
    max_examples=examples(150), stateful_step_count=30, deadline=None
)
test_reopened_residency = ReopenedResidency.TestCase


def test_a_check_made_by_a_handle_the_memo_served_is_kept_for_the_next(tmp_path, data):
    """A handle whose rows all came from the memo but that checked a copy itself (read it
    whole) leaves that check to the next handle, which reads the copy in range."""
    with _session(tmp_path) as s:
        with s.open_dataset("d") as ds:
            assert ds.store.res.chunk_keys()  # every row learned, no copy read
        with s.open_dataset("d") as ds:
            np.testing.assert_array_equal(ds[0:4, 0:4], data[0:4, 0:4])  # read whole
            assert not ds.store.res._copies.load.fetched
        with s.open_dataset("d") as ds:
            whole = []
            check = ds.store._check_whole
            ds.store._check_whole = lambda *a: whole.append(a[0]) or check(*a)
            np.testing.assert_array_equal(ds[0:4, 0:4], data[0:4, 0:4])
            assert whole == [] and "c/0/0" in ds.store._checked


def test_unlearning_a_whole_map_keeps_the_chunks_this_residency_changed():
    """After every row was learned, a chunk whose last copy this residency forgot (its
    delete not committed yet) stays as it is here: unlearning does not bring the catalog's
    row back."""
    tiers = _model_tiers()
    rows = {
        k: ChunkCopy("d", k, "fast", 16, "crc32c:00000001", "valid", 0.0) for k in ("c/0", "c/1")
    }
    asked: list[list[str] | None] = []

    def load(keys):
        asked.append(None if keys is None else list(keys))
        return [rows[k] for k in (rows if keys is None else keys) if k in rows], None

    res = Residency("d", [], tiers, load=load)
    assert res.chunk_keys() == ["c/0", "c/1"] and asked == [None]
    assert res.remove("c/0", "fast") is not None  # (its delete buffered)
    assert res.unlearn() == ["c/1"]
    assert res.copies("c/0") == [] and asked == [None]  # (not asked for: this one's own)
    assert res.copies("c/1") == [rows["c/1"]] and asked == [None, ["c/1"]]


def test_a_row_recorded_carries_the_latest_access_known_here():
    """A read's access time is noted per chunk, not in the row objects; a row this process
    records (here a copy added) carries the later of its own time and that one."""
    tiers = _model_tiers()
    row = ChunkCopy("d", "c/0", "fast", 16, "crc32c:00000001", "valid", 1.0)
    res = Residency("d", [row], tiers)
    res.touch(["c/0"], when=50.0)
    assert res.copy_on("c/0", "fast").last_access == 1.0 and res.last_access(row) == 50.0
    res.add(ChunkCopy("d", "c/0", "slow", 16, "crc32c:00000001", "valid", 2.0))
    (up,) = res.take_batch().upserts
    assert (up.tier, up.last_access) == ("slow", 50.0)


def test_a_chunk_another_process_writes_first_is_read_after_its_flush(tmp_path):
    """A handle that read a chunk no one had written (its fill value) kept that for good:
    another process's first write of it, flushed, showed in no object the handle read. A
    read of a chunk with no copy asks for the catalog's generation (one small query) and
    learns the chunk's rows again where it moved on."""
    with _session(tmp_path) as a, _session(tmp_path) as b:
        a.create_dataset("e", SHAPE, "f4", CHUNKS, hint="LOCALDISK", fill_value=7).close()
        reader = a.open_dataset("e")
        np.testing.assert_array_equal(reader[0:2, 0:2], 7)
        with b.open_dataset("e", "r+") as writer:
            writer[0:2, 0:2] = 1
        np.testing.assert_array_equal(reader[0:2, 0:2], 1)
        reader.close()
