"""``strataio bench sections`` at a small size: complete JSON, correct geometry, checked data,
the three cache modes doing what they say, before/after against an earlier run."""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import sys
import time

import numpy as np
import pytest
from click.testing import CliRunner

from strataio.arrays.chunk_cache import SETTLE_NS, chunk_cache
from strataio.arrays.dataset import Dataset
from strataio.arrays.store import CountingChunkStore
from strataio.bench.contenders import CONTENDERS, can_reopen, make_contender
from strataio.bench.sections import (
    CACHES,
    PAPER_PATTERNS,
    SectionsConfig,
    compare_with_baseline,
    count_steps,
    measure,
    measure_round_robin,
    plan_passes,
    run_sections,
    scaled_chunks,
    scaled_patterns,
    verify,
)
from strataio.cli import main
from strataio.errors import ChecksumError, StrataError


def test_geometry_scaled_to_8000() -> None:
    p = scaled_patterns(8000)
    # numpy (start, stop) = ((y0, x0), (y1, x1)); x runs along a row
    assert p["A"] == ((0, 0), (160, 160))
    assert p["B"] == ((0, 0), (160, 640))
    assert p["C"] == ((0, 0), (160, 3840))
    assert p["D"] == ((800, 800), (960, 960))
    assert p["E"] == ((0, 0), (13, 8000))  # 13 full-width rows: one contiguous piece
    assert p["F"] == ((0, 0), (8000, 13))  # every row, 13 columns: the worst naive case
    assert p["G"] == ((0, 0), (640, 160))
    assert p["H"] == ((960, 960), (1280, 1280))
    assert scaled_chunks(8000) == (160, 320)
    assert set(p) == set(PAPER_PATTERNS)


def test_tiny_sizes_keep_nonempty_boxes() -> None:
    for size in (2, 7, 50, 121):
        for (y0, x0), (y1, x1) in scaled_patterns(size).values():
            assert 0 <= y0 < y1 <= size and 0 <= x0 < x1 <= size


