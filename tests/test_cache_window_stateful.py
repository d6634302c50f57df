"""A realm cache kept in an MPI window (strataio.collective.cache_window) in one process: the
rules of :class:`test_realm_cache.CacheMachine`, plus independent calls made through the
coherence protocol (:meth:`SharedCaches.clean` on the window, while the owner does not hold
it), each followed by its own I/O straight on the file.

After every step the file overlaid with the cached pages is the oracle; after a clean, the
file holds the oracle's bytes in the runs touched (their dirty bytes written back), and
before a write no cached page holds a byte of them (the owner re-indexes its table, edited
in the window, and reads the new bytes from the file).
"""

from __future__ import annotations

import os

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import rule
from mpi4py import MPI

from hunt import examples
from strataio.collective.cache_window import SharedCaches
from strataio.collective.driver import PosixDriver
from strataio.collective.realm_cache import CacheMemory, RealmCache
from strataio.layout.extents import Extents
from strataio.storage.vectored import VectoredPlan
from test_realm_cache import CacheMachine


class SharedCacheMachine(CacheMachine):
    def _cache(self, page: int, stripe: int) -> RealmCache:
        """The cache with its pages in an MPI window (one rank), and another descriptor of
        the file for the independent calls that clean it, as another rank's."""
        self.other = PosixDriver.open(self.path, os.O_RDWR)  # (another rank's descriptor)
        slot, nslots = RealmCache.shape(self.capacity, page, stripe)
        self.shape = (slot, nslots, stripe)
        self.shared = SharedCaches(MPI.COMM_SELF, CacheMemory.nbytes(nslots, slot))
        cache = RealmCache(
            self.driver, self.capacity, page=page, stripe=stripe, memory=self.shared.memory
        )
        cache.guard = self.shared.hold
        return cache

    def teardown(self) -> None:
        if self.driver is not None:
            self.shared.free()
            self.other.close()
        super().teardown()

    def _clean(self, off: int, n: int, drop: bool) -> Extents:
        """Step 2 of the protocol for an independent call on ``[off, off + n)``."""
        runs = Extents.single(off, n)
        self.shared.release()  # (the owner is between calls)
        self.shared.clean(0, runs, self.other, drop, self.shape)
        with open(self.path, "rb") as f:
            disk = f.read()
        end = min(off + n, len(disk))
        assert disk[off:end] == bytes(self.oracle[off:end])
        return runs

    @rule(off=st.integers(0, 20_000), n=st.integers(1, 6000))
    def independent_write(self, off: int, n: int) -> None:
        self._clean(off, n, drop=True)
        mem = self.cache.mem
        start, plen = self.cache.grid.bounds(np.maximum(mem.slot_page, 0))
        touching = (mem.slot_page >= 0) & (start < off + n) & (start + plen > off)
        assert not touching.any()
        data = self.rng.integers(0, 256, n, dtype=np.uint8)
        plan = VectoredPlan(np.array([off]), np.array([n]), np.array([0]))
        self.other.writev(plan, data)
        if len(self.oracle) < off + n:
            self.oracle.extend(bytes(off + n - len(self.oracle)))
        self.oracle[off : off + n] = data.tobytes()

    @rule(off=st.integers(0, 20_000), n=st.integers(1, 6000))
    def independent_read(self, off: int, n: int) -> None:
        self._clean(off, n, drop=False)
        buf = np.zeros(n, dtype=np.uint8)
        self.other.pread(buf, off)
        assert buf.tobytes() == self._expect(off, n)


SharedCacheMachine.TestCase.settings = settings(
    max_examples=examples(100),
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_shared_cache_machine = SharedCacheMachine.TestCase
