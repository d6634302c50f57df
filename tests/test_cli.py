"""``strataio info`` and ``strataio demo`` through click's CliRunner."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys

import click
import numpy as np
import pytest
import zarr
from click.testing import CliRunner

import strataio
from strataio.cli import main
from strataio.cli.output import HINT


def _chunk_files(path) -> list[str]:
    out = []
    for dirpath, _dirs, files in os.walk(os.path.join(path, "c")):
        out.extend(os.path.join(dirpath, f) for f in files)
    return out


def test_demo_then_info(tmp_path) -> None:
    runner = CliRunner()
    res = runner.invoke(
        main, ["demo", "sections", "--dir", str(tmp_path), "--size", "400", "--chunk", "50"]
    )
    assert res.exit_code == 0, res.output
    assert res.output.count(" ok") == 8 and "MISMATCH" not in res.output
    for name in "ABCDEFGH":
        assert f"\n  {name} " in res.output
    path = tmp_path / "sample.zarr"
    # the sample is a real dataset: its contents read back through zarr-python
    assert zarr.open_array(store=str(path), mode="r").shape == (400, 400)

    res = runner.invoke(main, ["info", str(path)])
    assert res.exit_code == 0, res.output
    files = _chunk_files(path)
    assert len(files) == 64
    assert "400 x 400" in res.output and "float32" in res.output and "50 x 50" in res.output
    assert "64 / 64" in res.output
    assert "zstd" in res.output and "crc32c" in res.output
    assert f"{sum(os.path.getsize(f) for f in files)} (" in res.output


def test_info_partial_dataset_and_foreign_writer(tmp_path) -> None:
    path = tmp_path / "part.zarr"
    with strataio.create_dataset(path, (100, 60), "int16", (30, 20)) as ds:
        ds[0:30, 0:40] = np.ones((30, 40), np.int16)
        ds[95, 59] = 3
    res = CliRunner().invoke(main, ["info", str(path)])
    assert res.exit_code == 0, res.output
    files = _chunk_files(path)
    assert len(files) == 3
    assert "3 / 12" in res.output and "int16" in res.output
    assert f"{sum(os.path.getsize(f) for f in files)} (" in res.output
    assert "unfinished writes" not in res.output
    # a writer killed in a put leaves its temporary file: info names it
    (path / "c" / "0" / "0.4242.7.strataio-tmp").write_bytes(b"half")
    res = CliRunner().invoke(main, ["info", str(path)])
    assert res.exit_code == 0, res.output
    assert "unfinished writes" in res.output and "1 temporary file(s)" in res.output

    # an array written by zarr-python is described the same way
    zpath = tmp_path / "z.zarr"
    z = zarr.create_array(
        store=str(zpath), shape=(10, 10), chunks=(5, 5), dtype="float64", compressors=None
    )
    z[0:5, 0:10] = 1.0
    res = CliRunner().invoke(main, ["info", str(zpath)])
    assert res.exit_code == 0, res.output
    assert "2 / 4" in res.output and "float64" in res.output and "800 (" in res.output


_HELD_WRITER = """
import os, sys
import strataio
real_replace, held = os.replace, []
def replace(src, dst):  # the chunk's put, its temporary file written, waits before its rename
    if not held:
        held.append(src)
        print("renaming", flush=True)
        sys.stdin.readline()
    real_replace(src, dst)
os.replace = replace
with strataio.open_dataset(sys.argv[1], mode="r+") as ds:
    ds[int(sys.argv[2]) : int(sys.argv[2]) + 30, 0:20] = int(sys.argv[3])
