"""Calibration into the performance table of both catalogs, and the calibrate / predict
commands end to end (small sizes: each launches mpiexec)."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from strataio.catalog.base import open_catalog
from strataio.cli import main
from strataio.config import load_config
from strataio.errors import BusyError, StrataError
from strataio.predict.calibrate import calibrate, default_sizes
from strataio.predict.perfdb import FIXED_OPS, SERIES_OPS, PerfTable
from strataio.predict.ranks import launch
from strataio.tiers.tier import register_configured_tiers

pytestmark = pytest.mark.mpi

CONFIG = """
[catalog]
url = "{catalog}"

[[tiers]]
name = "local"
kind = "posix"
role = "localdisk"
path = "local"

[[tiers]]
name = "tape"
kind = "posix"
role = "remotetape"
path = "tape"
shaped = "remote_tape_2002"
time_scale = 0.0005
"""

WORKLOAD = """
[run]
ranks = 2
iterations = 2
tier = "local"
method = "{method}"
cb_nodes = 1
cb_buffer_size = 4096

[[dataset]]
name = "temp"
dtype = "float32"
dims = [8, 16, 16]
pattern = "B**"
frequency = 1
mode = "write"

[[dataset]]
name = "vr_temp"
dtype = "uint8"
dims = [16, 16, 16]
pattern = "BBB"
frequency = 2
mode = "read"
tier = "tape"
"""


def write_config(tmp_path, catalog: str) -> str:
    path = tmp_path / "strataio.toml"
    path.write_text(CONFIG.format(catalog=catalog))
    return str(path)


def test_default_sizes_are_log_spaced_1k_to_256m():
    sizes = default_sizes()
    assert sizes[0] == 1024 and sizes[-1] == 256 << 20
    assert all(b == 4 * a for a, b in zip(sizes, sizes[1:]))
    assert default_sizes(5000) == [1024, 4096]


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_calibration_is_stored_and_read_back(tmp_path, request, kind):
    url = str(tmp_path / "cat.db") if kind == "sqlite" else request.getfixturevalue("pg_url")
    cfg = load_config(write_config(tmp_path, url))
    seen = []
    with open_catalog(cfg.catalog.url) as cat:
        register_configured_tiers(cat, cfg)
        rows = calibrate(
            cfg,
            cat,
            ["tape"],
            sizes=[1024, 4096],
            repeat=2,
            levels=(1, 2),
            on_progress=lambda tier, done, total: seen.append((tier, done, total)),
        )
        back = cat.perf_rows("tape")
    assert sorted(back, key=repr) == sorted(rows, key=repr)
    assert {r.concurrency for r in back} == {1, 2}
    assert len({r.when for r in back}) == 1  # one calibration, one time stamp
    perf = PerfTable(back)
    for op in (*FIXED_OPS, *SERIES_OPS):
        assert perf.has("tape", op), op
    assert perf.measured_range("tape", "put") == (1024, 4096)
    # the shaped tape pays 6.17 s open + 0.42 s close per object (x 0.0005): a chunk put
    # takes at least that, a local File open far less
    assert perf.time("tape", "put", 1024) >= (6.17 + 0.42) * 0.0005
    assert seen[-1][1] == seen[-1][2] and seen[0][0] == "tape"


def test_a_tier_being_calibrated_is_not_calibrated_again_at_once(tmp_path):
    """While one process calibrates a tier, another calibration of it fails at once naming
    that process (both would time each other's calls and share scratch files); once the
    first is done (or dead: the lock is the system's), the tier calibrates again."""
    cfg = load_config(write_config(tmp_path, str(tmp_path / "cat.db")))
    lock = tmp_path / "tape" / ".strataio-predict" / "calibrate.lock"
    lock.parent.mkdir(parents=True)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time\n"
            f"f = open({str(lock)!r}, 'a+')\n"
            "fcntl.flock(f, fcntl.LOCK_EX); f.truncate(0)\n"
            "f.write(f'pid {os.getpid()} on a node'); f.flush()\n"
            "print('held', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with open_catalog(cfg.catalog.url) as cat:
            register_configured_tiers(cat, cfg)
            with pytest.raises(BusyError, match=f"pid {holder.pid}"):
                calibrate(cfg, cat, ["tape"], sizes=[1024], repeat=1, levels=(1,))
            assert cat.perf_rows("tape") == []
            holder.kill()
            holder.wait()
            rows = calibrate(cfg, cat, ["tape"], sizes=[1024], repeat=1, levels=(1,))
        assert rows and lock.read_text().startswith(f"pid {os.getpid()} on ")
        with open(lock) as f:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released after the calibration
    finally:
        holder.kill()
        holder.wait()


def test_calibrate_quick_with_no_level_left_is_refused(tmp_path):
    """--quick keeps the levels up to 2 processes: with none left it measured nothing and
    said "0 measurements stored"; it is a usage error naming the option."""
    config = write_config(tmp_path, str(tmp_path / "cat.db"))
    out = CliRunner().invoke(main, ["calibrate", "-c", config, "--quick", "--concurrency", "4"])
    assert out.exit_code == 2, out.output
    assert "--concurrency 4 leaves no level" in out.output


def test_calibrate_and_predict_commands(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = write_config(tmp_path, "cat.db")
    r = CliRunner()
    out = r.invoke(
        main,
        ["calibrate", "-c", config, "--quick", "--max-size", "16KiB", "--concurrency", "2"]
        + ["--plot", "curves.png"],
    )
    assert out.exit_code == 0, out.output
    assert "performance database" in out.output and (tmp_path / "curves.png").stat().st_size
    with open_catalog(str(tmp_path / "cat.db")) as cat:
        assert {r.tier for r in cat.perf_rows()} == {"local", "tape"}

    for method in ("naive", "collective", "chunked"):
        (tmp_path / "w.toml").write_text(WORKLOAD.format(method=method))
        out = r.invoke(main, ["predict", "-c", config, "w.toml"])
        assert out.exit_code == 0, out.output
        for word in ("temp", "vr_temp", "BBB", "16,16,16", "tape", "total"):
            assert word in out.output
        out = r.invoke(main, ["predict", "-c", config, "w.toml", "--measure", "--json"])
        assert out.exit_code == 0, out.output
        got = json.loads(out.output)
        names = [d["name"] for d in got["datasets"]]
        assert names == ["temp", "vr_temp"]
        assert all(d["predicted_s"] > 0 and d["measured_s"] > 0 for d in got["datasets"])
        assert got["measured_total_s"] == pytest.approx(
            sum(d["measured_s"] for d in got["datasets"])
        )
        # the shaped tape dominates: 2 reads of 6.63 s x 0.0005 at least
        vr = got["datasets"][1]
        assert vr["measured_s"] >= 2 * 6.63 * 0.0005 and vr["predicted_s"] >= 2 * 6.63 * 0.0005

    # a tier configured otherwise since its calibration (here its device model's time scale,
    # which every time it measured follows) is refused, not predicted 1000 times too fast
    (tmp_path / "strataio.toml").write_text(
        CONFIG.format(catalog="cat.db").replace("time_scale = 0.0005", "time_scale = 0.5")
    )
    out = r.invoke(main, ["predict", "-c", config, "w.toml"])
    assert out.exit_code == 2, out.output
    assert "'tape' was calibrated as" in out.output and "time_scale=0.0005" in out.output
    assert "time_scale=0.5" in out.output and "strataio calibrate --tier tape" in out.output


def test_predict_errors_exit_2(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = write_config(tmp_path, "cat.db")
    r = CliRunner()
    (tmp_path / "w.toml").write_text(WORKLOAD.format(method="naive").replace("B**", "B*"))
    out = r.invoke(main, ["predict", "-c", config, "w.toml"])
    assert out.exit_code == 2 and "one letter per dimension" in out.output
    (tmp_path / "w.toml").write_text(WORKLOAD.format(method="naive"))
    out = r.invoke(main, ["predict", "-c", config, "w.toml"])  # nothing calibrated
    assert out.exit_code == 1 and "strataio calibrate --tier" in out.output
    big = CONFIG.format(catalog="cat.db").replace(
        'path = "local"', 'path = "local"\ncapacity = 100'
    )
    (tmp_path / "small.toml").write_text(
        big.replace('path = "tape"\n', 'path = "tape"\ncapacity = 100\n')
    )
    out = r.invoke(main, ["predict", "-c", "small.toml", "w.toml"])
    assert out.exit_code == 2 and "too large for every tier" in out.output


@pytest.mark.slow
def test_bench_predict_runs_a_workload(tmp_path):
    out = CliRunner().invoke(
        main,
        ["bench", "predict", "--dir", str(tmp_path), "--max-size", "16KiB", "--repeat", "1"]
        + ["--runs", "1", "--workload", "chunked-archive", "--json", str(tmp_path / "r.json")],
    )
    assert out.exit_code == 0, out.output
    got = json.loads((tmp_path / "r.json").read_text())
    (w,) = got["workloads"]
    assert w["name"] == "chunked-archive" and w["measured_s"] > 0 and w["predicted_s"] > 0
    assert got["worst_error"] == w["error"]


def test_ranks_without_a_block_take_part(tmp_path, monkeypatch):
    # 2 rows over 4 ranks (pattern B**): ranks 2 and 3 hold nothing, yet every collective call
    # needs them; each method must run to the end
    from strataio.predict.runner import run_workload
    from strataio.predict.workload import parse_workload

    monkeypatch.chdir(tmp_path)
    cfg = load_config(write_config(tmp_path, "cat.db"))
    with open_catalog(cfg.catalog.url) as cat:
        register_configured_tiers(cat, cfg)  # (a run makes no tier's directory)
    for method in ("naive", "collective", "chunked"):
        text = WORKLOAD.format(method=method).replace("ranks = 2", "ranks = 4")
        text = text.replace("[8, 16, 16]", "[2, 16, 16]").replace("[16, 16, 16]", "[3, 4, 4]")
        measured = run_workload(parse_workload(text), cfg, timeout=120)
        assert set(measured) == {"temp", "vr_temp"} and min(measured.values()) > 0, method


def test_ranks_killed_without_a_word_are_said_to_be_killed(tmp_path, monkeypatch):
    """A run whose rank the system kills (out of memory, say) writes nothing to stderr; the
    error still says what most likely happened instead of ending at its colon."""
    (tmp_path / "killed_rank.py").write_text(
        "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    with pytest.raises(StrataError, match=r"killed \(SIGKILL\).*out of memory"):
        launch(1, "killed_rank", [], timeout=60)


def test_a_known_tier_whose_directory_is_missing_is_not_measured_nor_made(tmp_path):
    """A tier the catalog knows whose directory is missing (a volume not mounted) is down for
    a Session; calibrating it measured an empty directory made in its place. Refused, saying
    so, with nothing made and nothing recorded; a tier new to the catalog gets its directory,
    as a Session makes it."""
    cfg = load_config(write_config(tmp_path, str(tmp_path / "cat.db")))
    with open_catalog(cfg.catalog.url) as cat:
        register_configured_tiers(cat, cfg)
        assert (tmp_path / "tape").is_dir()
        (tmp_path / "tape").rmdir()
        with pytest.raises(StrataError, match=r"tier 'tape' cannot be measured: .* missing"):
            calibrate(cfg, cat, ["tape"], sizes=[1024], repeat=1, levels=(1,))
        assert not (tmp_path / "tape").exists() and cat.perf_rows("tape") == []
    (tmp_path / "new").mkdir()
    fresh = load_config(write_config(tmp_path / "new", str(tmp_path / "new" / "cat.db")))
    with open_catalog(fresh.catalog.url) as cat:
        rows = calibrate(fresh, cat, ["local"], sizes=[1024], repeat=1, levels=(1,))
    assert rows and (tmp_path / "new" / "local").is_dir()


def test_a_read_only_tier_is_neither_calibrated_nor_measured_nor_written(tmp_path):
    """A tier configured ``read_only`` (storage read but never written) got a work folder,
    a lock file and a calibration's files written into it; calibrating it by name, or a
    measured run on it, is refused naming it with nothing made there, and calibrating every
    tier leaves it out."""
    from strataio.predict.runner import run_workload
    from strataio.predict.workload import parse_workload

    text = CONFIG.format(catalog=tmp_path / "cat.db") + (
        '\n[[tiers]]\nname = "ro"\nkind = "posix"\nrole = "remotedisk"\npath = "ro"\n'
        "read_only = true\n"
    )
    (tmp_path / "strataio.toml").write_text(text)
    (tmp_path / "ro").mkdir()
    cfg = load_config(str(tmp_path / "strataio.toml"))
    with open_catalog(cfg.catalog.url) as cat:
        register_configured_tiers(cat, cfg)
        with pytest.raises(StrataError, match=r"tier 'ro' is read-only"):
            calibrate(cfg, cat, ["ro"], sizes=[1024], repeat=1, levels=(1,))
        wl = parse_workload(WORKLOAD.format(method="naive").replace('tier = "tape"', 'tier = "ro"'))
        with pytest.raises(StrataError, match=r"tier 'ro' is read-only"):
            run_workload(wl, cfg, timeout=120)
        assert list((tmp_path / "ro").iterdir()) == [] and cat.perf_rows("ro") == []
        rows = calibrate(cfg, cat, sizes=[1024], repeat=1, levels=(1,))
    assert {r.tier for r in rows} == {"local", "tape"} and list((tmp_path / "ro").iterdir()) == []


def test_a_calibration_too_large_for_the_node_is_refused_before_measuring(tmp_path, monkeypatch):
    """A --max-size the ranks' buffers cannot fit in memory (or its file on the tier's free
    space) ended in each rank's MemoryError traceback (or a full disk) after the launch; it
    is refused first, saying how much it needs, with nothing made on the tier."""
    import shutil
    from collections import namedtuple

    cfg = load_config(write_config(tmp_path, str(tmp_path / "cat.db")))
    with open_catalog(cfg.catalog.url) as cat:
        register_configured_tiers(cat, cfg)
        with pytest.raises(StrataError, match=r"tier 'local': .*1\.0 PiB.* memory"):
            calibrate(cfg, cat, ["local"], sizes=[1024, 1 << 50], repeat=1, levels=(1, 2))
        usage = namedtuple("usage", "total used free")
        monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(1 << 30, 0, 1 << 20))
        with pytest.raises(StrataError, match=r"tier 'local': .* free"):
            calibrate(cfg, cat, ["local"], sizes=[1024, 1 << 20], repeat=1, levels=(1,))
        assert not (tmp_path / "local" / ".strataio-predict").exists()
        assert cat.perf_rows() == []
    out = CliRunner().invoke(main, ["calibrate", "-c", cfg.source, "--max-size", "1PiB"])
    assert out.exit_code == 1 and "Traceback" not in out.output and "memory" in out.output


def test_a_measured_run_too_large_for_the_node_is_refused_before_launching(tmp_path, monkeypatch):
    """A workload whose datasets the ranks cannot hold in memory (or the tiers on disk) ended
    in each rank's MemoryError traceback after the launch; it is refused first, naming the
    bytes needed, with nothing made on the tiers."""
    import shutil
    from collections import namedtuple

    from strataio.predict.runner import run_workload
    from strataio.predict.workload import parse_workload

    cfg = load_config(write_config(tmp_path, str(tmp_path / "cat.db")))
    with open_catalog(cfg.catalog.url) as cat:
        register_configured_tiers(cat, cfg)
    huge = parse_workload(
        WORKLOAD.format(method="naive").replace("[8, 16, 16]", "[1048576, 1048576, 1024]")
    )
    with pytest.raises(StrataError, match=r"4\.0 PiB.* memory"):
        run_workload(huge, cfg, timeout=120)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(1 << 30, 0, 1024))
    small = parse_workload(WORKLOAD.format(method="naive"))
    with pytest.raises(StrataError, match=r"tier 'local': .* free"):
        run_workload(small, cfg, timeout=120)
    assert not (tmp_path / "local" / ".strataio-predict").exists()


def test_predicting_on_a_tier_no_calibration_can_measure_does_not_advise_calibrating_it(
    tmp_path, monkeypatch
):
    """A workload on a memory or read-only tier, which has no calibration, was told to run
    `strataio calibrate --tier` on it, which refuses such a tier; it now says why the tier
    has none and that a posix tier that takes writes is needed."""
    monkeypatch.chdir(tmp_path)
    text = CONFIG.format(catalog="cat.db") + (
        '\n[[tiers]]\nname = "mem"\nkind = "memory"\nrole = "memory"\n'
        '\n[[tiers]]\nname = "ro"\nkind = "posix"\nrole = "remotedisk"\npath = "ro"\n'
        "read_only = true\n"
    )
    (tmp_path / "strataio.toml").write_text(text)
    (tmp_path / "ro").mkdir()
    for tier, why in (("mem", "is a memory tier"), ("ro", "is read-only")):
        (tmp_path / "w.toml").write_text(
            WORKLOAD.format(method="naive").replace('tier = "tape"', f'tier = "{tier}"')
        )
        out = CliRunner().invoke(main, ["predict", "-c", "strataio.toml", "w.toml"])
        assert out.exit_code == 2, out.output
        assert f"tier {tier!r} {why}" in out.output and "calibrate --tier" not in out.output


_FAILING_RANK = """
import sys
from mpi4py import MPI
from strataio.collective.file import File

def _failing(self, *args, _real=File.write_at, _calls=[0]):
    _calls[0] += 1
    if MPI.COMM_WORLD.Get_rank() == 1 and _calls[0] == 3:
        raise OSError(28, "No space left on device (rank 1 alone)")
    return _real(self, *args)

File.write_at = _failing
from strataio.predict import {module}
{module}._rank_main(sys.argv[1:])
"""


@pytest.mark.parametrize("module", ["calibrate", "runner"])
def test_a_rank_failing_alone_ends_the_job_saying_why(tmp_path, monkeypatch, module):
    """One rank's I/O failing (its disk full, say) while the others go on into the next
    collective call left them waiting for it, and the command with them, forever; the job
    ends at once, saying what failed on which rank, with no traceback for a message."""
    import time

    from strataio.predict.runner import workload_to_toml
    from strataio.predict.workload import parse_workload

    monkeypatch.chdir(tmp_path)
    cfg_path = write_config(tmp_path, "cat.db")
    with open_catalog(load_config(cfg_path).catalog.url) as cat:
        register_configured_tiers(cat, load_config(cfg_path))
    (tmp_path / "failing_rank.py").write_text(_FAILING_RANK.format(module=module))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    if module == "calibrate":
        args = [
            json.dumps(
                {"config": cfg_path, "tier": "local", "sizes": [1024], "repeat": 2, "cold": False}
            )
        ]
    else:
        text = WORKLOAD.format(method="naive").replace('tier = "tape"', 'tier = "local"')
        (tmp_path / "w.toml").write_text(workload_to_toml(parse_workload(text)))
        args = [cfg_path, str(tmp_path / "w.toml")]
    started = time.monotonic()
    with pytest.raises(StrataError) as err:
        launch(2, "failing_rank", args, timeout=60)
    assert time.monotonic() - started < 30, "the other rank waited for the failed one"
    said = str(err.value)
    assert "rank 1" in said and "No space left on device (rank 1 alone)" in said, said
    assert "Traceback" not in said, said


def test_a_calibration_of_small_sizes_is_refused_on_a_tier_without_room_for_its_bursts(
    tmp_path, monkeypatch
):
    """Small sizes are timed in bursts of up to 8 calls (4 MiB per rank) at offsets beyond
    each other: 1 MiB twice at one process is a file of 1 + 2 · 4 calls, 9 MiB. The check
    counted 3 MiB, so the launch met a full disk midway; it is refused first."""
    import shutil
    from collections import namedtuple

    cfg = load_config(write_config(tmp_path, str(tmp_path / "cat.db")))
    usage = namedtuple("usage", "total used free")
    with open_catalog(cfg.catalog.url) as cat:
        register_configured_tiers(cat, cfg)
        monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(1 << 30, 0, 8 << 20))
        with pytest.raises(StrataError, match=r"tier 'local': .* writes 9\.0 MiB .* 8\.0 MiB free"):
            calibrate(cfg, cat, ["local"], sizes=[1 << 20], repeat=2, levels=(1,))
        assert cat.perf_rows() == []


def test_bench_predict_no_calibrate_needs_a_folder(tmp_path):
    """Without --dir the benchmark's folder is a new temporary one, which holds no calibration
    to reuse: the error advised running once without --no-calibrate, which cannot help."""
    out = CliRunner().invoke(main, ["bench", "predict", "--no-calibrate", "--runs", "1"])
    assert out.exit_code == 2 and "--dir" in out.output, out.output


def test_a_configuration_without_a_tier_to_calibrate_is_refused(tmp_path):
    """Every tier read-only (or not posix): the command measured nothing, said "0
    measurements stored" with exit 0, and with --plot ended in matplotlib's traceback."""
    text = CONFIG.format(catalog=str(tmp_path / "cat.db"))
    text = text.replace('path = "local"\n', 'path = "local"\nread_only = true\n')
    text = text.replace('path = "tape"\n', 'path = "tape"\nread_only = true\n')
    (tmp_path / "local").mkdir()
    (tmp_path / "tape").mkdir()
    (tmp_path / "strataio.toml").write_text(text)
    for plot in ([], ["--plot", str(tmp_path / "curves.png")]):
        out = CliRunner().invoke(
            main, ["calibrate", "-c", str(tmp_path / "strataio.toml"), "--quick", *plot]
        )
        assert out.exit_code == 1 and "Traceback" not in out.output, out.output
        assert "no tier" in out.output and "'tape' is read-only" in out.output, out.output
    assert not (tmp_path / "curves.png").exists()
    with open_catalog(str(tmp_path / "cat.db")) as cat:
        assert cat.perf_rows() == []


def test_calibrate_says_which_sizes_it_measured(tmp_path, monkeypatch):
    """--max-size is where the ×4 ladder from 1 KiB stops, not a size it measures: 20 KiB
    measures up to 16 KiB (256MB, up to 64 MiB), and the output named no size at all."""
    monkeypatch.chdir(tmp_path)
    config = write_config(tmp_path, "cat.db")
    out = CliRunner().invoke(
        main,
        ["calibrate", "-c", config, "--tier", "local", "--quick"]
        + ["--max-size", "20KiB", "--concurrency", "1"],
    )
    assert out.exit_code == 0, out.output
    assert "transfers of 1.0 KiB … 16.0 KiB stored" in out.output, out.output


def test_a_calibration_beyond_the_tiers_configured_capacity_is_refused(tmp_path):
    """The files a calibration writes on a tier count against the capacity its
    configuration gives it (a share of a burst buffer, say), beside the copies stored there:
    one that would pass it is refused before anything is launched or written."""
    import numpy as np

    import strataio

    path = tmp_path / "strataio.toml"
    text = CONFIG.format(catalog=str(tmp_path / "cat.db"))
    path.write_text(text.replace('path = "local"', 'path = "local"\ncapacity = "4MiB"', 1))
    with (
        strataio.Session(str(path)) as s,
        s.create_dataset("d", (256, 1024), "f4", (64, 1024), hint="LOCALDISK") as d,
    ):
        d[...] = np.ones((256, 1024), "f4")  # 1 MiB stored on "local"
    cfg = load_config(str(path))
    with open_catalog(cfg.catalog.url) as cat:
        with pytest.raises(StrataError, match=r"tier 'local': .* configured capacity of 4\.0 MiB"):
            calibrate(cfg, cat, ["local"], sizes=[1 << 20], repeat=1, levels=(1,))
        assert cat.perf_rows() == []
    assert not (tmp_path / "local" / ".strataio-predict").exists()


def test_what_a_killed_measurement_left_goes_when_the_tier_is_next_locked(tmp_path):
    """A calibration or measured run killed with its ranks leaves its files in the tier's
    work folder; the next process to take the tier's measurement lock deletes them (the
    lock is held by whoever writes there), and keeps the lock file."""
    from strataio.predict.native import LOCK_NAME, WORK_DIR, lock_tiers

    cfg = load_config(write_config(tmp_path, str(tmp_path / "cat.db")))
    work = tmp_path / "local" / WORK_DIR
    (work / "calibrate-4096" / "c").mkdir(parents=True)
    (work / "calibrate-4096" / "c" / "0").write_bytes(b"x" * 4096)
    (work / "calibrate.bin").write_bytes(b"x" * 8192)
    with lock_tiers([cfg.tier("local")], "a test"):
        assert sorted(p.name for p in work.iterdir()) == [LOCK_NAME]
    assert (work / LOCK_NAME).exists()
