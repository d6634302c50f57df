"""The ChunkStore contract as one test suite, run against every implementation.

An implementation's test is a subclass of :class:`ChunkStoreContract` that defines a
``stores`` fixture returning a :class:`StoreFactory` (see ``test_chunkstore_contract.py``).
Every check compares against a model: a dict of chunk key to bytes. Optional capabilities are
checked where a store declares them, and must raise :class:`CapabilityError` where it does not.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Hashable
from typing import Protocol

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from strataio.arrays.dataset import Dataset
from strataio.arrays.metadata import ArrayMetadata
from strataio.arrays.store import ChunkStore, StoreCapabilities
from strataio.errors import CapabilityError, StrataError

#: the array every store is made for, and the chunk keys the checks use
SHAPE, CHUNKS, DTYPE = (64, 48), (8, 6), "float32"
KEYS = [f"c/{i}/{j}" for i in range(3) for j in range(3)]


class StoreFactory(Protocol):
    def new(self) -> ChunkStore:
        """A fresh store, empty of chunks, for an array of SHAPE/CHUNKS/DTYPE."""

    def reopen(self, store: ChunkStore) -> ChunkStore:
        """Close ``store`` and open another handle on the same data (as a new process would)."""


def _bytes(buf) -> bytes:
    return None if buf is None else bytes(memoryview(buf).cast("B"))


def _payload(rng: np.random.Generator, n: int | None = None) -> bytes:
    n = int(rng.integers(1, 300)) if n is None else n
    return rng.integers(0, 256, n, dtype=np.uint8).tobytes()


class ChunkStoreContract:
    """Subclasses provide the ``stores`` fixture."""

    @pytest.fixture
    def stores(self) -> StoreFactory:  # pragma: no cover - overridden
        raise NotImplementedError

    # ----------------------------------------------------------------- required methods
    def test_is_a_chunk_store(self, stores: StoreFactory) -> None:
        store = stores.new()
        assert isinstance(store, ChunkStore)
        assert isinstance(store.capabilities, StoreCapabilities)
        assert isinstance(store.name, str) and store.name

    def test_chunks_never_written_read_none(self, stores: StoreFactory) -> None:
        store = stores.new()
        assert store.get_chunks(KEYS[:3]) == [None, None, None]
        assert store.get_chunks([]) == []
        assert store.list_chunks() == []

    def test_put_get_round_trip_in_order(self, stores: StoreFactory) -> None:
        store = stores.new()
        rng = np.random.default_rng(1)
        model = {k: _payload(rng) for k in KEYS[::2]}
        store.put_chunks(list(model.items()))
        got = store.get_chunks(KEYS)
        assert [_bytes(b) for b in got] == [model.get(k) for k in KEYS]
        assert [_bytes(b) for b in store.get_chunks(KEYS[::-1])] == [
            model.get(k) for k in KEYS[::-1]
        ]

    def test_put_accepts_buffers_and_replaces(self, stores: StoreFactory) -> None:
        store = stores.new()
        arr = np.arange(40, dtype=np.float32)
        store.put_chunks(
            [(KEYS[0], b"abc"), (KEYS[1], bytearray(b"defg")), (KEYS[2], memoryview(arr))]
        )
        assert [_bytes(b) for b in store.get_chunks(KEYS[:3])] == [
            b"abc",
            b"defg",
            arr.tobytes(),
        ]
        store.put_chunks([(KEYS[0], b"a much longer replacement"), (KEYS[1], b"x")])
        assert [_bytes(b) for b in store.get_chunks(KEYS[:2])] == [
            b"a much longer replacement",
            b"x",
        ]

    def test_delete_and_list(self, stores: StoreFactory) -> None:
        store = stores.new()
        store.put_chunks([(k, k.encode()) for k in KEYS[:4]])
        assert sorted(store.list_chunks()) == sorted(KEYS[:4])
        store.delete_chunks([KEYS[1], KEYS[7]])  # one never written: no error
        assert sorted(store.list_chunks()) == sorted([KEYS[0], KEYS[2], KEYS[3]])
        assert store.get_chunks([KEYS[1]]) == [None]
        store.put_chunks([(KEYS[1], b"back")])
        assert _bytes(store.get_chunks([KEYS[1]])[0]) == b"back"

    def test_meta_round_trip(self, stores: StoreFactory) -> None:
        store = stores.new()
        doc = ArrayMetadata.create(SHAPE, DTYPE, CHUNKS, None, 0, {"v": 1}).to_json()
        store.put_meta(doc)
        assert store.get_meta() == doc
        doc2 = ArrayMetadata.create(SHAPE, DTYPE, CHUNKS, None, 0, {"v": 2}).to_json()
        store.put_meta(doc2)
        assert store.get_meta() == doc2
        back = stores.reopen(store)
        assert back.get_meta() == doc2

    def test_update_meta_applies_each_change_to_the_document_stored_then(
        self, stores: StoreFactory
    ) -> None:
        """Each change is made of the zarr.json stored when it runs: four threads adding one
        attribute at a time, at once, keep every one. A change that raises puts nothing."""
        store = stores.new()
        doc = ArrayMetadata.create(SHAPE, DTYPE, CHUNKS, None, 0, {"v": 1})
        store.put_meta(doc.to_json())

        def add(key: str, raw: bytes | None) -> bytes:
            assert raw is not None
            now = ArrayMetadata.from_json(raw)
            now.attrs[key] = True
            return now.to_json()

        def adder(who: int) -> None:
            for i in range(8):
                store.update_meta(functools.partial(add, f"{who}.{i}"))

        threads = [threading.Thread(target=adder, args=(w,)) for w in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads)
        want = {"v": 1} | {f"{w}.{i}": True for w in range(4) for i in range(8)}
        assert ArrayMetadata.from_json(store.get_meta()).attrs == want
        before = store.get_meta()

        def refuse(raw: bytes | None) -> bytes:
            raise StrataError("refused")

        with pytest.raises(StrataError, match="refused"):
            store.update_meta(refuse)
        assert store.get_meta() == before

    def test_reopen_sees_flushed_chunks(self, stores: StoreFactory) -> None:
        store = stores.new()
        rng = np.random.default_rng(2)
        model = {k: _payload(rng) for k in KEYS[:5]}
        store.put_chunks(list(model.items()))
        store.delete_chunks([KEYS[4]])
        del model[KEYS[4]]
        store.flush()
        back = stores.reopen(store)
        assert sorted(back.list_chunks()) == sorted(model)
        assert [_bytes(b) for b in back.get_chunks(KEYS)] == [model.get(k) for k in KEYS]

    def test_concurrent_puts(self, stores: StoreFactory) -> None:
        """A Dataset puts disjoint chunks from several threads at once."""
        store = stores.new()
        rng = np.random.default_rng(3)
        model = {k: _payload(rng, 2000) for k in KEYS}
        errors: list[BaseException] = []

        def put(keys: list[str]) -> None:
            try:
                for k in keys:
                    store.put_chunks([(k, model[k])])
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=put, args=(KEYS[i::3],)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        store.flush()
        assert [_bytes(b) for b in store.get_chunks(KEYS)] == [model[k] for k in KEYS]

    # ----------------------------------------------------------------- capabilities
    def test_absent_capabilities_refuse_clearly(self, stores: StoreFactory) -> None:
        store = stores.new()
        caps = store.capabilities
        assert not caps.chunk_cache or caps.versions
        calls = [
            ("partial_reads", lambda: store.read_span(KEYS[0], 0, memoryview(bytearray(4)))),
            ("versions", lambda: store.chunk_versions(KEYS[:1])),
            ("versions", lambda: store.get_chunks_as(KEYS[:1], [None])),
            ("chunk_cache", lambda: store.cache_space),
        ]
        for name, call in calls:
            if getattr(caps, name):
                continue
            with pytest.raises(CapabilityError, match=name) as info:
                call()
            assert isinstance(info.value, StrataError)

    def test_partial_reads(self, stores: StoreFactory) -> None:
        store = stores.new()
        if not store.capabilities.partial_reads:
            pytest.skip("no partial reads")
        data = _payload(np.random.default_rng(4), 1000)
        store.put_chunks([(KEYS[0], data)])
        for lo, n in ((0, 1000), (0, 1), (999, 1), (123, 456)):
            out = bytearray(n)
            assert store.read_span(KEYS[0], lo, memoryview(out)) == 1000
            assert bytes(out) == data[lo : lo + n]
        assert store.read_span(KEYS[1], 0, memoryview(bytearray(8))) is None

    def test_versions_change_with_the_chunk(self, stores: StoreFactory) -> None:
        store = stores.new()
        if not store.capabilities.versions:
            pytest.skip("no versions")
        assert store.chunk_versions(KEYS[:2]) == [None, None]
        store.put_chunks([(KEYS[0], b"one")])
        (v1, none) = store.chunk_versions(KEYS[:2])
        assert v1 is not None and none is None
        assert store.chunk_versions(KEYS[:1]) == [v1]  # stable while unchanged
        store.put_chunks([(KEYS[0], b"two")])
        assert store.chunk_versions(KEYS[:1]) != [v1]
        store.delete_chunks(KEYS[:1])
        assert store.chunk_versions(KEYS[:1]) == [None]

    def test_chunks_read_under_their_versions(self, stores: StoreFactory) -> None:
        """A read through :meth:`get_chunks_as` says its bytes came from the object the
        versions were taken of, where nothing failed over."""
        store = stores.new()
        if not store.capabilities.versions:
            pytest.skip("no versions")
        store.put_chunks([(KEYS[0], b"one")])
        store.flush()
        store.get_chunks(KEYS[:1])  # (a tiered store may stage it on its first read)
        versions = store.chunk_versions(KEYS[:2])
        got = store.get_chunks_as(KEYS[:2], versions)
        assert [(None if b is None else _bytes(b)) for b, _ in got] == [b"one", None]
        assert got[0][1] is True

    def test_cache_space_names_one_store(self, stores: StoreFactory) -> None:
        a, b = stores.new(), stores.new()
        if not a.capabilities.chunk_cache:
            pytest.skip("no decoded-chunk cache")
        assert isinstance(a.cache_space, Hashable)
        assert a.cache_space == a.cache_space
        assert a.cache_space != b.cache_space

    # ----------------------------------------------------------------- through a Dataset
    @pytest.mark.parametrize("codec", [None, "crc32c", "zstd"])
    def test_a_dataset_over_the_store_matches_numpy(self, stores: StoreFactory, codec) -> None:
        store = stores.new()
        meta = ArrayMetadata.create(SHAPE, DTYPE, CHUNKS, codec, -1, None)
        store.put_meta(meta.to_json())
        ds = Dataset(store, meta, "r+", name="contract")
        want = np.full(SHAPE, -1, dtype=DTYPE)
        rng = np.random.default_rng(5)
        for _ in range(12):
            a = [int(rng.integers(0, n)) for n in SHAPE]
            b = [int(rng.integers(x + 1, n + 1)) for x, n in zip(a, SHAPE)]
            box = tuple(slice(x, y) for x, y in zip(a, b))
            if rng.random() < 0.5:
                val = rng.standard_normal([y - x for x, y in zip(a, b)]).astype(DTYPE)
                ds[box] = val
                want[box] = val
            else:
                np.testing.assert_array_equal(ds[box], want[box])
        ds.close()
        back = Dataset(stores.reopen(store), meta, "r")
        np.testing.assert_array_equal(back[...], want)

    def test_state_machine(self, stores: StoreFactory) -> None:
        """Random puts, deletes, flushes and reopens; after each step every chunk reads back
        its last value and the listing is the model's keys."""

        class Machine(ChunkStoreMachine):
            factory = stores

        run_state_machine_as_test(
            Machine,
            settings=settings(
                max_examples=12,
                stateful_step_count=10,
                deadline=None,
                suppress_health_check=list(HealthCheck),
            ),
        )