"""


def _held_writer(script: str, path, row: int, value: int) -> subprocess.Popen:
    """A process running ``script`` (writing ``value`` from ``row`` of the dataset at ``path``),
    once it says it is about to rename its temporary file into place, where it waits for a
    line on its stdin."""
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(path), str(row), str(value)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
    )
    assert proc.stdout.readline() == "renaming\n"
    return proc


def _reap(*procs: subprocess.Popen) -> None:
    """Kill and wait for those of ``procs`` still running (a test that failed midway)."""
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_fsck_path_says_what_is_there_when_it_is_no_array(tmp_path) -> None:
    """fsck PATH of nothing said "not a directory", and of a Zarr group exited 1 (problems
    found) saying it was no array: both are usage errors (exit 2) saying what is there. info
    PATH of a group says the same, exit 2 (it exited 1, as for a zarr.json it cannot read)."""
    strataio.create_dataset(tmp_path / "grp" / "arr", (10, 10), "f4", (5, 5)).close()
    r = CliRunner()
    out = r.invoke(main, ["fsck", str(tmp_path / "nosuch")])
    assert out.exit_code == 2 and "no such file or directory" in out.output, out.output
    for cmd in ("fsck", "info"):
        out = r.invoke(main, [cmd, str(tmp_path / "grp")])
        assert out.exit_code == 2, out.output
        assert "is a Zarr group, not an array" in out.stderr, out.output
        out = r.invoke(main, [cmd, str(tmp_path / "grp" / "arr")])
        assert out.exit_code == 0, out.output


def test_fsck_path_deletes_a_killed_writers_temporary_files_not_a_live_ones(tmp_path) -> None:
    path = tmp_path / "d.zarr"
    oracle = np.ones((100, 60), np.int16)
    with strataio.create_dataset(path, (100, 60), "int16", (30, 20)) as ds:
        ds[...] = oracle
    killed, live = (_held_writer(_HELD_WRITER, path, row, v) for row, v in ((0, 7), (30, 9)))
    try:
        killed.send_signal(signal.SIGKILL)
        killed.wait(10)
        temps = sorted(str(p) for p in path.rglob("*.strataio-tmp"))
        assert len(temps) == 2
        (dead,) = [t for t in temps if f".{killed.pid}." in t]
        (running,) = [t for t in temps if f".{live.pid}." in t]
        runner = CliRunner()
        res = runner.invoke(main, ["info", str(path)])
        assert res.exit_code == 0, res.output
        said = " ".join(res.output.split())  # (the table wraps long values)
        assert "2 temporary file(s)" in said and "1 of a put running now" in said
        assert "1 left by a writer killed in a put" in said and "fsck" in said

        res = runner.invoke(main, ["fsck", str(path)])  # only a look: exit 1, nothing deleted
        assert res.exit_code == 1, res.output
        assert "leftover" in res.output and "in-flight" in res.output
        assert os.path.exists(dead) and os.path.exists(running)

        res = runner.invoke(main, ["fsck", str(path), "--repair"])
        assert res.exit_code == 0, res.output
        assert "1 of writers that are gone, deleted" in res.output
        assert "1 of puts running now, left alone" in res.output
        assert not os.path.exists(dead) and os.path.exists(running)

        live.stdin.write("\n")
        live.stdin.flush()
        assert live.wait(20) == 0
    finally:
        _reap(killed, live)
    oracle[30:60, 0:20] = 9  # the killed writer's chunk keeps its old value
    with strataio.open_dataset(path, mode="r") as ds:
        assert np.array_equal(ds[...], oracle)
    res = runner.invoke(main, ["fsck", str(path)])
    assert res.exit_code == 0, res.output
    assert "0 temporary files" in res.output
    assert list(path.rglob("*.strataio-tmp")) == []
    # a path with no dataset: a usage error, one line
    res = runner.invoke(main, ["fsck", str(tmp_path / "missing")])
    assert res.exit_code == 2 and res.stderr.startswith("error: "), res.output


def test_fsck_path_on_a_read_only_file_system_says_so(tmp_path, monkeypatch) -> None:
    """On a read-only mount a temporary file's lock cannot be taken for writing (EROFS), nor
    the file deleted: fsck PATH --repair says that is why it is left (it said only that
    there was no lock to judge by); where the file system is writable it is deleted."""
    path = tmp_path / "d.zarr"
    strataio.create_dataset(path, (4, 4), "f4", (2, 2)).close()
    temp = path / "c" / "0" / "0.4242.7.strataio-tmp"
    temp.parent.mkdir(parents=True)
    temp.write_bytes(b"half")
    real_open, real_statvfs = os.open, os.statvfs

    def open_(file, flags, *args, **kwargs):  # (as the kernel answers on a read-only mount)
        if str(file).startswith(str(path)) and flags & (os.O_WRONLY | os.O_RDWR):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), file)
        return real_open(file, flags, *args, **kwargs)

    def statvfs(file):
        got = real_statvfs(file)
        if not str(file).startswith(str(path)):
            return got
        return os.statvfs_result((*got[:8], got.f_flag | os.ST_RDONLY, *got[9:]))

    runner = CliRunner()
    with monkeypatch.context() as m:
        m.setattr(os, "open", open_)
        m.setattr(os, "statvfs", statvfs)
        res = runner.invoke(main, ["fsck", str(path), "--repair"])
    said = " ".join(res.output.split())  # (the table wraps long values)
    assert res.exit_code == 1, res.output
    assert "the file system is read-only: its lock cannot be taken" in said, said
    assert "no lock to tell" not in said
    assert "1 that cannot be judged here, left (1 on a read-only file system)" in said
    assert temp.exists()
    res = runner.invoke(main, ["fsck", str(path), "--repair"])
    assert res.exit_code == 0 and "1 of writers that are gone, deleted" in res.output
    assert not temp.exists()


_HELD_SHARD_WRITER = """
import os, sys
import numpy as np
from mpi4py import MPI
import strataio
real_replace = os.replace
def replace(src, dst):  # the shard's temporary file written whole, its rename waits
    if src.endswith(".part"):
        print("renaming", flush=True)
        sys.stdin.readline()
    real_replace(src, dst)