def test_bench_sections_small_run(tmp_path) -> None:
    out = tmp_path / "r.json"
    work = tmp_path / "work"
    res = CliRunner().invoke(
        main,
        [
            "bench",
            "sections",
            "--size",
            "100",
            "--chunks",
            "25,50",
            "--repeat",
            "1",
            "--dir",
            str(work),
            "--json",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    r = json.loads(out.read_text())
    assert "Sections, chunks 25x25" in res.output and "memcpy" in res.output
    assert r["array"]["shape"] == [100, 100]
    assert list(r["caches"]) == list(CACHES)
    for mode in CACHES:  # the summary says what each mode is
        assert f"cache mode {mode}:" in res.output
    for heading in ("s/zarr", "s/tstore", "s/tstore-c", "tiered/s", "tiered/crc"):
        assert heading in res.output
    assert r["memcpy_bytes_per_s"] > 0
    labels = [p["label"] for p in r["passes"]]
    assert labels[:2] == ["25x25", "50x50"] and labels[2].startswith("adaptive")
    for ps in r["passes"][:2]:
        got = {(x["pattern"], x["op"], x["cache"], x["contender"]) for x in ps["results"]}
        want = {
            (p, op, cache, c)
            for p in "ABCDEFGH"
            for op in ("read", "write")
            for cache in ("warm", "first", "cold")
            for c in CONTENDERS
        }
        assert got == want
        assert all(x["seconds"] > 0 and len(x["samples"]) == 1 for x in ps["results"])
    adaptive = r["passes"][2]
    assert adaptive["chunks"] == [1, 100]  # E is one full row at this size
    assert {x["pattern"] for x in adaptive["results"]} == {"E"}
    # naive call counts follow the row-major geometry: E one call, F and G one per row
    info = r["patterns"]
    assert info["E"]["naive_calls"] == 1
    assert info["F"]["naive_calls"] == 100
    assert info["G"]["naive_calls"] == info["G"]["stop"][0]
    assert [c["chunks"] for c in r["pattern_c_warm_read"]] == [[25, 25], [50, 50]]
    # the work directory is removed afterwards
    assert os.listdir(work) == []


def test_progress_steps_match_the_plan(tmp_path) -> None:
    cfg = SectionsConfig(
        size=60,
        chunks=(20,),
        patterns="ACE",
        repeat=1,
        ops=("read",),
        contenders=("naive", "strataio"),
        workdir=tmp_path,
    )
    steps: list[str] = []
    r = run_sections(cfg, steps.append)
    assert len(steps) == count_steps(cfg, plan_passes(cfg))
    assert [p["label"] for p in r["passes"]] == ["20x20", "adaptive 1x60"]


def test_chunk_cache_size_applies_to_the_run_only(tmp_path) -> None:
    before = chunk_cache().capacity
    cfg = SectionsConfig(
        size=60,
        chunks=(20,),
        patterns="C",
        repeat=1,
        contenders=("naive", "strataio"),
        adaptive=False,
        workdir=tmp_path,
        chunk_cache=0,
    )
    r = run_sections(cfg)
    assert r["chunk_cache_bytes"] == 0
    assert chunk_cache().capacity == before
    (c,) = r["pattern_c_warm_read"]
    assert c["fraction_of_memcpy"] > 0 and c["memcpy_bytes_per_s"] > 0


def test_bench_rejects_bad_options(tmp_path) -> None:
    bad = tmp_path / "other.json"
    bad.write_text(json.dumps({"benchmark": "superfile", "rows": []}))
    for args in (
        ["--patterns", "AZ"],
        ["--ops", "read,scan"],
        ["--contenders", "naive,lmdb"],
        ["--chunks", "a,b"],
        ["--chunk-cache", "lots"],
        ["--chunk-cache", "-1"],
        ["--baseline", str(bad)],
        ["--baseline", str(tmp_path / "absent.json")],
    ):
        res = CliRunner().invoke(main, ["bench", "sections", "--size", "50", *args])
        assert res.exit_code == 2, res.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cache", "warm,hot"], "unknown cache state ['hot']: choose from warm, first, cold"),
        (["--cache", ","], "unknown cache state []"),
        (["--contenders", "naive,tiered"], "unknown contender ['tiered']: choose from naive,"),
        (["--collective", "--cache", "first"], "for the collective run: choose from cold, warm"),
        (["--collective", "--reopen"], "--reopen times the single-process table"),
        (["--chunks", "10,64"], "chunk side 64 is larger than the array side 50"),
        (["--collective", "--chunks", "51"], "chunk side 51 is larger than the array side 50"),
    ],
)
def test_bad_modes_and_contenders_are_named(args: list[str], message: str) -> None:
    res = CliRunner().invoke(main, ["bench", "sections", "--size", "50", *args])
    assert res.exit_code == 2, res.output
    assert message in " ".join(res.output.split())


@pytest.mark.parametrize("reopen", [False, True], ids=["kept-open", "reopen"])
@pytest.mark.parametrize("name", CONTENDERS)
def test_every_mode_keeps_the_data(tmp_path, name: str, reopen: bool) -> None:
    """Reads and writes timed in every cache mode (with every call opening and closing the
    array, too), then the store still holds the oracle's data, a read in each mode returns
    it, and the contender holds a handle again."""
    if reopen and not can_reopen(name):
        pytest.skip(f"{name} is timed with its handle kept open only")
    data = np.random.default_rng(7).random((64, 64), dtype=np.float32)
    c = make_contender(name, tmp_path / name, (16, 16), 1 << 20)
    c.setup(data)
    try:
        start, stop = (5, 3), (40, 61)
        payload = np.ascontiguousarray(data[5:40, 3:61])
        for mode in CACHES:
            for op in ("read", "write"):
                times = measure(c, op, mode, start, stop, payload, 2, reopen=reopen)
                assert len(times) == 2 and all(t > 0 for t in times)
            verify(c, start, stop, data)
            verify(c, (0, 0), (64, 64), data)
    finally:
        c.close()


def _counting(ds: Dataset) -> Dataset:
    return Dataset(CountingChunkStore(ds.store), ds.meta, "r+", name=ds.name)


