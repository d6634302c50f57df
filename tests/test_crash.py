"""Crash recovery without waiting: kill -9 a process in the middle of creates, rewrites and
moves, run ``strataio fsck --repair`` with its default options at once, and every chunk reads
back at once as its old or its new value; a second fsck is clean.

Trials run several workers at a time (each on its own catalog and tiers), on SQLite and on
PostgreSQL catalogs. The CI run makes 20 trials; ``-m slow`` makes 200.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import numpy as np
import pytest
from click.testing import CliRunner

import strataio
from strataio.cli import main as cli
from strataio.errors import StrataError

sys.path.insert(0, str(Path(__file__).parent))
import crash_worker  # noqa: E402

WORKER = Path(__file__).parent / "crash_worker.py"


def config_text(root: Path, catalog_url: str) -> str:
    return f"""\
[catalog]
url = "{catalog_url}"

[[tiers]]
name = "local"
kind = "posix"
role = "localdisk"
path = "{root / "local"}"

[[tiers]]
name = "archive"
kind = "posix"
role = "remotetape"
path = "{root / "archive"}"
"""


@dataclass
class Trial:
    """One worker run: its configuration (``config`` None = the embedded default in
    ``root``), the operation, and what was seen."""

    root: Path
    op: str
    config: str | None
    delay: float
    proc: subprocess.Popen | None = None
    done: int = 0
    notes: list[str] = field(default_factory=list)

    def session(self) -> strataio.Session:
        return strataio.Session(self.config)

    def argv(self) -> list[str]:
        return [sys.executable, str(WORKER), self.config or "-", self.op]


def fsck_cli(trial: Trial, *extra: str):
    args = ["fsck", *extra]
    if trial.config is not None:
        args += ["--config", trial.config]
    cwd = os.getcwd()
    os.chdir(trial.root)  # the embedded default configuration is relative to it
    try:
        return CliRunner().invoke(cli, args)
    finally:
        os.chdir(cwd)


def prepare(trial: Trial) -> None:
    cwd = os.getcwd()
    os.chdir(trial.root)
    try:
        with trial.session() as s:
            crash_worker.setup(s, trial.op)
    finally:
        os.chdir(cwd)


def run_trials(trials: list[Trial], batch: int = 5) -> list[str]:
    """Run ``trials``, ``batch`` workers at a time: start each worker, kill it (SIGKILL)
    ``delay`` seconds after it is ready, then repair and check it. Returns one message per
    failed trial."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    env.pop("STRATAIO_CONFIG", None)
    failures = []
    for b in range(0, len(trials), batch):
        group = trials[b : b + batch]
        for t in group:
            prepare(t)
            t.proc = subprocess.Popen(
                t.argv(),
                cwd=t.root,
                stdout=subprocess.PIPE,
                stderr=open(t.root / "stderr.txt", "w"),  # noqa: SIM115 - the child owns it
                text=True,
                env=env,
            )
        for t in group:
            line = t.proc.stdout.readline().strip()
            assert line == "ready", (t.root / "stderr.txt").read_text()
        t0 = time.monotonic()
        for t in sorted(group, key=lambda t: t.delay):
            time.sleep(max(0.0, t0 + t.delay - time.monotonic()))
            t.proc.kill()
        for t in group:
            out = t.proc.stdout.read().split()
            t.proc.wait()
            t.done = int(out[-1]) if out else 0
            try:
                check(t)
            except (AssertionError, StrataError) as exc:  # a read that fails fails the trial
                failures.append(f"{t.op} trial in {t.root}: {type(exc).__name__}: {exc}")
    return failures


def check(t: Trial) -> None:
    where = f"{t.op} trial in {t.root} (step {t.done} done)"
    first = fsck_cli(t, "--repair")
    assert first.exit_code == 0, f"{where}: fsck --repair:\n{first.output}"
    t.notes.append(first.output)
    # the killed worker's registration is found dead at once, by its released lock
    assert "1 session ended without closing (forgotten)" in first.output, first.output
    check_data(t, where)
    second = fsck_cli(t)
    assert second.exit_code == 0 and " 0 problems" in second.output, (
        f"{where}: second fsck:\n{second.output}"
    )


def check_data(t: Trial, where: str) -> None:
    """Every chunk of every dataset reads back, at once, as its old or its new value."""
    cwd = os.getcwd()
    os.chdir(t.root)
    try:
        with t.session() as s:
            for rec in s.list_datasets():
                ds = s.open_dataset(rec.name)
                got = ds[...]
                ds.close()
                if rec.name == "a":
                    old = crash_worker.state(t.op, t.done)
                    new = crash_worker.state(t.op, t.done + 1)
                else:  # a dataset of the create loop: unwritten chunks read as the fill value
                    k = int(rec.name[1:])
                    old, new = np.zeros_like(got), crash_worker.version(k)
                for i in range(0, got.shape[0], 10):
                    for j in range(0, got.shape[1], 10):
                        block = np.s_[i : i + 10, j : j + 10]
                        assert np.array_equal(got[block], old[block]) or np.array_equal(
                            got[block], new[block]
                        ), f"{where}: chunk ({i // 10}, {j // 10}) of {rec.name} is torn"
    finally:
        os.chdir(cwd)