os.replace = replace
ds = strataio.open_dataset(sys.argv[1], mode="r+", comm=MPI.COMM_SELF)
row = int(sys.argv[2])
ds.write_all(np.s_[row : row + 6, 0:8], np.full((6, 8), int(sys.argv[3]), "i8"))
ds.close()
"""


def test_fsck_path_deletes_a_killed_shard_writes_part_files_not_a_running_ones(tmp_path) -> None:
    """A collective shard write killed before its rename leaves its ``.part`` file and its
    call's lock file: info counts them (not as chunks), fsck --repair deletes them; a running
    write's, whose rank holds the lock, are left alone, the ``.part`` file renamed into place
    and the lock file removed as the write goes on."""
    path = tmp_path / "s.zarr"
    oracle = np.arange(12 * 12, dtype="i8").reshape(12, 12)
    with strataio.create_dataset(
        path, oracle.shape, "i8", (3, 4), shards=(6, 8), codec="zstd"
    ) as ds:
        ds[...] = oracle
    # (each writes one whole shard: c/0/0, c/1/0)
    killed, live = (_held_writer(_HELD_SHARD_WRITER, path, row, v) for row, v in ((0, 7), (6, 9)))
    try:
        killed.send_signal(signal.SIGKILL)
        killed.wait(10)
        parts = sorted(str(p) for p in path.rglob("*.part"))
        assert len(parts) == 2
        (dead,) = [p for p in parts if "/c/0/0." in p]
        (running,) = [p for p in parts if "/c/1/0." in p]
        locks = {p: str(path / f".{p.split('.')[-2]}.lock") for p in (dead, running)}
        assert sorted(locks.values()) == sorted(str(p) for p in path.glob(".*.lock"))
        runner = CliRunner()
        res = runner.invoke(main, ["info", str(path)])
        assert res.exit_code == 0, res.output
        said = " ".join(res.output.split())  # (the table wraps long values)
        assert "4 / 4" in said  # (a temporary file is no shard)
        assert "4 temporary file(s)" in said
        assert "2 of a collective shard write running now" in said, said
        assert "2 left by a collective shard write whose ranks were killed" in said
        assert f"fsck {path} --repair" in said

        res = runner.invoke(main, ["fsck", str(path)])  # only a look: exit 1, nothing deleted
        assert res.exit_code == 1, res.output
        assert "leftover" in res.output and "in-flight" in res.output
        assert "lock file of a collective shard write whose ranks were killed" in res.output
        assert all(os.path.exists(p) for p in (dead, running, *locks.values()))

        res = runner.invoke(main, ["fsck", str(path), "--repair"])
        assert res.exit_code == 0, res.output
        assert "2 of writers that are gone, deleted" in res.output
        assert "2 of collective shard writes running now, left alone" in res.output
        assert not os.path.exists(dead) and not os.path.exists(locks[dead])
        assert os.path.exists(running) and os.path.exists(locks[running])

        live.stdin.write("\n")
        live.stdin.flush()
        assert live.wait(60) == 0
    finally:
        _reap(killed, live)
    oracle[6:12, 0:8] = 9  # the killed writer's shard keeps its old value
    with strataio.open_dataset(path, mode="r") as ds:
        assert np.array_equal(ds[...], oracle)
    res = CliRunner().invoke(main, ["fsck", str(path)])
    assert res.exit_code == 0 and "0 temporary files" in res.output, res.output
    assert list(path.rglob("*.part")) == [] and list(path.glob(".*.lock")) == []


_HELD_META_CHANGE = """
import sys
import strataio
from strataio.arrays.store import BackendChunkStore
real_put = BackendChunkStore.put_meta
def put_meta(self, data):  # the attribute change holds the array's lock; its put waits
    print("renaming", flush=True)
    sys.stdin.readline()
    real_put(self, data)
