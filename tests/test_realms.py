"""File realms: policies as Extents, persistent striped realms, their hints, and the two-phase
engine walking them, against ROMIO's default path at 1, 2 and 4 ranks."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from mpi4py import MPI

import strataio
from mpirun import run_mpi
from strataio.collective import twophase
from strataio.collective.hints import parse_hints
from strataio.collective.realms import (
    EvenRealms,
    StripedRealms,
    policy_from_hints,
    realm_alignment,
    stripe_size,
)
from strataio.errors import HintError
from strataio.layout.extents import Extents


def _check_partition(realms: list[Extents], lo: int, hi: int) -> None:
    """Realms are sorted, disjoint, and together exactly ``[lo, hi)``."""
    for r in realms:
        assert r.is_sorted()
    every = Extents.concat(realms).union()
    if hi > lo:
        assert len(every) == 1 and (int(every.offsets[0]), every.nbytes) == (lo, hi - lo)
    assert sum(r.nbytes for r in realms) == max(hi - lo, 0)


@settings(max_examples=200, deadline=None)
@given(
    stripe=st.integers(1, 50),
    naggr=st.integers(1, 6),
    lo=st.integers(0, 400),
    span=st.integers(0, 400),
)
def test_striped_realms_partition_the_range_by_owner(stripe, naggr, lo, span):
    sr = StripedRealms(stripe, naggr)
    realms = sr.realms(lo, lo + span, naggr, None)
    _check_partition(realms, lo, lo + span)
    for a, r in enumerate(realms):
        bytes_ = r.byte_indices()
        assert np.all(sr.owner(bytes_) == a)
        assert np.all((bytes_ // stripe) % naggr == a)


@settings(max_examples=100, deadline=None)
@given(naggr=st.integers(1, 6), lo=st.integers(0, 300), span=st.integers(0, 300),
       align=st.sampled_from([0, 1, 8, 64]))  # fmt: skip
def test_even_realms_are_one_piece_each_and_partition(naggr, lo, span, align):
    realms = EvenRealms(align).realms(lo, lo + span, naggr, None)
    assert len(realms) == naggr and all(len(r) <= 1 for r in realms)
    _check_partition(realms, lo, lo + span)


@settings(max_examples=150, deadline=None)
@given(stripe=st.integers(1, 40), naggr=st.integers(1, 5), lo=st.integers(0, 200),
       span=st.integers(1, 600), cb=st.integers(1, 90))  # fmt: skip
def test_windows_cut_each_realm_in_buffer_sized_pieces(stripe, naggr, lo, span, cb):
    """The two-phase windows: every realm byte in exactly one window of its aggregator, at
    its rank in the realm minus the window's start, windows of at most ``cb`` bytes."""
    realms = StripedRealms(stripe, naggr).clip(lo, lo + span)
    win = twophase._windows(realms, cb)
    assert np.all(np.diff(win.off) > 0)  # file order, disjoint
    assert int(win.len.sum()) == span
    for a, r in enumerate(realms):
        m = win.agg == a
        got = Extents(win.off[m], win.len[m]).byte_indices()
        assert np.array_equal(got, r.byte_indices())
        stream = win.iter[m] * cb + win.pos[m]
        assert np.array_equal(stream, r.mem[np.searchsorted(r.offsets, win.off[m], "right") - 1]
                              + (win.off[m] - r.offsets[np.searchsorted(r.offsets, win.off[m], "right") - 1]))  # fmt: skip
        assert np.all(win.pos[m] + win.len[m] <= cb)


def test_stripe_sizes_follow_romio():
    # aar: ceil(AAR / aggregators) (ADIOI_Calc_file_realms_aar); fsize: impending file size
    assert stripe_size("aar", 10, 110, 0, 3, 1) == 34
    assert stripe_size("aar", 10, 110, 0, 3, 16) == 48
    assert stripe_size("-1", 0, 100, 1000, 4, 1) == 250
    assert stripe_size("-1", 0, 2000, 1000, 4, 1) == 500  # a write that grows the file
    assert stripe_size("4096", 0, 1, 0, 4, 1) == 4096
    assert stripe_size("100", 0, 1, 0, 4, 64) == 128
    assert stripe_size("aar", 5, 5, 0, 4, 1) == 1


