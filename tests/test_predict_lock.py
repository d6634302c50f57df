"""The tier lock every process that measures a tier holds (a calibration, ``predict
--measure``): one at a time, the second told who holds it, waiting only when asked; predicting
alone takes no lock. A measured run's files are not named by its datasets' names."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from strataio.catalog.base import PerfRow, open_catalog
from strataio.cli import main
from strataio.config import load_config
from strataio.errors import BusyError
from strataio.predict.calibrate import calibrate
from strataio.predict.perfdb import FIXED_OPS, SERIES_OPS
from strataio.predict.runner import run_workload
from strataio.predict.workload import load_workload
from strataio.tiers.tier import register_configured_tiers

CONFIG = """
[catalog]
url = "cat.db"

[[tiers]]
name = "local"
kind = "posix"
role = "localdisk"
path = "local"
"""

WORKLOAD = """
[run]
ranks = 2
iterations = 1
tier = "local"
method = "naive"

[[dataset]]
name = "{name}"
dtype = "float32"
dims = [8, 16, 16]
pattern = "B**"
frequency = 1
mode = "write"
"""


@pytest.fixture
def setup(tmp_path, monkeypatch):
    """A configuration with one POSIX tier, its (synthetic) calibration in the catalog, and a
    workload on it; returns (config path, workload path, lock file path)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "strataio.toml").write_text(CONFIG)
    (tmp_path / "w.toml").write_text(WORKLOAD.format(name="temp"))
    cfg = load_config(str(tmp_path / "strataio.toml"))
    rows = [PerfRow("local", op, 0, 1e-4, 1, 1.0) for op in FIXED_OPS]
    rows += [
        PerfRow("local", op, n, n * 1e-9, 1, 1.0) for op in SERIES_OPS for n in (1024, 1 << 20)
    ]
    with open_catalog(cfg.catalog.url) as cat:
        register_configured_tiers(cat, cfg)
        cat.record_perf(rows)
    lock = tmp_path / "local" / ".strataio-predict" / "calibrate.lock"
    lock.parent.mkdir(parents=True)
    return tmp_path / "strataio.toml", tmp_path / "w.toml", lock


