"""The tier commands: tiers, info NAME, stage, migrate, evict, fsck, rm, and their exit codes;
the tape benchmark's logic at time scale 0 (the cost model only accounts)."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

import strataio
from strataio.bench.tape import run_tape
from strataio.cli import main
from strataio.sizes import format_size

CONFIG = """
[catalog]
url = "cat.db"
[[tiers]]
name = "disk"
kind = "posix"
role = "localdisk"
path = "disk"
capacity = "1MiB"
[[tiers]]
name = "tape"
kind = "posix"
role = "remotetape"
path = "tape"
"""


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "strataio.toml").write_text(CONFIG)
    a = np.arange(100 * 100, dtype="f4").reshape(100, 100)
    with strataio.Session() as s:
        ds = s.create_dataset("temp", a.shape, a.dtype, (10, 10), hint="REMOTETAPE")
        ds[...] = a
        ds.close()
    return tmp_path, a


def where(name):
    with strataio.Session() as s:
        rows = s.catalog.residency(name)
    return {t: sum(c.tier == t for c in rows) for t in ("disk", "tape")}


def test_tier_commands(project):
    root, a = project
    r = CliRunner()
    out = r.invoke(main, ["tiers"])
    assert out.exit_code == 0 and "disk" in out.output and "1.0 MiB" in out.output
    assert where("temp") == {"disk": 0, "tape": 100}
    out = r.invoke(main, ["stage", "temp", "--section", "0:20,0:100"])
    assert out.exit_code == 0, out.output
    assert "20 chunks staged" in out.output and where("temp") == {"disk": 20, "tape": 100}
    for bad, says in ((["--section", ""], "is empty"), (["--section", "0:9000,:"], "fit temp")):
        out = r.invoke(main, ["evict", "temp", *bad])
        assert out.exit_code == 2 and says in out.output, out.output
    assert where("temp") == {"disk": 20, "tape": 100}  # (nothing evicted)
    out = r.invoke(main, ["info", "temp"])
    assert out.exit_code == 0 and "residency of temp" in out.output and "REMOTETAPE" in out.output
    out = r.invoke(main, ["evict", "temp", "--tier", "disk"])
    assert out.exit_code == 0 and where("temp") == {"disk": 0, "tape": 100}
    assert "20 chunk copies dropped from disk" in out.output, out.output
    assert "80 not there" in out.output, out.output
    out = r.invoke(main, ["evict", "temp", "--tier", "disk"])  # (nothing there any more)
    assert out.exit_code == 0, out.output
    assert "0 chunk copies dropped from disk" in out.output and "100 not there" in out.output
    out = r.invoke(main, ["stage", "temp", "--to", "disk"])
    assert out.exit_code == 0 and where("temp") == {"disk": 100, "tape": 100}
    out = r.invoke(main, ["migrate", "temp", "--section", "0:50,:", "--to", "tape"])
    assert out.exit_code == 0 and where("temp") == {"disk": 50, "tape": 100}
    assert "50 already on tape; copies on faster tiers: 50 removed;" in out.output, out.output
    assert r.invoke(main, ["fsck"]).exit_code == 0
    (root / "tape" / "temp" / "c" / "9" / "9").write_bytes(b"x" * 400)  # corrupt a copy
    out = r.invoke(main, ["fsck"])
    assert out.exit_code == 1 and "checksum" in out.output
    assert r.invoke(main, ["fsck", "--repair"]).exit_code == 0
    assert r.invoke(main, ["fsck"]).exit_code == 0
    with strataio.Session() as s:
        ds = s.open_dataset("temp")
        np.testing.assert_array_equal(ds[...], a)
        ds.close()
    # usage errors exit 2, a dataset or tier name that is not there among them (as for info
    # and calibrate); failures exit 1
    assert r.invoke(main, ["stage", "temp", "--section", "a:b"]).exit_code == 2
    assert r.invoke(main, ["stage"]).exit_code == 2
    before = where("temp")
    for op, to in (("stage", "--to"), ("migrate", "--to"), ("evict", "--tier")):
        out = r.invoke(main, [op, "nosuch"])
        assert out.exit_code == 2 and "error: no dataset 'nosuch' in catalog" in out.stderr
        out = r.invoke(main, [op, "temp", to, "nowhere"])
        assert out.exit_code == 2, out.output
        assert "error: no tier named 'nowhere'; tiers are disk, tape" in out.stderr
    assert where("temp") == before  # (nothing moved)


def test_a_move_prints_only_its_summary_on_stdout_and_its_bar_on_a_terminal_s_stderr(project):
    """stage / migrate / evict piped into a script: stdout holds the summary line alone; the
    progress bar goes to stderr, and only on a terminal (FORCE_COLOR makes rich think so)."""
    r = CliRunner()
    for args, summary in (
        (["stage", "temp", "--section", "0:20,:"], "stage: 20 chunks staged"),
        (["evict", "temp", "--tier", "disk"], "evict: 20 chunk copies dropped"),
    ):
        out = r.invoke(main, args)
        assert out.exit_code == 0, out.output
        assert out.stdout.splitlines() == [out.stdout.strip()] and out.stdout.startswith(summary)
        assert out.stderr == ""
    out = r.invoke(main, ["stage", "temp", "--section", "0:20,:"], env={"FORCE_COLOR": "1"})
    assert out.exit_code == 0, out.output
    assert "20/20 chunks" in out.stderr and "20/20" not in out.stdout
    assert where("temp") == {"disk": 20, "tape": 100}
    # a name with braces or brackets is shown as it is (no format field, no markup)
    with strataio.Session() as s:
        for name in ("x{y}", "r[bold]x"):
            ds = s.create_dataset(name, (10, 10), "f4", (5, 5), hint="REMOTETAPE")
            ds[...] = 1
            ds.close()
    for name in ("x{y}", "r[bold]x"):
        for env in ({}, {"FORCE_COLOR": "1"}):
            out = r.invoke(main, ["stage", name], env=env)
            assert out.exit_code == 0 and "Traceback" not in out.output, out.output
            if env:  # (FORCE_COLOR colours stdout too)
                assert f"stage {name} " in out.stderr and "4/4 chunks" in out.stderr
            else:
                assert out.stdout.startswith("stage: 4 chunks staged") and out.stderr == ""
            assert r.invoke(main, ["evict", name]).exit_code == 0


def test_stage_migrate_evict_a_superfile(project):
    """A superfile's containers move whole, through the same commands as a dataset's chunks
    (stage opened it as an array dataset, and failed)."""
    r = CliRunner()
    images = {f"i{i}": np.full((16, 24), i, "f4") for i in range(8)}
    with strataio.Session() as s:
        sf = s.superfile("imgs", hint="REMOTETAPE", container_bytes=3000)
        for k, v in images.items():
            sf.put(k, v)
        sf.close()
        n = len({c.key for c in s.catalog.residency("imgs")})
    assert n > 1 and where("imgs") == {"disk": 0, "tape": n}
    out = r.invoke(main, ["stage", "imgs"])
    assert out.exit_code == 0, out.output
    assert f"stage: {n} containers staged" in out.output and "0 failed" in out.output
    assert where("imgs") == {"disk": n, "tape": n}
    out = r.invoke(main, ["stage", "imgs", "--to", "disk"])
    assert out.exit_code == 0 and f"0 containers staged (0 B), {n} already there" in out.output
    out = r.invoke(main, ["stage", "imgs", "--section", "0:1"])
    assert out.exit_code == 2 and "superfile" in out.stderr and "--section" in out.stderr
    out = r.invoke(main, ["evict", "imgs", "--tier", "disk"])
    assert out.exit_code == 0 and f"{n} container copies dropped from disk" in out.output
    assert where("imgs") == {"disk": 0, "tape": n}
    assert r.invoke(main, ["stage", "imgs"]).exit_code == 0
    out = r.invoke(main, ["migrate", "imgs"])
    assert out.exit_code == 0 and f"copies on faster tiers: {n} removed;" in out.output
    assert where("imgs") == {"disk": 0, "tape": n}
    assert r.invoke(main, ["fsck"]).exit_code == 0
    with strataio.Session() as s:
        sf = s.superfile("imgs", "r")
        assert sorted(sf.members()) == sorted(images)
        for k, v in images.items():
            np.testing.assert_array_equal(sf.get(k), v)
        sf.close()


def test_info_of_a_name_never_creates_a_catalog_and_says_whether_there_is_one(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("STRATAIO_CONFIG", raising=False)
    (tmp_path / "strataio.toml").write_text(CONFIG)
    res = CliRunner().invoke(main, ["info", "nosuch"])
    assert res.exit_code == 2, res.output
    assert f"no dataset 'nosuch': no catalog at {tmp_path / 'cat.db'}" in res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["strataio.toml"]
    with strataio.Session() as s:
        s.create_dataset("t", (4,), "f4", (2,), hint="LOCALDISK").close()
    res = CliRunner().invoke(main, ["info", "nosuch"])
    assert res.exit_code == 2 and f"not in catalog {tmp_path / 'cat.db'}" in res.stderr


def test_info_of_a_dataset_whose_hint_names_a_role_no_tier_has_says_so(project):
    """A REMOTETAPE dataset described where the configuration has no remotetape tier: its
    writes go nowhere, and info says why (it raised IndexError)."""
    root, _ = project
    (root / "strataio.toml").write_text(CONFIG.split('[[tiers]]\nname = "tape"')[0])
    out = CliRunner().invoke(main, ["info", "temp"])
    assert out.exit_code == 0, out.output
    said = " ".join(out.output.split())
    assert "writes go to: nowhere (hint REMOTETAPE names role 'remotetape'" in said, said


def test_info_describes_a_superfile(project):
    """info NAME on a superfile shows its members, containers and their bytes, and its
    containers per tier (it showed an array of shape (0,) and dtype u1); counting the members
    stages nothing, and a container without a copy leaves them uncounted, exit 1."""
    root, _ = project
    r = CliRunner()
    with strataio.Session() as s:
        sf = s.superfile("imgs", hint="REMOTETAPE", container_bytes=3000)
        for i in range(8):
            sf.put(f"i{i}", np.full((16, 24), i, "f4"))
        sf.put("i0", b"put again")  # (one member, its newest value)
        sf.close()
        sizes = {c.key: c.nbytes for c in s.catalog.residency("imgs")}
    n, total = len(sizes), sum(sizes.values())
    assert n > 1

    def info():
        out = r.invoke(main, ["info", "imgs"])
        text = "".join(" " if "\u2500" <= ch <= "\u257f" else ch for ch in out.output)
        return out, " ".join(text.split())  # (words only: no table rules)

    out, said = info()
    assert out.exit_code == 0, out.output
    assert "shape" not in said and "u1" not in said, said
    assert f"superfile: 8 members in {n} containers of {format_size(total)}" in said, said
    assert "a container closes at 2.9 KiB" in said and "hint=REMOTETAPE" in said
    assert f"tier containers bytes dirty disk 0 0 B 0 tape {n} {format_size(total)} 0" in said
    assert where("imgs") == {"disk": 0, "tape": n}  # (its containers read, none staged)
    assert r.invoke(main, ["stage", "imgs"]).exit_code == 0
    out, said = info()
    assert out.exit_code == 0 and f"disk {n} {format_size(total)} 0" in said, said
    for tier in ("disk", "tape"):
        (root / tier / "imgs" / "sf" / "00000000").unlink()
    out, said = info()
    assert out.exit_code == 1 and f"superfile: ? members in {n} containers" in said, said
    assert out.stderr.startswith("error: superfile 'imgs': its members cannot be counted")
    assert "sf/00000000" in out.stderr and len(out.stderr.splitlines()) == 1


def test_tape_benchmark_logic():
    res = run_tape(size=1000, chunk=50, time_scale=0.0)
    gain = {r["pattern"]: r["gain_pct"] for r in res["patterns"]}
    # a small square section is cheaper than recalling the whole file; a full-width strip
    # (pattern E) touches every chunk column and costs more than the recall (Table 3)
    assert gain["A"] > 50 and gain["D"] > 50 and gain["A"] > gain["C"] and gain["E"] < 0
    for r in res["reuse"]:  # Figure 4: only the chunks the first read did not stage
        assert 0 < r["staged_with_reuse"] < r["staged_without_reuse"] == r["second_chunks"]


def test_tape_benchmark_refuses_an_array_too_small_for_figure_4(tmp_path, monkeypatch):
    """Figure 4's reads are sixteenths of the array: below 16 elements they would be empty (a
    division by zero, once); at 16 each second read stages a chunk the first did not."""
    monkeypatch.chdir(tmp_path)
    out = CliRunner().invoke(main, ["bench", "tape", "--size", "15", "--chunk", "4"])
    assert out.exit_code == 2 and "'--size': 15 is not in the range x>=16" in out.output
    assert "Traceback" not in out.output
    with pytest.raises(ValueError, match="at least 16"):
        run_tape(size=15, chunk=4, time_scale=0.0)
    res = run_tape(size=16, chunk=4, time_scale=0.0)
    for r in res["reuse"]:
        assert 0 <= r["staged_with_reuse"] < r["staged_without_reuse"] == r["second_chunks"]
    out = CliRunner().invoke(main, ["bench", "tape", "--size", "16", "--time-scale", "0"])
    assert out.exit_code == 0 and "extended band" in out.output, out.output


@pytest.mark.parametrize("hidden", [0.5, 0.95])
def test_overlap_benchmark_says_why_it_fails(hidden, tmp_path, monkeypatch):
    """bench overlap exits 1 when the loop hides less than 90 % of the staging time (its help
    says so) and says on stderr by how much it missed: it exited 1 without a word."""
    import strataio.bench.tape as tape

    def run_overlap(sections, time_scale):
        assert (sections, time_scale) == (4, 0.002)
        return {
            "sections": sections, "time_scale": time_scale, "compute_only_s": 1.0,
            "stage_only_s": 0.8, "loop_prestage_s": 1.2, "serial_sum_s": 1.8,
            "exposed_wait_s": 0.8 * (1 - hidden), "loop_saving_fraction": 0.75,
            "hidden_fraction": hidden,
        }  # fmt: skip

    monkeypatch.setattr(tape, "run_overlap", run_overlap)
    monkeypatch.chdir(tmp_path)
    out = CliRunner().invoke(main, ["bench", "overlap", "--sections", "4"])
    if hidden >= 0.9:
        assert out.exit_code == 0 and out.stderr == "", out.output
        return
    assert out.exit_code == 1, out.output
    assert out.stderr.startswith(
        "error: the loop hid 50.0 % of the staging time, less than the 90 % asked: it waited "
        "0.400 s for stages of 0.800 s in all"
    ), out.stderr
    help_text = " ".join(CliRunner().invoke(main, ["bench", "overlap", "--help"]).output.split())
    assert "Exits 1, saying so on stderr, if the loop hides less than 90 % of the" in help_text


def test_a_tier_setting_its_backend_refuses_is_a_configuration_error(project, monkeypatch):
    """An S3 endpoint from the environment that is no URL: every command that builds the
    tiers exits 2 with one line naming the tier and the configuration, as for a bad file."""
    root, _ = project
    (root / "strataio.toml").write_text(
        CONFIG + '[[tiers]]\nname = "object"\nkind = "s3"\nrole = "remotedisk"\n'
        'bucket = "simdata"\ncredentials = { access_key_id = "a", secret_access_key = "b" }\n'
    )
    monkeypatch.setenv("AWS_ENDPOINT_URL", "zzz")
    for cmd in (["tiers"], ["fsck"], ["stage", "temp"], ["info", "temp"]):
        out = CliRunner().invoke(main, cmd)
        assert out.exit_code == 2, (cmd, out.output)
        assert out.stderr.count("\n") == 1 and "Traceback" not in out.output
        assert out.stderr.startswith(
            f"error: cannot set up tier 'object' configured in {root / 'strataio.toml'}: "
        ), out.stderr
        assert "'zzz' must be an http(s) URL" in out.stderr


def test_errors_are_one_line_with_the_documented_exit_status(project):
    root, _ = project
    r = CliRunner()
    # a configuration that cannot be read: exit 2
    (root / "bad.toml").write_text(CONFIG.replace('capacity = "1MiB"', 'capacity = "1 MiBs"'))
    for cmd in (["tiers"], ["fsck"], ["stage", "temp"], ["migrate", "temp"], ["evict", "temp"]):
        out = r.invoke(main, [*cmd, "--config", "bad.toml"])
        assert out.exit_code == 2, out.output
        assert out.stderr.startswith("error: ") and "capacity" in out.stderr
        assert "Traceback" not in out.output
    out = r.invoke(main, ["fsck", "--config", "nosuch.toml"])
    assert out.exit_code == 2 and "does not exist" in out.stderr
    # a catalog that cannot be opened is a runtime failure: exit 1
    (root / "dir.db").mkdir()
    (root / "cat2.toml").write_text(CONFIG.replace('url = "cat.db"', 'url = "dir.db"'))
    for cmd in (["tiers"], ["fsck"], ["stage", "temp"]):
        out = r.invoke(main, [*cmd, "--config", "cat2.toml"])
        assert out.exit_code == 1 and out.stderr.startswith("error: cannot open catalog")
    # an unknown dataset or tier: exit 2, one line naming it
    out = r.invoke(main, ["migrate", "temp", "--to", "floppy"])
    assert out.exit_code == 2 and "floppy" in out.stderr and "Traceback" not in out.output


def test_a_tier_whose_directory_is_unusable_is_down_and_the_others_serve(project):
    """A POSIX tier whose directory cannot be made (a file in the way, as where a mount is
    missing) is built down, with the reason; the hierarchy's other tiers still serve, and
    the commands say which tier is down instead of refusing the configuration."""
    root, a = project
    (root / "blocker").write_text("")
    (root / "down.toml").write_text(CONFIG.replace('path = "disk"', 'path = "blocker/disk"'))
    with strataio.Session(root / "down.toml") as s:
        disk = s.tiers["disk"]
        assert not disk.up and "blocker" in disk.last_error
        ds = s.open_dataset("temp")
        assert np.array_equal(ds[...], a)  # from the tape
        ds.close()
    r = CliRunner()
    out = r.invoke(main, ["tiers", "--config", "down.toml"])
    assert out.exit_code == 1 and "tiers down: disk" in out.stdout, out.output
    out = r.invoke(main, ["fsck", "--config", "down.toml"])
    assert out.exit_code == 1 and "tiers down, not checked: disk (" in out.stdout, out.output
    assert "blocker" in out.stdout  # (why: the error the probe of the tier met)
    assert "Traceback" not in out.output
    # put right (the catalog knows the tier: its directory is not made), a check finds it
    # answering again
    (root / "blocker").unlink()
    (root / "blocker" / "disk").mkdir(parents=True)
    out = r.invoke(main, ["tiers", "--check", "--config", "down.toml"])
    assert out.exit_code == 0, out.output
    with strataio.Session(root / "down.toml") as s:
        assert s.tiers["disk"].up


def test_tiers_says_a_tier_whose_file_system_refuses_writes_is_read_only(project, monkeypatch):
    """``strataio tiers --check`` on a tier whose file system is read-only (EROFS) while
    its reads work reports it up and read-only, saying why, and exits 0 (it was reported
    down, exit 1: its probe's put was refused)."""
    import errno

    from strataio.storage.posix import PosixBackend

    put = PosixBackend.put

    def refused(self, key, data, *, durable=False):
        if self.root.name == "disk":
            raise OSError(errno.EROFS, "Read-only file system", str(self.root / key))
        return put(self, key, data, durable=durable)

    monkeypatch.setattr(PosixBackend, "put", refused)
    out = CliRunner().invoke(main, ["tiers", "--check"])
    assert out.exit_code == 0, out.output
    disk = next(line for line in out.stdout.splitlines() if line.startswith("│ disk "))
    assert "up (read-only: its storage refuses writes)" in disk, out.stdout
    assert "Read-only file system" in disk, out.stdout


def test_tiers_shows_the_whole_last_error(project):
    """The "last error" column holds the whole message, wrapped where the table is too wide
    (it was cut at 60 characters, before the reason: here the path, not "Not a directory")."""
    root, _ = project
    (root / "blocker").write_text("")
    deep = "blocker/" + "a-rather-long-directory-name/" * 4 + "disk"
    (root / "down.toml").write_text(CONFIG.replace('path = "disk"', f'path = "{deep}"'))
    with strataio.Session(root / "down.toml") as s:
        message = s.tiers["disk"].last_error
    assert len(message) > 120 and message.endswith("Not a directory"), message
    out = CliRunner().invoke(main, ["tiers", "--config", "down.toml"])
    assert out.exit_code == 1, out.output
    assert last_error_shown(out.stdout, "disk") == message.replace(" ", "")


def last_error_shown(table: str, tier: str) -> str:
    """The "last error" of ``tier`` in the table ``strataio tiers`` printed, its spaces left
    out (the cell is folded over lines where the table is too wide)."""
    # the tier row's last cell, and the cells below it until the next tier's row
    cells, rows = [], [line.split("│") for line in table.splitlines() if line.startswith("│")]
    for row in rows[[r[1].strip() for r in rows].index(tier) :]:
        if cells and row[1].strip():
            break
        cells.append(row[-2].strip())
    return "".join(cells).replace(" ", "")


def test_a_known_tier_whose_directory_is_missing_is_down_and_not_made_again(project):
    """A tier the catalog knows whose directory is missing (a volume not mounted, the
    directory removed) is down, saying so and how to bring it back; nothing is made in its
    place. (Any session, and so every command, made it again, empty: reads found its copies
    gone, fsck --repair dropped the rows of those with another copy, writes went there.)
    Reads are served by the other tier, writes go there, fsck leaves the tier's rows; once
    the directory is back, every copy is there and read."""
    root, a = project
    r = CliRunner()
    out = r.invoke(main, ["stage", "temp", "--to", "disk"])
    assert out.exit_code == 0 and where("temp") == {"disk": 100, "tape": 100}, out.output
    (root / "disk").rename(root / "disk.away")
    with strataio.Session() as s:
        disk = s.tiers["disk"]
        assert not disk.up and str(root / "disk") in disk.last_error
        assert "is missing" in disk.last_error and "strataio init" in disk.last_error
        ds = s.open_dataset("temp")
        assert np.array_equal(ds[...], a)  # from the tape
        ds.close()
        b = s.create_dataset("new", (10, 10), "f4", (10, 10), hint="LOCALDISK")
        b[...] = 1
        b.close()
    assert where("new") == {"disk": 0, "tape": 1}
    out = r.invoke(main, ["tiers"])
    assert out.exit_code == 1 and "tiers down: disk" in out.stdout, out.output
    shown = last_error_shown(out.stdout, "disk")
    assert "ismissing" in shown and "`strataioinit`" in shown and "tiers--check" in shown
    out = r.invoke(main, ["fsck", "--repair"])
    assert out.exit_code == 1 and "tiers down, not checked: disk (" in out.stdout, out.output
    assert "is missing" in out.stdout and ", 0 problems;" in out.stdout, out.output
    assert where("temp") == {"disk": 100, "tape": 100}
    assert not (root / "disk").exists()
    # put back, every copy is there: fsck finds it answering and checks them all
    (root / "disk.away").rename(root / "disk")
    out = r.invoke(main, ["fsck"])
    assert out.exit_code == 0 and "tiers down" not in out.stdout, out.output
    (root / "tape").rename(root / "tape.away")
    with strataio.Session() as s:
        assert s.tiers["disk"].up and not s.tiers["tape"].up
        ds = s.open_dataset("temp")
        assert np.array_equal(ds[...], a)  # from the disk
        ds.close()


def test_only_the_directories_of_tiers_new_to_the_catalog_are_made(project):
    """A session makes the directories of a configuration's tiers the catalog has never
    registered (its first use, a tier just added to it); one missing of a tier it knows is
    made by ``strataio init`` alone, new and empty."""
    root, a = project
    assert (root / "disk").is_dir() and (root / "tape").is_dir()  # (made by the first session)
    more = '[[tiers]]\nname = "more"\nkind = "posix"\nrole = "remotetape"\npath = "more"\n'
    (root / "strataio.toml").write_text(CONFIG + more)
    r = CliRunner()
    out = r.invoke(main, ["tiers"])
    assert out.exit_code == 0 and (root / "more").is_dir(), out.output
    (root / "more").rmdir()
    out = r.invoke(main, ["tiers"])
    assert out.exit_code == 1 and "tiers down: more" in out.stdout, out.output
    assert not (root / "more").exists()
    out = r.invoke(main, ["init"])
    assert out.exit_code == 0 and f"created tier directory {root / 'more'}" in out.output
    out = r.invoke(main, ["tiers", "--check"])
    assert out.exit_code == 0 and (root / "more").is_dir(), out.output
    # a configuration first used by a command that registers its tiers without a session
    fresh = CONFIG.replace("cat.db", "fresh.db").replace('path = "', 'path = "fresh-')
    (root / "fresh.toml").write_text(fresh)
    assert r.invoke(main, ["ls", "--config", "fresh.toml"]).exit_code == 0
    assert (root / "fresh-disk").is_dir() and (root / "fresh-tape").is_dir()
    out = r.invoke(main, ["tiers", "--config", "fresh.toml"])
    assert out.exit_code == 0, out.output


def test_init_does_not_make_a_tier_holding_copies_new_unless_asked(project):
    """strataio init leaves missing the directory of a tier on which the catalog records
    copies (a volume not mounted: an empty directory on another disk would take the writes a
    mount then hides), says how many and how to go on, and exits 1, having made the others;
    --remake-tier NAME makes it new and empty, saying the copies recorded there are lost. A
    name not configured is a usage error, before anything is made."""
    root, a = project
    r = CliRunner()
    out = r.invoke(main, ["stage", "temp", "--section", "0:100,0:100", "--to", "disk"])
    assert out.exit_code == 0, out.output
    (root / "disk").rename(root / "unmounted")
    (root / "tape").rename(root / "tape-away")
    (root / "tape").mkdir()  # (made again by hand: the copies there read as missing)
    out = r.invoke(main, ["init", "--remake-tier", "nosuch"])
    assert out.exit_code == 2 and "no tier 'nosuch'" in out.output, out.output
    assert not (root / "disk").exists()
    out = r.invoke(main, ["init"])
    assert out.exit_code == 1, out.output
    assert "tier 'disk'" in out.stderr and "records 100 chunk copies" in out.stderr
    assert "--remake-tier disk" in out.stderr and not (root / "disk").exists()
    (root / "unmounted").rename(root / "disk")  # (mounted again: everything is there)
    (root / "tape").rmdir()
    (root / "tape-away").rename(root / "tape")
    out = r.invoke(main, ["fsck"])
    assert out.exit_code == 0, out.output
    shutil.rmtree(root / "disk")  # (the disk replaced: made new on purpose)
    out = r.invoke(main, ["init", "--remake-tier", "disk", "--remake-tier", "tape"])
    assert out.exit_code == 0 and (root / "disk").is_dir(), out.output
    assert "new and empty: 100 chunk copies" in out.output and "fsck --repair" in out.output
    assert "tier 'tape': its directory" in out.output and "in place, not made anew" in out.output
    with strataio.Session() as s:
        ds = s.open_dataset("temp")
        assert np.array_equal(ds[...], a)  # (from the tape)
        ds.close()
    assert r.invoke(main, ["fsck", "--repair"]).exit_code == 0  # (disk's rows dropped)
    # the objects of a dataset deleted while the disk was away are kept from a remade one
    with strataio.Session() as s:
        s.create_dataset("gone", (10, 10), "f4", (10, 10), hint="LOCALDISK")[...] = 1.0
    (root / "disk").rename(root / "unmounted")
    out = r.invoke(main, ["rm", "gone", "-y"])
    assert out.exit_code == 0 and "fsck --repair" in out.output, out.output
    out = r.invoke(main, ["init"])
    assert out.exit_code == 1 and "the objects of 1 deleted dataset" in out.stderr, out.output
    assert not (root / "disk").exists()
    (root / "unmounted").rename(root / "disk")
    assert r.invoke(main, ["fsck", "--repair"]).exit_code == 0
    assert not (root / "disk" / "gone").exists()


def test_fsck_probes_a_tier_the_catalog_has_marked_down(project):
    """A tier another process marked down in the catalog, answering again, is probed by
    fsck and checked (it was skipped unprobed: exit 1 and "tiers down", its corrupt copy
    unseen); the probe records it up in the catalog."""
    root, _ = project
    r = CliRunner()
    out = r.invoke(main, ["stage", "temp", "--section", "0:10,0:10", "--to", "disk"])
    assert out.exit_code == 0, out.output
    with strataio.Session() as s:
        s.catalog.set_tier_state("disk", "down")
    (root / "disk" / "temp" / "c" / "0" / "0").write_bytes(b"x" * 400)
    out = r.invoke(main, ["fsck"])
    assert out.exit_code == 1 and "checksum" in out.stdout, out.output
    assert "tiers down" not in out.stdout, out.output
    with strataio.Session() as s:
        assert {t.name: t.state for t in s.catalog.tiers()}["disk"] == "up"


def test_fsck_in_flight_and_progress(project):
    root, _ = project
    r = CliRunner()
    orphan = root / "tape" / "temp" / "c" / "0" / "0"
    copy = root / "disk" / "temp" / "c" / "0" / "0"
    copy.parent.mkdir(parents=True)
    copy.write_bytes(orphan.read_bytes())  # a stage's destination, before its commit
    with strataio.Session() as job:  # a live session has the dataset open
        ds = job.open_dataset("temp")
        out = r.invoke(main, ["fsck", "--repair"])
        assert out.exit_code == 0, out.output
        assert "in-flight" in out.stdout and "1 in flight in running processes" in out.stdout
        assert copy.exists()
        ds.close()
    assert "--grace" not in r.invoke(main, ["fsck", "--help"]).output
    out = r.invoke(main, ["fsck", "--repair"])  # its writer is done: removed at once
    assert out.exit_code == 0 and "orphan" in out.stdout and not copy.exists()
    # the progress bar goes to stderr, only on a terminal (FORCE_COLOR makes rich think so)
    assert r.invoke(main, ["fsck"]).stderr == ""
    out = r.invoke(main, ["fsck"], env={"FORCE_COLOR": "1"})
    assert out.exit_code == 0 and "100/100" in out.stderr and "copies" in out.stderr
    assert "100/100" not in out.stdout


def _cli(cwd, *args):
    """``strataio ARGS`` as a user runs it: a new process, in ``cwd``."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "STRATAIO_CONFIG"}
    cmd = [sys.executable, "-c", "from strataio.cli import main; main()", *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


def test_new_user_sequence_has_no_dead_end(tmp_path, monkeypatch):
    """init, an edit of strataio.toml, then the commands a new user tries, with bad input too:
    each works or says what is wrong in one line (no traceback), with a non-zero status. The
    first steps run as a user runs them (new processes); the rest through click's runner."""
    assert _cli(tmp_path, "init").returncode == 0
    cfg = tmp_path / "strataio.toml"
    cfg.write_text(cfg.read_text().replace('url = ".strataio/catalog.db"', 'url = "db/catalog.db"'))
    p = _cli(tmp_path, "ls")
    assert p.returncode == 0 and "no datasets" in p.stdout, (p.stdout, p.stderr)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("STRATAIO_CONFIG", raising=False)
    runner = CliRunner()
    for args in (["du"], ["tiers"]):
        res = runner.invoke(main, args)
        assert res.exit_code == 0, (args, res.output)
    with strataio.Session(cfg) as s:
        ds = s.create_dataset("t", (40, 40), "f4", (20, 20))
        ds[...] = np.ones((40, 40), "f4")
        ds.close()
    for args in (["info", "t"], ["stage", "t"], ["migrate", "t"], ["evict", "t"], ["fsck"]):
        res = runner.invoke(main, args)
        assert res.exit_code == 0, (args, res.output)
    bad = {
        ("info", "nosuch"): "no dataset 'nosuch'",
        ("stage", "nosuch"): "nosuch",
        ("stage", "t", "--to", "warp"): "no tier named 'warp'",
        ("evict", "t", "--tier", "warp"): "no tier named 'warp'",
        ("stage", "t", "--section", "0:99"): "out of bounds",
        ("stage", "t", "--section", "0:40:20,0:40"): "no step",
        ("stage", "t", "--section", "0:8:1:junk"): "no step",
        ("stage", "t", "--section", "30:8,0:40"): "selects nothing",
        ("ls", "-c", "missing.toml"): "missing.toml",
    }
    (tmp_path / "binary.toml").write_bytes(b"\x00\xff")
    (tmp_path / "afile").write_text("")
    (tmp_path / "filetier.toml").write_text(cfg.read_text().replace(".strataio/local", "afile"))
    (tmp_path / "ftp.toml").write_text(cfg.read_text().replace('"posix"', '"ftp"', 1))
    for cmd in (["du"], ["tiers"], ["fsck"], ["stage", "t"], ["info", "t"]):
        bad[(*cmd, "-c", "binary.toml")] = "not valid TOML"
        bad[(*cmd, "-c", "ftp.toml")] = "'ftp' is not one of"
    for cmd in (["tiers"], ["fsck"]):  # (the tier in the file's place is down)
        bad[(*cmd, "-c", "filetier.toml")] = "tiers down"
    for args, text in bad.items():
        res = runner.invoke(main, list(args))
        assert res.exit_code != 0 and text in res.output, (args, res.output)
        assert isinstance(res.exception, SystemExit), (args, res.exception)  # no traceback
        assert len(res.stderr.strip().splitlines()) <= 3, args


def test_moves_list_their_failures_in_key_order_and_count_the_rest(project):
    """A move lists the first 10 failed chunks by key, numbers as numbers (the moves finish
    in any order, and the list came out in another each run), then how many more failed (it
    stopped at 10 without a word); its summary writes one chunk in the singular."""
    r = CliRunner()
    out = r.invoke(main, ["evict", "temp", "--tier", "tape"])  # (no slower tier to go to)
    assert out.exit_code == 1, out.output
    listed = [line.split(":")[0].strip() for line in out.output.splitlines() if ": chunk" in line]
    assert listed == [f"c/0/{j}" for j in range(10)], out.output
    assert "… and 90 more chunks of the 100 failed" in out.output, out.output
    assert "0 chunk copies dropped from tape" in out.output and "100 failed" in out.output
    out = r.invoke(main, ["evict", "temp", "--section", "0:10,0:20", "--tier", "tape"])
    assert out.exit_code == 1 and "more of the" not in out.output, out.output
    out = r.invoke(main, ["stage", "temp", "--section", "0:10,0:10", "--to", "disk"])
    assert out.exit_code == 0 and "stage: 1 chunk staged" in out.output, out.output
    out = r.invoke(main, ["migrate", "temp", "--section", "0:10,0:10", "--to", "tape"])
    assert out.exit_code == 0 and "1 already on tape" in out.output, out.output
    r.invoke(main, ["stage", "temp", "--section", "0:10,0:10", "--to", "disk"])
    out = r.invoke(main, ["evict", "temp", "--section", "0:10,0:10", "--tier", "disk"])
    assert out.exit_code == 0 and "evict: 1 chunk copy dropped from disk" in out.output
    with strataio.Session() as s:
        ds = s.create_dataset("one", (10,), "f4", (10,), hint="LOCALDISK")
        ds[...] = 1.0
        ds.close()
    out = r.invoke(main, ["migrate", "one", "--to", "tape"])
    assert out.exit_code == 0 and "migrate: 1 chunk copied" in out.output, out.output


def test_moves_count_chunks_never_written_apart(project):
    """Chunks never written read as the fill value: a stage or migrate says so, and does
    not count them as already there."""
    with strataio.Session() as s:
        ds = s.create_dataset("sparse", (100, 100), "f4", (10, 10), hint="REMOTETAPE")
        ds[0:10, 0:30] = 1.0  # 3 of 100 chunks written
        ds.close()
    r = CliRunner()
    out = r.invoke(main, ["stage", "sparse", "--to", "disk"])
    assert out.exit_code == 0, out.output
    assert "3 chunks staged" in out.output and "0 already there" in out.output, out.output
    assert "97 never written (nothing to move)" in out.output, out.output
    with strataio.Session() as s:
        ds = s.open_dataset("sparse")
        got = ds.migrate(to="tape").wait()
        assert (got.moved, got.reused, got.unwritten) == (0, 3, 97)
        assert got.done_count == got.total == 100
        ds.close()


def test_a_stage_onto_a_tier_smaller_than_the_section_says_how_many_stayed(tmp_path, monkeypatch):
    """A stage whose target tier cannot hold the whole section keeps the chunks it placed
    first (it never evicts its own chunks for later ones) and says how many found no room:
    every chunk it says it staged is on the tier."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "strataio.toml").write_text(CONFIG.replace('"1MiB"', '"12KiB"'))
    with strataio.Session() as s:
        ds = s.create_dataset("big", (100, 100), "f4", (10, 10), hint="REMOTETAPE")
        ds[...] = 1.0  # 100 chunks of 400 bytes: 40 000 bytes for a 12 KiB tier
        ds.close()
    out = CliRunner().invoke(main, ["stage", "big", "--to", "disk"])
    assert out.exit_code == 0, out.output
    held = where("big")["disk"]
    assert 0 < held < 100
    text = " ".join(out.output.split())
    assert f"{held} chunks staged" in text and f"{100 - held} not staged (no room on disk)" in text
    assert "only" not in text, text
    out = CliRunner().invoke(main, ["evict", "big", "--tier", "disk"])
    assert out.exit_code == 0 and where("big")["disk"] == 0, out.output
    out = CliRunner().invoke(main, ["stage", "big"])  # (to the fastest tier with room)
    assert out.exit_code == 0, out.output
    held = where("big")["disk"]
    text = " ".join(out.output.split())
    assert f"{held} chunks staged" in text and f"{100 - held} not staged" in text, text
    assert "only" not in text, text


def test_the_command_runs_as_a_module(project):
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "strataio", "tiers"], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0 and "disk" in out.stdout, out.stderr
    out = subprocess.run(
        [sys.executable, "-m", "strataio.cli", "--version"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0 and "strataio" in out.stdout, out.stderr


THREE_TIERS = """
[catalog]
url = "cat.db"
[[tiers]]
name = "local"
kind = "posix"
role = "localdisk"
path = "local"
capacity = "16KiB"
[[tiers]]
name = "remote"
kind = "posix"
role = "remotedisk"
path = "remote"
capacity = "32KiB"
[[tiers]]
name = "archive"
kind = "posix"
role = "remotetape"
path = "archive"
"""


def test_a_stage_that_finds_no_room_says_so_fails_and_gives_up_at_once(tmp_path, monkeypatch):
    """Every tier faster than the archive is full of another dataset's only copies, which
    nothing can evict (another process has it open; then, the archive they would be written
    back to is read-only): the stage says no chunk was staged and why, exits 1, and gives up
    after one eviction round per tier (it was counted "64 already there", exit 0, after an
    eviction round per chunk and tier, each writing back victim after victim in vain)."""
    from collections import Counter

    from strataio.tiers.placement import Placement

    monkeypatch.chdir(tmp_path)
    (tmp_path / "strataio.toml").write_text(THREE_TIERS)
    (tmp_path / "ro.toml").write_text(THREE_TIERS + "read_only = true\n")
    rng = np.random.default_rng(0)
    with strataio.Session() as s:
        # 64 chunks of 400 bytes on the archive; 160 chunks filling local, then remote
        for name, hint, rows in (("a", "REMOTETAPE", 80), ("fill", "LOCALDISK", 200)):
            ds = s.create_dataset(name, (rows, 80), "f4", (10, 10), hint=hint)
            ds[...] = rng.random((rows, 80), dtype="f4")
            ds.close()
    rounds: Counter[str] = Counter()
    make_room = Placement.make_room

    def counted(self, tier, nbytes, **kw):
        rounds[tier.name] += 1
        return make_room(self, tier, nbytes, **kw)

    monkeypatch.setattr(Placement, "make_room", counted)

    def stage(*args):
        rounds.clear()
        out = CliRunner().invoke(main, ["stage", "a", *args])
        assert out.exception is None or isinstance(out.exception, SystemExit), out.exception
        return out, " ".join(out.stdout.split()), " ".join(out.stderr.split())

    with strataio.Session() as job:  # a live job has the filler open: none of it can go
        held = job.open_dataset("fill")
        out, text, err = stage()
        held.close()
    assert out.exit_code == 1, out.output
    assert "stage: 0 chunks staged (0 B), 0 already there," in text, text
    assert "64 not staged (no room on local, remote)" in text, text
    assert err.startswith("error: nothing staged: no room on local, remote for the 64 chunks")
    assert "already there are on" not in text  # (no note about chunks evicted meanwhile)
    assert sum(rounds.values()) <= 4, rounds
    assert where3("a") == {"local": 0, "remote": 0, "archive": 64}
    # nothing holds the filler now, but its write-backs have nowhere to go
    out, text, err = stage("-c", "ro.toml")
    assert out.exit_code == 1 and "64 not staged (no room on local, remote)" in text, text
    assert sum(rounds.values()) <= 8, rounds
    out, text, err = stage("--to", "local", "-c", "ro.toml")
    assert out.exit_code == 1 and "64 not staged (no room on local)" in text, text
    assert "error: nothing staged: no room on local for the 64 chunks" in err, err
    assert sum(rounds.values()) <= 8, rounds
    assert where3("a") == {"local": 0, "remote": 0, "archive": 64}
    # with the archive writable, the filler goes down a tier and the stage succeeds
    out, text, err = stage()
    assert out.exit_code == 0 and "64 chunks staged" in text and err == "", out.output
    assert "not staged" not in text


def where3(name):
    with strataio.Session() as s:
        rows = s.catalog.residency(name)
    return {t: sum(c.tier == t for c in rows) for t in ("local", "remote", "archive")}


# ----------------------------------------------------------------------------- rm
def held(name):
    """``{tier: "N chunks (SIZE)"}``: what the catalog holds of dataset ``name``."""
    with strataio.Session() as s:
        usage = [u for u in s.catalog.usage() if u.dataset == name]
    return {u.tier: f"{u.copies} chunks ({format_size(u.nbytes)})" for u in usage}


def test_rm_asks_first_then_says_what_it_removed_and_leaves_no_folder(project):
    """rm lists what each dataset holds per tier and asks (on stderr); declined, or with
    nothing to answer, nothing is deleted (exit 1). Answered yes, or with --yes (no
    question), it says what it removed per tier, and the datasets' objects and folders
    are gone from every tier, the tiers' own directories kept."""
    root, _ = project
    r = CliRunner()
    assert r.invoke(main, ["stage", "temp", "--section", "0:20,:", "--to", "disk"]).exit_code == 0
    was = held("temp")
    assert list(was) == ["disk", "tape"] and was["disk"].startswith("20 chunks")
    for answer in ("n\n", "\n", None):  # no, the default, the end of input
        out = r.invoke(main, ["rm", "temp"], input=answer)
        assert out.exit_code == 1, out.output
        assert "delete 'temp'? [y/N]" in out.stderr and "nothing deleted" in out.stderr
        assert f"temp: {was['disk']} on disk, {was['tape']} on tape" in out.stdout
    assert where("temp") == {"disk": 20, "tape": 100}
    out = r.invoke(main, ["rm", "temp"], input="y\n")
    assert out.exit_code == 0, out.output
    assert f"deleted temp: {was['disk']} from disk, {was['tape']} from tape" in out.stdout
    assert "remnant" not in out.stdout
    for tier in ("disk", "tape"):
        assert not (root / tier / "temp").exists() and (root / tier).is_dir()
    assert "no datasets" in r.invoke(main, ["ls"]).stdout
    with strataio.Session() as s:
        for name in ("x", "y"):
            ds = s.create_dataset(name, (20, 20), "f4", (10, 10), hint="LOCALDISK")
            ds[...] = 1.0
            ds.close()
        assert s.catalog.remnants() == []
    out = r.invoke(main, ["rm", "--yes", "x", "y", "x"])  # (a name given twice: deleted once)
    assert out.exit_code == 0 and out.stderr == "", out.output
    assert "deleted x: 4 chunks" in out.stdout and "deleted y: 4 chunks" in out.stdout
    assert not (root / "disk" / "x").exists() and not (root / "disk" / "y").exists()
    assert "no datasets" in r.invoke(main, ["ls"]).stdout


def test_rm_of_a_name_the_catalog_does_not_have_deletes_nothing(project, tmp_path):
    """An unknown NAME, among others or alone, is a usage error (exit 2) naming it, and
    nothing is deleted: also where NAME is a plain dataset's directory (said so), where the
    configuration file is missing, and where there is no catalog (none is created)."""
    root, a = project
    r = CliRunner()
    out = r.invoke(main, ["rm", "-y", "temp", "nosuch"])
    assert out.exit_code == 2, out.output
    said = f"error: no dataset 'nosuch' in catalog {root / 'cat.db'}; nothing deleted\n"
    assert out.stderr == said and out.stdout == ""
    assert where("temp") == {"disk": 0, "tape": 100}
    strataio.create_dataset(root / "plain", (10,), "f4", (5,)).close()
    out = r.invoke(main, ["rm", "-y", "plain"])
    assert out.exit_code == 2 and "'plain' is a plain dataset's directory" in out.stderr
    assert (root / "plain" / "zarr.json").is_file()
    assert r.invoke(main, ["rm"]).exit_code == 2  # (no NAME: click's usage error)
    out = r.invoke(main, ["rm", "-y", "temp", "--config", "nosuch.toml"])
    assert out.exit_code == 2 and "does not exist" in out.stderr, out.output
    (root / "fresh.toml").write_text(CONFIG.replace('url = "cat.db"', 'url = "fresh.db"'))
    out = r.invoke(main, ["rm", "-y", "temp", "--config", "fresh.toml"])
    assert out.exit_code == 2 and f"no catalog at {root / 'fresh.db'}" in out.stderr
    assert not (root / "fresh.db").exists()
    assert "Traceback" not in out.output
    with strataio.Session() as s:
        ds = s.open_dataset("temp")
        np.testing.assert_array_equal(ds[...], a)
        ds.close()


def test_rm_refuses_a_dataset_another_process_has_open(project, monkeypatch):
    """A dataset another process has open is not deleted: its error names it and that
    process's writer, the other datasets named are deleted, and the exit status is 1.
    Once closed there, rm deletes it."""
    from strataio.catalog.base import Catalog

    root, a = project
    monkeypatch.setattr(Catalog, "MARK_LINGER_S", 0.0)  # (a refusal waits 1 s, not 3)
    r = CliRunner()
    with strataio.Session() as s:
        s.create_dataset("other", (20, 20), "f4", (10, 10), hint="LOCALDISK").close()
    with strataio.Session() as job:
        ds = job.open_dataset("temp", "r+")
        out = r.invoke(main, ["rm", "-y", "temp", "other"])
        assert out.exit_code == 1, out.output
        assert out.stderr.startswith("error: dataset 'temp' is in use by another process")
        assert job.writer in out.stderr and "Traceback" not in out.output
        assert "deleted other" in out.stdout and "deleted temp" not in out.stdout
        ds[0:10, 0:10] = 1.0  # (its writes go on)
        ds.close()
    assert where("temp") == {"disk": 0, "tape": 100}
    assert not (root / "disk" / "other").exists()
    out = r.invoke(main, ["rm", "-y", "temp"])
    assert out.exit_code == 0 and "deleted temp: 100 chunks" in out.stdout, out.output


def test_rm_with_a_tier_down_shows_the_remnants_until_fsck_repair_purges_them(project):
    """Objects on a tier down at the deletion stay as remnants: rm says so (exit 0: the
    dataset is deleted), ls counts them and ls --remnants lists them, rm of the name and
    fsck say they wait to be purged, and fsck --repair, once the tier answers, deletes them
    and their folders."""
    root, _ = project
    r = CliRunner()
    assert r.invoke(main, ["stage", "temp", "--section", "0:20,:", "--to", "disk"]).exit_code == 0
    was = held("temp")
    tape = root / "tape"
    tape.rename(root / "tape.away")
    tape.write_bytes(b"")  # (its directory unusable: the tier is down)
    try:
        out = r.invoke(main, ["rm", "-y", "temp"])
        assert out.exit_code == 0, out.output
        text = " ".join(out.stdout.split())  # (rich wraps long lines)
        assert f"deleted temp: {was['disk']} from disk" in text
        assert f"remnant: {was['tape']} of temp stay on tape (down:" in text
        assert "run 'strataio fsck --repair' once it answers" in text
        assert not (root / "disk" / "temp").exists()
        out = r.invoke(main, ["ls"])
        assert out.exit_code == 0 and "no datasets" in out.stdout
        assert "1 deleted dataset has objects waiting to be purged" in out.stdout
        out = r.invoke(main, ["ls", "--remnants"])
        assert out.exit_code == 0, out.output
        assert re.search(r"│ temp +│ tape +│ down", out.stdout), out.stdout
        assert "'strataio fsck --repair' deletes them" in " ".join(out.stdout.split())
        out = r.invoke(main, ["ls", "--remnants", "--json"])
        assert json.loads(out.stdout) == [{"dataset": "temp", "tiers": ["tape"]}]
        out = r.invoke(main, ["rm", "-y", "temp"])
        assert out.exit_code == 2, out.output
        assert "'temp' was deleted, and its objects on tape wait to be purged" in out.stderr
        out = r.invoke(main, ["fsck"])
        assert out.exit_code == 1 and "tiers down, not checked: tape" in out.stdout
        assert "objects of deleted datasets wait to be purged (temp on tape)" in " ".join(
            out.stdout.split()
        )
    finally:
        tape.unlink()
        (root / "tape.away").rename(tape)
    assert (tape / "temp").is_dir()
    out = r.invoke(main, ["fsck"])
    assert out.exit_code == 1 and "orphan" in out.stdout, out.output
    assert "'strataio fsck --repair' purges them" in " ".join(out.stdout.split())
    out = r.invoke(main, ["fsck", "--repair"])
    assert out.exit_code == 0 and "wait to be purged" not in out.stdout, out.output
    assert not (tape / "temp").exists() and tape.is_dir()
    out = r.invoke(main, ["ls", "--remnants"])
    assert out.exit_code == 0 and "no remnants" in out.stdout
    assert "waiting to be purged" not in r.invoke(main, ["ls"]).stdout
    assert r.invoke(main, ["fsck"]).exit_code == 0


def test_moves_off_a_tier_that_is_down_say_what_they_removed_and_what_they_left(project):
    """With the disk tier's directory gone, a migration that copies nothing removes nothing
    and says so, and an eviction from that tier, which drops the copies' rows while their
    objects stay on the absent volume, says that they stay and that fsck --repair deletes
    them once the tier is back (it said the copies were removed, or dropped, and nothing
    more; fsck later reported the objects as orphans)."""
    root, _ = project
    r = CliRunner()
    with strataio.Session() as s:
        ds = s.create_dataset("d", (20, 20), "f4", (10, 10), hint="LOCALDISK")
        ds[...] = 1.0
        ds.close()
    out = r.invoke(main, ["stage", "temp", "--section", "0:20,0:100", "--to", "disk"])
    assert out.exit_code == 0 and where("temp") == {"disk": 20, "tape": 100}, out.output
    (root / "disk").rename(root / "disk.away")
    out = r.invoke(main, ["migrate", "d", "--to", "tape"])
    assert out.exit_code == 1 and "0 chunks copied" in out.output, out.output
    assert "copies on faster tiers: 0 removed; 4 failed" in out.output, out.output
    out = r.invoke(main, ["evict", "temp", "--tier", "disk"])
    assert out.exit_code == 0 and where("temp") == {"disk": 0, "tape": 100}, out.output
    said = " ".join(out.output.split())
    assert "20 chunk copies dropped from disk" in said, said
    assert "the objects of 20 chunk copies stay there" in said, said
    assert "'strataio fsck --repair' deletes them once it is back" in said, said
    (root / "disk.away").rename(root / "disk")
    assert r.invoke(main, ["tiers", "--check"]).exit_code == 0
    assert r.invoke(main, ["fsck", "--repair"]).exit_code == 0
    assert r.invoke(main, ["fsck"]).exit_code == 0
    assert not list((root / "disk" / "temp").rglob("c/*/*"))


def test_a_stage_says_why_a_tier_without_room_takes_no_writes(tmp_path):
    """The tiers a stage found no room on are named with their condition where they take no
    writes (configured read-only, refusing writes, out of space): a read-only tier was
    reported as full, with nothing there to evict."""
    from strataio.cli.tiers_cmd import _no_room_tiers
    from strataio.storage.posix import PosixBackend
    from strataio.tiers.tier import Tier, TierSet

    tiers = TierSet(
        [
            Tier("local", PosixBackend(tmp_path / "l"), "localdisk", order=0, read_only=True),
            Tier("remote", PosixBackend(tmp_path / "r"), "remotedisk", order=1),
            Tier("tape", PosixBackend(tmp_path / "t"), "remotetape", order=2),
        ]
    )
    with strataio.Session(tiers=tiers, catalog=tmp_path / "cat.db") as s:
        ds = s.create_dataset("a", (10, 10), "f4", (10, 10), hint="REMOTETAPE")
        assert _no_room_tiers(ds.store, "local") == "local: up (read-only)"
        assert _no_room_tiers(ds.store, None) == "local: up (read-only), remote"
        ds.close()


def test_init_makes_no_directory_of_a_read_only_tier(tmp_path, monkeypatch):
    """A read-only tier must hold its data: init leaves its missing directory unmade, notes
    it (an error, exit 1, where the catalog records copies there), and --remake-tier of it
    is a usage error; the other tiers' directories are made."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "strataio.toml").write_text(THREE_TIERS + "read_only = true\n")
    out = CliRunner().invoke(main, ["init"])
    assert out.exit_code == 0, out.output
    assert "note: tier 'archive' is read-only" in out.stderr and "not made" in out.stderr
    assert (tmp_path / "local").is_dir() and not (tmp_path / "archive").exists()
    out = CliRunner().invoke(main, ["init", "--remake-tier", "archive"])
    assert out.exit_code == 2 and "'archive' is read-only" in out.output, out.output
    assert not (tmp_path / "archive").exists()
    # copies recorded there, then the volume away: an error
    (tmp_path / "strataio.toml").write_text(THREE_TIERS)
    (tmp_path / "archive").mkdir()  # (the volume mounted, writable for a while)
    with strataio.Session() as s:
        s.create_dataset("a", (10, 10), "f4", (10, 10), hint="REMOTETAPE")[...] = 1.0
    assert (tmp_path / "archive" / "a" / "c" / "0" / "0").is_file()
    (tmp_path / "strataio.toml").write_text(THREE_TIERS + "read_only = true\n")
    shutil.rmtree(tmp_path / "archive")
    out = CliRunner().invoke(main, ["init"])
    assert out.exit_code == 1, out.output
    assert "error: tier 'archive' is read-only" in out.stderr and "records 1 chunk" in out.stderr
    assert not (tmp_path / "archive").exists()


def test_stage_migrate_evict_of_a_plain_dataset_say_what_it_is(project):
    """A name that is not in the catalog but the path of a plain dataset: the error says the
    storage hierarchy does not manage it and how to bring data under a Session (exit 2, as
    for any name not in the catalog); a plain folder is only not in the catalog."""
    root, _ = project
    strataio.create_dataset(root / "x" / "a", (4,), "f4", (2,))
    r = CliRunner()
    for op in ("stage", "migrate", "evict"):
        out = r.invoke(main, [op, "x/a"])
        assert out.exit_code == 2, out.output
        assert "error: no dataset 'x/a' in catalog" in out.stderr
        assert "x/a is a plain dataset (a Zarr array at that path), which the storage " in (
            out.stderr
        )
        assert "hierarchy does not manage" in out.stderr
        assert "strataio.Session().create_dataset(name, shape, dtype, chunks)" in out.stderr
        out = r.invoke(main, [op, "x"])  # (a Zarr group, no array)
        assert out.exit_code == 2 and "plain dataset" not in out.stderr, out.stderr
        assert "error: no dataset 'x' in catalog" in out.stderr
    assert where("temp") == {"disk": 0, "tape": 100}  # (nothing moved)


def test_a_migration_s_summary_says_why_copies_were_kept_without_blaming_read_only_tiers():
    """Copies a migration kept (recorded again) are on a tier that takes no writes, or were
    changed by another process since the move looked (a rewrite): the summary said only
    "read-only tiers" where none was."""
    from strataio.cli.tiers_cmd import _summary
    from strataio.tiers.mover import MoveResult

    line = _summary("migrate", MoveResult("migrate", total=4, moved=4, removed=2, kept=2), None)
    assert "2 chunk copies kept there, catalogued (on a tier that takes no writes, or " in line
    assert "changed by another process since the move looked)" in line, line


def _disk_marked_down(root) -> str:
    """Tier "disk" marked down in the catalog by a write that found its directory gone, the
    directory then put back (only the catalog says it is down); the reason it records."""
    with strataio.Session() as s:
        ds = s.create_dataset("d", (10, 10), "f4", (10, 10), hint="LOCALDISK")
        (root / "disk").rename(root / "unmounted")
        ds[...] = 1.0  # (the disk is gone: written to the tape, the disk marked down)
        ds.close()
    (root / "unmounted").rename(root / "disk")
    with strataio.Session() as s:
        return {t.name: t.why for t in s.catalog.tiers()}["disk"]


def test_a_tier_marked_down_by_another_process_says_why(project):
    """``strataio tiers`` in a process that did not find the tier down itself gives the
    error that marked it down (the catalog keeps it with the state), not only that the
    catalog says so; the reason goes when the tier is up again."""
    why = _disk_marked_down(project[0])
    assert why.startswith("posix:") and "is missing (a volume not mounted" in why, why
    out = CliRunner().invoke(main, ["tiers"])
    assert out.exit_code == 1, out.output
    assert "marked down in the catalog:" in out.output, out.output
    with strataio.Session() as s:  # (what the table shows, whole)
        assert s.tiers["disk"].last_error == f"marked down in the catalog: {why}"
    assert "'strataio tiers --check' probes them again" in out.output
    assert CliRunner().invoke(main, ["tiers", "--check"]).exit_code == 0
    with strataio.Session() as s:
        assert {t.name: (t.state, t.why) for t in s.catalog.tiers()}["disk"] == ("up", "")


def test_why_a_tier_is_down_is_passed_on_as_the_catalog_says_it(project):
    """A Session that finds a tier down only because the catalog says so registers the
    error the catalog holds as it is: the catalog's reason stays the first process's own
    words however many sessions open meanwhile (each prefixed "marked down in the catalog:"
    to it, so the reason grew at every Session)."""
    why = _disk_marked_down(project[0])
    assert why.startswith("posix:") and "is missing" in why, why
    for _ in range(3):
        with strataio.Session() as s:
            disk = s.tiers["disk"]
            assert disk.last_error == f"marked down in the catalog: {why}"
        with strataio.Session() as s:
            assert {t.name: (t.state, t.why) for t in s.catalog.tiers()}["disk"] == ("down", why)


def test_registering_the_configured_tiers_keeps_why_a_tier_is_down(project):
    """The catalog commands register the configured tiers, keeping each one's state: they
    kept a tier down and dropped why, so that other processes could only say the catalog
    marks it down."""
    from strataio.cli.context import open_configured_catalog
    from strataio.config import load_config

    with strataio.Session() as s:
        s.catalog.set_tier_state("disk", "down", "EIO reading the probe")
    catalog, _ = open_configured_catalog(load_config(None))
    with catalog:
        got = {t.name: (t.state, t.why) for t in catalog.tiers()}["disk"]
    assert got == ("down", "EIO reading the probe")


def test_a_tier_dropped_from_the_configuration_is_down_and_its_copies_kept(project):
    """A tier the catalog knows that the configuration no longer has is down (not
    configured): a dataset with copies there is read from its other copies, written, and
    closed (each failed with "no tier named"); ``strataio tiers`` lists the tier down,
    ``fsck --repair`` reports its copies not checked and keeps their rows. With the tier
    configured again, everything reads and fsck --repair deletes the copy the write made
    obsolete there."""
    root, a = project
    r = CliRunner()
    out = r.invoke(main, ["stage", "temp", "--to", "disk"])
    assert out.exit_code == 0 and where("temp") == {"disk": 100, "tape": 100}, out.output
    full = (root / "strataio.toml").read_text()
    tape_only = (
        CONFIG[: CONFIG.index("[[tiers]]")] + CONFIG[CONFIG.index('[[tiers]]\nname = "tape"') :]
    )
    (root / "strataio.toml").write_text(tape_only)
    with strataio.Session() as s:
        disk = s.tiers["disk"]
        assert not disk.up and disk.condition == "down (not configured)"
        assert not disk.check() and not disk.up and s.tiers.names == ["tape", "disk"]
        ds = s.open_dataset("temp", "r+")
        assert np.array_equal(ds[...], a)  # from the tape
        ds[0:10, 0:10] = -1
        b = a.copy()
        b[0:10, 0:10] = -1
        assert np.array_equal(ds[...], b)
        ds.close()
        assert {t.name: t.state for t in s.catalog.tiers()}["disk"] == "up"  # (left as it was)
    assert where("temp") == {"disk": 99, "tape": 100}
    assert (root / "disk" / "temp" / "c" / "0" / "0").exists()  # (obsolete, not deleted)
    out = r.invoke(main, ["tiers"])
    assert out.exit_code == 1, out.output
    row = next(line for line in out.stdout.splitlines() if "│ disk" in line)
    assert "down (not configured)" in row, out.stdout
    assert "holding copies that cannot be read here: disk" in out.stdout, out.output
    out = r.invoke(main, ["fsck", "--repair"])
    assert out.exit_code == 1 and "tiers down, not checked: disk (not configured" in out.stdout
    assert ", 0 problems;" in out.stdout, out.output
    assert where("temp") == {"disk": 99, "tape": 100}
    # configured again: every copy reads, and the obsolete object goes
    (root / "strataio.toml").write_text(full)
    with strataio.Session() as s:
        assert s.tiers["disk"].up and s.tiers.names == ["disk", "tape"]
        ds = s.open_dataset("temp")
        assert np.array_equal(ds[...], b)
        ds.close()
    out = r.invoke(main, ["fsck", "--repair"])
    assert out.exit_code == 0, out.output
    assert not (root / "disk" / "temp" / "c" / "0" / "0").exists()
    out = r.invoke(main, ["fsck"])
    assert out.exit_code == 0 and ", 0 problems" in out.stdout, out.output
    (root / "tape").rename(root / "tape.away")
    with strataio.Session() as s:
        ds = s.open_dataset("temp")
        assert np.array_equal(ds[10:, :], b[10:, :])  # the disk's copies, read
        ds.close()