def test_realm_hints_parse_and_fold_alignment():
    h = parse_hints({"romio_cb_pfr": "enable", "romio_cb_fr_types": "fsize",
                     "romio_cb_fr_alignment": "4096"})  # fmt: skip
    assert (h.romio_cb_pfr, h.romio_cb_fr_types, h.romio_cb_fr_alignment) == ("enable", "-1", 4096)
    assert realm_alignment(h) == 4096
    assert realm_alignment(parse_hints({"striping_unit": "1024"})) == 1024
    assert parse_hints({"romio_cb_fr_type": "0"}).romio_cb_fr_types == "aar"  # ROMIO's key
    for bad in ("-2", "none", "0.5", str(2**63)):
        with pytest.raises(HintError, match="romio_cb_fr_types"):
            parse_hints({"romio_cb_fr_types": bad})
    with pytest.raises(HintError, match="romio_cb_fr_alignment"):
        parse_hints({"romio_cb_fr_alignment": "0"})
    assert "strataio_realm_alignment" not in parse_hints(None).as_dict()
    with pytest.raises(HintError, match="now called romio_cb_fr_alignment"):
        parse_hints({"strataio_realm_alignment": "64"})
    with pytest.raises(HintError, match="needs romio_cb_pfr=enable"):
        policy_from_hints(parse_hints({"strataio_realms": "dynamic"}))
    # persistent realms are a property of the open file: a view cannot switch them
    base = parse_hints({"romio_cb_pfr": "enable"})
    assert parse_hints({"romio_cb_pfr": "disable", "romio_cb_fr_types": "8"}, base=base) == base


def test_file_fixes_realms_at_first_two_phase_call_and_shows_the_size(tmp_path: Path):
    hints = {"romio_cb_pfr": "enable", "romio_cb_fr_types": "aar", "romio_cb_write": "enable",
             "romio_cb_read": "enable", "cb_buffer_size": "64"}  # fmt: skip
    data = np.arange(1000, dtype=np.uint8)
    with strataio.File.open(None, tmp_path / "f.bin", "w", hints=hints) as f:
        assert f.realms is None and f.hints["romio_cb_fr_types"] == "aar"
        f.write_at_all(100, data[:300])
        assert f.realms == StripedRealms(300, 1)
        assert f.hints["romio_cb_fr_types"] == "300"
        f.write_at_all(0, data)  # a larger AAR: the realms stay
        assert f.realms == StripedRealms(300, 1)
        out = np.zeros(1000, np.uint8)
        f.read_at_all(0, out)
        assert np.array_equal(out, data)
    with strataio.File.open(
        None, tmp_path / "g.bin", "w", hints={**hints, "romio_cb_fr_types": "-1"}
    ) as f:
        f.write_at_all(0, data[:10])
        assert f.realms == StripedRealms(10, 1)


def test_stripe_rounded_up_past_the_largest_offset_stays_below_it(tmp_path: Path):
    """A stripe that the alignment rounds up past 2**63 - 1 is the largest multiple of the
    alignment below it: the file is written, read and closed as with any other stripe."""
    assert stripe_size(str(2**62 + 1), 0, 1, 0, 1, 2**62) == 2**62
    hints = {"romio_cb_pfr": "enable", "romio_cb_fr_types": str(2**62 + 1),
             "romio_cb_fr_alignment": str(2**62), "romio_cb_write": "enable",
             "romio_cb_read": "enable"}  # fmt: skip
    data = np.arange(1000, dtype=np.uint8)
    with strataio.File.open(None, tmp_path / "w.bin", "w", hints=hints) as f:
        f.write_at_all(10, data)
        out = np.zeros(1000, np.uint8)
        f.read_at_all(10, out)
        assert f.realms == StripedRealms(2**62, 1) and np.array_equal(out, data)
    assert (tmp_path / "w.bin").read_bytes()[10:] == data.tobytes()


def test_dynamic_realms_follow_view_and_memory_layout(tmp_path: Path):
    hints = {"romio_cb_pfr": "enable", "strataio_realms": "dynamic", "romio_cb_write": "enable",
             "romio_cb_read": "enable"}  # fmt: skip
    with strataio.File.open(None, tmp_path / "d.bin", "w", hints=hints) as f:
        f.write_at_all(0, np.zeros(100, np.uint8))
        assert f.realms == StripedRealms(100, 1)
        f.write_at_all(0, np.zeros(400, np.uint8))  # same pattern (contiguous): kept
        assert f.realms == StripedRealms(100, 1)
        f.set_view(0, MPI.BYTE, MPI.BYTE.Create_resized(0, 2).Commit())
        f.write_at_all(0, np.ones(50, np.uint8))  # a new view: recomputed for this access
        assert f.realms == StripedRealms(99, 1) and f.hints["romio_cb_fr_types"] == "99"
        vec = MPI.BYTE.Create_vector(3, 1, 2).Commit()
        f.write_at_all(0, [np.ones(50, np.uint8), 10, vec])  # a new memory layout
        assert f.realms == StripedRealms(59, 1)  # 30 bytes through the view: 59-byte AAR


