"""The in-process chunk cache of a storage hierarchy (strataio.tiers.cache) against an exact
model: an ordered dict of entries (LRU order), the capacity and the counters.

Storage's chunks change underneath (a commit here or by another process): a read takes an
entry only where the entry's checksum is the chunk's current one (``accepts``, as a tiered
store's reads do), so after every step no entry a read would take holds bytes other than
the chunk's current ones, the bytes counted are the entries' and within the capacity, and
entries evicted, invalidated or refused are gone.
"""

from __future__ import annotations

from collections import OrderedDict

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from strataio.tiers.cache import CachedBytes, ChunkCache

DATASETS = ("a", "b")
KEYS = ("c/0", "c/1", "c/2", "c/3")

slots = st.tuples(st.sampled_from(DATASETS), st.sampled_from(KEYS))


def content(n: int, size: int) -> tuple[bytes, str]:
    """Value ``n`` of a chunk: its bytes and checksum."""
    return bytes([n % 256]) * size, f"crc:{n}"


class ChunkCacheModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.cache: ChunkCache | None = None
        self.entries: OrderedDict[tuple[str, str], CachedBytes] = OrderedDict()
        self.current: dict[tuple[str, str], tuple[bytes, str]] = {}  # storage's chunks
        self.hits = self.misses = 0
        self.n = 0

    @initialize(capacity=st.integers(0, 300))
    def make(self, capacity: int) -> None:
        self.cache = ChunkCache(capacity)
        self.capacity = capacity

    def _evict(self) -> None:
        while sum(len(e.data) for e in self.entries.values()) > self.capacity and self.entries:
            self.entries.popitem(last=False)

    def _accepts(self, name: str):
        def accepts(keys, checksums):
            return [
                self.current.get((name, k), (b"", None))[1] == c for k, c in zip(keys, checksums)
            ]

        return accepts

    # ----------------------------------------------------------------- rules
    @rule(slot=slots, size=st.integers(0, 120))
    def commit(self, slot: tuple[str, str], size: int) -> None:
        """A new value of a chunk committed (here or by another process): nothing is told."""
        self.n += 1
        self.current[slot] = content(self.n, size)

    @rule(slot=slots, stale=st.booleans())
    def put(self, slot: tuple[str, str], stale: bool) -> None:
        """Hold a chunk's bytes as read (``stale``: bytes read before its last commit)."""
        data, digest = content(-1, 10) if stale else self.current.get(slot, (b"", "crc:0"))
        kept = self.cache.put(*slot, bytearray(data), digest)
        assert kept == (len(data) <= self.capacity)
        self.entries.pop(slot, None)
        if kept:
            self.entries[slot] = CachedBytes(data, digest)
            self._evict()

    @rule(slot=slots)
    def get(self, slot: tuple[str, str]) -> None:
        got = self.cache.get(*slot)
        want = self.entries.get(slot)
        if want is None:
            assert got is None
            self.misses += 1
        else:
            assert got == want.data
            self.entries.move_to_end(slot)
            self.hits += 1

    @rule(name=st.sampled_from(DATASETS), keys=st.lists(st.sampled_from(KEYS), max_size=5))
    def get_many(self, name: str, keys: list[str]) -> None:
        accepts = self._accepts(name)
        got = self.cache.get_many(name, keys, accepts)
        found = []
        for k in keys:
            e = self.entries.get((name, k))
            if e is not None:
                self.entries.move_to_end((name, k))
            found.append(e)
        for k, e, g in zip(keys, found, got):
            if e is not None and accepts([k], [e.checksum])[0]:
                assert g == e.data
                self.hits += 1
            else:
                assert g is None
                self.entries.pop((name, k), None)  # (a refused entry leaves)
                self.misses += 1

    @rule(slot=slots)
    def get_many_while_another_thread_puts(self, slot: tuple[str, str]) -> None:
        """An entry refused while another thread holds newer bytes of the chunk meanwhile:
        the newer entry stays."""
        name, key = slot
        if slot not in self.entries or not self.capacity:
            return
        newer = content(10_000 + self.n, 1)

        def accepts(keys, checksums):
            self.cache.put(name, key, newer[0], newer[1])
            return [False] * len(keys)

        assert self.cache.get_many(name, [key], accepts) == [None]
        self.misses += 1
        self.entries.pop(slot)
        self.entries[slot] = CachedBytes(*newer)
        self._evict()

    @rule(name=st.sampled_from(DATASETS), keys=st.none() | st.lists(st.sampled_from(KEYS)))
    def invalidate(self, name: str, keys: list[str] | None) -> None:
        self.cache.invalidate(name, keys)
        for slot in list(self.entries):
            if slot[0] == name and (keys is None or slot[1] in keys):
                del self.entries[slot]

    @rule()
    def clear(self) -> None:
        self.cache.clear()
        self.entries.clear()

    @rule(capacity=st.integers(0, 300))
    def resize(self, capacity: int) -> None:
        self.cache.resize(capacity)
        self.capacity = capacity
        self._evict()

    # ----------------------------------------------------------------- invariants
    @invariant()
    def holds_the_model_s_entries_in_lru_order(self) -> None:
        if self.cache is None:
            return
        assert list(self.cache._entries.items()) == list(self.entries.items())
        assert len(self.cache) == len(self.entries)
        for name in DATASETS:
            assert self.cache.holding(name, list(KEYS)) == [
                k for k in KEYS if (name, k) in self.entries
            ]

    @invariant()
    def bytes_counted_and_within_capacity(self) -> None:
        if self.cache is None:
            return
        assert self.cache.nbytes == sum(len(e.data) for e in self.entries.values())
        assert self.cache.nbytes <= self.cache.capacity == self.capacity

    @invariant()
    def counters_count_the_reads(self) -> None:
        if self.cache is None:
            return
        assert (self.cache.hits, self.cache.misses) == (self.hits, self.misses)

    @invariant()
    def a_read_takes_only_current_bytes(self) -> None:
        if self.cache is None:
            return
        for name in DATASETS:
            got = self.cache.get_many(name, KEYS, self._accepts(name))
            for k, g in zip(KEYS, got):
                e = self.entries.get((name, k))
                if g is not None:
                    assert g == self.current[name, k][0] == e.data
                    self.entries.move_to_end((name, k))
                    self.hits += 1
                else:
                    self.entries.pop((name, k), None)
                    self.misses += 1


ChunkCacheModel.TestCase.settings = settings(
    max_examples=200, stateful_step_count=30, deadline=None
)
test_chunk_cache_model = ChunkCacheModel.TestCase
