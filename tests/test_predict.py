"""Prediction: equations (1) and (2) on hand-computed cases, interpolation in the performance
database, the partition of a dataset over ranks, and workload files with their errors."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strataio.catalog.base import PerfRow
from strataio.errors import MetadataError
from strataio.predict.model import equation1, equation2, native_calls, predict
from strataio.predict.perfdb import PerfTable, UncalibratedError
from strataio.predict.runner import workload_to_toml
from strataio.predict.workload import Partition, WorkloadError, load_workload, parse_workload
from strataio.storage.shaped import PRESETS

# -- equation (1) and (2) ------------------------------------------------------------------


def test_equation1_is_the_sum_of_its_six_terms_table1_remote_disk_write():
    # Table 1, remote disk, write: conn 0.44, open 0.42, seek -, close 0.83, connclose 0.0002
    t = equation1(conn=0.44, open=0.42, seek=0.0, transfer=6.78, fileclose=0.83, connclose=0.0002)
    assert t == pytest.approx(8.4702)
    # the shaped preset charges the same per call
    model = PRESETS["remote_disk_2002"]
    s = 2 << 20
    assert model.call_time(s, write=True) == pytest.approx(
        equation1(0.44, 0.42, 0.0, s / model.write.bandwidth, 0.83, 0.0002)
    )


def test_equation2_paper_example_term_by_term():
    # vr-temp on local disk and vr-press on remote disk, every 6 of 120 iterations, n = 1
    # (collective I/O): 120 // 6 + 1 = 21 accesses each
    assert equation2([(120, 6, 1, 0.12)]) == pytest.approx(2.52)
    assert equation2([(120, 6, 1, 8.47)]) == pytest.approx(177.87)
    assert equation2([(120, 6, 1, 0.12), (120, 6, 1, 8.47)]) == pytest.approx(180.39)
    # The paper prints (120/6 + 1) * 0.25 = 2.59 and (120/6 + 1) * 8.47 = 177.98: neither
    # product holds (21 * 0.25 = 5.25, 21 * 8.47 = 177.87). Its sums are 21 times unrounded
    # unit times, t(1) = 2.59 / 21 = 0.1233 (printed 0.12) and t(2) = 177.98 / 21 = 8.4752
    # (printed 8.47):
    assert equation2([(120, 6, 1, 0.25)]) == pytest.approx(5.25)
    assert equation2([(120, 6, 1, 2.59 / 21), (120, 6, 1, 177.98 / 21)]) == pytest.approx(180.57)


def test_equation2_counts_accesses_of_steps_0_to_n():
    assert equation2([(10, 3, 2, 1.0)]) == 8.0  # steps 0, 3, 6, 9: 4 accesses of 2 calls
    assert equation2([(0, 5, 1, 1.0)]) == 1.0  # the initial dump only
    assert equation2([(12, 1, 1, 0.5), (12, 4, 3, 0.25)]) == 13 * 0.5 + 4 * 3 * 0.25


# -- the performance database ---------------------------------------------------------------


def rows(tier, op, points, c=1, when=1.0):
    return [PerfRow(tier, op, n, t, c, when) for n, t in points]


def test_interpolation_is_log_log_between_points():
    perf = PerfTable(rows("t", "write", [(1024, 1.0), (4096, 4.0), (65536, 16.0)]))
    assert perf.time("t", "write", 1024) == pytest.approx(1.0)
    assert perf.time("t", "write", 2048) == pytest.approx(2.0)  # slope 1 in log-log
    assert perf.time("t", "write", 16384) == pytest.approx(8.0)  # slope 1/2: sqrt
    # below the smallest size: the smallest size's time (fixed costs dominate)
    assert perf.time("t", "write", 10) == pytest.approx(1.0)
    # above the largest: proportional to size from the largest point
    assert perf.time("t", "write", 4 * 65536) == pytest.approx(64.0)
    assert perf.measured_range("t", "write") == (1024, 65536)


def test_interpolation_in_concurrency_and_medians():
    pts = rows("t", "put", [(1024, 1.0), (1024, 3.0), (1024, 2.0)], c=1)
    pts += rows("t", "put", [(1024, 4.0)], c=4)
    perf = PerfTable(pts)
    assert perf.time("t", "put", 1024, 1) == pytest.approx(2.0)  # median of 1, 2, 3
    assert perf.time("t", "put", 1024, 2) == pytest.approx(2.0 + (4.0 - 2.0) / 3)
    assert perf.time("t", "put", 1024, 8) == pytest.approx(8.0)  # shared beyond the top
    assert perf.time("t", "put", 1024, 0) == pytest.approx(2.0)


def test_latest_calibration_of_a_tier_wins():
    old = rows("t", "open", [(0, 9.0)], when=1.0) + rows("u", "open", [(0, 5.0)], when=1.0)
    new = rows("t", "open", [(0, 1.0)], when=2.0)
    perf = PerfTable(old + new)
    assert perf.time("t", "open") == 1.0
    assert perf.time("u", "open") == 5.0
    assert perf.tiers == ["t", "u"]


def test_a_calibration_holds_only_for_the_settings_it_measured():
    """Each calibration records the tier settings it measured; the latest one's are
    compared with those configured now. Rows that record none (calibrations made before
    settings were recorded) are not judged."""
    then = [PerfRow("t", "open", 0, 1.0, 1, 2.0, "posix:/a shaped=m time_scale=0.001")]
    perf = PerfTable([PerfRow("t", "open", 0, 9.0, 1, 1.0, "posix:/old"), *then])
    assert perf.changed_since("t", "posix:/a shaped=m time_scale=0.001") is None
    said = perf.changed_since("t", "posix:/a shaped=m time_scale=1")
    assert said is not None and "time_scale=0.001" in said and "calibrate --tier t" in said
    assert PerfTable(rows("u", "open", [(0, 5.0)])).changed_since("u", "anything") is None


@pytest.mark.parametrize(
    ("damaged", "said"),
    [
        (PerfRow("t", "write", 4096, "abc", 1, 2.0), "not a number"),
        (PerfRow("t", "write", 0, 1.0, 1, 2.0), "0 bytes"),
        (PerfRow("t", "write", 4096, -1.0, 1, 2.0), "-1.0 seconds"),
        (PerfRow("t", "write", 4096, math.inf, 1, 2.0), "inf seconds"),
        (PerfRow("t", "write", 4096, 1.0, 0, 2.0), "concurrency 0"),
    ],
)
def test_a_damaged_performance_table_says_which_rows_and_to_calibrate_again(damaged, said):
    """A row no calibration writes in a tier's latest calibration makes that tier's op
    damaged: using it raises, naming the rows and the command, while the table's other
    tiers and ops still predict; the same row in a calibration superseded since is never
    used, so it is harmless."""
    good = rows("t", "write", [(1024, 1.0), (4096, 4.0)], when=2.0)
    good += rows("t", "read", [(1024, 0.5)], when=2.0) + rows("u", "write", [(1024, 3.0)])
    perf = PerfTable([*good, damaged])
    with pytest.raises(MetadataError, match=said) as info:
        perf.time("t", "write", 4096)
    assert "strataio calibrate --tier t" in str(info.value)
    assert not perf.has("t", "write") and perf.damage("t") == perf.damage("t", "write")
    assert perf.time("t", "read", 1024) == 0.5 and perf.time("u", "write", 1024) == 3.0
    assert perf.damage("t", "read") is None and perf.damage("u") is None
    older = dataclasses.replace(damaged, when=1.0)
    assert PerfTable([*good, older]).time("t", "write", 4096) == pytest.approx(4.0)


def test_missing_measurements_name_the_tier_and_the_command():
    perf = PerfTable(rows("t", "open", [(0, 1.0)]))
    with pytest.raises(UncalibratedError, match="no 'write' measurement"):
        perf.time("t", "write", 10)
    with pytest.raises(UncalibratedError, match="strataio calibrate --tier nope"):
        perf.time("nope", "open")


# -- the partition --------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    dims=st.lists(st.integers(1, 9), min_size=1, max_size=4),
    ranks=st.integers(1, 6),
    data=st.data(),
)
def test_partition_runs_match_a_numpy_oracle(dims, ranks, data):
    pattern = "".join(data.draw(st.sampled_from("B*")) for _ in dims)
    part = Partition.of(tuple(dims), pattern, ranks)
    a = np.arange(math.prod(dims)).reshape(dims)
    seen = []
    for r in range(ranks):
        block = a[part.box(r)].ravel()
        count, n = part.runs(r)
        offs = part.run_offsets(r)
        assert len(offs) == count
        got = np.concatenate([np.arange(o, o + n) for o in offs]) if count else block[:0]
        np.testing.assert_array_equal(got, block)
        seen.append(block)
    # BLOCK distribution: every element once, on the ranks of the grid
    np.testing.assert_array_equal(np.sort(np.concatenate(seen)), a.ravel())
    assert all(g == 1 for g, c in zip(part.grid, pattern) if c == "*")


def test_partition_pattern_letters():
    assert Partition.of((64, 64, 64), "BBB", 4).grid == (2, 2, 1)
    part = Partition.of((64, 64, 64), "B**", 4)
    assert part.grid == (4, 1, 1) and part.runs(0) == (1, 16 * 64 * 64)
    part = Partition.of((64, 64, 64), "*B*", 4)
    assert part.runs(1) == (64, 16 * 64)


# -- workloads ------------------------------------------------------------------------------

WORKLOAD = """
[run]
ranks = 4
iterations = 10
tier = "fast"
method = "naive"
cb_nodes = 2
cb_buffer_size = 1024

