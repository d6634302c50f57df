"""``strataio init / ls / du`` through click's runner, on a real SQLite catalog."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from strataio.catalog import ChunkCopy, DatasetRecord, open_catalog
from strataio.cli import main
from strataio.config import CONFIG_ENV, default_config_text, load_config


@pytest.fixture
def runner(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(CONFIG_ENV, raising=False)
    return CliRunner()


def _populate() -> None:
    cfg = load_config()
    with open_catalog(cfg.catalog.url) as cat:
        cat.create_dataset(DatasetRecord("temp", (100, 80), "<f8", (10, 20), '["zstd"]', "AUTO"))
        cat.create_dataset(DatasetRecord("press", (7,), "<i2", (3,), "[]", "REMOTETAPE"))
        cat.commit(
            [ChunkCopy("temp", f"c/{i}/{j}", "local", 1000) for i in range(10) for j in range(4)]
            + [ChunkCopy("temp", "c/0/0", "archive", 1000)]
            + [ChunkCopy("press", f"c/{i}", "archive", 6) for i in range(3)]
        )


def test_init_writes_config_and_catalog(runner, tmp_path):
    res = runner.invoke(main, ["init"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "strataio.toml").read_text() == default_config_text()
    with open_catalog(tmp_path / ".strataio" / "catalog.db") as cat:
        assert [(t.name, t.role, t.order) for t in cat.tiers()] == [
            ("local", "localdisk", 0),
            ("remote", "remotedisk", 1),
            ("archive", "remotetape", 2),
        ]
    # keeps an existing file (creating only what is missing), --force overwrites it
    (tmp_path / "strataio.toml").write_text("# mine\n" + default_config_text())
    res = runner.invoke(main, ["init"])
    assert res.exit_code == 0, res.output
    assert "kept" in res.output and "--force" in res.output and "nothing to create" in res.output
    assert (tmp_path / "strataio.toml").read_text().startswith("# mine")
    res = runner.invoke(main, ["init", "--force"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "strataio.toml").read_text() == default_config_text()


def test_ls_and_du(runner):
    assert runner.invoke(main, ["init"]).exit_code == 0
    res = runner.invoke(main, ["ls"])
    assert res.exit_code == 0 and "no datasets" in res.output
    _populate()
    res = runner.invoke(main, ["ls", "--json"])
    assert res.exit_code == 0, res.output
    rows = {r["name"]: r for r in json.loads(res.output)}
    assert rows["temp"] == {
        "name": "temp",
        "kind": "array",
        "shape": [100, 80],
        "dtype": "<f8",
        "chunks": [10, 20],
        "nchunks": 40,
        "hint": "AUTO",
        "state": "active",
        "size_bytes": 64000,
        "stored_bytes": 41000,
        "chunks_per_tier": {"local": 40, "remote": 0, "archive": 1},
    }
    assert rows["press"]["chunks_per_tier"] == {"local": 0, "remote": 0, "archive": 3}
    assert rows["press"]["nchunks"] == 3 and rows["press"]["hint"] == "REMOTETAPE"
    res = runner.invoke(main, ["ls"])
    assert res.exit_code == 0
    for text in ("temp", "press", "100×80", "REMOTETAPE", "on local", "on archive"):
        assert text in res.output

    res = runner.invoke(main, ["du", "--json"])
    assert res.exit_code == 0, res.output
    du = json.loads(res.output)
    assert [(t["name"], t["copies"], t["bytes"]) for t in du["tiers"]] == [
        ("local", 40, 40000),
        ("remote", 0, 0),
        ("archive", 4, 1018),
    ]
    assert du["datasets"] == {
        "press": {"archive": 18},
        "temp": {"local": 40000, "archive": 1000},
    }
    res = runner.invoke(main, ["du", "-b"])
    assert res.exit_code == 0
    assert "40000" in res.output and "41000" in res.output and "1018" in res.output


def test_du_shows_capacity_use(runner, tmp_path):
    assert runner.invoke(main, ["init"]).exit_code == 0
    (tmp_path / "strataio.toml").write_text(
        default_config_text().replace('path = ".strataio/local"', 'path = "l"\ncapacity = 50000')
    )
    # as a session does on open: the catalog learns the configured tiers
    with open_catalog(load_config().catalog.url) as cat:
        cat.register_tiers(load_config().tier_records())
    _populate()
    res = runner.invoke(main, ["du", "--bytes"])
    assert res.exit_code == 0, res.output
    assert "80.0" in res.output  # 40000 of 50000 bytes


def test_errors_exit_codes(runner, tmp_path, monkeypatch):
    # no catalog yet: created from the (default) configuration, as a Session does
    res = runner.invoke(main, ["ls"])
    assert res.exit_code == 0 and "no datasets" in res.output, res.output
    assert (tmp_path / ".strataio" / "catalog.db").is_file()
    # a catalog that cannot be created: exit 1, naming it
    blocked = tmp_path / "blocked.toml"
    (tmp_path / "afile").write_text("")
    blocked.write_text(
        default_config_text().replace('url = ".strataio/catalog.db"', 'url = "afile/cat.db"')
    )
    res = runner.invoke(main, ["du", "-c", str(blocked)])
    assert res.exit_code == 1, res.output
    assert "afile/cat.db" in res.output and "Traceback" not in res.output
    # a bad config file: exit 2, naming file and key
    bad = tmp_path / "bad.toml"
    bad.write_text("[[tiers]]\nname = 'x'\nkind = 'posix'\nrole = 'warp'\n")
    res = runner.invoke(main, ["du", "--config", str(bad)])
    assert res.exit_code == 2
    assert "bad.toml" in res.output and "role" in res.output and "Traceback" not in res.output
    monkeypatch.setenv(CONFIG_ENV, str(tmp_path / "gone.toml"))
    res = runner.invoke(main, ["ls"])
    assert res.exit_code == 2 and "STRATAIO_CONFIG" in res.output
    # a runtime failure (unreachable database): exit 1
    pg = tmp_path / "pg.toml"
    pg.write_text(
        "[catalog]\nurl = 'postgresql://u:pw@/db?host=/nonexistent-dir'\n"
        "[[tiers]]\nname = 'm'\nkind = 'memory'\nrole = 'memory'\n"
    )
    res = runner.invoke(main, ["ls", "-c", str(pg)])
    assert res.exit_code == 1, res.output
    assert "cannot connect" in res.output and "pw" not in res.output
    # click's own usage errors stay exit 2
    assert runner.invoke(main, ["ls", "--nope"]).exit_code == 2


def test_ls_shows_a_superfile_as_one(runner):
    """A superfile is listed as kind "superfile" with its containers (their number and the
    size they close at) and their bytes, not as an array of shape 0 with "1 (0)" chunks."""
    import numpy as np

    import strataio

    assert runner.invoke(main, ["init"]).exit_code == 0
    with strataio.Session() as s:
        sf = s.superfile("images", container_bytes=4096, hint="LOCALDISK")
        for i in range(20):
            sf.put(f"img{i}", np.full((20, 20), i, "f4"))  # 1600 bytes each: 3 a container
        sf.close()
        ds = s.create_dataset("temp", (40, 40), "f4", (20, 20), hint="LOCALDISK")
        ds[...] = 1.0
        ds.close()
    with open_catalog(load_config().catalog.url) as cat:
        copies = cat.residency("images")
    assert len(copies) == 7
    res = runner.invoke(main, ["ls", "--json"])
    assert res.exit_code == 0, res.output
    rows = {r["name"]: r for r in json.loads(res.output)}
    assert rows["images"] == {
        "name": "images",
        "kind": "superfile",
        "shape": None,
        "dtype": None,
        "chunks": None,
        "nchunks": 7,
        "containers": 7,
        "container_bytes": 4096,
        "hint": "LOCALDISK",
        "state": "active",
        "size_bytes": sum(c.nbytes for c in copies),
        "stored_bytes": sum(c.nbytes for c in copies),
        "chunks_per_tier": {"local": 7, "remote": 0, "archive": 0},
    }
    assert rows["temp"]["kind"] == "array" and rows["temp"]["shape"] == [40, 40]
    res = runner.invoke(main, ["ls"])
    assert res.exit_code == 0, res.output
    line = next(x for x in res.stdout.splitlines() if "images" in x)
    cells = [c.strip() for c in line.split("│")[1:-1]]
    assert cells[:5] == ["images", "superfile", "-", "-", "7 containers (close at 4.0 KiB)"]
    line = next(x for x in res.stdout.splitlines() if "temp" in x)
    assert [c.strip() for c in line.split("│")[1:-1]][:5] == [
        "temp",
        "array",
        "40×40",
        "<f4",
        "20×20 (4)",
    ]


def test_an_empty_catalog_file_is_refused_by_every_command(runner, tmp_path):
    """A catalog file emptied (a crash, a truncated copy, ``touch``) is not taken for a new
    catalog: ls would list no datasets and init would call the catalog in place. Every
    command names the file and says it is empty, and leaves it as it is; deleted, init makes
    a new one."""
    assert runner.invoke(main, ["init"]).exit_code == 0
    _populate()
    path = tmp_path / ".strataio" / "catalog.db"
    os.truncate(path, 0)
    for cmd, status in (
        (["ls"], 1),
        (["du"], 1),
        (["init"], 1),
        (["tiers"], 1),
        (["fsck"], 1),
        (["info", "temp"], 1),  # (it was 2, unlike every other command)
    ):
        res = runner.invoke(main, cmd)
        said = " ".join(res.output.split())
        assert res.exit_code == status, (cmd, res.output)
        assert f"catalog '{path}' is an empty file" in said, (cmd, res.output)
        assert "delete it to start a new catalog" in said and "Traceback" not in said
        assert path.stat().st_size == 0, cmd
    path.unlink()
    res = runner.invoke(main, ["init"])
    assert res.exit_code == 0 and "created catalog" in res.output, res.output
    res = runner.invoke(main, ["ls"])
    assert res.exit_code == 0 and "no datasets" in res.output, res.output


def test_init_then_edit_then_ls_has_no_dead_end(runner, tmp_path):
    """The sequence a new user runs: init, edit the config (a new catalog place, a new tier),
    then any command; init again only creates what is missing."""
    assert runner.invoke(main, ["init"]).exit_code == 0
    text = (
        default_config_text().replace('url = ".strataio/catalog.db"', 'url = "meta/cat.db"')
        + '\n[[tiers]]\nname = "deep"\nkind = "posix"\nrole = "remotetape"\npath = "deep"\n'
    )
    (tmp_path / "strataio.toml").write_text(text)
    for cmd in (["ls"], ["du"]):
        res = runner.invoke(main, cmd)
        assert res.exit_code == 0, res.output
        assert "strataio init" not in res.output
    assert (tmp_path / "meta" / "cat.db").is_file()
    with open_catalog(tmp_path / "meta" / "cat.db") as cat:
        assert [t.name for t in cat.tiers()] == ["local", "remote", "archive", "deep"]
    res = runner.invoke(main, ["ls"])
    assert res.exit_code == 0 and "no datasets" in res.output

    # init on an existing config: keeps it, creates only what is missing, says what it did
    (tmp_path / "meta" / "cat.db").unlink()
    res = runner.invoke(main, ["init"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "strataio.toml").read_text() == text
    assert "kept" in res.output and "created catalog" in res.output
    assert (tmp_path / "deep").is_dir() and "deep" in res.output
    res = runner.invoke(main, ["init"])
    assert res.exit_code == 0, res.output
    assert "nothing to create" in res.output and "created" not in res.output


def test_init_on_a_broken_config_says_how_to_fix(runner, tmp_path):
    (tmp_path / "strataio.toml").write_bytes(b"\x00\xff binary")
    res = runner.invoke(main, ["init"])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert "strataio.toml" in res.output and "--force" in res.output
    assert runner.invoke(main, ["init", "--force"]).exit_code == 0


class SetupMachine(RuleBasedStateMachine):
    """A user's project folder: init, edits of strataio.toml, lost pieces, commands in any
    order. After every step: every command that needs the catalog works, the catalog knows
    every configured tier, every POSIX tier folder exists after init, and init never changes
    an existing config unless forced."""

    def __init__(self) -> None:
        super().__init__()
        self.old_cwd = os.getcwd()
        self.dir = Path(tempfile.mkdtemp(prefix="strataio-setup-"))
        os.chdir(self.dir)
        self.runner = CliRunner()
        self.text: str | None = None  # the config file's content, None while there is none
        self.extra = 0

    def teardown(self) -> None:
        os.chdir(self.old_cwd)
        shutil.rmtree(self.dir, ignore_errors=True)

    def _write(self, text: str) -> None:
        (self.dir / "strataio.toml").write_text(text)
        self.text = text

    @rule(force=st.booleans())
    def init(self, force: bool) -> None:
        res = self.runner.invoke(main, ["init", "--force"] if force else ["init"])
        assert res.exit_code == 0, res.output
        if self.text is None or force:
            self.text = default_config_text()
        assert (self.dir / "strataio.toml").read_text() == self.text
        for t in load_config().tiers:
            if t.kind == "posix":
                assert Path(t.path).is_dir(), (t.name, res.output)

    @precondition(lambda self: self.text is not None)
    @rule(place=st.sampled_from(["a.db", "deep/b.db", ".strataio/catalog.db"]))
    def move_catalog(self, place: str) -> None:
        self._write(re.sub(r'(?m)^url = ".*"$', f'url = "{place}"', self.text))

    @precondition(lambda self: self.text is not None)
    @rule()
    def add_tier(self) -> None:
        self.extra += 1
        n = self.extra
        self._write(
            self.text
            + f'\n[[tiers]]\nname = "t{n}"\nkind = "posix"\nrole = "remotetape"\npath = "t{n}"\n'
        )

    @rule()
    def lose_catalog(self) -> None:
        if self.text is not None:
            url = load_config().catalog.url
            for suffix in ("", "-wal", "-shm"):
                Path(url + suffix).unlink(missing_ok=True)

    @rule(cmd=st.sampled_from([["ls"], ["du"], ["ls", "--json"], ["tiers"]]))
    def command(self, cmd: list[str]) -> None:
        res = self.runner.invoke(main, cmd)
        assert res.exit_code == 0, (cmd, res.output)

    @invariant()
    def catalog_knows_the_configured_tiers(self) -> None:
        res = self.runner.invoke(main, ["du", "--json"])
        assert res.exit_code == 0, res.output
        cfg = load_config()
        assert [t["name"] for t in json.loads(res.output)["tiers"]][: len(cfg.tiers)] == [
            t.name for t in cfg.tiers
        ]
        with open_catalog(cfg.catalog.url) as cat:
            assert {t.name for t in cfg.tiers} <= {t.name for t in cat.tiers()}


def test_setup_has_no_dead_end_in_any_order(monkeypatch):
    monkeypatch.delenv(CONFIG_ENV, raising=False)
    run_state_machine_as_test(
        SetupMachine,
        settings=settings(max_examples=25, stateful_step_count=8, deadline=None),
    )


@pytest.mark.parametrize("given", ["in the user part", "as a query parameter"])
def test_a_catalog_password_shows_nowhere(runner, tmp_path, pg_url, given):
    """A PostgreSQL catalog URL's password, given either way libpq takes it, is masked in
    every command's output, in an error naming the catalog, and in a Session's repr (also
    the warning about a Session left unclosed)."""
    import strataio
    from strataio.session import _close_at_exit

    secret = "hunter2-pw"
    assert pg_url.startswith("postgresql://postgres:@")
    if given == "in the user part":
        url = pg_url.replace("postgres:@", f"postgres:{secret}@", 1)
    else:
        url = f"{pg_url}&password={secret}"
    tiers = "[[tiers]]\nname = 'local'\nkind = 'posix'\nrole = 'localdisk'\npath = 'local'\n"
    (tmp_path / "strataio.toml").write_text(f"[catalog]\nurl = '{url}'\n{tiers}")
    outputs = []
    for args in (["init"], ["ls"], ["tiers"], ["du"], ["fsck"], ["info", "nope"]):
        res = runner.invoke(main, args)
        assert res.exit_code == (2 if args[0] == "info" else 0), res.output
        outputs.append(res.output)
    assert "***" in outputs[1]  # (ls names the catalog)
    # an error naming the catalog: a database that does not exist
    (tmp_path / "strataio.toml").write_text(
        f"[catalog]\nurl = '{url.replace('/postgres?', '/nosuchdb?', 1)}'\n{tiers}"
    )
    res = runner.invoke(main, ["ls"])
    assert res.exit_code == 1 and "nosuchdb" in res.output, res.output
    outputs.append(res.output)
    (tmp_path / "strataio.toml").write_text(f"[catalog]\nurl = '{url}'\n{tiers}")
    with pytest.warns(ResourceWarning) as caught:
        session = strataio.Session()
        outputs += [repr(session), repr(session.catalog)]
        _close_at_exit()
    outputs += [str(w.message) for w in caught]
    for text in outputs:
        assert secret not in text, text


def test_init_refuses_an_unknown_remake_tier_before_writing_anything(runner, tmp_path):
    """`init --remake-tier NAME` with no tier NAME in the configuration it would write is a
    usage error before strataio.toml is written (or, with --force, replaced) or a catalog made."""
    res = runner.invoke(main, ["init", "--remake-tier", "nope"])
    assert res.exit_code == 2, res.output
    assert "--remake-tier: no tier 'nope'" in res.stderr
    assert sorted(os.listdir(tmp_path)) == []
    mine = "# mine\n" + default_config_text()
    (tmp_path / "strataio.toml").write_text(mine)
    res = runner.invoke(main, ["init", "--force", "--remake-tier", "nope"])
    assert res.exit_code == 2 and "no tier 'nope'" in res.stderr, res.output
    assert (tmp_path / "strataio.toml").read_text() == mine
    assert sorted(os.listdir(tmp_path)) == ["strataio.toml"]
