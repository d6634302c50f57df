"""The APRIL tape experiment (its §6, Tables 2–3, Figure 4) on a shaped archive tier.

The archive is a POSIX directory behind :class:`~strataio.storage.shaped.Shaped` with the
``remote_tape_2002`` cost model (HPSS via SRB in 2002: 0.81 s connection, 6.17 s mount/open,
0.46 s close, 0.309 MB/s, one drive), its times multiplied by ``time_scale``. Two ways to read a
section of a tape-resident 2-D float32 array:

- **whole-file recall** (the baseline): the array is one file, and an HSM whose unit is the
  file recalls the whole of it before the section can be cut out;
- **sub-filing + staging** (APRIL): the array is chunked; the chunks covering the section are
  staged to disk and read from there.

Access patterns A–H are Table 2's, coordinates scaled from the paper's 50000 × 50000 array to
``size`` × ``size``; the paper writes a pattern as (x0, y0)-(x1, y1), i.e. numpy
``a[y0:y1, x0:x1]``. Times are reported both as modelled tape seconds (what the cost model
charges, independent of ``time_scale``) and as measured wall seconds.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from rich.table import Table

from strataio.storage.posix import PosixBackend
from strataio.storage.shaped import CostModel, Shaped
from strataio.tiers.tier import Tier, TierSet

PAPER_EDGE = 50000
#: Table 2 of the APRIL paper: (x0, y0, x1, y1) on a 50000 x 50000 array
PATTERNS = {
    "A": (0, 0, 1000, 1000),
    "B": (0, 0, 4000, 1000),
    "C": (0, 0, 24000, 1000),
    "D": (5000, 5000, 6000, 6000),
    "E": (0, 0, 50000, 80),
    "F": (0, 0, 80, 50000),
    "G": (0, 0, 1000, 4000),
    "H": (6000, 6000, 8000, 8000),
}
#: Table 3's read gains of sub-filing with small chunks (%), for comparison
PAPER_READ_GAIN = {"A": 85.2, "B": 43.2, "C": -240.5, "D": 84.1, "E": -3229.3, "F": 85.9,
                   "G": 88.3, "H": 76.6}  # fmt: skip


#: the least array edge: Figure 4's reads are whole sixteenths of it (a smaller array would
#: make them empty, nothing staged either way and no gain to show)
MIN_SIZE = 16


def scaled_section(pattern: str, size: int) -> tuple[slice, slice]:
    """Pattern ``pattern``'s box on a ``size`` x ``size`` array (rows = y, columns = x)."""
    x0, y0, x1, y1 = PATTERNS[pattern]

    def sc(v: int, up: bool) -> int:
        s = v * size / PAPER_EDGE
        return int(np.ceil(s)) if up else int(np.floor(s))

    return slice(sc(y0, False), max(sc(y1, True), sc(y0, False) + 1)), slice(
        sc(x0, False), max(sc(x1, True), sc(x0, False) + 1)
    )


def _tiers(root: Path, time_scale: float | None) -> TierSet:
    tape: Any = PosixBackend(root / "tape")
    if time_scale is not None:
        tape = Shaped(tape, CostModel.from_preset("remote_tape_2002"), time_scale)
    return TierSet(
        [
            Tier("disk", PosixBackend(root / "disk"), "localdisk", order=0),
            Tier("tape", tape, "remotetape", order=1, concurrency=1),
        ]
    )


def _setup(root: Path, size: int, chunk: int) -> np.ndarray:
    """Write the array to the (unshaped) tape directory: chunked and as one whole file."""
    from strataio.session import Session

    a = np.arange(size * size, dtype=np.float32).reshape(size, size)
    with Session(tiers=_tiers(root, None), catalog=root / "catalog.db") as s:
        ds = s.create_dataset("april", a.shape, a.dtype, (chunk, chunk), hint="REMOTETAPE")
        ds[...] = a
        ds.close()
    PosixBackend(root / "tape").put("whole/april.f32", a.tobytes(), durable=True)
    return a


def _tape(s: Any) -> Shaped:
    return s.tiers["tape"].backend


