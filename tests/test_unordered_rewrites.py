"""Two processes rewrite one chunk unordered while a third reads it: every interleaving.

Each writer's rewrite has three steps another process can come between: its announcement
in the catalog (``a``), the put of its object (``p``) and its commit (``c``, at flush). The
tests run both writers' steps in each of the 20 orders that keep each writer's own order,
with a reader reading the chunk after every step, and check what the README promises of
unordered writes: either value may stand, a reader gets the old value, one of the new ones
or ``ChunkChangedError``, never a ``ChecksumError`` (which says the bytes are no writer's),
and once both writers have flushed, the value that stands is one of theirs and fsck finds
nothing wrong.

In four of the orders a writer's commit came after the other writer had announced its own
rewrite over the first's, but before the other's put: the commit settled its row to its own
bytes, the other's put then landed, and until the other's commit the row named bytes the
object no longer held (a reader reported a ``ChecksumError``). Now a write's row replaces only
its own announcement; another's stays for that writer's commit, which settles it to the bytes
there (its own, or the first writer's where that put came last). The writers are Sessions of
one process on threads, each step let through by a hook, so each order runs as written.

A writer killed after a put that landed over the other writer's committed rewrite (its own
announcement replaced by the other's) left bytes no row named, for good: the catalog now
notes such replaced announcements, and fsck settles the row to a dead writer's bytes.
"""

from __future__ import annotations

import itertools
import sys
import threading

import numpy as np
import pytest

import strataio
from strataio.errors import ChunkChangedError
from strataio.tiers.fsck import Action, Kind, fsck
from strataio.tiers.residency import object_key
from strataio.tiers.store import TieredChunkStore
from test_concurrent_sessions import CONFIG  # (a fast local disk and an archive)

KEY = "c/0/0"
ORIGINAL, A_VALUE, B_VALUE = 7.0, 1.0, 2.0
#: whether each writer reads the chunk once it opened the dataset, before any step: its view
#: of the chunk's row is then older than the other writer's announcement
READ_FIRST = False


def _orders() -> list[str]:
    """Each interleaving of A's and B's steps ``a``, ``p``, ``c`` (each in its own order), as
    a string such as ``"AaBaApAcBpBc"``."""
    out = []
    for mine in itertools.combinations(range(6), 3):
        steps, ia, ib = [], 0, 0
        for i in range(6):
            if i in mine:
                steps.append("A" + "apc"[ia])
                ia += 1
            else:
                steps.append("B" + "apc"[ib])
                ib += 1
        out.append("".join(steps))
    return out


class _Killed(BaseException):
    """A writer's thread stops here, as its process would at a kill -9."""