class Holder:
    """Another process holding the tier's lock as a calibration holds it (``flock``, its pid
    written in the file) until :meth:`release`."""

    def __init__(self, lock) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import fcntl, os, sys\n"
                f"f = open({str(lock)!r}, 'a+')\n"
                "fcntl.flock(f, fcntl.LOCK_EX); f.truncate(0)\n"
                "f.write(f'pid {os.getpid()} on a node (calibrating)'); f.flush()\n"
                "print('held', flush=True); sys.stdin.readline()",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout.readline().strip() == "held"
        self.pid = self.proc.pid

    def release(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()  # its readline returns: it exits, the system drops the lock
            self.proc.wait(10)

    def __enter__(self) -> Holder:
        return self

    def __exit__(self, *exc) -> None:
        self.proc.kill()
        self.proc.wait()


def test_predict_measure_does_not_run_beside_a_calibration_of_its_tier(setup):
    """While a calibration holds the tier, ``predict --measure`` fails at once naming it (it
    ran, timing its I/O into the calibration's); ``predict`` alone still answers."""
    config, workload, lock = setup
    r = CliRunner()
    with Holder(lock) as holder:
        t0 = time.monotonic()
        out = r.invoke(main, ["predict", "-c", str(config), str(workload), "--measure"])
        assert out.exit_code == 1, out.output
        assert f"tier 'local' is busy: pid {holder.pid} on a node (calibrating)" in out.output
        assert str(lock) in out.output and "--wait" in out.output
        assert time.monotonic() - t0 < 2  # refused before launching anything
        out = r.invoke(main, ["predict", "-c", str(config), str(workload), "--json"])
        assert out.exit_code == 0, out.output  # predicting only reads: no lock
        assert lock.read_text().startswith(f"pid {holder.pid} ")  # left as the holder wrote it


def test_measured_runs_and_calibrations_wait_for_the_tier_then_name_its_holder(setup):
    from strataio.predict.native import lock_tiers

    config, workload, lock = setup
    cfg, wl = load_config(str(config)), load_workload(workload)
    with Holder(lock) as holder:
        said: list[str] = []
        t0 = time.monotonic()
        with pytest.raises(BusyError, match=f"still busy after 0.3 s: pid {holder.pid} on a"):
            run_workload(wl, cfg, wait=0.3, on_wait=said.append)
        assert 0.3 <= time.monotonic() - t0 < 2
        assert len(said) == 1 and said[0].startswith("waiting up to 0.3 s for tier 'local'")
        assert f"pid {holder.pid}" in said[0] and str(lock) in said[0]
        with open_catalog(cfg.catalog.url) as cat, pytest.raises(BusyError, match="is busy"):
            calibrate(cfg, cat, ["local"], sizes=[1024], repeat=1, levels=(1,))

        said.clear()
        with lock_tiers(
            [cfg.tier("local")],
            "a test",
            wait=10,
            on_wait=lambda m: (said.append(m), holder.release()),
        ):
            assert holder.proc.returncode == 0 and len(said) == 1  # waited for it, then had it
            assert lock.read_text().startswith(f"pid {os.getpid()} on ")
            assert lock.read_text().endswith("(a test)")
        with open(lock) as f:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released with the block


@pytest.mark.mpi
def test_a_measured_run_removes_nothing_its_dataset_names_name(setup, tmp_path):
    """A dataset named as a path (absolute, or the work folder) is a label: the run's files
    are its own (the run removed the folder the name named)."""
    config, workload, _ = setup
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("precious")
    names = (str(victim), ".", "..")  # (an empty name is refused: test_predict)
    workload.write_text(
        WORKLOAD.format(name=names[0])
        + "".join(WORKLOAD[WORKLOAD.index("[[dataset]]") :].format(name=name) for name in names[1:])
    )
    measured = run_workload(load_workload(workload), load_config(str(config)), timeout=60)
    assert sorted(measured) == sorted(names) and all(t > 0 for t in measured.values())
    assert (victim / "keep.txt").read_text() == "precious"
    assert (tmp_path / "strataio.toml").exists() and (tmp_path / "local").is_dir()
    assert not any((tmp_path / "local" / ".strataio-predict").glob("dataset-*"))  # removed


def test_a_wait_that_is_not_a_number_is_refused(setup):
    """``--wait nan`` passed the range check (every comparison with nan is false) and waited
    not at all; it is a usage error now, for ``predict`` and ``calibrate`` alike."""
    config, workload, _ = setup
    r = CliRunner()
    for args in (["predict", str(workload)], ["calibrate", "--quick"]):
        out = r.invoke(main, [*args, "-c", str(config), "--wait", "nan"])
        assert out.exit_code == 2 and "not a number of seconds" in out.output, out.output


def test_ranks_launched_under_the_lock_hold_it_after_their_caller_lets_go(setup):
    """A process launched while the tier's lock is held (a measured run's ``mpiexec``)
    inherits it: a caller killed mid-run leaves the tier locked until the run ends, not
    free for a calibration to time the run's I/O."""
    from strataio.predict.native import held_lock_fds, lock_tiers
    from strataio.predict.ranks import _started

    config, _, _ = setup
    tc = load_config(str(config)).tiers[0]
    with open(os.devnull, "w") as err:
        with lock_tiers([tc], "measuring"):
            assert len(held_lock_fds()) == 1
            run = _started([sys.executable, "-c", "import time; time.sleep(60)"], err, {})
        assert held_lock_fds() == ()
        try:
            with pytest.raises(BusyError, match="measuring"), lock_tiers([tc], "calibrating"):
                pass
        finally:
            run.kill()
            run.wait()
    with lock_tiers([tc], "calibrating"):  # (free once the run is gone)
        pass


def test_a_holder_that_has_ended_is_said_to_have_ended(setup):
    """A holder killed mid-run (kill -9, a closed terminal) leaves the ranks it launched
    holding the lock; the error named its pid as the holder, a process the user then could
    not find. It now says that process has ended and the processes it launched hold the
    lock until they end."""
    import socket

    from strataio.predict.native import lock_tiers

    config, _, lock = setup
    tc = load_config(str(config)).tiers[0]
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    with open(lock, "a+") as f:  # (as the ranks of the ended holder hold it)
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write(f"pid {gone.pid} on {socket.gethostname()} since 12:00 (measured run of w.toml)")
        f.flush()
        with pytest.raises(BusyError) as err, lock_tiers([tc], "calibrating"):
            pass
    said = str(err.value)
    assert f"pid {gone.pid}" in said and "has ended" in said and "launched" in said
    with Holder(lock) as alive, pytest.raises(BusyError) as err, lock_tiers([tc], "calibrating"):
        pass
    assert f"pid {alive.pid}" in str(err.value) and "has ended" not in str(err.value)