def run_tape(size: int = 4000, chunk: int = 80, time_scale: float = 0.001) -> dict[str, Any]:
    """Run patterns A–H both ways and the three Figure 4 scenarios on a ``size`` x ``size``
    array of ``chunk`` x ``chunk`` chunks (elements; ``size`` at least :data:`MIN_SIZE`);
    return the figures."""
    from strataio.session import Session

    if size < MIN_SIZE:
        raise ValueError(
            f"size {size}: the array edge must be at least {MIN_SIZE} (Figure 4 reads "
            "sixteenths of it)"
        )
    out: dict[str, Any] = {
        "size": size,
        "chunk": chunk,
        "time_scale": time_scale,
        "patterns": [],
        "reuse": [],
    }
    with tempfile.TemporaryDirectory(prefix="strataio-bench-tape-") as tmp:
        root = Path(tmp)
        a = _setup(root, size, chunk)
        with Session(tiers=_tiers(root, time_scale), catalog=root / "catalog.db") as s:
            tape = _tape(s)
            for name in PATTERNS:
                sec = scaled_section(name, size)
                # baseline: recall the whole file, then cut the section out
                tape.reset_stats()
                t0 = time.perf_counter()
                whole = np.frombuffer(tape.get("whole/april.f32"), dtype=np.float32)
                got = whole.reshape(size, size)[sec].copy()
                wall_whole = time.perf_counter() - t0
                model_whole = tape.stats().simulated
                assert np.array_equal(got, a[sec])
                # sub-filing: stage the cover to disk, read from there
                ds = s.open_dataset("april", "r+")
                tape.reset_stats()
                t0 = time.perf_counter()
                got = ds[sec]
                wall_sub = time.perf_counter() - t0
                model_sub = tape.stats().simulated
                assert np.array_equal(got, a[sec])
                nchunks = len(ds.grid.cover(_section(sec)))
                ds.evict(None, tier="disk").wait()  # next pattern starts from tape again
                ds.close()
                out["patterns"].append(
                    {
                        "pattern": name,
                        "elements": int(got.size),
                        "chunks": nchunks,
                        "whole_model_s": model_whole,
                        "sub_model_s": model_sub,
                        "whole_wall_s": wall_whole,
                        "sub_wall_s": wall_sub,
                        "gain_pct": 100.0 * (1 - model_sub / model_whole),
                        "paper_gain_pct": PAPER_READ_GAIN[name],
                    }
                )
            out["reuse"] = _reuse(s, a, size, chunk)
    return out


def _section(sec: tuple[slice, slice]) -> Any:
    from strataio.layout.sections import Section

    return Section((sec[0].start, sec[1].start), (sec[0].stop, sec[1].stop))


def _reuse(s: Any, a: np.ndarray, size: int, chunk: int) -> list[dict[str, Any]]:
    """Figure 4: a second read overlapping the first stages only the chunks it adds."""
    q = size // 16
    scenarios = {
        "shifted square": ((slice(0, 2 * q), slice(0, 2 * q)), (slice(q, 3 * q), slice(q, 3 * q))),
        "grown square": ((slice(0, 2 * q), slice(0, 2 * q)), (slice(0, 3 * q), slice(0, 3 * q))),
        "extended band": ((slice(0, q), slice(0, 4 * q)), (slice(0, q), slice(2 * q, 6 * q))),
    }
    tape = _tape(s)
    rows = []
    for label, (first, second) in scenarios.items():
        times = {}
        for reuse in (False, True):
            ds = s.open_dataset("april", "r+")
            _ = ds[first]
            if not reuse:
                ds.evict(None, tier="disk").wait()
            tape.reset_stats()
            got = ds[second]
            times[reuse] = (tape.stats().simulated, tape.stats().requests)
            assert np.array_equal(got, a[second])
            ds.evict(None, tier="disk").wait()
            ds.close()
        rows.append(
            {
                "scenario": label,
                "second_chunks": len(s.open_dataset("april").grid.cover(_section(second))),
                "staged_without_reuse": times[False][1],
                "staged_with_reuse": times[True][1],
                "model_s_without_reuse": times[False][0],
                "model_s_with_reuse": times[True][0],
                "gain_pct": 100.0 * (1 - times[True][0] / times[False][0]),
            }
        )
    return rows


def tape_tables(results: dict[str, Any]) -> list[Table]:
    """Rich tables of :func:`run_tape`'s figures (Table 3 style, then Figure 4)."""
    t = Table(
        title=(
            f"APRIL reads on a shaped tape ({results['size']}² float32, chunks "
            f"{results['chunk']}², time_scale {results['time_scale']})"
        )
    )
    for col in ("pattern", "elements", "chunks", "whole-file recall (model s)",
                "sub-filing + stage (model s)", "gain %", "paper gain %", "wall s whole/sub"):  # fmt: skip
        t.add_column(col, justify="right")
    for r in results["patterns"]:
        t.add_row(
            r["pattern"],
            str(r["elements"]),
            str(r["chunks"]),
            f"{r['whole_model_s']:.1f}",
            f"{r['sub_model_s']:.1f}",
            f"{r['gain_pct']:.1f}",
            f"{r['paper_gain_pct']:.1f}",
            f"{r['whole_wall_s']:.2f}/{r['sub_wall_s']:.2f}",
        )
    f4 = Table(title="Figure 4: second read overlapping the first (tape requests = chunks staged)")
    for col in ("scenario", "chunks in 2nd read", "staged w/o reuse", "staged with reuse",
                "model s w/o", "model s with", "gain %"):  # fmt: skip
        f4.add_column(col, justify="right")
    for r in results["reuse"]:
        f4.add_row(
            r["scenario"],
            str(r["second_chunks"]),
            str(r["staged_without_reuse"]),
            str(r["staged_with_reuse"]),
            f"{r['model_s_without_reuse']:.1f}",
            f"{r['model_s_with_reuse']:.1f}",
            f"{r['gain_pct']:.1f}",
        )
    return [t, f4]


# ----------------------------------------------------------------------------- overlap
#: the share of the staging time the prestaging loop must hide for ``bench overlap`` to pass
HIDDEN_GOAL = 0.9
#: rows (and columns) of the overlap loop's array, whose row bands are its sections
OVERLAP_ROWS = 1024