class _Writer:
    """A Session rewriting chunk ``KEY`` on a thread of its own, each of its steps waiting
    for :meth:`step`."""

    def __init__(self, root, value: float) -> None:
        self.session = strataio.Session(config=root / "strataio.toml")
        self.ds = self.session.open_dataset("a", "r+")
        if READ_FIRST:
            self.ds[0:10, 0:10]
        self.value = value
        self.go = {k: threading.Event() for k in "apc"}
        self.done = {k: threading.Event() for k in "apc"}
        self.failed: BaseException | None = None
        self.killed = False
        self.ended = threading.Event()
        commit, backend = self.session.commit, self.session.tiers["fast"].backend
        announce, put = commit.announce, backend.put_versioned
        target = object_key("a", KEY)

        def announced(*args, **kwargs):
            got = announce(*args, **kwargs)
            if not got:  # (announced whole: rows changed since they were learned come back)
                self.done["a"].set()
            return got

        def put_versioned(key, data, *args, **kwargs):
            if key != target or self.done["p"].is_set():
                return put(key, data, *args, **kwargs)
            self._wait("p")
            got = put(key, data, *args, **kwargs)
            self.done["p"].set()
            return got

        commit.announce = announced
        backend.put_versioned = put_versioned
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self._wait("a")
            self.ds[0:10, 0:10] = self.value
            self._wait("c")
            self.ds.flush()
            self.done["c"].set()
        except BaseException as exc:  # (reported by step)
            self.failed = exc
        finally:
            self.ended.set()

    def _wait(self, name: str) -> None:
        self.go[name].wait()
        if self.killed:
            raise _Killed

    def kill(self) -> None:
        """The writer's process dies here: its liveness token goes (as the system releases
        a dead process's lock) and it takes no further step."""
        self.killed = True
        self.session.catalog._locks.release(self.session.writer)
        for go in self.go.values():
            go.set()
        self.thread.join(10)

    def step(self, name: str) -> None:
        self.go[name].set()
        while not self.done[name].wait(0.01):
            # (done is set before ended: looked at again, a step that ended the run is done)
            if self.ended.is_set() and not self.done[name].is_set():
                raise AssertionError(f"the writer ended before step {name!r}: {self.failed!r}")

    def close(self) -> None:
        """Let the writer's steps not taken yet run (a test that failed midway), then close
        (a killed writer's Session stays as its dead process left it)."""
        for go in self.go.values():
            go.set()
        self.thread.join(10)
        if not self.killed:
            self.session.close()


def _read(ds) -> float | str:
    """The chunk's one value, or ``"changed"`` where the read says the chunk kept changing."""
    ds.clear_cache()
    try:
        got = np.unique(ds[0:10, 0:10])
    except ChunkChangedError:
        return "changed"
    assert got.size == 1, f"a read mixed values: {got}"
    return float(got[0])


def _run(root, order: str, kill: str = "") -> list[float | str]:
    """Run ``order`` (killing each writer ``kill`` names after the step it gives: ``"A2"``
    kills A after its second step, ``"A1B2"`` both), reading the chunk after every step;
    returns what each read saw."""
    kills = {kill[i]: int(kill[i + 1]) for i in range(0, len(kill), 2)}
    (root / "strataio.toml").write_text(CONFIG)
    with (
        strataio.Session(config=root / "strataio.toml") as s,
        s.create_dataset("a", (20, 20), "f4", (10, 10), hint="LOCALDISK") as ds,
    ):
        ds[...] = ORIGINAL
    writers = {"A": _Writer(root, A_VALUE), "B": _Writer(root, B_VALUE)}
    reading = strataio.Session(config=root / "strataio.toml")
    seen: list[float | str] = []
    taken = {"A": 0, "B": 0}
    try:
        reader = reading.open_dataset("a")
        for i in range(0, len(order), 2):
            who = order[i]
            if writers[who].killed:
                continue
            writers[who].step(order[i + 1])
            taken[who] += 1
            if kills.get(who) == taken[who]:
                writers[who].kill()
            seen.append(_read(reader))
        for w in writers.values():
            assert w.failed is None or w.killed, w.failed
    finally:
        for w in writers.values():
            w.close()
        reading.close()
    return seen


@pytest.mark.parametrize("order", _orders())
def test_a_reader_of_two_unordered_rewrites_sees_a_value_a_writer_wrote(
    tmp_path, monkeypatch, order
):
    monkeypatch.setattr(TieredChunkStore, "REREAD_PAUSE", 0.001)
    seen = _run(tmp_path, order)
    assert set(seen) <= {ORIGINAL, A_VALUE, B_VALUE, "changed"}, seen
    with strataio.Session(config=tmp_path / "strataio.toml") as s:
        assert _read(s.open_dataset("a")) in (A_VALUE, B_VALUE)
        assert fsck(s.catalog, s.tiers).clean


