"""Conditional data sieving inside two-phase I/O: the window rule, ``romio_cb_ds_threshold``,
and its effect on what aggregators do (counted system calls) with the bytes unchanged."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mpi4py import MPI

import strataio
from strataio.collective import fileio
from strataio.collective.hints import parse_hints
from strataio.errors import HintError

WINDOW = 1 << 20


def _regular(extent: int, density: float, size: int = WINDOW) -> tuple[np.ndarray, np.ndarray]:
    n = size // extent
    off = np.arange(n, dtype=np.int64) * extent
    return off, np.full(n, int(density * extent), dtype=np.int64)


@pytest.mark.parametrize("write", [False, True])
def test_measured_rule_is_on_extent_and_density(write: bool) -> None:
    """Reads sieve while the hole (1 - d) E is within SIEVE_READ_BYTES, writes while
    (2 - d) E (the piece read back, the hole read and written) is within SIEVE_WRITE_BYTES."""
    for density in (0.25, 0.5, 0.75):
        if write:
            crossover = fileio.SIEVE_WRITE_BYTES / (2 - density)
        else:
            crossover = fileio.SIEVE_READ_BYTES / (1 - density)
        off, ln = _regular(int(crossover * 0.8), density)
        sp_off, sp_len = fileio.window_spans(off, ln, WINDOW, write)
        assert sp_off.size == 1 and int(sp_len[0]) == int(off[-1] + ln[-1])
        off, ln = _regular(int(crossover * 1.25), density)
        sp_off, sp_len = fileio.window_spans(off, ln, WINDOW, write)
        assert np.array_equal(sp_off, off) and np.array_equal(sp_len, ln)


def test_romio_threshold_is_a_percent_of_the_window_extent() -> None:
    off = np.array([0, 100, 1000], dtype=np.int64)
    ln = np.array([50, 50, 100], dtype=np.int64)  # 200 bytes of data over 1100: 18 %
    one = fileio.window_spans(off, ln, WINDOW, False, 18)
    assert one[0].tolist() == [0] and one[1].tolist() == [1100]
    runs = fileio.window_spans(off, ln, WINDOW, True, 19)
    assert runs[0].tolist() == [0, 100, 1000] and runs[1].tolist() == [50, 50, 100]
    assert fileio.window_spans(off, ln, WINDOW, False, 0)[0].size == 1  # ROMIO's default
    # the automatic rule joins the 50-byte hole and the 850-byte one alike
    assert fileio.window_spans(off, ln, WINDOW, False)[0].size == 1


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 40_000), st.integers(1, 5000)), min_size=1, max_size=40),
    st.sampled_from([fileio.AUTO_THRESHOLD, 0, 30, 60, 100]),
    st.booleans(),
)
def test_spans_cover_the_runs_and_start_and_end_on_them(pieces, threshold, write) -> None:
    off, ln = fileio.union_runs(
        np.array([p[0] for p in pieces], dtype=np.int64),
        np.array([p[1] for p in pieces], dtype=np.int64),
    )
    sp_off, sp_len = fileio.window_spans(off, ln, 1 << 30, write, threshold)
    ends = sp_off + sp_len
    assert np.all(sp_off[1:] > ends[:-1])  # sorted, disjoint, not touching
    assert np.isin(sp_off, off).all() and np.isin(ends, off + ln).all()
    span_of = np.searchsorted(sp_off, off, side="right") - 1
    assert np.all(off + ln <= ends[span_of])  # every run inside a span
    if threshold != fileio.AUTO_THRESHOLD:  # ROMIO's rule: whole window or every run
        assert sp_off.size in (1, off.size)


def test_hint_values_and_what_they_select() -> None:
    assert parse_hints(None).romio_cb_ds_threshold == "automatic"
    h = parse_hints({"romio_cb_ds_threshold": " 40 "})
    assert h.as_dict()["romio_cb_ds_threshold"] == "40"
    assert fileio.sieve_threshold(h, True) == 40
    for bad in ("-1", "half", ""):
        with pytest.raises(HintError, match="romio_cb_ds_threshold"):
            parse_hints({"romio_cb_ds_threshold": bad})
    assert fileio.sieve_threshold(parse_hints(None), False) == fileio.AUTO_THRESHOLD
    off = parse_hints({"romio_ds_read": "disable"})
    assert fileio.sieve_threshold(off, False) is None
    assert fileio.sieve_threshold(off, True) == fileio.AUTO_THRESHOLD
    # a given threshold decides, as ROMIO's overrides romio_ds_* inside two-phase
    given = parse_hints({"romio_ds_read": "disable", "romio_cb_ds_threshold": "0"})
    assert fileio.sieve_threshold(given, False) == 0


def _counting(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    calls = {"read": 0, "write": 0}
    for name, kind in (("pread_upto", "read"), ("pwrite_from", "write")):
        real = getattr(fileio, name)

        def counted(*a, _real=real, _kind=kind, **kw):  # type: ignore[no-untyped-def]
            calls[_kind] += 1
            return _real(*a, **kw)

        monkeypatch.setattr(fileio, name, counted)
    return calls


@pytest.mark.parametrize(
    ("threshold", "sieved"), [("automatic", True), ("0", True), ("30", False), ("25", True)]
)
def test_threshold_changes_the_calls_not_the_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, threshold: str, sieved: bool
) -> None:
    """A 4 KiB-extent view at 25 % density (3 KiB holes): sieved by the measured rule and by
    ROMIO's percent up to 25, one call per piece above."""
    path = tmp_path / "f.bin"
    init = np.random.default_rng(0).integers(0, 256, 1 << 18, dtype=np.uint8)
    init.tofile(path)
    data = np.random.default_rng(1).integers(0, 256, 1 << 16, dtype=np.uint8)
    view = MPI.BYTE.Create_contiguous(1024).Create_resized(0, 4096).Commit()
    hints = {"romio_cb_write": "enable", "romio_cb_read": "enable"}
    calls = _counting(monkeypatch)
    with strataio.File.open(
        None, path, "r+", hints=hints | {"romio_cb_ds_threshold": threshold}
    ) as f:
        f.set_view(0, MPI.BYTE, view)
        f.write_at_all(0, data)
        assert f.last_path == "two-phase"
        wrote = dict(calls)
        back = np.zeros_like(data)
        f.read_at_all(0, back)
    view.Free()
    read = calls["read"] - wrote["read"]
    assert (wrote["write"], read) == ((1, 1) if sieved else (64, 64))
    want = init.copy()
    want.reshape(-1, 4096)[:64, :1024] = data.reshape(64, 1024)
    assert np.array_equal(np.fromfile(path, dtype=np.uint8), want)
    assert np.array_equal(back, data)


def test_sweep_reports_crossovers_and_a_threshold() -> None:
    from strataio.bench.sieving import run_sweep

    r = run_sweep(window_mib=1, repeat=1, rounds=1, extents=[1024, 4096, 262144])
    assert len(r.cells) == 2 * 3 * 3 and len(r.crossovers) == 2 * 3
    dense = [c for c in r.cells if c.op == "read" and c.extent == 1024]
    assert all(c.per_piece > c.sieved for c in dense)  # 1024 calls against one
    for x in r.crossovers:
        assert x.extra == pytest.approx(x.hole + (x.extent if x.op == "write" else 0))
    assert all(t % 4096 == 0 for t in r.threshold.values())
    assert r.current == {"read": fileio.SIEVE_READ_BYTES, "write": fileio.SIEVE_WRITE_BYTES}
