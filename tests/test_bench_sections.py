"""``strataio bench sections`` at a small size: complete JSON, correct geometry, checked data."""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from strataio.arrays.chunk_cache import chunk_cache
from strataio.bench.contenders import CONTENDERS, make_contender
from strataio.bench.sections import (
    PAPER_PATTERNS,
    SectionsConfig,
    count_steps,
    plan_passes,
    run_sections,
    scaled_chunks,
    scaled_patterns,
    verify,
)
from strataio.cli import main
from strataio.errors import StrataError


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
    assert r["memcpy_bytes_per_s"] > 0
    labels = [p["label"] for p in r["passes"]]
    assert labels[:2] == ["25x25", "50x50"] and labels[2].startswith("adaptive")
    for ps in r["passes"][:2]:
        got = {(x["pattern"], x["op"], x["cache"], x["contender"]) for x in ps["results"]}
        want = {
            (p, op, cache, c)
            for p in "ABCDEFGH"
            for op in ("read", "write")
            for cache in ("cold", "warm")
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
    for args in (
        ["--patterns", "AZ"],
        ["--ops", "read,scan"],
        ["--contenders", "naive,lmdb"],
        ["--chunks", "a,b"],
        ["--chunk-cache", "lots"],
        ["--chunk-cache", "-1"],
    ):
        res = CliRunner().invoke(main, ["bench", "sections", "--size", "50", *args])
        assert res.exit_code == 2, res.output


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
        assert len(files) >= (65 if name in ("strataio", "zarr", "tensorstore") else 1)
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