BackendChunkStore.put_meta = put_meta
ds = strataio.open_dataset(sys.argv[1], mode="r+")
ds.attrs["step"] = int(sys.argv[3])
ds.close()
"""


def test_fsck_path_deletes_the_lock_file_of_a_killed_attribute_change_not_a_running_ones(
    tmp_path,
) -> None:
    """An attribute change holds the array's lock file, .zarr.json.lock, from before its read
    of zarr.json until after its put, and removes it then; one killed meanwhile leaves it.
    info and fsck report it (a running change's as in-flight), fsck --repair deletes a
    killed change's only, and a change after a killed one is not held back by its file."""
    dead_path, live_path = tmp_path / "a.zarr", tmp_path / "b.zarr"
    for p in (dead_path, live_path):
        strataio.create_dataset(p, (4,), "f4", (2,)).close()
    dead_lock, live_lock = (p / ".zarr.json.lock" for p in (dead_path, live_path))
    killed, live = (
        _held_writer(_HELD_META_CHANGE, p, 0, v) for p, v in ((dead_path, 7), (live_path, 9))
    )
    try:
        killed.send_signal(signal.SIGKILL)
        killed.wait(10)
        assert dead_lock.exists() and live_lock.exists()
        runner = CliRunner()
        res = runner.invoke(main, ["info", str(dead_path)])
        said = " ".join(res.output.split())  # (the table wraps long values)
        assert res.exit_code == 0 and "1 left by a writer killed in a zarr.json change" in said
        res = runner.invoke(main, ["fsck", str(dead_path)])  # only a look
        said = " ".join(res.output.split())
        assert res.exit_code == 1 and "lock file of a zarr.json change killed" in said, said
        assert dead_lock.exists()
        res = runner.invoke(main, ["fsck", str(live_path), "--repair"])
        said = " ".join(res.output.split())
        assert res.exit_code == 0 and "1 of zarr.json changes running now, left alone" in said
        assert live_lock.exists()
        res = runner.invoke(main, ["fsck", str(dead_path), "--repair"])
        assert res.exit_code == 0 and "1 of writers that are gone, deleted" in res.output
        assert not dead_lock.exists()
        live.stdin.write("\n")
        live.stdin.flush()
        assert live.wait(20) == 0
        assert not live_lock.exists()
        killed = _held_writer(_HELD_META_CHANGE, dead_path, 0, 7)
        killed.send_signal(signal.SIGKILL)
        killed.wait(10)
    finally:
        _reap(killed, live)
    assert dead_lock.exists()
    with strataio.open_dataset(dead_path, mode="r+") as ds:
        ds.attrs["step"] = 8
    assert not dead_lock.exists()
    assert dict(strataio.open_dataset(dead_path).attrs) == {"step": 8}
    assert dict(strataio.open_dataset(live_path).attrs) == {"step": 9}


def test_info_errors_are_messages_not_tracebacks(tmp_path) -> None:
    runner = CliRunner()
    notadir = tmp_path / "file.txt"
    notadir.write_text("hello")
    empty = tmp_path / "empty"
    empty.mkdir()
    broken = tmp_path / "broken.zarr"
    broken.mkdir()
    (broken / "zarr.json").write_text("{not json")
    malformed = tmp_path / "malformed.zarr"
    malformed.mkdir()
    (malformed / "zarr.json").write_text('{"zarr_format": 3, "node_type": "array"}')
    # nothing to describe at the path: a usage error (2); a dataset whose zarr.json cannot be
    # used: a runtime failure (1), as for every other command (it was 2)
    for target, status in (
        (tmp_path / "missing", 2),
        (notadir, 2),
        (empty, 2),
        (broken, 1),
        (malformed, 1),
    ):
        res = runner.invoke(main, ["info", str(target)])
        assert res.exit_code == status, (target, res.output)
        assert res.exception is None or isinstance(res.exception, SystemExit)
        assert "Traceback" not in res.output
        assert res.stderr.startswith("error: ") and str(target.name) in res.stderr
        assert len(res.stderr.splitlines()) == 1, res.stderr
        assert res.stdout == ""
        if status == 1:
            assert str(target / "zarr.json") in res.stderr, res.stderr


def test_readme_links_stay_in_the_repository_and_its_commands_exist():
    import re
    from pathlib import Path

    import click

    root = Path(__file__).resolve().parent.parent
    for doc in (root / "README.md", root / "docs" / "architecture.md"):
        text = doc.read_text()
        for target in re.findall(r"\]\(([^)]+)\)", text):
            assert "://" not in target, f"{doc.name} links outside the repository: {target}"
            assert (doc.parent / target.split("#")[0]).exists(), f"{doc.name}: {target} missing"
        assert "shared documents" not in text
    shell = "".join(re.findall(r"```sh\n(.*?)```", (root / "README.md").read_text(), re.S))
    ctx = click.Context(main)
    lines = re.findall(r"^strataio ([a-z][^\s#]*(?: [a-z][^\s#]*)?)", shell, re.M)
    assert len(lines) > 10
    for line in lines:
        words = line.split()
        cmd = main.get_command(ctx, words[0])
        assert cmd is not None, f"README names an unknown command: strataio {line}"
        if isinstance(cmd, click.Group) and len(words) > 1:
            assert cmd.get_command(ctx, words[1]) is not None, f"strataio {line}"


@pytest.mark.parametrize(
    "args",
    [
        ["bench", "irregular", "--ranks", "0"],
        ["bench", "loopcache", "--ranks", "2,x"],
        ["bench", "realms", "--ranks", "-1"],
        ["bench", "sections", "--collective", "--ranks", "0"],
        ["calibrate", "--concurrency", "1,0"],
        ["bench", "realms", "--scale", "0"],
        ["bench", "tape", "--time-scale", "nan"],
        ["bench", "irregular", "--timeout", "-5"],
        ["demo", "--time-scale", "-1"],
    ],
)
def test_counts_and_factors_are_checked_before_anything_runs(args: list[str]) -> None:
    got = CliRunner().invoke(main, args)
    assert got.exit_code == 2 and "Traceback" not in got.output
    assert f"Invalid value for '{args[-2]}'" in got.output


@pytest.mark.parametrize(
    "args, says",
    [
        (["flatten", "--pieces", "0"], "--pieces"),
        (["flatten", "--realms", "0"], "--realms"),
        (["sieving", "--file-mib", "0"], "--file-mib"),
        (["irregular", "--reps", "0"], "--reps"),
        (["irregular", "--items", "0"], "--items"),
        (["loopcache", "--loops", "0"], "--loops"),
        (["loopcache", "--hint", "cb_nodes"], "is not KEY=VALUE"),
        (["realms", "--hint", "=4"], "is not KEY=VALUE"),
        (["loopcache", "--hint", "cb_buffer_size=abc"], "expected an integer"),
        (["realms", "--hint", "romio_cb_read=maybe"], "expected one of enable"),
        (["realms", "--hint", "strataio_driver_latency=soon"], "expected a number"),
        (["predict", "--no-calibrate", "--dir", "{tmp}/empty"], "no calibration in"),
        (["realms", "--reps", "0"], "--reps"),
        (["sliding-window", "--scale", "0"], "--scale"),
        (["overlap", "--sections", "0"], "--sections"),
        (["overlap", "--sections", "1"], "1 is not in the range 2<=x<=1024"),
        (["tape", "--size", "0"], "--size"),
        (["tape", "--chunk", "0"], "--chunk"),
        (["predict", "--max-size", "0"], "'0': expected a size of at least 1.0 KiB"),
        (["predict", "--max-size", "1000"], "'1000': expected a size of at least 1.0 KiB"),
        (["predict", "--runs", "0"], "--runs"),
        (["compress", "--ranks", "0"], "--ranks"),
        (["compress", "--per-rank", "0"], "'0': expected a size of at least 1 B"),
        (["compress", "--per-rank", "1.5"], "'1.5' is not a whole number of bytes"),
        (["compress", "--bandwidth", "0"], "'0': expected a size of at least 1 B"),
        (["superfile", "--size", "0"], "'0': expected a size of at least 1 B"),
        (["superfile", "--size", "-5"], "'-5': expected a size of at least 1 B"),
        (["superfile", "--size", "none"], "'none': expected a size of at least 1 B"),
        (["superfile", "--container", "-5"], "'-5': expected a size of at least 1 B"),
        (["superfile", "--sweep", "1MiB,-5"], "'-5': expected a size of at least 1 B"),
        (["superfile", "--sweep", "1MiB,lots"], "cannot read 'lots' as a size"),
        (["loopcache", "--index-bytes", "-5"], "'-5': expected a size of at least 1 B"),
        (["loopcache", "--index-bytes", ","], "expected sizes like 64KiB,1MiB"),
        (["sections", "--chunk-cache", "-5"], "'-5': expected a size of at least 0 B"),
        (["superfile", "--counts", "abc"], "expected counts"),
        (["superfile", "--counts", "0"], "at least 1"),
        (["irregular", "--itemsize", "0"], "every count must be at least 1"),
        (["irregular", "--itemsize", "16,abc"], "expected counts like 1,2,4"),
    ],
)
def test_bench_options_out_of_range_are_usage_errors(args, says, tmp_path) -> None:
    """Zero, negative or malformed counts, sizes and hints are refused before anything runs,
    alike: a usage error (exit 2) with a message naming the option (not a traceback, a hang,
    a table of nothing, or for a negative size a bare error and exit 1)."""
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    res = CliRunner().invoke(main, ["bench", *args])
    found = "--no-calibrate" in args  # (no option out of range: the suite finds it, exit 1)
    assert res.exit_code == (1 if found else 2), res.output
    assert says in res.output, res.output
    if not found:
        assert f"Invalid value for '{args[-2]}'" in res.output, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception


def test_calibrate_refuses_a_plot_it_could_not_write_before_measuring(tmp_path) -> None:
    """--plot into a folder that does not exist is a usage error at once, not after the
    minutes of a calibration."""
    res = CliRunner().invoke(main, ["calibrate", "--plot", str(tmp_path / "no" / "x.png")])
    assert res.exit_code == 2 and "no folder" in res.output, res.output
    assert not (tmp_path / "no").exists()


def test_a_hint_is_judged_alone_and_passed_on_with_its_key_stripped() -> None:
    """A shaped driver's parameter is a value the bench's own driver preset completes (the
    rule between hints is the ranks'); blanks around a key would make it an unknown hint the
    ranks ignore, so they go."""
    assert HINT.convert("strataio_driver_latency=0.01", None, None) == (
        "strataio_driver_latency=0.01"
    )
    assert HINT.convert(" cb_buffer_size =4096", None, None) == "cb_buffer_size=4096"
    with pytest.raises(click.BadParameter, match="expected an integer"):
        HINT.convert("strataio_driver_bandwidth=fast", None, None)


@pytest.mark.parametrize("option, value", [("--size", "-5"), ("--size", "0"), ("--chunk", "0")])
def test_demo_sections_refuses_a_size_or_chunk_below_one(option, value, tmp_path) -> None:
    """`strataio demo sections` with a side or chunk side below 1 is a usage error naming the
    option (not a numpy traceback), and no folder or dataset is made."""
    where = tmp_path / "demo"
    res = CliRunner().invoke(main, ["demo", "sections", "--dir", str(where), option, value])
    assert res.exit_code == 2, res.output
    assert f"Invalid value for '{option}'" in res.output and "Traceback" not in res.output
    assert not where.exists()


def test_demo_sections_fails_with_exit_1_where_data_differs_or_storage_fails(
    tmp_path, monkeypatch
) -> None:
    """A pattern that reads back different data, or a write that fails, is a failure (exit
    1), not a usage error (2: an option refused, such as --codec)."""
    args = ["demo", "sections", "--dir", str(tmp_path / "d"), "--size", "40", "--chunk", "10"]
    res = CliRunner().invoke(main, [*args, "--codec", "bogus"])
    assert res.exit_code == 2 and "unknown codec 'bogus'" in res.stderr, res.output
    with monkeypatch.context() as m:
        m.setattr(np, "array_equal", lambda a, b: False)
        res = CliRunner().invoke(main, args)
    assert res.exit_code == 1, res.output
    assert "MISMATCH" in res.stdout and "error: 8 pattern(s) read back different data" in res.stderr

    def full(self, *a, **k):
        raise strataio.errors.BackendError("No space left on device")

    monkeypatch.setattr(strataio.Dataset, "__setitem__", full)
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 1 and "No space left on device" in res.stderr, res.output


@pytest.mark.parametrize(
    "before, says",
    [
        (["--size", "50"], "--size: options of the Astro3D run ('strataio demo'), not of 'demo "
         "sections': give --size after 'sections'"),
        (["--json", "{tmp}/out.json", "--ranks", "2"], "--ranks, --json: options of the Astro3D"),
    ],
)  # fmt: skip
def test_demo_options_before_a_subcommand_are_refused_not_ignored(before, says, tmp_path) -> None:
    """`strataio demo --size 50 sections`: the group's options do nothing for a subcommand, so
    they are a usage error naming them (and where a subcommand's own goes), and nothing runs."""
    before = [a.replace("{tmp}", str(tmp_path)) for a in before]
    where = tmp_path / "demo"
    res = CliRunner().invoke(main, ["demo", *before, "sections", "--dir", str(where)])
    assert res.exit_code == 2, res.output
    assert says in " ".join(res.stderr.split()), res.stderr
    assert not where.exists() and not (tmp_path / "out.json").exists()


@pytest.mark.parametrize(
    "args",
    [
        ["bench", "tape", "--json", "{tmp}/no/out.json"],
        ["bench", "flatten", "--json", "{tmp}/no/out.json"],
        ["demo", "--dir", "{tmp}/demo", "--chart", "{tmp}/no/chart.png"],
        ["demo", "--dir", "{tmp}/demo", "--json", "{tmp}/no/out.json"],
    ],
)
def test_an_output_file_without_its_folder_is_refused_before_the_run(args, tmp_path) -> None:
    """--json or --chart into a folder that does not exist is a usage error naming it, at
    once: not a traceback (or an error) after the benchmark or demo has run for minutes."""
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 2, res.output
    assert f"Invalid value for '{args[-2]}'" in res.output, res.output
    assert f"no folder {tmp_path / 'no'}" in res.output, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert sorted(os.listdir(tmp_path)) == []


def test_an_interrupted_command_says_so_in_one_line_and_exits_130(monkeypatch) -> None:
    """Ctrl-C in a command is one line on stderr saying it was interrupted and what to do,
    and exit status 130 as for any command SIGINT ends (not click's bare "Aborted!" and 1,
    a failure's status)."""

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("strataio.cli.catalog_cmd.load_config", interrupted)
    res = CliRunner().invoke(main, ["ls"])
    assert res.exit_code == 130, res.output
    assert "Aborted!" not in res.output and "Traceback" not in res.output
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: interrupted"), res.output
    assert "strataio fsck --repair" in lines[0]


def test_fsck_path_decodes_every_chunk_and_reports_the_corrupt_ones(tmp_path) -> None:
    """fsck PATH looked only at temporary files: a chunk whose crc32c no longer matched, or
    a raw chunk cut short, passed as clean (exit 0). Every chunk is now decoded (--quick:
    sized, where chunks are stored plain), a bad one reported by key (exit 1) and left, as
    it has no other copy; -c, which names a catalog, is refused with PATH (exit 2)."""
    data = np.random.default_rng(3).random((40, 40), dtype="f4")
    for codec in ("crc32c", None, "zstd"):
        with strataio.create_dataset(
            tmp_path / f"{codec}", (40, 40), "f4", (10, 10), codec=codec
        ) as d:
            d[...] = data
    r = CliRunner()
    for codec in ("crc32c", None, "zstd"):
        out = r.invoke(main, ["fsck", str(tmp_path / f"{codec}")])
        assert out.exit_code == 0 and "16 chunks decoded, 0 corrupt" in out.output, out.output
    with open(tmp_path / "crc32c" / "c" / "2" / "1", "r+b") as f:
        f.seek(7)
        f.write(b"\xff\x00")
    os.truncate(tmp_path / "None" / "c" / "0" / "3", 100)
    with open(tmp_path / "zstd" / "c" / "1" / "1", "wb") as f:
        f.write(b"not a zstd frame")
    for codec, key, why in [
        ("crc32c", "c/2/1", "checksum mismatch"),
        ("None", "c/0/3", "expected 100"),
        ("zstd", "c/1/1", ""),
    ]:
        out = r.invoke(main, ["fsck", "--repair", str(tmp_path / codec)])
        assert out.exit_code == 1, out.output
        assert "16 chunks decoded, 1 corrupt" in out.output and key in out.output, out.output
        assert why in out.output, out.output
    out = r.invoke(main, ["fsck", "--quick", str(tmp_path / "None")])
    assert out.exit_code == 1 and "16 chunks sized, 1 corrupt" in out.output, out.output
    assert "100 bytes; its chunks store 400" in out.output, out.output
    out = r.invoke(main, ["fsck", "--quick", str(tmp_path / "crc32c")])
    assert out.exit_code == 0 and "16 chunks sized, 0 corrupt" in out.output, out.output
    out = r.invoke(main, ["fsck", "--quick", str(tmp_path / "zstd")])
    assert out.exit_code == 0 and "16 chunks listed" in out.output, out.output
    assert (tmp_path / "crc32c" / "c" / "2" / "1").exists()  # (left: no other copy)
    out = r.invoke(main, ["fsck", "-c", str(tmp_path / "x.toml"), str(tmp_path / "zstd")])
    assert out.exit_code == 2 and "has none" in out.output, out.output
