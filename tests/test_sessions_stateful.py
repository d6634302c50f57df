"""A stateful property test of two Sessions (two processes' worth: each its own catalog
connection, writer, residency and tiers) working on one dataset at once, and of three.

Rules write whole chunks through either session, flush, migrate, stage and evict through
either, and close and reopen either's dataset. Neither session knows what the other did
until the catalog tells it. After every step where no write is left unflushed, reads
through each session's open dataset give the last value written to every chunk (by
whichever session; of a chunk both wrote while the other's write was not flushed yet, one of
the values they flushed: the last put where both put one object, the last commit where they
put objects on different tiers), and every move succeeds (but the eviction from the archive
of a chunk whose only copy is there); while one is, a read or a move may fail (the chunk's
object holds bytes no catalogued row names yet), but nothing may be lost. After both
sessions close, a new session reads the last values, and ``fsck`` finds nothing to repair.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

import strataio
from hunt import examples
from strataio.errors import StrataError
from strataio.storage.posix import PosixBackend
from strataio.tiers.fsck import fsck
from strataio.tiers.tier import Tier, TierSet

SHAPE = (8, 8)
CHUNKS = (4, 4)  # 4 chunks
LEVELS = [("fast", "localdisk"), ("slow", "remotedisk"), ("archive", "remotetape")]
WHO = ("A", "B")

chunk_boxes = st.lists(st.tuples(st.integers(0, 1), st.integers(0, 1)), min_size=1, max_size=4)


class TwoSessions(RuleBasedStateMachine):
    #: the sessions, by name (the rules draw from the module's ``WHO``; a machine of more
    #: sessions redefines them)
    WHO: tuple[str, ...] = WHO
    #: bytes the fast tier holds (None: unbounded)
    FAST_CAPACITY: int | None = None
    #: the dataset's codec (the default: plain chunks with a CRC-32C)
    CODEC: Any = "crc32c"

    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="strataio-sessions-"))
        self.oracle = np.zeros(SHAPE, "i4")
        self.sessions = {w: self._session() for w in self.WHO}
        with self._session() as s:
            ds = s.create_dataset("d", SHAPE, "i4", CHUNKS, hint="LOCALDISK", codec=self.CODEC)
            ds[...] = self.oracle
            ds.close()
        self.ds = {w: self.sessions[w].open_dataset("d", "r+") for w in self.WHO}
        # per session, chunk -> value written since its last flush
        self.pending: dict[str, dict[tuple[int, int], int]] = {w: {} for w in self.WHO}
        # chunk -> values flushed while both sessions had it written and not flushed: which
        # one stands depends on where each put its object (see the module doc)
        self.racing: dict[tuple[int, int], set[int]] = {}
        self.value = 0

    def _others(self, who: str) -> list[str]:
        return [w for w in self.WHO if w != who]

    def _flush_others_writing(self, who: str, chunks: list[tuple[int, int]]) -> None:
        """Flush each other session holding an unflushed write of one of ``chunks`` (writes
        of one chunk coordinated, as MPI-IO asks outside atomic mode)."""
        for other in self._others(who):
            if self.pending[other].keys() & set(chunks):
                self.flush(other)

    @property
    def dirty(self) -> bool:
        """True while either session holds a write not flushed."""
        return any(self.pending.values())

    def _flushed(self, who: str) -> None:
        for chunk, v in self.pending[who].items():
            if chunk in self.racing:
                self.racing[chunk].add(v)
        self.pending[who].clear()

    def _settle(self, got: np.ndarray) -> None:
        """Once no write is pending, each raced chunk holds one of the values flushed in
        its race: the oracle takes it."""
        for r, c in list(self.racing):
            box = np.s_[r * 4 : r * 4 + 4, c * 4 : c * 4 + 4]
            value = int(got[box].flat[0])
            assert value in self.racing[r, c], ((r, c), value, self.racing[r, c])
            self.oracle[box] = value
        self.racing.clear()

    def _session(self) -> strataio.Session:
        tiers = TierSet(
            [
                Tier(
                    n,
                    PosixBackend(self.root / n),
                    role,
                    order=i,
                    capacity=self.FAST_CAPACITY if i == 0 else None,
                )
                for i, (n, role) in enumerate(LEVELS)
            ]
        )
        return strataio.Session(tiers=tiers, catalog=self.root / "cat.db")

    # ----------------------------------------------------------------- rules
    @rule(who=st.sampled_from(WHO), chunks=chunk_boxes)
    def write(self, who: str, chunks: list[tuple[int, int]]) -> None:
        others = self._others(who)
        for r, c in sorted(set(chunks)):
            self.value += 1
            box = np.s_[r * 4 : r * 4 + 4, c * 4 : c * 4 + 4]
            self.ds[who][box] = np.full(CHUNKS, self.value, "i4")
            self.oracle[box] = self.value
            self.pending[who][r, c] = self.value
            if any((r, c) in self.pending[o] for o in others):
                self.racing.setdefault((r, c), set())

    @rule(who=st.sampled_from(WHO))
    def flush(self, who: str) -> None:
        self.ds[who].flush()
        self._flushed(who)

    @rule(who=st.sampled_from(WHO), op=st.sampled_from(["migrate", "stage", "evict"]),
          tier=st.sampled_from([n for n, _ in LEVELS]))  # fmt: skip
    def move(self, who: str, op: str, tier: str) -> None:
        ds = self.ds[who]
        if op == "evict":
            handle = ds.evict(None, tier=tier)
        else:
            handle = getattr(ds, op)(None, to=tier)
        result = handle.result()
        # a move may fail for a chunk rewritten and not flushed yet (its copy holds bytes no
        # catalogued row names yet, or this session's row names bytes another's write
        # replaced); never while every write is flushed
        if op == "evict" and tier == LEVELS[-1][0]:
            # the slowest tier's copy is the chunk's last where the catalog names no other
            rows = self.sessions[who].catalog.residency("d")
            alone = {k for k, _ in result.failed if {c.tier for c in rows if c.key == k} == {tier}}
            result.failed[:] = [f for f in result.failed if f[0] not in alone]
        if op == "migrate" and tier == LEVELS[0][0] and self.FAST_CAPACITY is not None:
            # a migration of more than the fast tier holds keeps the chunks it placed first
            # there (it never evicts its own) and fails the rest, saying the tier is full
            on = {k for k, cs in ds.residency().items() if any(c.tier == tier for c in cs)}
            full = {k for k, m in result.failed if "is full" in m}
            assert not full & on and result.moved <= len(on), (result, sorted(on))
            result.failed[:] = [f for f in result.failed if f[0] not in full]
        if result.failed:
            assert self.dirty, result.failed

    @rule(who=st.sampled_from(WHO))
    def reopen(self, who: str) -> None:
        self.ds[who].close()
        self._flushed(who)
        self.ds[who] = self.sessions[who].open_dataset("d", "r+")

    @rule()
    def fsck_repair_beside(self) -> None:
        """A third session runs ``fsck --repair`` while both have the dataset open: what
        their writes and moves leave in flight is theirs, so it finds no problem, and the
        values read after it are still the last written (the invariant below)."""
        with self._session() as s:
            report = fsck(s.catalog, s.tiers, repair=True)
        assert report.clean, report.problems

    # ----------------------------------------------------------------- invariants
    @invariant()
    def each_session_reads_the_last_values(self) -> None:
        for who in self.WHO:
            try:
                got = self.ds[who][...]
            except StrataError:
                # only while a session holds rewrites no catalogued row names yet
                assert self.dirty
                continue
            if not self.dirty:
                self._settle(got)
                np.testing.assert_array_equal(got, self.oracle)

    def teardown(self) -> None:
        try:
            for who in self.WHO:
                self.ds[who].close()
                self._flushed(who)
            for s in self.sessions.values():
                s.close()
            with self._session() as s:
                got = s.open_dataset("d")[...]
                self._settle(got)
                np.testing.assert_array_equal(got, self.oracle)
                report = fsck(s.catalog, s.tiers)
                assert report.clean, report
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


TwoSessions.TestCase.settings = settings(
    max_examples=examples(30),
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_two_sessions = pytest.mark.filterwarnings("ignore::ResourceWarning")(TwoSessions.TestCase)


class TwoSessionsLonger(TwoSessions):
    pass


TwoSessionsLonger.TestCase.settings = settings(
    TwoSessions.TestCase.settings, max_examples=examples(300)
)
test_two_sessions_long = pytest.mark.slow(
    pytest.mark.filterwarnings("ignore::ResourceWarning")(TwoSessionsLonger.TestCase)
)


class TwoSessionsOnAFullTier(TwoSessions):
    """The same, with room on the fast tier for two of the four chunks: writes and stages
    evict (and write back) chunks the other session may be reading, moving or rewriting.
    Each session counts the tier's use as it sees it, so together they may fill it past
    its capacity; nothing may be lost either way.

    Here the sessions coordinate writes of one chunk, as MPI-IO asks of overlapping writes
    outside atomic mode: one flushes before the other writes a chunk it wrote. Unflushed
    writes of one chunk by both, interleaved with the evictions and write-backs of each,
    can leave an older value of one of them standing and an announcement that fsck then
    repairs (see the README)."""

    FAST_CAPACITY = 2 * 64 + 16

    @rule(who=st.sampled_from(WHO), chunks=chunk_boxes)
    def write(self, who: str, chunks: list[tuple[int, int]]) -> None:
        self._flush_others_writing(who, chunks)
        super().write(who, chunks)


TwoSessionsOnAFullTier.TestCase.settings = TwoSessions.TestCase.settings
test_two_sessions_on_a_full_tier = pytest.mark.filterwarnings("ignore::ResourceWarning")(
    TwoSessionsOnAFullTier.TestCase
)


class TwoSessionsRaw(TwoSessions):
    """Raw chunks, the catalog's CRC-32C their only check: a read of a thin section reads a
    copy in range once a read checked it whole, also in a session that reopened the
    dataset after the other's checks reached the catalog (the verified-once rule across
    processes); a copy rewritten, moved or evicted since must be read whole again."""

    CODEC = None

    @rule(who=st.sampled_from(WHO), row=st.integers(0, SHAPE[0] - 1))
    def read_row(self, who: str, row: int) -> None:
        try:
            got = self.ds[who][row, 1:7]
        except StrataError:
            assert self.dirty  # (as the invariant's whole reads)
            return
        if not self.dirty and not self.racing:
            np.testing.assert_array_equal(got, self.oracle[row, 1:7])


TwoSessionsRaw.TestCase.settings = settings(
    TwoSessions.TestCase.settings, max_examples=examples(15)
)
test_two_sessions_raw = pytest.mark.filterwarnings("ignore::ResourceWarning")(
    TwoSessionsRaw.TestCase
)


WHO3 = ("A", "B", "C")


class ThreeSessions(TwoSessions):
    """Three sessions: chains of unordered rewrites of one chunk (each session's write
    announced over another's announcement, put and committed in any order), with moves and
    reopens of any of them between; the same promises hold."""

    WHO = WHO3

    @rule(who=st.sampled_from(WHO3), chunks=chunk_boxes)
    def write(self, who: str, chunks: list[tuple[int, int]]) -> None:
        super().write(who, chunks)

    @rule(who=st.sampled_from(WHO3))
    def flush(self, who: str) -> None:
        super().flush(who)

    @rule(who=st.sampled_from(WHO3), op=st.sampled_from(["migrate", "stage", "evict"]),
          tier=st.sampled_from([n for n, _ in LEVELS]))  # fmt: skip
    def move(self, who: str, op: str, tier: str) -> None:
        super().move(who, op, tier)

    @rule(who=st.sampled_from(WHO3))
    def reopen(self, who: str) -> None:
        super().reopen(who)


ThreeSessions.TestCase.settings = settings(TwoSessions.TestCase.settings, max_examples=examples(15))
test_three_sessions = pytest.mark.filterwarnings("ignore::ResourceWarning")(ThreeSessions.TestCase)


class ThreeSessionsOnAFullTier(ThreeSessions):
    """Three sessions on the full tier of :class:`TwoSessionsOnAFullTier`, writes of one
    chunk coordinated as there."""

    FAST_CAPACITY = TwoSessionsOnAFullTier.FAST_CAPACITY

    @rule(who=st.sampled_from(WHO3), chunks=chunk_boxes)
    def write(self, who: str, chunks: list[tuple[int, int]]) -> None:
        self._flush_others_writing(who, chunks)
        super().write(who, chunks)


ThreeSessionsOnAFullTier.TestCase.settings = ThreeSessions.TestCase.settings
test_three_sessions_on_a_full_tier = pytest.mark.filterwarnings("ignore::ResourceWarning")(
    ThreeSessionsOnAFullTier.TestCase
)


# Interleavings the machine found, each of which once lost a value or left a chunk
# unreadable: (rule, *arguments) steps, the invariant checked after each.
FOUND = {
    # A reads a chunk whose "fast" object B has rewritten (not flushed): the bytes fail
    # A's row and A reads the archive copy instead; what it read was cached under the
    # version of B's object, and B read A's older value back after its flush
    "failover-read-cached-as-the-other-copy": [
        ("move", "A", "migrate", "archive"),
        ("write", "B", [(0, 0), (0, 1)]),
        ("write", "A", [(0, 0)]),
        ("flush", "A"),
        ("flush", "A"),
        ("flush", "B"),
    ],
    # B's read stages its own copy; A evicts the archive copy and migrates: B's read finds
    # both its copies missing and must learn the new one from the catalog
    "read-after-two-moves": [
        ("move", "B", "migrate", "archive"),
        ("move", "A", "evict", "archive"),
        ("move", "A", "migrate", "slow"),
    ],
    # A's read stages the chunk to the tier B has just rewritten it on, unflushed
    "stage-over-unflushed-write": [
        ("move", "A", "migrate", "archive"),
        ("move", "B", "migrate", "slow"),
        ("write", "B", [(0, 0)]),
        ("flush", "B"),
    ],
    # B evicts, on a row it loaded before A announced its rewrite, the copy A is rewriting
    "evict-on-a-stale-row": [
        ("move", "A", "migrate", "slow"),
        ("move", "A", "migrate", "archive"),
        ("write", "A", [(0, 0)]),
        ("move", "B", "evict", "fast"),
        ("flush", "A"),
    ],
    # B migrates, knowing the fast copy is being rewritten by A
    "migrate-over-a-rewrite": [
        ("move", "A", "migrate", "archive"),
        ("write", "A", [(0, 0)]),
        ("move", "B", "migrate", "archive"),
        ("flush", "A"),
    ],
    # B rewrites a chunk it knows on "slow" only onto "fast", where A's read staged it
    "write-over-a-copy-unknown-here": [
        ("move", "A", "migrate", "archive"),
        ("move", "B", "migrate", "slow"),
        ("flush", "A"),
        ("write", "B", [(0, 0)]),
        ("move", "A", "migrate", "slow"),
        ("flush", "B"),
    ],
    # A replaces B's unflushed new object on "fast" (announced, no row there yet), flushes
    # and migrates it away; B's flush finds its object gone
    "flush-after-its-object-was-replaced-and-moved": [
        ("move", "A", "migrate", "slow"),
        ("write", "B", [(0, 0)]),
        ("write", "A", [(0, 0)]),
        ("flush", "A"),
        ("write", "B", [(0, 1)]),
        ("move", "A", "migrate", "slow"),
        ("flush", "B"),
    ],
    # B opened the dataset while A's rewrite was announced; A has recorded it since
    "migrate-after-the-rewrite-is-recorded": [
        ("move", "B", "migrate", "archive"),
        ("move", "A", "migrate", "slow"),
        ("write", "A", [(0, 0)]),
        ("reopen", "B"),
        ("reopen", "A"),
        ("move", "B", "migrate", "archive"),
    ],
}


# The same, found on the full tier.
FOUND_ON_A_FULL_TIER = {
    # A's stage makes room on "fast" by writing a chunk back to "slow", where B is putting
    # its rewrite of that chunk (announced, not flushed)
    "write-back-over-a-rewrite": [
        ("move", "B", "evict", "fast"),
        ("write", "B", [(0, 1), (0, 0), (1, 0)]),
        ("move", "B", "migrate", "fast"),
        ("flush", "B"),
        ("write", "A", [(0, 1), (1, 1)]),
        ("write", "B", [(0, 0)]),
        ("move", "A", "stage", "fast"),
    ],
}


class TwoSessionsCompressed(TwoSessions):
    """The found interleavings again with compressed chunks, which are read whole through
    another path than plain ones (and cached whole)."""

    CODEC = "zstd"


@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.parametrize(
    ("machine_class", "steps"),
    [(TwoSessions, steps) for steps in FOUND.values()]
    + [(TwoSessionsCompressed, steps) for steps in FOUND.values()]
    + [(TwoSessionsOnAFullTier, steps) for steps in FOUND_ON_A_FULL_TIER.values()],
    ids=[*FOUND, *(f"{name}-zstd" for name in FOUND), *FOUND_ON_A_FULL_TIER],
)
def test_found_interleavings(machine_class, steps):
    machine = machine_class()
    try:
        machine.each_session_reads_the_last_values()
        for rule, *args in steps:
            getattr(machine, rule)(*args)
            machine.each_session_reads_the_last_values()
    finally:
        machine.teardown()