@pytest.mark.parametrize("order", _orders())
def test_writers_that_learned_the_chunk_before_either_announced_agree_with_a_reader(
    tmp_path, monkeypatch, order
):
    """Each writer learned the chunk's row (a read) before either announced its rewrite, so
    the second announcement is made over a row its writer did not know. It named the wrong
    old bytes (the chunk's original value, not the first writer's), and where the first
    writer's put came last (AaBaBpAp...) the commit that left the second writer's write out
    settled the row back to the original while the object held the first writer's bytes: a
    flush raised ObjectError ("replaced by something no write stands for") and readers got
    ChecksumError until the other commit. Announcements are now made only over the row the
    writer knows, learning it again where it changed."""
    monkeypatch.setattr(TieredChunkStore, "REREAD_PAUSE", 0.001)
    monkeypatch.setattr(sys.modules[__name__], "READ_FIRST", True)
    seen = _run(tmp_path, order)  # (fails where a writer's step raised)
    assert set(seen) <= {ORIGINAL, A_VALUE, B_VALUE, "changed"}, seen
    with strataio.Session(config=tmp_path / "strataio.toml") as s:
        assert _read(s.open_dataset("a")) in (A_VALUE, B_VALUE)
        assert fsck(s.catalog, s.tiers).clean


@pytest.mark.parametrize("order", _orders())
def test_a_writer_putting_the_old_value_back_is_no_lost_write(tmp_path, monkeypatch, order):
    """B writes the chunk's original value back while A rewrites it: in every order each
    flush returns (where B's put landed last, the value A's write replaced stands, named by
    a row: B's, no loss of A's), and a reader sees a value a writer wrote. In four orders
    A's flush raised an ObjectError saying that no write stood for the object there."""
    monkeypatch.setattr(TieredChunkStore, "REREAD_PAUSE", 0.001)
    monkeypatch.setattr(sys.modules[__name__], "B_VALUE", ORIGINAL)
    seen = _run(tmp_path, order)  # (fails where a writer's step raised)
    assert set(seen) <= {ORIGINAL, A_VALUE, "changed"}, seen
    with strataio.Session(config=tmp_path / "strataio.toml") as s:
        assert _read(s.open_dataset("a")) in (A_VALUE, ORIGINAL)
        assert fsck(s.catalog, s.tiers).clean


@pytest.mark.parametrize(
    ("order", "kill"),
    [(o, k) for o in _orders() for k in ("A1", "A2", "B1", "B2", "A1B1", "A1B2", "A2B1", "A2B2")],
)
def test_a_writer_killed_midway_leaves_a_chunk_fsck_settles(tmp_path, monkeypatch, order, kill):
    """One writer, or both, dies after its first or second step: reads in the meantime see
    a value some writer wrote, and ``fsck --repair`` leaves a clean catalog whose chunk
    reads as one of the values written (a dead writer's, where its put landed last).

    With both killed, a rewrite announced over the other's announcement after that writer
    died names the bytes its object holds as the old ones (read there: a row names one old
    version only). Named after the dead writer's new checksum, as after a live one's, a
    chunk whose dead writer never put read as corrupt for good (20 of those 80 cases)."""
    monkeypatch.setattr(TieredChunkStore, "REREAD_PAUSE", 0.001)
    seen = _run(tmp_path, order, kill)
    assert set(seen) <= {ORIGINAL, A_VALUE, B_VALUE, "changed"}, seen
    with strataio.Session(config=tmp_path / "strataio.toml") as s:
        fsck(s.catalog, s.tiers, repair=True)
        assert fsck(s.catalog, s.tiers).clean
        assert _read(s.open_dataset("a")) in (ORIGINAL, A_VALUE, B_VALUE)