def test_first_mode_empties_the_chunk_cache(tmp_path) -> None:
    """``first`` reads every chunk from storage in every timed call; ``warm`` only in the
    untimed call before them: the decoded-chunk cache serves the rest."""
    cache = chunk_cache()
    saved = cache.capacity
    cache.resize(64 << 20)
    data = np.random.default_rng(9).random((64, 64), dtype=np.float32)
    c = make_contender("strataio", tmp_path / "s", (16, 16))
    c.setup(data)
    try:
        c.ds = _counting(c.ds)
        time.sleep(2 * SETTLE_NS / 1e9)  # chunks written moments ago are not cached
        start, stop = (0, 0), (40, 40)
        c.read(start, stop)
        per_call = c.ds.store.reads  # 9 chunks, however the read path asks for them
        assert per_call >= 9
        c.forget()
        c.ds.store.reads = 0
        hits = cache.hits
        measure(c, "read", "first", start, stop, data[:40, :40], 3)
        assert c.ds.store.reads == 4 * per_call  # the untimed call and each timed one
        assert cache.hits == hits
        c.forget()
        c.ds.store.reads = 0
        measure(c, "read", "warm", start, stop, data[:40, :40], 3)
        # the untimed call and the first timed one (a chunk is kept on its second read)
        assert c.ds.store.reads == 2 * per_call
        assert cache.hits >= hits + 2 * 9
    finally:
        c.close()
        cache.resize(saved)


def test_first_mode_of_the_written_tiered_contender_forgets_every_check(tmp_path) -> None:
    """``strataio-tiered-written``'s first read finds the copies it reads unchecked, as after
    their write: ``forget`` empties the tiered store's record of verified copies, the
    catalog's included (and the data read stays right)."""
    data = np.random.default_rng(13).random((64, 64), dtype=np.float32)
    c = make_contender("strataio-tiered-written", tmp_path / "t", (16, 16))
    c.setup(data)
    try:
        store = c.ds.store
        c.read((0, 0), (40, 40))
        c.read((0, 0), (40, 40))
        assert store.verified_chunks()  # the copies read were checked once and remembered
        c.forget()
        assert not store.verified_chunks()
        assert np.array_equal(c.read((0, 0), (40, 40)), data[:40, :40])
    finally:
        c.close()


def test_first_mode_of_the_tiered_contender_keeps_the_catalog_s_checks(tmp_path) -> None:
    """``strataio-tiered``'s ``forget`` leaves what a process opening the dataset anew finds:
    nothing learned from the catalog yet, so its next read learns its chunks' rows with the
    checks an earlier read made, and checks no copy whole (and reads the right data)."""
    data = np.random.default_rng(14).random((64, 64), dtype=np.float32)
    c = make_contender("strataio-tiered", tmp_path / "t", (16, 16))
    c.setup(data)
    try:
        store = c.ds.store
        c.read((0, 0), (40, 40))
        c.forget()
        assert store.verified_chunks() == set() and store.res.learned_keys() == []
        whole = []
        check = store._check_whole
        store._check_whole = lambda *a: whole.append(a[0]) or check(*a)
        assert np.array_equal(c.read((0, 0), (40, 40)), data[:40, :40])
        assert whole == []
        assert store.verified_chunks() == {f"c/{i}/{j}" for i in range(3) for j in range(3)}
        assert np.array_equal(c.read((8, 40), (24, 64)), data[8:24, 40:64])
        assert sorted(whole) == ["c/0/3", "c/1/3"]  # those never read before, checked whole
    finally:
        c.close()


