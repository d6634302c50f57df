"""The decoded-chunk cache (strataio.arrays.chunk_cache) as state machines.

:class:`DecodedCacheModel` drives one :class:`DecodedChunkCache` against an exact model (an
ordered dict of entries, the chunks remembered by :meth:`~DecodedChunkCache.admit`, the
counters): after every step the cache holds the model's entries in its LRU order, its byte
count is their charge and within the capacity, and a lookup serves an entry only at the
version storage holds now.

:class:`CachedDatasetMachine` reads a POSIX dataset through the process's cache (every chunk
kept on its second read, no settling time) while its chunks change through every documented
path: this handle's writes, another process's strataio writes (a file renamed over the
chunk, nothing said to this process's cache), in-place rewrites, ``clear_cache`` and
``resize``: every read gives the last value written (a numpy oracle).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections import OrderedDict

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

import strataio
from hunt import examples
from strataio.arrays import chunk_cache as cc
from strataio.arrays.chunk_cache import CachedChunk, DecodedChunkCache

SPACES = ("s", "t")
KEYS = ("k0", "k1", "k2", "k3")
ENTRY = cc._ENTRY_BYTES

slots = st.tuples(st.sampled_from(SPACES), st.sampled_from(KEYS))


class DecodedCacheModel(RuleBasedStateMachine):
    """One cache against an exact model of its entries (LRU order), remembered reads and
    counters; storage's current version of each chunk moves on as chunks are rewritten."""

    def __init__(self) -> None:
        super().__init__()
        self.cache: DecodedChunkCache | None = None
        self.entries: OrderedDict[tuple[str, str], CachedChunk] = OrderedDict()
        self.seen: dict[tuple[str, str], tuple] = {}
        self.stored: dict[tuple[str, str], int] = {}  # chunk -> storage's version number
        self.hits = self.misses = 0

    @initialize(capacity=st.integers(0, 6 * (64 + ENTRY)))
    def make(self, capacity: int) -> None:
        self.cache = DecodedChunkCache(capacity)
        self.capacity = capacity

    def _version(self, slot: tuple[str, str]) -> tuple:
        return (self.stored.get(slot, 0), 64, 0)

    def _charge(self, e: CachedChunk) -> int:
        return e.chunk.nbytes + ENTRY

    def _evict(self) -> None:
        while sum(map(self._charge, self.entries.values())) > self.capacity and self.entries:
            self.entries.popitem(last=False)

    # ----------------------------------------------------------------- rules
    @rule(slot=slots)
    def rewrite(self, slot: tuple[str, str]) -> None:
        """Storage's chunk changes (any writer): its version moves on, the cache is not told."""
        self.stored[slot] = self.stored.get(slot, 0) + 1

    @rule(slot=slots, n=st.integers(0, 3 * 64), current=st.booleans())
    def store(self, slot: tuple[str, str], n: int, current: bool) -> None:
        v = self._version(slot) if current else (-1, 64, 0)  # (an older version read)
        e = CachedChunk(v, np.full(n, 7, np.uint8), 0, n)
        kept = self.cache.store(*slot, e)
        assert kept == (self._charge(e) <= self.capacity)
        self.entries.pop(slot, None)
        if not kept:  # (one too large for the cache is discarded, remembered read too)
            self.seen.pop(slot, None)
        else:
            self.entries[slot] = e
            self._evict()

    @rule(wanted=st.lists(slots, min_size=1, max_size=5), absent=st.booleans())
    def lookup(self, wanted: list[tuple[str, str]], absent: bool) -> None:
        for space in SPACES:
            keys = [k for s, k in wanted if s == space]
            versions = [None if absent else self._version((space, k)) for k in keys]
            got = self.cache.lookup(space, keys, versions)
            for k, v, e in zip(keys, versions, got):
                want = self.entries.get((space, k))
                if want is not None and v is not None and want.version == v:
                    assert e is want
                    self.entries.move_to_end((space, k))
                    self.hits += 1
                else:
                    assert e is None
                    self.entries.pop((space, k), None)  # (a stale entry leaves)
                    self.misses += 1

    @rule(slot=slots)
    def admit(self, slot: tuple[str, str]) -> None:
        v = self._version(slot)
        assert self.cache.remembers(*slot, v) == (self.seen.get(slot) == v)
        got = self.cache.admit(*slot, v)
        assert got == (self.seen.get(slot) == v)
        if got:
            del self.seen[slot]
        else:
            self.seen[slot] = v

    @rule(space=st.sampled_from(SPACES), keys=st.none() | st.lists(st.sampled_from(KEYS)))
    def discard(self, space: str, keys: list[str] | None) -> None:
        self.cache.discard(space, keys)
        for slot in list(self.entries) + list(self.seen):
            if slot[0] == space and (keys is None or slot[1] in keys):
                self.entries.pop(slot, None)
                self.seen.pop(slot, None)

    @rule()
    def clear(self) -> None:
        self.cache.clear()
        self.entries.clear()
        self.seen.clear()

    @rule(capacity=st.integers(0, 6 * (64 + ENTRY)))
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
        for slot in self.entries:
            assert slot in self.cache
        for space in SPACES:
            held = [k for k in KEYS if (space, k) in self.entries]
            assert self.cache.holds_any(space, KEYS) == bool(held)

    @invariant()
    def bytes_counted_and_within_capacity(self) -> None:
        if self.cache is None:
            return
        assert self.cache.nbytes == sum(map(self._charge, self.entries.values()))
        assert self.cache.nbytes <= self.cache.capacity == self.capacity
        assert self.cache.enabled == (self.capacity > 0)

    @invariant()
    def remembers_the_model_s_reads(self) -> None:
        if self.cache is None:
            return
        assert dict(self.cache._seen) == self.seen
        assert len(self.cache._seen) <= cc.SEEN_ENTRIES

    @invariant()
    def counters_count_the_lookups(self) -> None:
        if self.cache is None:
            return
        assert (self.cache.hits, self.cache.misses) == (self.hits, self.misses)

    @invariant()
    def no_stale_entry_is_served(self) -> None:
        if self.cache is None:
            return
        for space, key in list(self.cache._entries):
            (got,) = self.cache.lookup(space, [key], [self._version((space, key))])
            assert got is None or got.version == self._version((space, key))
            # (the lookup is the model's too)
            if got is None:
                self.entries.pop((space, key))
                self.misses += 1
            else:
                self.entries.move_to_end((space, key))
                self.hits += 1