@pytest.mark.parametrize("order", ["AaBaBpBcApAc", "BaAaApAcBpBc"])
@pytest.mark.parametrize("killed", [True, False])
def test_a_put_after_the_commit_of_the_rewrite_announced_over_it_is_settled(
    tmp_path, monkeypatch, order, killed
):
    """The first writer's announcement is replaced by the second's, which is put and
    committed before the first writer's put. Had the first writer died then, no row named
    the bytes its object held: the chunk read as corrupt and fsck could not repair it. The
    catalog notes the replaced announcement (Catalog.overtaken); fsck, also without verify
    (such a copy is always read), settles the row to the dead writer's bytes and clears the
    note. A writer that lives commits its rewrite, which clears the note."""
    monkeypatch.setattr(TieredChunkStore, "REREAD_PAUSE", 0.001)
    first = order[0]
    _run(tmp_path, order, f"{first}2" if killed else "")
    value = A_VALUE if first == "A" else B_VALUE
    with strataio.Session(config=tmp_path / "strataio.toml") as s:
        notes = s.catalog.overtaken()
        assert [(e.key, e.tier) for e in notes] == ([(KEY, "fast")] if killed else [])
        if killed:
            report = fsck(s.catalog, s.tiers, verify=False)
            assert [(f.kind, f.action) for f in report.findings] == [(Kind.STATE, Action.ADOPT)]
            fsck(s.catalog, s.tiers, repair=True, verify=False)
            assert s.catalog.overtaken() == []
        assert fsck(s.catalog, s.tiers).clean
        assert _read(s.open_dataset("a")) == value


def test_fsck_leaves_a_live_writers_put_over_the_others_commit_to_its_flush(tmp_path):
    """As above, the first writer alive after its put: fsck leaves the chunk to it (in
    flight: its flush settles the row), and after that flush finds nothing."""
    (tmp_path / "strataio.toml").write_text(CONFIG)
    with (
        strataio.Session(config=tmp_path / "strataio.toml") as s,
        s.create_dataset("a", (20, 20), "f4", (10, 10), hint="LOCALDISK") as ds,
    ):
        ds[...] = ORIGINAL
    writers = {"A": _Writer(tmp_path, A_VALUE), "B": _Writer(tmp_path, B_VALUE)}
    try:
        for who, step in ("Aa", "Ba", "Bp", "Bc", "Ap"):
            writers[who].step(step)
        with strataio.Session(config=tmp_path / "strataio.toml") as s:
            found = [(f.kind, f.action, f.detail) for f in fsck(s.catalog, s.tiers).findings]
            assert [f[:2] for f in found] == [(Kind.IN_FLIGHT, Action.LEAVE)], found
            assert "its put may land yet" in found[0][2]
            fsck(s.catalog, s.tiers, repair=True)
            assert len(s.catalog.overtaken()) == 1  # (left to its writer)
        writers["A"].step("c")
    finally:
        for w in writers.values():
            w.close()
    with strataio.Session(config=tmp_path / "strataio.toml") as s:
        assert s.catalog.overtaken() == [] and fsck(s.catalog, s.tiers).clean
        assert _read(s.open_dataset("a")) == A_VALUE


def test_a_rewrite_whose_row_keeps_changing_gives_up_with_nothing_put(tmp_path, monkeypatch):
    """Where the row a rewrite is announced over changes at every look (other processes
    rewriting the chunk without end), the write gives up after ANNOUNCE_TRIES with
    ExistsError naming the chunk and saying nothing was put; the chunk keeps its value."""
    from strataio.errors import ExistsError
    from strataio.tiers.commit import Commit

    (tmp_path / "strataio.toml").write_text(CONFIG)
    with strataio.Session(config=tmp_path / "strataio.toml") as s:
        with s.create_dataset("a", (20, 20), "f4", (10, 10), hint="LOCALDISK") as ds:
            ds[...] = ORIGINAL
        ds = s.open_dataset("a", "r+")
        ds[0:10, 0:10]  # (its row learned)
        tries = []

        def always_changed(self, res, intents, expect=None, *, partly=False):
            tries.append(expect)
            return [c.key for c in intents] if partly else []

        monkeypatch.setattr(Commit, "announce", always_changed)
        with pytest.raises(ExistsError, match=r"c/0/0 on tier 'fast' changed 8 times") as err:
            ds[0:10, 0:10] = A_VALUE
        assert "nothing was put" in str(err.value)
        monkeypatch.undo()
        assert len(tries) == TieredChunkStore.ANNOUNCE_TRIES and all(tries)
        ds.close()
        ds = s.open_dataset("a")
        assert _read(ds) == ORIGINAL
        ds.close()