class ChunkStoreMachine(RuleBasedStateMachine):
    factory: StoreFactory

    def __init__(self) -> None:
        super().__init__()
        self.store = self.factory.new()
        self.model: dict[str, bytes] = {}
        self.versions: dict[str, object] = {}

    @rule(
        keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=4, unique=True),
        data=st.data(),
    )
    def put(self, keys: list[str], data: st.DataObject) -> None:
        items = [(k, data.draw(st.binary(min_size=0, max_size=64))) for k in keys]
        self.store.put_chunks(items)
        self.model.update(items)

    @rule(keys=st.lists(st.sampled_from(KEYS), max_size=3, unique=True))
    def delete(self, keys: list[str]) -> None:
        self.store.delete_chunks(keys)
        for k in keys:
            self.model.pop(k, None)

    @rule()
    def flush(self) -> None:
        self.store.flush()

    @precondition(lambda self: bool(self.model))
    @rule()
    def reopen(self) -> None:
        self.store.flush()
        self.store = self.factory.reopen(self.store)

    @invariant()
    def chunks_read_back(self) -> None:
        got = [_bytes(b) for b in self.store.get_chunks(KEYS)]
        assert got == [self.model.get(k) for k in KEYS]
        assert sorted(self.store.list_chunks()) == sorted(self.model)

    @invariant()
    def versions_follow_presence(self) -> None:
        if self.store.capabilities.versions:
            vs = self.store.chunk_versions(KEYS)
            assert [v is not None for v in vs] == [k in self.model for k in KEYS]
