"""The Backend contract as one test suite, run against every backend.

A backend's test is a subclass of :class:`BackendContract` that defines a ``backend`` fixture
(see ``test_backends.py``). Every check compares against a numpy oracle of the object's bytes:
reads past the end of an object read zeros (a hole), writes past the end grow it with zeros,
and a backend without in-place writes must still produce the same bytes (read-modify-write).
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from strataio.errors import ExistsError, InvalidKeyError, NotFoundError
from strataio.layout.extents import Extents
from strataio.storage.base import Backend

INVALID_KEYS = [
    "",
    "..",
    "../x",
    "a/../../x",
    "a/./b",
    "/etc/passwd",
    "a//b",
    "a/",
    "a\x00b",
    "C:x",
    "a\\b",
]


def random_bytes(rng: np.random.Generator, n: int) -> bytes:
    return rng.integers(0, 256, n, dtype=np.uint8).tobytes()


def random_extents(
    rng: np.random.Generator,
    span: int,
    count: int,
    *,
    disjoint: bool = False,
    max_length: int | None = None,
) -> Extents:
    """``count`` pieces within ``[0, span)``: unsorted, possibly empty, and (unless
    ``disjoint``) overlapping, placed in the data stream in a shuffled order with gaps.
    Overlapping pieces are up to ``max_length`` (default ``span // 8``) bytes long."""
    if disjoint:
        count = max(1, min(count, span // 2))
        cuts = np.sort(rng.choice(span, size=2 * count, replace=False))
        offsets, ends = cuts[0::2], cuts[1::2]
        order = rng.permutation(count)
        offsets, lengths = offsets[order], (ends - offsets)[order]
    else:
        offsets = rng.integers(0, span, count)
        lengths = rng.integers(0, max(2, max_length or span // 8), count)
        lengths[rng.random(count) < 0.1] = 0
    # stream positions: a shuffled packing with random gaps, so mem is not the running sum
    slot = rng.permutation(count)
    gaps = rng.integers(0, 5, count)
    sizes = (lengths + gaps)[np.argsort(slot)]
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    mem = starts[slot]
    return Extents(offsets, lengths, mem)


def oracle_read(obj: np.ndarray, ext: Extents) -> np.ndarray:
    """What ``read`` must return: pieces at their stream positions, past-end bytes zero."""
    out = np.zeros(int((ext.mem + ext.lengths).max(initial=0)), dtype=np.uint8)
    padded = np.concatenate([obj, np.zeros(max(0, ext.last - obj.size), dtype=np.uint8)])
    ext = ext.compact()
    if len(ext):
        out[Extents(ext.mem, ext.lengths).byte_indices()] = padded[ext.byte_indices()]
    return out


def oracle_write(obj: np.ndarray, ext: Extents, data: np.ndarray) -> np.ndarray:
    """The object after ``write`` (pieces disjoint): grown with zeros as needed."""
    out = np.zeros(max(obj.size, ext.last), dtype=np.uint8)
    out[: obj.size] = obj
    ext = ext.compact()
    if len(ext):
        out[ext.byte_indices()] = data[Extents(ext.mem, ext.lengths).byte_indices()]
    return out


def as_array(buf) -> np.ndarray:
    return np.frombuffer(memoryview(buf).cast("B"), dtype=np.uint8)


class BackendContract:
    """Generic tests of :class:`~strataio.storage.base.Backend`; subclasses supply ``backend``.

    ``object_size`` bounds the objects the random tests use (keep it small for slow backends).
    """

    object_size = 64 * 1024

    @pytest.fixture
    def backend(self) -> Backend:  # pragma: no cover - overridden
        raise NotImplementedError

    # ----------------------------------------------------------------- whole objects
    @pytest.mark.parametrize("n", [0, 1, 4097])
    def test_put_get_round_trip(self, backend: Backend, n: int) -> None:
        data = random_bytes(np.random.default_rng(n), n)
        backend.put("obj/a", data)
        assert bytes(backend.get("obj/a")) == data
        assert backend.size("obj/a") == n
        assert backend.exists("obj/a")

    def test_put_accepts_buffers(self, backend: Backend) -> None:
        arr = np.arange(1000, dtype=np.float64)
        backend.put("f64", arr)
        assert as_array(backend.get("f64")).view(np.float64).tolist() == arr.tolist()
        backend.put("mv", memoryview(bytearray(b"xyz")))
        assert bytes(backend.get("mv")) == b"xyz"
        backend.put("dur", b"durable", durable=True)
        backend.sync(["dur"])
        assert bytes(backend.get("dur")) == b"durable"

    def test_put_replaces_whole_object(self, backend: Backend) -> None:
        backend.put("k", b"a" * 5000)
        backend.put("k", b"short")
        assert bytes(backend.get("k")) == b"short"
        assert backend.size("k") == 5

    def test_put_is_atomic_to_readers(self, backend: Backend) -> None:
        versions = [b"A" * 3000, b"B" * 7000]
        backend.put("swap", versions[0])
        seen: list[bytes] = []
        stop = threading.Event()

        def reader() -> None:
            while not stop.is_set():
                seen.append(bytes(backend.get("swap")))

        t = threading.Thread(target=reader)
        t.start()
        try:
            for i in range(20):
                backend.put("swap", versions[i % 2])
        finally:
            stop.set()
            t.join()
        assert seen
        assert all(s in versions for s in seen), "a reader saw a torn object"

    # ----------------------------------------------------------------- extents
    @pytest.mark.parametrize("seed", range(4))
    def test_read_random_extents(self, backend: Backend, seed: int) -> None:
        rng = np.random.default_rng(seed)
        n = int(rng.integers(1, self.object_size))
        obj = np.frombuffer(random_bytes(rng, n), dtype=np.uint8)
        backend.put("r/obj", obj)
        ext = random_extents(rng, int(n * 1.2) + 1, int(rng.integers(1, 40)))
        got = as_array(backend.read("r/obj", ext))
        np.testing.assert_array_equal(got, oracle_read(obj, ext))

    def test_read_edge_cases(self, backend: Backend) -> None:
        backend.put("e", b"0123456789")
        assert bytes(backend.read("e", Extents.empty())) == b""
        assert bytes(backend.read("e", Extents.single(3, 0))) == b""
        assert bytes(backend.read("e", Extents.single(0, 10))) == b"0123456789"
        assert bytes(backend.read("e", Extents.single(8, 4))) == b"89\0\0"
        assert bytes(backend.read("e", Extents.single(20, 3))) == b"\0\0\0"
        # stream order differs from offset order; repeated bytes
        ext = Extents([7, 0, 7], [2, 3, 1], [0, 2, 5])
        assert bytes(backend.read("e", ext)) == b"78012" + b"7"
        backend.put("empty", b"")
        assert bytes(backend.read("empty", Extents.single(0, 2))) == b"\0\0"

    @pytest.mark.parametrize("seed", range(4))
    def test_write_random_extents(self, backend: Backend, seed: int) -> None:
        rng = np.random.default_rng(100 + seed)
        n = int(rng.integers(1, self.object_size))
        obj = np.frombuffer(random_bytes(rng, n), dtype=np.uint8)
        backend.put("w/obj", obj)
        for _ in range(2):
            # pieces may reach past the end: the object grows, the gap reads as zeros
            ext = random_extents(rng, int(n * 1.5) + 16, int(rng.integers(1, 30)), disjoint=True)
            data = np.frombuffer(
                random_bytes(rng, int((ext.mem + ext.lengths).max(initial=0))), dtype=np.uint8
            )
            backend.write("w/obj", ext, data)
            obj = oracle_write(obj, ext, data)
            np.testing.assert_array_equal(as_array(backend.get("w/obj")), obj)
            assert backend.size("w/obj") == obj.size

    def test_write_creates_object(self, backend: Backend) -> None:
        backend.write("new/obj", Extents([4, 0], [2, 2]), b"ABCD")
        assert bytes(backend.get("new/obj")) == b"CD\0\0AB"
        backend.write("new/empty", Extents.empty(), b"")
        assert backend.exists("new/empty")
        assert backend.size("new/empty") == 0

    # ----------------------------------------------------------------- namespace
    def test_missing_key(self, backend: Backend) -> None:
        for op in (
            lambda: backend.get("nope"),
            lambda: backend.read("nope", Extents.single(0, 1)),
            lambda: backend.read("nope", Extents.empty()),
            lambda: backend.size("no/such"),
        ):
            with pytest.raises(NotFoundError, match="nope|no/such"):
                op()
        assert not backend.exists("nope")
        backend.delete("nope")  # a missing object is not an error

    def test_delete(self, backend: Backend) -> None:
        backend.put("d/x", b"1")
        backend.put("d/y", b"2")
        backend.delete("d/x")
        assert not backend.exists("d/x")
        assert backend.exists("d/y")
        with pytest.raises(NotFoundError):
            backend.get("d/x")
        assert sorted(backend.list("d")) == ["d/y"]

    def test_list_prefix(self, backend: Backend) -> None:
        keys = ["a/b/c", "a/b/d", "a/e", "ab/x", "f"]
        for k in keys:
            backend.put(k, k.encode())
        assert sorted(backend.list()) == sorted(keys)
        assert sorted(backend.list("a")) == ["a/b/c", "a/b/d", "a/e"]
        assert sorted(backend.list("a/")) == ["a/b/c", "a/b/d", "a/e"]
        assert sorted(backend.list("a/b")) == ["a/b/c", "a/b/d"]
        assert sorted(backend.list("ab")) == ["ab/x"]
        assert list(backend.list("zzz")) == []

    def test_remove_empty_folders_keeps_every_object(self, backend: Backend) -> None:
        """Removing the folders left empty under a prefix removes no object, under it or
        beside it, and a put there afterwards works; the whole namespace ("") is never
        asked for."""
        for k in ("a/b/c", "a/d", "ab/x", "f"):
            backend.put(k, k.encode())
        backend.delete("a/b/c")
        backend.remove_empty_folders("a")
        assert sorted(backend.list()) == ["a/d", "ab/x", "f"]
        backend.delete("a/d")
        backend.remove_empty_folders("a/")
        assert sorted(backend.list()) == ["ab/x", "f"]
        backend.remove_empty_folders("nothing/here")
        backend.put("a/b/c", b"again")
        assert bytes(backend.get("a/b/c")) == b"again"
        with pytest.raises(InvalidKeyError):
            backend.remove_empty_folders("")
        with pytest.raises(InvalidKeyError):
            backend.remove_empty_folders("../x")

    def test_unusual_key_characters(self, backend: Backend) -> None:
        keys = ["dir with space/\u00fc-\u00f1_%25.x", "a+b=c/d&e", "x~y/z'q", "c/0/1"]
        for k in keys:
            backend.put(k, k.encode())
        for k in keys:
            assert bytes(backend.get(k)) == k.encode()
            assert backend.exists(k)
        assert sorted(backend.list()) == sorted(keys)

    @pytest.mark.parametrize("key", INVALID_KEYS)
    def test_invalid_keys(self, backend: Backend, key: str) -> None:
        for op in (
            lambda: backend.put(key, b"x"),
            lambda: backend.get(key),
            lambda: backend.write(key, Extents.single(0, 1), b"x"),
            lambda: backend.read(key, Extents.single(0, 1)),
            lambda: backend.exists(key),
            lambda: backend.delete(key),
            lambda: backend.size(key),
            lambda: backend.get_many(["ok", key]),
        ):
            with pytest.raises(InvalidKeyError):
                op()
        assert list(backend.list()) == []

    def test_get_many(self, backend: Backend) -> None:
        keys = [f"m/{i}" for i in range(12)]
        for i, k in enumerate(keys):
            if i % 3:
                backend.put(k, k.encode() * (i + 1))
        got = backend.get_many(keys + ["m/missing"])
        assert len(got) == 13
        for i, (k, g) in enumerate(zip(keys, got)):
            if i % 3:
                assert bytes(g) == k.encode() * (i + 1)
            else:
                assert g is None
        assert got[-1] is None
        assert backend.get_many([]) == []

    def test_readinto_range_versioned(self, backend: Backend) -> None:
        """A range read with the object's version: the version :meth:`Backend.versions`
        gives while the object is unchanged, a new one once it is replaced."""
        backend.put("v/a", b"0123456789")
        out = bytearray(4)
        size, version = backend.readinto_range_versioned("v/a", 3, memoryview(out))
        assert (size, bytes(out)) == (10, b"3456")
        known = backend.versions(["v/a"])
        if known is None:
            assert version is None  # a backend without versions
            return
        assert version == known[0]
        backend.put("v/a", b"abcdefghij")
        _, again = backend.readinto_range_versioned("v/a", 3, memoryview(out))
        assert bytes(out) == b"defg" and again != version

    def test_put_versioned(self, backend: Backend) -> None:
        """A put's version is the one :meth:`Backend.object_versions` then gives for the
        object (None for a backend without versions); a put of the same bytes again is a new
        version (save where versions are hashes of the bytes), a put of others always."""
        first = backend.put_versioned("pv/a", b"same bytes")
        assert bytes(backend.get("pv/a")) == b"same bytes"
        known = backend.object_versions(["pv/a"])
        if known is None:
            assert first is None
            return
        assert first == known[0]
        second = backend.put_versioned("pv/a", b"same bytes", durable=True)
        assert second == backend.object_versions(["pv/a"])[0]
        assert (second == first) if backend.content_versions else (second != first)
        third = backend.put_versioned("pv/a", b"other bytes")
        assert third == backend.object_versions(["pv/a"])[0] and third not in (first, second)

    def test_delete_if_deletes_only_the_version_seen(self, backend: Backend) -> None:
        """:meth:`Backend.delete_if` deletes an object still at the version given, and
        leaves one put anew since."""
        seen = backend.put_versioned("di/a", b"old")
        if seen is None:
            return  # (no versions: callers delete unconditionally)
        assert backend.delete_if("di/a", seen)
        assert not backend.exists("di/a")
        assert not backend.delete_if("di/a", seen)  # (gone: nothing to do)
        seen = backend.put_versioned("di/b", b"old")
        backend.put_versioned("di/b", b"new")
        assert not backend.delete_if("di/b", seen)
        assert bytes(backend.get("di/b")) == b"new"

    def test_delete_if_many_deletes_only_the_versions_seen(self, backend: Backend) -> None:
        """:meth:`Backend.delete_if_many` deletes, of several objects, those still at the
        versions given, and leaves those put anew since."""
        keys = [f"dm/{i}" for i in range(5)]
        seen = [backend.put_versioned(k, f"old {k}".encode()) for k in keys]
        if seen[0] is None:
            return  # (no versions: callers delete unconditionally)
        for k in keys[1::2]:
            backend.put_versioned(k, f"new {k}".encode())  # (another process, since the look)
        assert backend.delete_if_many(keys, seen) == [True, False, True, False, True]
        assert sorted(backend.list("dm/")) == keys[1::2]
        assert backend.delete_if_many([], []) == []

    def test_put_if_replaces_only_the_version_seen(self, backend: Backend) -> None:
        """:meth:`Backend.put_if` replaces an object still at the version given (None: puts
        only where there is none), and refuses, changing nothing, where it changed since."""
        seen = backend.put_if("pi/a", b"first", None)
        if seen is None:
            return  # (no versions: callers put unconditionally)
        with pytest.raises(ExistsError):
            backend.put_if("pi/a", b"again", None)
        backend.put_versioned("pi/a", b"theirs")  # (another process, since the look)
        with pytest.raises(ExistsError):
            backend.put_if("pi/a", b"mine", seen)
        assert bytes(backend.get("pi/a")) == b"theirs"
        (now,) = backend.object_versions(["pi/a"])
        assert backend.put_if("pi/a", b"mine", now) == backend.object_versions(["pi/a"])[0]
        assert bytes(backend.get("pi/a")) == b"mine"

    def test_put_new_puts_only_where_nothing_is(self, backend: Backend) -> None:
        """:meth:`Backend.put_new` puts an object under a free name (its version as
        :meth:`Backend.put_versioned` gives it) and refuses a taken one, changing nothing."""
        first = backend.put_new("pn/a", b"first", durable=True)
        assert bytes(backend.get("pn/a")) == b"first"
        known = backend.object_versions(["pn/a"])
        assert first == (None if known is None else known[0])
        with pytest.raises(ExistsError):
            backend.put_new("pn/a", b"second")
        assert bytes(backend.get("pn/a")) == b"first"
        assert backend.object_versions(["pn/a"]) == known
        assert sorted(backend.list("pn/")) == ["pn/a"]  # no temporary file left behind