DecodedCacheModel.TestCase.settings = settings(
    max_examples=examples(100), stateful_step_count=30, deadline=None
)
test_decoded_cache_model = DecodedCacheModel.TestCase


# --------------------------------------------------------------------------- dataset level
SHAPE = (8, 8)
CHUNKS = (4, 4)  # four chunks of 64 bytes (int32)
TMP = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None

box = st.tuples(st.integers(0, SHAPE[0] - 1), st.integers(0, SHAPE[1] - 1)).flatmap(
    lambda lo: st.tuples(
        st.just(lo), st.tuples(st.integers(lo[0] + 1, SHAPE[0]), st.integers(lo[1] + 1, SHAPE[1]))
    )
)
chunk_at = st.tuples(st.integers(0, 1), st.integers(0, 1))


def index(b) -> tuple[slice, slice]:
    (r0, c0), (r1, c1) = b
    return np.s_[r0:r1, c0:c1]


class CachedDatasetMachine(RuleBasedStateMachine):
    """Reads through the process's decoded-chunk cache, keeping every chunk at once, while
    chunks change through every documented path: a read always gives the last value."""

    def __init__(self) -> None:
        super().__init__()
        self._settle = cc.SETTLE_NS
        self._cache = cc._cache
        cc.SETTLE_NS = -(1 << 62)  # every version counts as settled
        cc._cache = DecodedChunkCache(3 * (64 + ENTRY))  # room for three of the four chunks
        self.root = tempfile.mkdtemp(prefix="strataio-cc-sm-", dir=TMP)
        self.path = os.path.join(self.root, "a")
        self.ds = None

    @initialize(codec=st.sampled_from([None, "zstd", "crc32c"]))
    def make(self, codec) -> None:
        self.ds = strataio.create_dataset(self.path, SHAPE, "int32", CHUNKS, codec=codec)
        self.oracle = np.arange(64, dtype="int32").reshape(SHAPE)
        self.ds[...] = self.oracle
        self.value = 100

    def teardown(self) -> None:
        try:
            if self.ds is not None:
                self.ds.close()
        finally:
            cc.SETTLE_NS = self._settle
            cc._cache = self._cache
            shutil.rmtree(self.root, ignore_errors=True)

    def _next(self) -> int:
        self.value += 1
        return self.value

    # ----------------------------------------------------------------- rules
    @rule(where=box)
    def read(self, where) -> None:
        np.testing.assert_array_equal(self.ds[index(where)], self.oracle[index(where)])

    @rule(where=box)
    def read_into(self, where) -> None:
        (r0, c0), (r1, c1) = where
        out = np.empty((r1 - r0, c1 - c0), "int32")
        self.ds.read_section((r0, c0), (r1, c1), out=out)
        np.testing.assert_array_equal(out, self.oracle[index(where)])

    @rule(where=box)
    def write(self, where) -> None:
        v = self._next()
        self.ds[index(where)] = v
        self.oracle[index(where)] = v

    @rule(where=box)
    def another_process_writes(self, where) -> None:
        """Another process's strataio write: a file renamed over each chunk, of which this
        process's cache hears nothing."""
        v = self._next()
        other = strataio.open_dataset(self.path, mode="r+")
        other._cache_space = None
        other[index(where)] = v
        other.close()
        self.oracle[index(where)] = v

    @rule(at=chunk_at)
    def rewrite_in_place(self, at) -> None:
        """A chunk's file rewritten without being replaced (zarr-python's local store); the
        time of the change is made later than the version any read saw, as the settle rule
        (turned off here) would ensure."""
        r, c = at
        v = self._next()
        chunk = np.full(CHUNKS, v, "int32")
        path = os.path.join(self.path, "c", str(r), str(c))
        before = os.stat(path).st_ctime_ns
        with open(path, "r+b") as f:
            f.truncate(0)
            f.write(bytes(self.ds.codecs.encode(chunk)))
        while os.stat(path).st_ctime_ns == before:
            time.sleep(0.001)
            os.utime(path)
        self.oracle[r * 4 : r * 4 + 4, c * 4 : c * 4 + 4] = v

    @rule()
    def clear_cache(self) -> None:
        self.ds.clear_cache()
        assert not cc.chunk_cache().holds_any(self.ds._cache_space, self._keys())

    @rule(chunks=st.integers(0, 5))
    def resize(self, chunks: int) -> None:
        cc.chunk_cache().resize(chunks * (64 + ENTRY))

    @rule()
    def reopen(self) -> None:
        self.ds.close()
        self.ds = strataio.open_dataset(self.path, mode="r+")

    def _keys(self) -> list[str]:
        return [f"c/{r}/{c}" for r in range(2) for c in range(2)]

    # ----------------------------------------------------------------- invariants
    @invariant()
    def reads_give_the_last_values(self) -> None:
        if self.ds is not None:
            np.testing.assert_array_equal(self.ds[...], self.oracle)

    @invariant()
    def the_cache_stays_within_its_bytes(self) -> None:
        cache = cc.chunk_cache()
        with cache._lock:
            held = sum(cache.charge(e) for e in cache._entries.values())
        assert cache.nbytes == held <= cache.capacity

    @invariant()
    def every_entry_is_the_chunk_s_current_version(self) -> None:
        """An entry the cache holds is of the chunk's current version, or the next lookup
        drops it: never bytes of another value than storage's."""
        if self.ds is None:
            return
        space = self.ds._cache_space
        keys = self._keys()
        versions = self.ds._versions(keys)
        for key, v, e in zip(keys, versions, cc.chunk_cache().lookup(space, keys, versions)):
            if e is None:
                continue
            assert e.version == v
            r, c = (int(x) for x in key.split("/")[1:])
            want = self.oracle[r * 4 : r * 4 + 4, c * 4 : c * 4 + 4]
            got = np.ascontiguousarray(e.chunk).tobytes()[e.lo : e.hi]
            assert got == want.tobytes()[e.lo : e.hi], key


CachedDatasetMachine.TestCase.settings = settings(
    max_examples=examples(80),
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_cached_dataset_machine = CachedDatasetMachine.TestCase
