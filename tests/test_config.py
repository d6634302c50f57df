"""Configuration: lookup order, the embedded default, validation messages, secrets kept out."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from strataio.catalog import TierRecord
from strataio.catalog.base import redact_url
from strataio.config import (
    CONFIG_ENV,
    CONFIG_FILENAME,
    CatalogConfig,
    Config,
    default_config_text,
    load_config,
    parse_size,
)
from strataio.errors import ConfigError, StrataError


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(CONFIG_ENV, raising=False)


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_default_without_a_file(tmp_path):
    cfg = load_config()
    assert cfg.source is None
    assert cfg.catalog.url == str(tmp_path / ".strataio" / "catalog.db")
    assert [(t.name, t.kind, t.role, t.path) for t in cfg.tiers] == [
        ("local", "posix", "localdisk", str(tmp_path / ".strataio" / "local")),
        ("remote", "posix", "remotedisk", str(tmp_path / ".strataio" / "remote")),
        ("archive", "posix", "remotetape", str(tmp_path / ".strataio" / "archive")),
    ]
    shaped = [(t.name, t.shaped, t.time_scale) for t in cfg.tiers if t.shaped]
    assert shaped == [("remote", "remote_disk_2002", 0.001), ("archive", "remote_tape_2002", 0.001)]
    assert cfg.tier_records() == [
        TierRecord("local", f"posix:{tmp_path}/.strataio/local", "localdisk", None, 0),
        TierRecord("remote", f"posix:{tmp_path}/.strataio/remote", "remotedisk", None, 1),
        TierRecord("archive", f"posix:{tmp_path}/.strataio/archive", "remotetape", None, 2),
    ]
    # the default text is the default: a file holding it loads to the same thing
    _write(tmp_path / "strataio.toml", default_config_text())
    from_file = load_config()
    assert from_file.source == str(tmp_path / "strataio.toml")
    assert (from_file.catalog, from_file.tiers) == (cfg.catalog, cfg.tiers)


def test_lookup_order(tmp_path, monkeypatch):
    other = _write(
        tmp_path / "elsewhere" / "conf.toml",
        '[[tiers]]\nname = "m"\nkind = "memory"\nrole = "memory"\n',
    )
    monkeypatch.setenv(CONFIG_ENV, str(other))
    cfg = load_config()
    assert cfg.source == str(other) and [t.name for t in cfg.tiers] == ["m"]
    # relative paths are relative to the file, not the working directory
    assert cfg.catalog.url == str(tmp_path / "elsewhere" / ".strataio" / "catalog.db")
    # ./strataio.toml comes first
    _write(tmp_path / "strataio.toml", default_config_text())
    assert load_config().source == str(tmp_path / "strataio.toml")
    # an explicit path wins over both
    assert load_config(other).source == str(other)
    monkeypatch.setenv(CONFIG_ENV, str(tmp_path / "missing.toml"))
    (tmp_path / "strataio.toml").unlink()
    with pytest.raises(ConfigError, match=r"STRATAIO_CONFIG.*missing\.toml"):
        load_config()
    with pytest.raises(ConfigError, match="nope.toml.*does not exist"):
        load_config(tmp_path / "nope.toml")


FULL = """
[catalog]
url = "postgresql://meta:hunter2@db.example/strataio"

[[tiers]]
name = "ram"
kind = "memory"
role = "memory"
capacity = "2GiB"

[[tiers]]
name = "scratch"
kind = "posix"
role = "localdisk"
path = "/abs/scratch"
capacity = 1000000

[[tiers]]
name = "obj"
kind = "s3"
role = "remotedisk"
bucket = "data"
prefix = "/runs/"
endpoint = "http://127.0.0.1:9000"
region = "us-east-1"
capacity = "1.5 TB"
credentials = { access_key_id = "AKID", secret_access_key = "${TEST_S3_SECRET}" }