def _compute(x: np.ndarray, rounds: int) -> float:
    """Stand-in for the application's work on a section (numpy releases the GIL)."""
    y = np.empty_like(x)
    acc = 0.0
    for _ in range(rounds):
        np.sqrt(np.abs(x), out=y)
        y *= 1.0001
        acc += float(y[0, 0])
    return acc


def run_overlap(
    sections: int = 8,
    time_scale: float = 0.002,
    size: int = OVERLAP_ROWS,
    chunk: int = 128,
    repeats: int = 3,
) -> dict[str, Any]:
    """Loop over row bands: compute on band k while band k+1 stages from the tape.

    Reports the loop's time with prestaging against compute-only (bands already on disk) and
    stage-only (bands staged one after another, no compute), and the fraction of the staging
    time the loop hides: ``1 - exposed / stage``, where ``exposed`` is the time the loop spent
    waiting for a stage to finish (measured directly: comparing whole-loop times would drown
    it in the run-to-run noise of the compute). The first band is staged before the loop
    (nothing could hide it), so stage-only counts bands 2..n. Each figure is the median of
    ``repeats`` interleaved runs. ``sections``: 2 to ``size`` (one band hides nothing).
    """
    from strataio.session import Session

    if not 2 <= sections <= size:
        raise ValueError(f"sections {sections}: the loop takes 2 to {size} bands")

    band = size // sections
    secs = [np.s_[k * band : (k + 1) * band, :] for k in range(sections)]
    with tempfile.TemporaryDirectory(prefix="strataio-bench-overlap-") as tmp:
        root = Path(tmp)
        _setup(root, size, chunk)
        with Session(tiers=_tiers(root, time_scale), catalog=root / "catalog.db") as s:
            ds = s.open_dataset("april", "r+")
            # calibrate the compute so each band's work outlasts one band's staging
            ds.stage(secs[0]).wait()
            x = ds[secs[0]]
            _compute(x, 2)  # warm up
            t0 = time.perf_counter()
            _compute(x, 20)
            per_round = (time.perf_counter() - t0) / 20
            stage_band = 0.0
            rounds = 0
            stages, computes, loops, waits = [], [], [], []
            for _ in range(repeats):
                # stage-only: bands 2..n one after another (band 1 is staged before each loop)
                ds.evict(None, tier="disk").wait()
                ds.stage(secs[0]).wait()
                t0 = time.perf_counter()
                for sec in secs[1:]:
                    ds.stage(sec).wait()
                stages.append(time.perf_counter() - t0)
                if not rounds:
                    stage_band = stages[0] / (sections - 1)
                    rounds = max(1, int(1.3 * stage_band / per_round))
                # compute-only: every band, all already on disk
                t0 = time.perf_counter()
                for sec in secs:
                    _compute(ds[sec], rounds)
                computes.append(time.perf_counter() - t0)
                # the loop: compute on band k while band k+1 stages
                ds.evict(None, tier="disk").wait()
                ds.stage(secs[0]).wait()
                t0 = time.perf_counter()
                exposed = 0.0
                for k in range(sections):
                    nxt = ds.stage(secs[k + 1]) if k + 1 < sections else None
                    _compute(ds[secs[k]], rounds)
                    if nxt is not None:
                        t1 = time.perf_counter()
                        nxt.wait()
                        exposed += time.perf_counter() - t1
                loops.append(time.perf_counter() - t0)
                waits.append(exposed)
            ds.close()
    t_stage, t_compute, t_loop, t_wait = (
        float(np.median(v)) for v in (stages, computes, loops, waits)
    )
    hidden = 1.0 - t_wait / t_stage if t_stage > 0 else 1.0
    return {
        "sections": sections,
        "time_scale": time_scale,
        "compute_only_s": t_compute,
        "stage_only_s": t_stage,
        "loop_prestage_s": t_loop,
        "serial_sum_s": t_compute + t_stage,
        "exposed_wait_s": t_wait,
        # the same from whole-loop times: also charges the compute's slowdown while staging
        # threads share the cores
        "loop_saving_fraction": (t_compute + t_stage - t_loop) / t_stage if t_stage else 1.0,
        "hidden_fraction": max(0.0, hidden),
    }


def overlap_table(r: dict[str, Any]) -> Table:
    t = Table(title=f"prestaging overlap ({r['sections']} bands, time_scale {r['time_scale']})")
    for col in ("compute only s", "stage only s", "compute+stage s", "loop with prestage s",
                "waited for stage s", "staging hidden %", "(compute+stage-loop)/stage %"):  # fmt: skip
        t.add_column(col, justify="right")
    t.add_row(
        f"{r['compute_only_s']:.3f}",
        f"{r['stage_only_s']:.3f}",
        f"{r['serial_sum_s']:.3f}",
        f"{r['loop_prestage_s']:.3f}",
        f"{r['exposed_wait_s']:.3f}",
        f"{100 * r['hidden_fraction']:.1f}",
        f"{100 * r['loop_saving_fraction']:.1f}",
    )
    return t