def test_the_checked_plain_contender_checks_every_read(tmp_path) -> None:
    """``strataio-crc32c`` stores a CRC-32C with every chunk and a read checks it: a chunk
    file changed on disk after the first read fails the next read that the decoded-chunk
    cache does not serve."""
    data = np.random.default_rng(17).random((64, 64), dtype=np.float32)
    c = make_contender("strataio-crc32c", tmp_path / "c", (16, 16))
    c.setup(data)
    try:
        assert np.array_equal(c.read((0, 0), (16, 16)), data[:16, :16])
        chunk = c.root / "array.zarr" / "c" / "0" / "0"
        raw = bytearray(chunk.read_bytes())
        assert len(raw) == 16 * 16 * 4 + 4  # the chunk and its checksum
        raw[7] ^= 0xFF
        chunk.write_bytes(bytes(raw))
        c.forget()
        with pytest.raises(ChecksumError):
            c.read((0, 0), (16, 16))
    finally:
        c.close()


def _kvs_reads() -> dict[str, int]:
    import tensorstore as ts

    (m,) = ts.experimental_collect_matching_metrics("/tensorstore/cache/kvs_cache_read")
    return {v["category"]: v["value"] for v in m["values"]}


def test_first_mode_empties_the_tensorstore_cache_pool(tmp_path) -> None:
    """With its cache pool on, TensorStore revalidates cached chunks (``unchanged``) on a
    warm read; after ``forget`` it reads them again (``changed``)."""
    data = np.random.default_rng(11).random((64, 64), dtype=np.float32)
    c = make_contender("tensorstore-cached", tmp_path / "t", (16, 16), 1 << 20)
    c.setup(data)
    try:
        c.read((0, 0), (32, 32))
        before = _kvs_reads()
        c.read((0, 0), (32, 32))  # 4 chunks, all in the pool
        warm = _kvs_reads()
        assert warm["unchanged"] - before["unchanged"] == 4
        assert warm["changed"] == before["changed"]
        c.forget()
        c.read((0, 0), (32, 32))
        first = _kvs_reads()
        assert first["unchanged"] == warm["unchanged"]
        assert first["changed"] - warm["changed"] >= 4
    finally:
        c.close()


def _result(rows: list[tuple[str, str, str, str, float]]) -> dict:
    passes: dict[str, list[dict]] = {}
    for label, pat, cache, name, t in rows:
        passes.setdefault(label, []).append(
            {"pattern": pat, "op": "read", "cache": cache, "contender": name, "seconds": t}
        )
    return {
        "benchmark": "sections",
        "passes": [{"label": k, "results": v} for k, v in passes.items()],
    }


def test_compare_with_baseline_matches_rows_and_names_the_missing() -> None:
    old = _result(
        [
            ("8x8", "A", "warm", "strataio", 2.0),
            ("8x8", "A", "cold", "strataio", 4.0),  # not run now
            ("16x16", "A", "warm", "strataio", 1.0),  # a pass not run now
        ]
    )
    new = _result(
        [
            ("8x8", "A", "warm", "strataio", 1.0),
            ("8x8", "A", "first", "strataio", 3.0),  # no earlier row: a new mode
            ("8x8", "A", "warm", "strataio-tiered", 1.5),  # no earlier row: a new store
        ]
    )
    rows = compare_with_baseline(new, old)
    got = {
        (r["pass"], r["cache"], r["contender"]): (r["before"], r["after"], r["ratio"]) for r in rows
    }
    assert got == {
        ("8x8", "warm", "strataio"): (2.0, 1.0, 0.5),
        ("8x8", "first", "strataio"): (None, 3.0, None),
        ("8x8", "warm", "strataio-tiered"): (None, 1.5, None),
        ("8x8", "cold", "strataio"): (4.0, None, None),
        ("16x16", "warm", "strataio"): (1.0, None, None),
    }
    with pytest.raises(StrataError):
        compare_with_baseline(new, {"benchmark": "superfile"})