def test_a_note_stays_where_fsck_could_not_settle_the_chunk(tmp_path, monkeypatch):
    """fsck plans to settle a chunk to a dead writer's bytes (its put landed after the
    other's commit), but before the repair another writer announces a rewrite there, and
    then dies before its put: the repair of that row is left out, and the note stays, so
    that a later fsck settles the chunk to those bytes. fsck cleared the note all the same,
    and the chunk, whose object holds bytes no row names, read as corrupt for good."""
    from strataio.catalog import ChunkCopy
    from strataio.tiers.fsck import apply, inspect, plan

    monkeypatch.setattr(TieredChunkStore, "REREAD_PAUSE", 0.001)
    _run(tmp_path, "AaBaBpBcApAc", "A2")
    with strataio.Session(config=tmp_path / "strataio.toml") as s:
        p = plan(inspect(s.catalog, s.tiers, verify=False))
        (row,) = s.catalog.residency("a", [KEY])
        gone = "w-gone"  # (a writer that announced its rewrite, then died before its put)
        over = ChunkCopy(*row[:4], "c-other", "in-transit", row.last_access, row.checksum, gone)
        s.catalog.commit([over], durable=False, expect={row[:3]: (row.state, row.checksum)})
        apply(p, s.catalog, s.tiers)
        assert len(s.catalog.overtaken()) == 1
        fsck(s.catalog, s.tiers, repair=True)
        assert fsck(s.catalog, s.tiers).clean and s.catalog.overtaken() == []
        assert _read(s.open_dataset("a")) == A_VALUE


def test_a_rewrite_by_a_writer_that_knew_no_copy_notes_the_announcement_it_replaces(
    tmp_path, monkeypatch
):
    """B learned the chunk before it was first written (no copy then), so its rewrite is put
    as a new object, found one there, and is announced over the row there: A's announced
    rewrite. That announcement replaced A's unconditionally, naming A's old bytes as the
    ones it replaced and noting nothing, so where A's put landed after B's commit and A died
    the chunk read as corrupt for good. It is now made as any rewrite's is, over the row
    read there: A's announcement is noted, and fsck settles the chunk to A's bytes."""
    monkeypatch.setattr(TieredChunkStore, "REREAD_PAUSE", 0.001)
    (tmp_path / "strataio.toml").write_text(CONFIG)
    with strataio.Session(config=tmp_path / "strataio.toml") as s:
        s.create_dataset("a", (20, 20), "f4", (10, 10), hint="LOCALDISK").close()
    writers = {"B": _Writer(tmp_path, B_VALUE)}
    try:
        assert _read(writers["B"].ds) == 0.0  # (learned: no copy of the chunk)
        with strataio.Session(config=tmp_path / "strataio.toml") as s:
            ds = s.open_dataset("a", "r+")
            ds[...] = ORIGINAL
            ds.close()
        writers["A"] = _Writer(tmp_path, A_VALUE)
        for who, step in ("Aa", "Ba", "Bp", "Bc", "Ap"):
            writers[who].step(step)
        writers["A"].kill()
    finally:
        for w in writers.values():
            w.close()
    with strataio.Session(config=tmp_path / "strataio.toml") as s:
        assert [(e.key, e.tier) for e in s.catalog.overtaken()] == [(KEY, "fast")]
        fsck(s.catalog, s.tiers, repair=True)
        assert fsck(s.catalog, s.tiers).clean and s.catalog.overtaken() == []
        assert _read(s.open_dataset("a")) == A_VALUE