def test_kill9_during_a_chunkwise_rewrite_reads_back_after_one_repair(tmp_path):
    """Finding 2: with the embedded default configuration, kill -9 during a chunk-by-chunk
    rewrite, ``strataio fsck --repair``, then a read: every chunk is readable at once."""
    rng = random.Random(2)
    trials = []
    for i in range(4):
        root = tmp_path / f"t{i}"
        root.mkdir()
        trials.append(Trial(root, "chunkwise", None, rng.uniform(0.3, 1.0)))
    assert run_trials(trials) == []
    assert max(t.done for t in trials) >= 1


def new_schema(pg_server) -> str:
    """A ``postgresql://`` URL of a fresh schema of ``pg_server``."""
    import psycopg

    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server.get_uri(), autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    uri = pg_server.get_uri()
    return f"{uri}{'&' if '?' in uri else '?'}options={quote(f'-csearch_path={schema}')}"


def make_trials(tmp_path, request, n: int, seed: int) -> list[Trial]:
    """``n`` trials cycling over every operation on SQLite and PostgreSQL catalogs, in a
    seeded random order, each killed at a seeded random moment."""
    rng = random.Random(seed)
    combos = [(op, cat) for op in crash_worker.OPS for cat in ("sqlite", "postgresql")]
    rng.shuffle(combos)
    pg = None
    trials = []
    for i in range(n):
        op, cat = combos[i % len(combos)]
        root = tmp_path / f"{i:03d}-{op}-{cat}"
        root.mkdir()
        if cat == "sqlite":
            url = str(root / "catalog.db")
        else:
            pg = pg or request.getfixturevalue("pg_server")
            url = new_schema(pg)
        config = root / "strataio.toml"
        config.write_text(config_text(root, url))
        trials.append(Trial(root, op, str(config), rng.uniform(0.02, 1.2)))
    return trials


def crash_matrix(tmp_path, request, n: int, seed: int) -> None:
    trials = make_trials(tmp_path, request, n, seed)
    t0 = time.monotonic()
    failures = run_trials(trials)
    took = time.monotonic() - t0
    repaired = sum("repaired" in t.notes[0] for t in trials if t.notes)
    print(
        f"\ncrash trials: {len(trials) - len(failures)} of {len(trials)} passed in {took:.0f} s; "
        f"{repaired} needed a repair"
    )
    assert not failures, f"{len(failures)} of {len(trials)} trials failed:\n" + "\n".join(failures)
    assert repaired, "no kill landed in the middle of an operation: nothing was exercised"


def test_kill9_at_random_moments_then_repair_at_once(tmp_path, request):
    crash_matrix(tmp_path, request, 12, seed=15)


@pytest.mark.slow
def test_kill9_at_random_moments_then_repair_at_once_long(tmp_path, request):
    crash_matrix(tmp_path, request, 200, seed=1500)


_HOLDER = """
import sys, time
import strataio
s = strataio.Session(sys.argv[1])
ds = s.open_dataset("d", "r+")
print("open", flush=True)
sys.stdin.readline()
got = ds[...]
print("read", float(got.sum()), flush=True)
ds.close()
s.close()
"""


def test_a_dataset_open_in_another_live_session_is_not_evicted(tmp_path):
    """Two processes with the same dataset open: eviction in one never takes a copy the
    other has recorded (its residency would name an object that is gone)."""
    root = tmp_path
    config = root / "strataio.toml"
    config.write_text(
        config_text(root, str(root / "catalog.db")).replace(
            'role = "localdisk"', 'role = "localdisk"\ncapacity = "20KiB"'
        )
    )
    data = np.random.default_rng(4).random((60, 60), dtype="f4")  # incompressible
    with strataio.Session(str(config)) as s:
        d = s.create_dataset("d", data.shape, "f4", (10, 10), hint="LOCALDISK")
        d[...] = data
        d.close()
        fast_d = {c.key for c in s.catalog.residency("d") if c.tier == "local"}
    assert len(fast_d) == 36
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(config)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert holder.stdout.readline().strip() == "open"
        with strataio.Session(str(config)) as s:
            e = s.create_dataset("e", data.shape, "f4", (10, 10), hint="LOCALDISK")
            e[...] = data + 1  # needs room on "local", which only "d" could give
            e.close()
            assert {c.key for c in s.catalog.residency("d") if c.tier == "local"} == fast_d
        holder.stdin.write("\n")
        holder.stdin.flush()
        line = holder.stdout.readline().split()
        assert line[:1] == ["read"], line
        assert float(line[1]) == pytest.approx(float(data.sum()), rel=1e-6)
    finally:
        holder.kill()
        holder.wait()
    # "d" is open nowhere now: its copies may make room
    with strataio.Session(str(config)) as s:
        f = s.create_dataset("f", data.shape, "f4", (10, 10), hint="LOCALDISK")
        f[...] = data + 2
        f.close()
        assert {c.key for c in s.catalog.residency("d") if c.tier == "local"} != fast_d
        np.testing.assert_array_equal(s.open_dataset("d")[...], data)


def test_a_readers_close_keeps_what_a_writer_committed_meanwhile(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with strataio.Session() as s:
        ds = s.create_dataset("a", (20, 20), "f4", (10, 10), hint="LOCALDISK")
        ds[...] = 1
        ds.close()
    with strataio.Session() as reader:
        rd = reader.open_dataset("a")
        rd[...]  # noqa: B018 - a read: its access times reach the catalog at close
        with strataio.Session() as writer:
            wd = writer.open_dataset("a", "r+")
            wd[...] = 2
            wd.close()
        rd.close()
    with strataio.Session() as s:
        np.testing.assert_array_equal(s.open_dataset("a")[...], 2)