@pytest.mark.parametrize("nprocs", [1, 2, 4])
def test_every_realm_policy_matches_romio(nprocs: int, tmp_path: Path) -> None:
    """Random views and sequences of collective and independent calls on one open file, every
    realm policy, against ROMIO's default path; and the thesis's Figure 3.1 scenario."""
    out = run_mpi(nprocs, "realms_vs_romio.py", "--dir", tmp_path, "--cases", 3, timeout=240)
    assert "ok 24 cases" in out, out


class PersistentRealmsMachine(RuleBasedStateMachine):
    """One open file with persistent realms through random views, collective and independent
    writes and reads; after every step the file reads as a numpy oracle, the realms are fixed
    from the first two-phase call (recomputed only by dynamic realms on a new pattern), and the
    hints show their stripe."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="realms-sm-")
        self.oracle = np.zeros(0, dtype=np.uint8)
        self.f: strataio.File | None = None
        self.fixed: StripedRealms | None = None
        self.stride = 1
        self.stale = False
        self.types: list[MPI.Datatype] = []

    @initialize(
        fr=st.sampled_from(["aar", "-1", "5", "64"]),
        dynamic=st.booleans(),
        cb=st.sampled_from([16, 100, 4096]),
    )
    def open(self, fr: str, dynamic: bool, cb: int) -> None:
        hints = {"romio_cb_pfr": "enable", "romio_cb_fr_types": fr, "cb_buffer_size": str(cb),
                 "romio_cb_read": "enable", "romio_cb_write": "enable"}  # fmt: skip
        if dynamic:
            hints["strataio_realms"] = "dynamic"
        self.dynamic = dynamic
        self.f = strataio.File.open(None, os.path.join(self.dir, "f.bin"), "w", hints=hints)

    @rule(stride=st.integers(1, 4))
    def view(self, stride: int) -> None:
        t = MPI.BYTE.Create_resized(0, stride).Commit()
        self.types.append(t)
        self.f.set_view(0, MPI.BYTE, t)
        if self.dynamic and stride != self.stride:
            self.fixed, self.stale = None, True  # dynamic realms change at the next call
        self.stride = stride

    def _positions(self, offset: int, n: int) -> np.ndarray:
        return (offset + np.arange(n)) * self.stride

    @rule(offset=st.integers(0, 50), n=st.integers(1, 120), collective=st.booleans(),
          seed=st.integers(0, 2**16))  # fmt: skip
    def write(self, offset: int, n: int, collective: bool, seed: int) -> None:
        data = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)
        (self.f.write_at_all if collective else self.f.write_at)(offset, data)
        self.stale = self.stale and not collective
        pos = self._positions(offset, n)
        if pos[-1] >= self.oracle.size:
            self.oracle = np.concatenate(
                (self.oracle, np.zeros(pos[-1] + 1 - self.oracle.size, np.uint8))
            )
        self.oracle[pos] = data

    @rule(offset=st.integers(0, 50), n=st.integers(1, 120), collective=st.booleans())
    def read(self, offset: int, n: int, collective: bool) -> None:
        out = np.full(n, 7, dtype=np.uint8)
        got = (self.f.read_at_all if collective else self.f.read_at)(offset, out)
        self.stale = self.stale and not collective
        pos = self._positions(offset, n)
        inside = pos < self.oracle.size
        assert got == int(inside.sum())
        assert np.array_equal(out[inside], self.oracle[pos[inside]])

    @invariant()
    def realms_persist(self) -> None:
        if self.f is None:
            return
        realms = self.f.realms
        if self.stale:
            return
        if realms is None:
            assert self.fixed is None and self.f.hints["romio_cb_fr_types"] in (
                "aar",
                "-1",
                "5",
                "64",
            )
            return
        assert self.f.hints["romio_cb_fr_types"] == str(realms.stripe)
        if self.fixed is not None:
            assert realms == self.fixed
        self.fixed = realms

    def teardown(self) -> None:
        if self.f is not None:
            self.f.close()
        for t in self.types:
            t.Free()
        shutil.rmtree(self.dir, ignore_errors=True)


TestPersistentRealms = PersistentRealmsMachine.TestCase
TestPersistentRealms.settings = settings(max_examples=30, stateful_step_count=12, deadline=None)


@settings(max_examples=200, deadline=None)
@given(
    bounds=st.lists(st.integers(0, 300), max_size=30, unique=True),
    pieces=st.lists(st.tuples(st.integers(0, 300), st.integers(1, 40)), max_size=20),
)
def test_client_cut_at_inner_bounds_equals_the_full_split(bounds, pieces):
    """Cutting a rank's pieces only at the window bounds inside them (any overlap) is the
    full split."""
    ext = Extents([p[0] for p in pieces], [p[1] for p in pieces]).sort()
    b = np.array(sorted(bounds), dtype=np.int64)
    assert ext.split(twophase._inner(b, ext)) == ext.split(b)