[[dataset]]
name = "temp"
dtype = "float32"
dims = [8, 8, 16]
pattern = "BBB"
frequency = 3
mode = "write"

[[dataset]]
name = "vr_temp"
dtype = "uint8"
dims = [8, 8, 16]
pattern = "bbb"
frequency = 5
mode = "read"
tier = "slow"
"""


def synthetic_perf() -> PerfTable:
    """Unit times a hand computation can follow: t(s) = a + s * b per op, c = 4."""
    out = []
    for tier, scale in (("fast", 1.0), ("slow", 10.0)):
        for op in ("open", "view", "close"):
            out += rows(tier, op, [(0, 0.01 * scale)], c=4)
        for op in ("write", "read", "write_all", "read_all", "put", "get"):
            out += rows(tier, op, [(s, scale * (0.001 + s * 1e-6)) for s in (64, 256, 1024)], c=4)
    return PerfTable(out)


def test_equation2_per_method_hand_computed():
    wl = parse_workload(WORKLOAD)
    perf = synthetic_perf()

    def t(scale, s):
        return scale * (0.001 + s * 1e-6)

    # naive: BBB over 4 ranks is a 2x2x1 grid of (4, 4, 16) blocks: 4 runs of 64 floats
    p = predict(wl, perf)
    temp, vr = p.datasets
    assert temp.accesses == 4 and vr.accesses == 3  # steps 0,3,6,9 and 0,5,10
    assert native_calls(wl, wl.datasets[0]).groups == ((4, 256),)
    assert temp.predicted_s == pytest.approx(4 * (0.02 + 4 * t(1, 256)))
    # the uint8 dataset on the slow tier: 4 runs of 64 bytes each
    assert vr.predicted_s == pytest.approx(3 * (0.2 + 4 * t(10, 64)))
    assert p.total_s == pytest.approx(temp.predicted_s + vr.predicted_s)
    # collective: 4096 bytes, 2 aggregators of 2048, windows of 1024: 2 calls each
    wl_c = wl.with_run(method="collective")
    assert native_calls(wl_c, wl_c.datasets[0]).groups == ((2, 1024),)
    temp = predict(wl_c, perf).datasets[0]
    assert temp.predicted_s == pytest.approx(4 * (0.03 + 2 * t(1, 1024)))
    # a realm that leaves a short last window: 2048 = 1 x 1536 + 512
    wl_w = wl.with_run(method="collective", cb_buffer_size=1536)
    assert native_calls(wl_w, wl_w.datasets[0]).groups == ((1, 1536), (1, 512))
    # chunked: one chunk per rank, 4 * 4 * 16 floats = 1024 bytes, no open or close
    wl_k = wl.with_run(method="chunked")
    assert native_calls(wl_k, wl_k.datasets[0]).groups == ((1, 1024),)
    assert predict(wl_k, perf).datasets[0].predicted_s == pytest.approx(4 * t(1, 1024))


@settings(max_examples=60, deadline=None)
@given(
    dims=st.lists(st.integers(1, 9), min_size=1, max_size=3),
    ranks=st.integers(1, 12),
    data=st.data(),
)
def test_native_calls_are_the_busiest_ranks(dims, ranks, data):
    pattern = "".join(data.draw(st.sampled_from("B*")) for _ in dims)
    wl = parse_workload(WORKLOAD).with_run(ranks=ranks)
    ds = dataclasses.replace(wl.datasets[0], dims=tuple(dims), pattern=pattern)
    part = wl.partition(ds)
    item = ds.dtype.itemsize
    count, elems = max((part.runs(r) for r in range(ranks)), key=lambda x: x[0] * x[1])
    assert native_calls(wl.with_run(method="naive"), ds).groups == ((count, elems * item),)
    biggest = max(math.prod(part.shape(r)) for r in range(ranks)) * item
    assert native_calls(wl.with_run(method="chunked"), ds).groups == ((1, biggest),)


def test_a_prediction_for_a_million_ranks_takes_no_time():
    """The busiest rank was found by asking every rank for its block: a workload of a
    million ranks took half a minute to predict, one of a billion hours."""
    import time

    perf = synthetic_perf()
    for method in ("naive", "chunked"):
        wl = parse_workload(WORKLOAD).with_run(ranks=1_000_000, method=method)
        started = time.monotonic()
        p = predict(wl, perf)
        assert time.monotonic() - started < 2 and p.total_s > 0, method


def test_workload_round_trips_through_toml(tmp_path):
    wl = parse_workload(WORKLOAD, source="w")
    path = tmp_path / "w.toml"
    path.write_text(workload_to_toml(wl))
    back = load_workload(path)
    assert back.run == wl.run and back.datasets == wl.datasets


def bad(text: str, match: str) -> None:
    with pytest.raises(WorkloadError, match=match):
        parse_workload(text, source="bad.toml")


def test_workload_errors_are_clear():
    bad(WORKLOAD.replace("ranks = 4", "ranks = 4\nrank = 3"), r"run\.rank: unknown key")
    bad(WORKLOAD.replace('mode = "write"', 'mode = "write"\nchunks = 3'), r"chunks: unknown key")
    bad(WORKLOAD + "\n[extra]\n", "extra: unknown key")
    bad(WORKLOAD.replace('pattern = "BBB"', 'pattern = "BB"'), "2 letters but dims")
    bad(WORKLOAD.replace('pattern = "BBB"', 'pattern = "BCB"'), "letter 'C'")
    bad(WORKLOAD.replace('method = "naive"', 'method = "fast"'), "run.method")
    bad(WORKLOAD.replace("frequency = 3", "frequency = 0"), "frequency")
    bad(WORKLOAD.replace('dtype = "float32"', 'dtype = "float99"'), "not a numpy dtype")
    bad(WORKLOAD.replace("dims = [8, 8, 16]", "dims = [8, -8, 16]", 1), "positive integers")
    bad(WORKLOAD.replace('name = "vr_temp"', 'name = "temp"'), "used twice")
    for empty in ('""', '"  "'):
        bad(
            WORKLOAD.replace('name = "vr_temp"', f"name = {empty}"),
            r"^bad\.toml: dataset\[1\]\.name: must not be empty, got '\s*'$",
        )
    bad(WORKLOAD.replace('tier = "fast"\n', ""), r"run\.tier is missing")
    bad("[run]\nranks = 1\n", "dataset")
    bad("not toml [", "not valid TOML")
    bad(WORKLOAD.replace("ranks = 4", "ranks = true"), "expected int")


def test_a_dataset_too_large_for_any_tier():
    wl = parse_workload(WORKLOAD)
    wl.check_capacity({"fast": 8192, "slow": None})  # fits
    with pytest.raises(WorkloadError, match="too large for every tier"):
        wl.check_capacity({"fast": 1000, "slow": 1000})
    with pytest.raises(WorkloadError, match="it fits on slow"):
        wl.check_capacity({"fast": 1000, "slow": None})
    with pytest.raises(WorkloadError, match="no tier 'slow'"):
        wl.check_capacity({"fast": None})


def test_missing_workload_file(tmp_path):
    with pytest.raises(WorkloadError, match="does not exist"):
        load_workload(tmp_path / "none.toml")


def test_the_calibration_table_says_how_many_processes_its_times_are_of():
    """The table printed after a calibration said "one process" over times measured with 4
    (a calibration --concurrency 2,4, or --quick --concurrency 2); it now shows, per tier,
    the fewest processes its times were measured with."""
    from rich.console import Console

    from strataio.cli.predict_cmd import calibration_table

    console = Console(width=400, record=True)
    console.print(calibration_table(synthetic_perf()))
    text = console.export_text()
    assert "one process" not in text
    assert "processes" in text
    for line in text.splitlines():
        if line.lstrip("│ ").startswith(("fast", "slow")):
            assert line.split("│")[2].strip() == "4", line
