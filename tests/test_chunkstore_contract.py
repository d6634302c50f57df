"""Every ChunkStore against the shared contract: the backend store on each kind of backend
(a directory, a prefix, memory, S3) and the tiered store of a Session."""

from __future__ import annotations

import itertools

import pytest

import strataio
from chunkstore_contract import CHUNKS, DTYPE, SHAPE, ChunkStoreContract
from strataio.arrays.store import BackendChunkStore, ChunkStore
from strataio.storage.memory import MemoryBackend
from strataio.storage.posix import PosixBackend
from strataio.tiers.store import TieredChunkStore
from strataio.tiers.tier import Tier, TierSet


class BackendStores:
    """BackendChunkStores under fresh prefixes of one backend; reopening makes a new store
    (and, where ``make`` is given, a new backend object) over the same objects."""

    def __init__(self, backend, base: str = "", make=None) -> None:
        self.backend, self.base, self.make = backend, base, make
        self._n = itertools.count()

    def new(self) -> ChunkStore:
        return BackendChunkStore(self.backend, f"{self.base}a{next(self._n)}".strip("/"))

    def reopen(self, store: ChunkStore) -> ChunkStore:
        store.close()
        backend = self.make() if self.make is not None else self.backend
        return BackendChunkStore(backend, store.prefix)


class TestPosixDirectory(ChunkStoreContract):
    """One array per directory, as strataio.create_dataset stores it."""

    @pytest.fixture
    def stores(self, tmp_path):
        class Dirs:
            n = itertools.count()

            def new(self):
                return BackendChunkStore(PosixBackend(tmp_path / f"a{next(self.n)}"))

            def reopen(self, store):
                store.close()
                return BackendChunkStore(PosixBackend(store.backend.root, create=False))

        return Dirs()


class TestPosixPrefix(ChunkStoreContract):
    @pytest.fixture
    def stores(self, tmp_path):
        return BackendStores(
            PosixBackend(tmp_path), "group/", make=lambda: PosixBackend(tmp_path, create=False)
        )


class TestMemory(ChunkStoreContract):
    @pytest.fixture
    def stores(self):
        return BackendStores(MemoryBackend())


class TestS3(ChunkStoreContract):
    @pytest.fixture
    def stores(self, s3_backend):
        return BackendStores(s3_backend, "arrays/")


class TestTiered(ChunkStoreContract):
    """The store of a Session's datasets, on three posix tiers with a small fast tier (so
    that writes also evict); reopening opens the dataset in a new Session."""

    @pytest.fixture
    def stores(self, tmp_path):
        def tiers():
            return TierSet(
                [
                    Tier("fast", PosixBackend(tmp_path / "fast"), "localdisk", 4096, order=0),
                    Tier("disk", PosixBackend(tmp_path / "disk"), "remotedisk", order=1),
                    Tier("tape", PosixBackend(tmp_path / "tape"), "remotetape", order=2),
                ]
            )

        sessions: list[strataio.Session] = []

        def session():
            s = strataio.Session(tiers=tiers(), catalog=tmp_path / "cat.db")
            sessions.append(s)
            return s

        class Tiered:
            n = itertools.count()
            first = session()

            def new(self):
                ds = self.first.create_dataset(f"d{next(self.n)}", SHAPE, DTYPE, CHUNKS)
                assert isinstance(ds.store, TieredChunkStore)
                return ds.store

            def reopen(self, store):
                store.close()
                return session().open_dataset(store.name, "r+").store

        yield Tiered()
        for s in sessions:
            s.close()
