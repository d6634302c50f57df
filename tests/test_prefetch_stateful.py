"""Two Sessions (:mod:`test_sessions_stateful`) that also prefetch chunks into their
in-process chunk caches (no memory tier: :meth:`Dataset.prefetch` fills the cache), each
with room for two of the four chunks: after every step each cache's bytes are its entries'
and within its capacity, and, as in :class:`TwoSessions`, reads through either session give
the last values once no write is pending, however stale the other's cached bytes are."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule

import strataio
from strataio.errors import StrataError
from strataio.storage.posix import PosixBackend
from strataio.tiers.tier import Tier, TierSet
from test_sessions_stateful import LEVELS, WHO, TwoSessions, chunk_boxes

CACHE = 2 * 64 + 8  # two chunks of 64 bytes and their checksums


class PrefetchingSessions(TwoSessions):
    CODEC = "crc32c"

    def _session(self) -> strataio.Session:
        tiers = TierSet(
            [
                Tier(n, PosixBackend(self.root / n), role, order=i)
                for i, (n, role) in enumerate(LEVELS)
            ]
        )
        return strataio.Session(tiers=tiers, catalog=self.root / "cat.db", cache_bytes=CACHE)

    @rule(who=st.sampled_from(WHO), chunks=chunk_boxes)
    def prefetch(self, who: str, chunks: list[tuple[int, int]]) -> None:
        ds = self.ds[who]
        for r, c in sorted(set(chunks)):
            result = ds.prefetch(np.s_[r * 4 : r * 4 + 4, c * 4 : c * 4 + 4]).result()
            if result.failed:
                assert self.dirty, result.failed

    @rule(who=st.sampled_from(WHO), r=st.integers(0, 1), c=st.integers(0, 1))
    def read_chunk(self, who: str, r: int, c: int) -> None:
        box = np.s_[r * 4 : r * 4 + 4, c * 4 : c * 4 + 4]
        try:
            got = self.ds[who][box]
        except StrataError:
            assert self.dirty
            return
        if not self.dirty and (r, c) not in self.racing:
            np.testing.assert_array_equal(got, self.oracle[box])

    @invariant()
    def each_cache_stays_within_its_bytes(self) -> None:
        for s in self.sessions.values():
            cache = s.cache
            with cache._lock:
                held = sum(cache.charge(e) for e in cache._entries.values())
            assert cache.nbytes == held <= cache.capacity == CACHE


PrefetchingSessions.TestCase.settings = settings(
    TwoSessions.TestCase.settings, max_examples=15, stateful_step_count=25
)
test_prefetching_sessions = pytest.mark.filterwarnings("ignore::ResourceWarning")(
    PrefetchingSessions.TestCase
)