[[tiers]]
name = "tape"
kind = "posix"
role = "remotetape"
path = "tape"
shaped = "remote_tape_2002"
time_scale = 0.001
concurrency = 2
"""


def test_full_file(tmp_path, monkeypatch):
    monkeypatch.setenv("TEST_S3_SECRET", "s3cr3t-value")
    cfg = load_config(_write(tmp_path / "c.toml", FULL))
    assert cfg.catalog.url == "postgresql://meta:hunter2@db.example/strataio"
    ram, scratch, obj, tape = cfg.tiers
    assert (ram.capacity_bytes, ram.url) == (2 << 30, "memory:ram")
    assert (scratch.capacity_bytes, scratch.path) == (1_000_000, "/abs/scratch")
    assert obj.url == "s3://data/runs" and obj.capacity_bytes == 1_500_000_000_000
    assert (obj.endpoint, obj.region) == ("http://127.0.0.1:9000", "us-east-1")
    assert obj.credentials == {"access_key_id": "AKID", "secret_access_key": "s3cr3t-value"}
    assert (tape.path, tape.shaped, tape.time_scale) == (
        str(tmp_path / "tape"),
        "remote_tape_2002",
        0.001,
    )
    assert (tape.concurrency, ram.concurrency) == (2, None)
    assert cfg.tier("tape") is tape
    with pytest.raises(ConfigError, match="no tier 'disk'.*ram, scratch, obj, tape"):
        cfg.tier("disk")
    # secrets never show in a repr
    text = repr(cfg)
    assert "s3cr3t" not in text and "hunter2" not in text and "AKID" not in text
    assert "meta:***@db.example" in text
    with pytest.raises(AttributeError):
        cfg.tiers[0].name = "x"  # frozen
    assert isinstance(cfg, Config)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[tiers]\n", "not valid TOML"),
        ("[catalog]\nurl = 'x'\n", "tiers is missing"),
        ("tiers = []\n", "at least one tier"),
        ("colour = 1\n[[tiers]]\nname='a'\nkind='memory'\nrole='memory'\n", "colour: unknown key"),
        ("[[tiers]]\nkind='memory'\nrole='memory'\n", r"tiers\[0\]\.name is missing"),
        ("[[tiers]]\nname='a'\nkind='tape'\nrole='memory'\n", r"\(a\): kind: 'tape' is not one"),
        ("[[tiers]]\nname='a'\nkind='memory'\nrole='fast'\n", r"\(a\): role: 'fast' is not one"),
        ("[[tiers]]\nname='a'\nkind='posix'\nrole='localdisk'\n", r"\(a\): path is missing"),
        ("[[tiers]]\nname='a'\nkind='s3'\nrole='remotedisk'\n", r"\(a\): bucket is missing"),
        (
            "[[tiers]]\nname='a'\nkind='s3'\nrole='remotedisk'\nbucket='B_'\n",
            r"\(a\): bucket: 'B_' is not a valid S3 bucket name",
        ),
        (
            "[[tiers]]\nname='a'\nkind='s3'\nrole='remotedisk'\nbucket='bkt'\nprefix='a/../b'\n",
            r"\(a\): prefix: storage key 'a/../b' has an empty, '\.' or '\.\.' component",
        ),
        (
            "[[tiers]]\nname='a'\nkind='s3'\nrole='remotedisk'\nbucket='bkt'\nendpoint='host:9000'\n",
            r"\(a\): endpoint: 'host:9000' is not an http\(s\) URL",
        ),
        (
            "[[tiers]]\nname='a'\nkind='memory'\nrole='memory'\ncapacity='10 parsecs'\n",
            r"\(a\): capacity: cannot read '10 parsecs'",
        ),
        (
            "[[tiers]]\nname='a'\nkind='memory'\nrole='memory'\ncapacity='10000PB'\n",
            r"\(a\): capacity: '10000PB' is larger than the largest size supported \(8 EiB\)",
        ),
        (
            "[[tiers]]\nname='a'\nkind='posix'\nrole='localdisk'\npath='p'\n"
            "capacity=99999999999999999999\n",
            r"\(a\): capacity: 99999999999999999999 is larger than the largest size",
        ),
        (
            "[[tiers]]\nname='a'\nkind='memory'\nrole='localdisk'\n",
            r"\(a\): role: 'localdisk' keeps data across processes; a tier of kind 'memory' can "
            "only have role 'memory'",
        ),
        (
            "[[tiers]]\nname='a'\nkind='memory'\nrole='memory'\ncapacity=true\n",
            r"\(a\): capacity: expected int or str, got bool",
        ),
        ("[[tiers]]\nname='a'\nkind='memory'\nrole='memory'\npath='x'\n", r"\(a\): path: unknown"),
        (
            "[[tiers]]\nname='a'\nkind='memory'\nrole='memory'\nshaped='remote_tape_2002'\n"
            "time_scale=-1\n",
            r"\(a\): time_scale: must be a finite number >= 0",
        ),
        (
            "[[tiers]]\nname='a'\nkind='memory'\nrole='memory'\nshaped='tape'\n",
            r"\(a\): shaped: unknown model 'tape' \(known: remote_disk_2002, remote_tape_2002",
        ),
        (
            "[[tiers]]\nname='a'\nkind='memory'\nrole='memory'\nconcurrency=0\n",
            r"\(a\): concurrency: must be at least 1",
        ),
        (
            "[[tiers]]\nname='a b'\nkind='memory'\nrole='memory'\n",
            "'a b' is not a valid tier name",
        ),
        (
            "[[tiers]]\nname='a'\nkind='memory'\nrole='memory'\n" * 2,
            "name 'a' is used twice",
        ),
        (
            "[catalog]\nurl='mysql://u:pw@h/x'\n[[tiers]]\nname='a'\nkind='memory'\nrole='memory'\n",
            r"catalog\.url: unsupported scheme in 'mysql://u:\*\*\*@h/x'",
        ),
        (
            "[[tiers]]\nname='a'\nkind='s3'\nrole='remotedisk'\nbucket='bkt'\n"
            "credentials={secret_access_key='${STRATAIO_TEST_UNSET}'}\n",
            r"credentials\.secret_access_key: environment variable STRATAIO_TEST_UNSET is not set",
        ),
        (
            "[[tiers]]\nname='a'\nkind='s3'\nrole='remotedisk'\nbucket='bkt'\n"
            "credentials={password='x'}\n",
            r"credentials\.password: unknown key",
        ),
    ],
)
def test_bad_files_name_the_file_and_key(tmp_path, text, message):
    path = _write(tmp_path / "bad.toml", text)
    with pytest.raises(ConfigError, match=message) as info:
        load_config(path)
    assert str(path) in str(info.value)
    assert isinstance(info.value, StrataError)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (bytes(range(256)), "not UTF-8 text"),
        (b"\xff\xfe[catalog]\n", "not UTF-8 text"),
        (b"[[tiers]]\nname = 'a\x00'\n", "not valid TOML"),
    ],
)
def test_binary_files_are_config_errors(tmp_path, content, message):
    """A file that is not text (a binary dropped in by mistake) names the file, found by the
    lookup or given explicitly."""
    (tmp_path / CONFIG_FILENAME).write_bytes(content)
    for how in (lambda: load_config(), lambda: load_config(tmp_path / CONFIG_FILENAME)):
        with pytest.raises(ConfigError, match=message) as info:
            how()
        assert CONFIG_FILENAME in str(info.value)


def test_unreadable_config_paths_are_config_errors(tmp_path):
    (tmp_path / "dir.toml").mkdir()
    with pytest.raises(ConfigError, match="dir.toml"):
        load_config(tmp_path / "dir.toml")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(_write(tmp_path / "x.toml", "[[tiers]]\nname = "))


def test_format_size():
    from strataio.sizes import format_size

    assert format_size(0) == "0 B"
    assert format_size(1023) == "1023 B"
    assert format_size(1024) == "1.0 KiB"
    assert format_size(1536 * 1024) == "1.5 MiB"
    assert format_size(2**50) == "1.0 PiB"
    assert format_size(2**60) == "1024.0 PiB"
    assert format_size(None) == "-"
    assert format_size(None, none="unbounded") == "unbounded"
    assert format_size(1536, raw=True) == "1536"
    assert parse_size(format_size(3 * 2**30)) == 3 * 2**30


def test_parse_size():
    assert parse_size("10GiB") == 10 * 2**30
    assert parse_size("10 GB") == 10 * 10**9
    assert parse_size("1.5KiB") == 1536
    assert parse_size("512") == parse_size(512) == 512
    assert parse_size("4 kb") == 4000
    assert parse_size(None) is None and parse_size("unlimited") is None
    assert parse_size("8PiB") == 8 * 2**50 and parse_size(2**63 - 1) == 2**63 - 1
    assert parse_size(".5KiB") == 512 and parse_size("1.5TiB") == 3 * 2**39
    for bad in ("-1", "1e3", "GiB", "10 GiBs", -5, 2.5, 2**63, "9300PB", "0.3B", "5.5"):
        with pytest.raises(ConfigError):
            parse_size(bad)


def test_default_text_is_commented_valid_toml():
    text = default_config_text()
    data = tomllib.loads(text)
    assert data["catalog"]["url"] == ".strataio/catalog.db"
    assert [t["name"] for t in data["tiers"]] == ["local", "remote", "archive"]
    assert sum(line.startswith("#") for line in text.splitlines()) >= 10


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://meta:hunter2@db/strataio", "postgresql://meta:***@db/strataio"),
        (
            "postgresql://meta@/strataio?host=/run/pg&password=hunter2&sslmode=disable",
            "postgresql://meta@/strataio?host=/run/pg&password=***&sslmode=disable",
        ),
        ("postgresql:///strataio?PassWord=hunter2", "postgresql:///strataio?PassWord=***"),
        ("postgresql://m:hunter2@/s?password=hunter2", "postgresql://m:***@/s?password=***"),
        ("postgresql:///strataio?host=/run/pg", "postgresql:///strataio?host=/run/pg"),
        ("/abs/catalog.db", "/abs/catalog.db"),
    ],
)
def test_a_catalog_url_shows_no_password(url, shown):
    """A password is masked wherever libpq takes it: the user part or a query parameter."""
    assert redact_url(url) == shown
    assert repr(CatalogConfig(url)) == f"CatalogConfig(url={shown!r})"