def test_baseline_from_an_earlier_run(tmp_path) -> None:
    """One command gives before and after: the earlier run's JSON as --baseline; a row it
    lacks (here a contender it did not run) is shown as such."""
    common = [
        "bench", "sections", "--size", "64", "--chunks", "16", "--patterns", "AE",
        "--repeat", "1", "--no-adaptive", "--ops", "read", "--dir", str(tmp_path / "w"),
    ]  # fmt: skip
    first = tmp_path / "before.json"
    res = CliRunner().invoke(
        main, [*common, "--contenders", "naive,strataio", "--json", str(first)]
    )
    assert res.exit_code == 0, res.output
    second = tmp_path / "after.json"
    res = CliRunner().invoke(
        main,
        [
            *common, "--contenders", "naive,strataio,strataio-tiered", "--cache", "warm,first",
            "--baseline", str(first), "--json", str(second),
        ],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "Before and after, chunks 16x16" in res.output and "new/old" in res.output
    assert "no earlier row" in res.output
    assert "rows of the earlier run not run now" in res.output  # its cold rows
    r = json.loads(second.read_text())
    assert r["baseline"]["path"] == str(first)
    rows = r["baseline"]["rows"]
    earlier = json.loads(first.read_text())["passes"][0]["results"]
    by_key = {(x["pattern"], x["cache"], x["contender"]): x["seconds"] for x in earlier}
    now = {
        (x["pattern"], x["cache"], x["contender"]): x["seconds"] for x in r["passes"][0]["results"]
    }
    for row in rows:
        key = (row["pattern"], row["cache"], row["contender"])
        assert row["before"] == by_key.get(key) and row["after"] == now.get(key)
        if row["before"] is not None and row["after"] is not None:
            assert row["ratio"] == pytest.approx(row["after"] / row["before"])
        else:
            assert row["ratio"] is None
    tiered = [x for x in rows if x["contender"] == "strataio-tiered"]
    assert len(tiered) == 4 and all(x["before"] is None for x in tiered)
    assert {x["cache"] for x in rows if x["after"] is None} == {"cold"}


@pytest.mark.parametrize("name", CONTENDERS)
def test_verify_catches_wrong_data(tmp_path, name: str) -> None:
    data = np.random.default_rng(3).random((40, 40), dtype=np.float32)
    c = make_contender(name, tmp_path / name, (8, 8))
    c.setup(data)
    try:
        verify(c, (3, 5), (20, 33), data)  # the real store passes
        # a store holding other data than the oracle fails the check
        c.write((4, 6), np.zeros((2, 2), np.float32) - 7)
        with pytest.raises(StrataError):
            verify(c, (3, 5), (20, 33), data)
    finally:
        c.close()
    assert not (tmp_path / name).exists()


def _resident_pages(path: str) -> int:
    """Pages of ``path`` in the page cache, by mincore(2) on a mapping (reads nothing)."""
    size = os.path.getsize(path)
    if size == 0:
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t] + [ctypes.c_int] * 3 + [ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value), "mmap failed"
        try:
            vec = ctypes.create_string_buffer((size + mmap.PAGESIZE - 1) // mmap.PAGESIZE)
            assert libc.mincore(addr, size, vec) == 0, "mincore failed"
            return sum(b & 1 for b in vec.raw)
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mincore via libc")
@pytest.mark.parametrize("name", CONTENDERS)
def test_cold_drop_evicts_every_file(tmp_path, name: str) -> None:
    data = np.random.default_rng(5).random((256, 256), dtype=np.float32)
    c = make_contender(name, tmp_path / name, (32, 32))
    c.setup(data)
    try:
        files = c.files()
        chunked = (
            "strataio",
            "strataio-tiered",
            "strataio-crc32c",
            "zarr",
            "tensorstore",
            "tensorstore-cached",
        )
        assert len(files) >= (65 if name in chunked else 1)
        c.read((0, 0), (256, 256))
        assert sum(map(_resident_pages, files)) > 0  # warm: the data is cached
        c.drop_cache()
        assert sum(map(_resident_pages, files)) == 0
        # after a write the pages are dirty; the drop flushes and evicts them too
        c.write((5, 7), np.ascontiguousarray(data[5:200, 7:100]))
        c.drop_cache()
        assert sum(map(_resident_pages, files)) == 0
    finally:
        c.close()


def test_round_robin_interleaves_the_contenders_calls():
    """Each round times one call of every contender, starting one further along each round;
    each timed call follows an untimed call of the same contender (never another's), and
    cold rounds evict each contender's files right before its timed call."""
    calls: list[str] = []

    class Fake:
        def __init__(self, name):
            self.name = name

        def read(self, start, stop):
            calls.append(self.name)

        def forget(self):
            calls.append(f"forget {self.name}")

        def drop_cache(self):
            calls.append(f"drop {self.name}")

    a, b, c = Fake("a"), Fake("b"), Fake("c")
    got = measure_round_robin([a, b, c], "read", "warm", (0,), (1,), None, 3)
    warm_up = ["a", "b", "c"]
    rounds = [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]
    assert calls == warm_up + [x for r in rounds for n in r for x in (n, n)]
    assert {k: len(v) for k, v in got.items()} == {"a": 3, "b": 3, "c": 3}
    calls.clear()
    measure_round_robin([a, b], "read", "cold", (0,), (1,), None, 2)
    assert calls == ["a", "drop a", "a", "b", "drop b", "b", "b", "drop b", "b", "a", "drop a", "a"]
    calls.clear()
    measure_round_robin([a, b], "read", "first", (0,), (1,), None, 1)
    assert calls == ["a", "b", "a", "forget a", "a", "b", "forget b", "b"]
    calls.clear()
    measure_round_robin([a], "read", "warm", (0,), (1,), None, 2)  # alone: nothing to settle
    assert calls == ["a", "a", "a"]


def test_reopen_times_open_section_close_for_every_call(tmp_path) -> None:
    """With ``reopen`` each call opens the dataset and closes it (a timed call includes
    both), the contender holds its own handle again afterwards, and a run leaves out the
    contender whose first reads need a handle kept open."""

    data = np.random.default_rng(3).random((64, 64), dtype=np.float32)
    c = make_contender("strataio-tiered", tmp_path / "t", (16, 16))
    c.setup(data)
    try:
        opened, closed = [], []
        open_dataset = c.session.open_dataset

        def counted(*a, **kw):
            ds = open_dataset(*a, **kw)
            opened.append(kw.get("mode"))
            close = ds.close
            ds.close = lambda: closed.append(1) or close()
            return ds

        c.session.open_dataset = counted
        standing = c.ds
        assert standing is not None
        measure(c, "read", "first", (0, 0), (20, 20), data[:20, :20], 3, reopen=True)
        # the untimed call, three timed ones, then the handle held between measurements
        assert opened == ["r"] * 4 + ["r+"] and len(closed) == 4
        assert standing.store.closed and c.ds is not standing and not c.ds.store.closed
        np.testing.assert_array_equal(c.read((0, 0), (64, 64)), data)
    finally:
        c.close()
    cfg = SectionsConfig(
        size=48,
        chunks=(16,),
        patterns="A",
        repeat=1,
        ops=("read", "write"),
        caches=("first",),
        contenders=("naive", "strataio", "strataio-tiered", "strataio-tiered-written"),
        adaptive=False,
        workdir=tmp_path,
        reopen=True,
    )
    steps: list[str] = []
    r = run_sections(cfg, steps.append)
    assert len(steps) == count_steps(cfg, plan_passes(cfg))
    assert r["config"]["reopen"] is True
    timed = {x["contender"] for x in r["passes"][0]["results"]}
    assert timed == {"naive", "strataio", "strataio-tiered"}


def test_a_reopened_tensorstore_write_syncs_its_files_as_strataio_s_close_does(tmp_path) -> None:
    data = np.random.default_rng(4).random((32, 32), dtype=np.float32)
    c = make_contender("tensorstore", tmp_path / "ts", (16, 16))
    c.setup(data)
    try:
        synced = []
        spec = c._spec
        c._spec = lambda *a: synced.append(spec(*a)["context"]["file_io_sync"]) or spec(*a)
        measure(c, "write", "warm", (0, 0), (8, 8), data[:8, :8], 2, reopen=True)
        measure(c, "read", "warm", (0, 0), (8, 8), data[:8, :8], 1, reopen=True)
        # the untimed write, two timed, the handle kept between; one untimed read, one timed
        assert synced == [True, True, True, False, False, False, False]
        assert c.t is not None and not c.sync_files
    finally:
        c.close()
