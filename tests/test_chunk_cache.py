"""The decoded-chunk cache: hits, staleness checks against any writer, the settle rule, bounds."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import strataio
from strataio.arrays import chunk_cache as cc
from strataio.arrays.chunk_cache import CachedChunk, DecodedChunkCache, chunk_cache
from strataio.errors import ChecksumError, ConfigError
from strataio.layout.sections import Section

SETTLED = cc.SETTLE_NS / 1e9 + 0.02  # seconds after a write when its chunks may be cached


@pytest.fixture(autouse=True)
def fresh_cache(monkeypatch):
    """Each test starts with an empty process cache of the default size."""
    monkeypatch.setattr(cc, "_cache", DecodedChunkCache())
    yield cc._cache


def _hits() -> int:
    return chunk_cache().hits


def _chunk_file(root, key: str) -> str:
    return os.path.join(root, *key.split("/"))


def _rewrite_in_place(path: str, data: bytes) -> None:
    """Rewrite a file's bytes without replacing it, as zarr-python's local store does."""
    with open(path, "r+b") as f:
        f.write(data)


def _written(tmp_path, codec=None, dtype="int32"):
    ds = strataio.create_dataset(tmp_path / "a", (8, 8), dtype, (4, 4), codec=codec)
    want = np.arange(64, dtype=dtype).reshape(8, 8)
    ds[...] = want
    return ds, want


def test_repeated_reads_are_served_from_memory(tmp_path):
    ds, want = _written(tmp_path)
    time.sleep(SETTLED)
    np.testing.assert_array_equal(ds[...], want)  # remembered
    np.testing.assert_array_equal(ds[...], want)  # read again: kept
    before = _hits()
    out = np.empty((8, 8), dtype="int32")
    ds.read_section((0, 0), (8, 8), out=out)
    np.testing.assert_array_equal(out, want)
    assert _hits() - before == 4
    assert len(chunk_cache()) == 4 and chunk_cache().nbytes >= 4 * 64


def test_chunks_written_moments_ago_are_not_cached(tmp_path):
    """The settle rule: a change within one clock tick of the cached version could go unseen,
    so fresh chunks are read from storage every time."""
    ds, want = _written(tmp_path)
    np.testing.assert_array_equal(ds[...], want)
    np.testing.assert_array_equal(ds[...], want)
    assert len(chunk_cache()) == 0
    raw = np.full((4, 4), -7, dtype="<i4").tobytes()
    _rewrite_in_place(_chunk_file(tmp_path / "a", "c/0/0"), raw)  # same size, same tick
    assert (ds[0:4, 0:4] == -7).all()


@pytest.mark.parametrize("how", ["replace", "in-place"])
@pytest.mark.parametrize("codec", [None, "zstd"])
def test_a_chunk_changed_by_another_writer_is_read_again(tmp_path, how, codec):
    ds, want = _written(tmp_path, codec)
    time.sleep(SETTLED)
    ds[...]
    ds[...]
    assert len(chunk_cache()) == 4
    other = np.full((4, 4), -5, dtype="int32")
    if how == "replace":  # another process through strataio: a new file renamed over the chunk
        writer = strataio.open_dataset(tmp_path / "a", mode="r+")
        writer._cache_space = None  # it must not tell the reader's cache
        writer[4:8, 0:4] = other
        writer.close()
    else:
        blob = ds.codecs.encode(other)
        path = _chunk_file(tmp_path / "a", "c/1/0")
        if codec is None:
            _rewrite_in_place(path, bytes(blob))
        else:  # a compressed chunk's size changes: rewrite it in place, truncating
            with open(path, "r+b") as f:
                f.truncate(0)
                f.write(bytes(blob))
    got = ds[...]
    want[4:8, 0:4] = -5
    np.testing.assert_array_equal(got, want)


def test_corruption_after_caching_is_still_detected(tmp_path):
    ds, want = _written(tmp_path, "zstd+crc32c")
    time.sleep(SETTLED)
    ds[...]
    path = _chunk_file(tmp_path / "a", "c/0/1")
    with open(path, "rb") as f:
        raw = bytearray(f.read())
    raw[3] ^= 0xFF
    _rewrite_in_place(path, bytes(raw))
    with pytest.raises(ChecksumError):
        ds[0:4, 4:8]


def test_own_writes_replace_cached_chunks(tmp_path):
    ds, want = _written(tmp_path)
    time.sleep(SETTLED)
    ds[...]
    ds[1:3, 1:7] = 0
    want[1:3, 1:7] = 0
    np.testing.assert_array_equal(ds[...], want)


def _entry(ds, key="c/0/0"):
    (e,) = chunk_cache().lookup(ds._cache_space, [key], ds._versions([key]))
    return e


def test_partial_spans_are_cached_as_read_and_never_rewritten(tmp_path):
    ds = strataio.create_dataset(tmp_path / "a", (8, 8), "float64", (8, 8), codec=None)
    want = np.random.default_rng(1).random((8, 8))
    ds[...] = want
    time.sleep(SETTLED)
    np.testing.assert_array_equal(ds[2:3, :], want[2:3])  # bytes of row 2 only
    assert _entry(ds) is None  # read once: remembered, not kept
    np.testing.assert_array_equal(ds[2:3, :], want[2:3])
    first = _entry(ds)
    assert (first.lo, first.hi) == (2 * 64, 3 * 64)
    held = first.chunk.copy()
    np.testing.assert_array_equal(ds[3:5, 0:3], want[3:5, 0:3])  # not covered: read anew
    second = _entry(ds)
    assert (second.lo, second.hi) == (3 * 64, 4 * 64 + 3 * 8)
    assert second.chunk is not first.chunk
    # a buffer the cache handed out is never written again (a reader may be copying from it)
    np.testing.assert_array_equal(first.chunk, held)
    before = _hits()
    np.testing.assert_array_equal(ds[3:5, 1:2], want[3:5, 1:2])  # inside: a hit
    assert _hits() - before == 1
    np.testing.assert_array_equal(ds[...], want)


def test_checksummed_chunks_are_read_checked_and_cached_whole(tmp_path):
    """The default codec (crc32c) reads a chunk whole, checks it in place, keeps it whole."""
    ds = strataio.create_dataset(tmp_path / "a", (8, 8), "float64", (8, 8))
    want = np.random.default_rng(1).random((8, 8))
    ds[...] = want
    time.sleep(SETTLED)
    for _ in range(2):  # kept on its second read
        np.testing.assert_array_equal(ds[2:3, :], want[2:3])
    e = _entry(ds)
    assert (e.lo, e.hi) == (0, 8 * 8 * 8)
    np.testing.assert_array_equal(e.chunk, want)
    before = _hits()
    np.testing.assert_array_equal(ds[5:7, 1:4], want[5:7, 1:4])
    assert _hits() - before == 1


def test_stores_without_versions_read_without_the_cache():
    from strataio.arrays.metadata import ArrayMetadata
    from strataio.arrays.store import BackendChunkStore
    from strataio.storage.memory import MemoryBackend

    meta = ArrayMetadata.create((6, 6), "int32", (3, 3), None, 0, None)
    ds = strataio.Dataset(BackendChunkStore(MemoryBackend()), meta, "r+")
    want = np.arange(36, dtype="int32").reshape(6, 6)
    ds[...] = want
    np.testing.assert_array_equal(ds[1:5, 2:6], want[1:5, 2:6])
    np.testing.assert_array_equal(ds[...], want)
    assert len(chunk_cache()) == 0


def test_reads_from_many_threads_agree_with_numpy(tmp_path, monkeypatch):
    """One Dataset read by several threads at once: plans and entries are shared safely."""
    from concurrent.futures import ThreadPoolExecutor

    monkeypatch.setattr(cc, "SETTLE_NS", -(1 << 62))
    ds = strataio.create_dataset(tmp_path / "a", (40, 40), "int32", (4, 4))
    want = np.arange(1600, dtype="int32").reshape(40, 40)
    ds[...] = want
    rng = np.random.default_rng(7)
    boxes = []
    for _ in range(400):
        a, c = rng.integers(0, 39, 2)
        boxes.append((slice(a, rng.integers(a + 1, 41)), slice(c, rng.integers(c + 1, 41))))

    def check(box):
        np.testing.assert_array_equal(ds[box], want[box])

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(check, boxes))
    full = Section.full(ds.shape)
    assert ds._plan(full) is ds._plan(full)  # 100 chunks: remembered
    fine = strataio.create_dataset(tmp_path / "b", (20, 20), "int8", (1, 1))
    every = Section.full(fine.shape)
    assert fine._plan(every) is not fine._plan(every)  # 400 chunks: planned each time


def test_coarse_file_times_settle_later():
    now = 10**18
    fine = (1, 8, now - cc.SETTLE_NS - 1_000)  # sub-second ctime
    coarse = (1, 8, (now - cc.SETTLE_NS - 1_000) // 10**9 * 10**9)  # whole seconds
    assert now - coarse[2] == 10**9  # a second old: settled for a fine clock, not a coarse one
    assert cc.settled(fine, now)
    assert not cc.settled(coarse, now)
    assert cc.settled((1, 8, now - cc.COARSE_SETTLE_NS - 10**9), now)


def test_big_endian_chunks_are_cached_in_stored_order(tmp_path):
    ds = strataio.create_dataset(tmp_path / "a", (6, 6), ">f4", (3, 3))
    want = np.arange(36, dtype=">f4").reshape(6, 6)
    ds[...] = want
    time.sleep(SETTLED)
    ds[...]
    ds[...]
    assert not ds.codecs.stored_dtype.isnative
    (e,) = chunk_cache().lookup(ds._cache_space, ["c/1/1"], ds._versions(["c/1/1"]))
    assert e.chunk.dtype == ds.codecs.stored_dtype  # swapped while copying out, not stored
    got = ds[...]
    assert got.dtype.isnative
    np.testing.assert_array_equal(got, want)


def test_capacity_zero_disables_and_clear_cache_empties(tmp_path):
    ds, want = _written(tmp_path)
    time.sleep(SETTLED)
    ds[...]
    assert len(chunk_cache()) == 0  # read once: remembered, not kept
    ds[...]
    assert len(chunk_cache()) == 4
    ds.clear_cache()
    assert len(chunk_cache()) == 0
    chunk_cache().resize(0)
    np.testing.assert_array_equal(ds[...], want)
    assert len(chunk_cache()) == 0 and chunk_cache().nbytes == 0


def test_lru_eviction_keeps_within_capacity():
    c = DecodedChunkCache(capacity=3 * (800 + 256))
    for i in range(5):
        c.store("s", f"k{i}", CachedChunk((i, 1, 0), np.zeros(100), 0, 800))
    assert len(c) == 3 and c.nbytes <= c.capacity
    assert c.lookup("s", ["k0", "k4"], [(0, 1, 0), (4, 1, 0)])[0] is None
    # a version mismatch drops the entry
    assert c.lookup("s", ["k3"], [(3, 2, 0)]) == [None] and len(c) == 2
    c.store("s", "huge", CachedChunk((9, 1, 0), np.zeros(10_000), 0, 80_000))
    assert c.lookup("s", ["huge"], [(9, 1, 0)]) == [None]
    with pytest.raises(ConfigError, match="negative"):
        c.resize(-1)
    c.resize(0)
    assert len(c) == 0


def test_resize_takes_a_size_string_as_the_environment_does():
    """``resize`` takes what ``$STRATAIO_CHUNK_CACHE`` takes ("256MiB"); anything else that
    is no size is a ConfigError (it was a bare ``int()`` ValueError, no StrataError)."""
    c = DecodedChunkCache(capacity=1 << 20)
    c.resize("256MiB")
    assert c.capacity == 256 << 20
    c.resize(4096)
    assert c.capacity == 4096
    c.resize(1e6)
    assert c.capacity == 1_000_000 and type(c.capacity) is int
    c.resize(np.int64(4096))
    assert c.capacity == 4096
    for bad, said in (
        ("lots", "cannot read 'lots'"),
        ("unlimited", "bound"),
        ([1], "not a size"),
        (True, "not a size"),
        (1.5, "1.5 is not a whole number of bytes"),
        (float("inf"), "not a whole number"),
        (float("nan"), "not a whole number"),
    ):
        with pytest.raises(ConfigError, match=said):
            c.resize(bad)
    assert c.capacity == 4096


def test_size_from_environment(monkeypatch):
    monkeypatch.setattr(cc, "_cache", None)
    monkeypatch.setenv(cc.ENV_VAR, "1MiB")
    assert chunk_cache().capacity == 1 << 20
    monkeypatch.setattr(cc, "_cache", None)
    monkeypatch.setenv(cc.ENV_VAR, "lots")
    with pytest.raises(ConfigError, match="STRATAIO_CHUNK_CACHE"):
        chunk_cache()
    monkeypatch.setenv(cc.ENV_VAR, "unlimited")
    with pytest.raises(ConfigError, match="bound"):
        chunk_cache()


@pytest.mark.parametrize("empty", ["", "  "])
def test_an_empty_size_in_the_environment_is_the_default(monkeypatch, empty):
    """``STRATAIO_CHUNK_CACHE=`` means unset, as an empty variable does to most tools."""
    monkeypatch.setattr(cc, "_cache", None)
    monkeypatch.setenv(cc.ENV_VAR, empty)
    assert chunk_cache().capacity == cc.DEFAULT_CAPACITY == 64 << 20


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_random_reads_and_writes_with_everything_cached(tmp_path_factory, monkeypatch, data):
    """With every chunk cached at once, reads still match a numpy oracle through writes."""
    monkeypatch.setattr(cc, "SETTLE_NS", -(1 << 62))
    nd = data.draw(st.integers(1, 3))
    shape = tuple(data.draw(st.integers(1, 10)) for _ in range(nd))
    chunks = tuple(data.draw(st.integers(1, 5)) for _ in range(nd))
    codec = data.draw(st.sampled_from([None, "zstd"]))
    ds = strataio.create_dataset(
        tmp_path_factory.mktemp("c") / "a", shape, "int16", chunks, codec=codec, fill_value=3
    )
    oracle = np.full(shape, 3, dtype="int16")

    def box():
        lo = [data.draw(st.integers(0, n)) for n in shape]
        return tuple(slice(a, data.draw(st.integers(a, n))) for a, n in zip(lo, shape))

    for step in range(5):
        if data.draw(st.booleans()):
            b = box()
            vals = np.full(oracle[b].shape, step, dtype="int16")
            ds[b] = vals
            oracle[b] = vals
        for _ in range(2):
            b = box()
            np.testing.assert_array_equal(ds[b], oracle[b])
    np.testing.assert_array_equal(ds[...], oracle)


def test_a_chunk_is_admitted_on_its_second_read_of_one_version():
    c = DecodedChunkCache(capacity=1 << 20)
    assert not c.admit("s", "k", (1, 8, 0))  # first read: remembered only
    assert not c.admit("s", "k", (2, 8, 0))  # another version: remembered anew
    assert c.admit("s", "k", (2, 8, 0))  # the same version again: keep it
    assert not c.admit("s", "k", (2, 8, 0))  # (admitted once; the entry is what counts now)
    c.discard("s")
    assert not c.admit("s", "k", (2, 8, 0))  # forgotten with the space's entries
    c.clear()
    assert not c.admit("s", "k", (2, 8, 0))
    for i in range(cc.SEEN_ENTRIES + 1):  # remembered keys are bounded
        c.admit("t", f"k{i}", (i, 8, 0))
    assert not c.admit("t", "k0", (0, 8, 0))


def test_datasets_of_one_name_in_two_catalogs_keep_their_own_cached_chunks(tmp_path):
    """Two Sessions of one process, each with its own catalog and a dataset called ``a``:
    their chunks are two arrays' and are cached apart, so reading them in turn is served
    from memory (they used to take each other's cache entries at every read)."""
    from strataio.storage.posix import PosixBackend
    from strataio.tiers.tier import Tier, TierSet

    handles, wants = [], []
    for n in range(2):
        root = tmp_path / f"s{n}"
        tiers = TierSet([Tier("local", PosixBackend(root / "local"), "localdisk", order=0)])
        s = strataio.Session(tiers=tiers, catalog=root / "cat.db")
        want = np.full((8, 8), n + 1, dtype="int32")
        with s.create_dataset("a", (8, 8), "int32", (4, 4), hint="LOCALDISK", codec=None) as ds:
            ds[...] = want
        handles.append((s, s.open_dataset("a")))
        wants.append(want)
    try:
        time.sleep(SETTLED)
        for _ in range(2):  # remembered, then kept
            for (_, ds), want in zip(handles, wants):
                np.testing.assert_array_equal(ds[...], want)
        before = _hits()
        for (_, ds), want in zip(handles, wants):
            np.testing.assert_array_equal(ds[...], want)
        assert _hits() - before == 8
    finally:
        for s, ds in handles:
            ds.close()
            s.close()
