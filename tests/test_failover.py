"""Failover: a SeaweedFS tier dies in the middle of a write-heavy run; the run completes on the
next tier, every chunk reads back, the catalog says where each went, and ``strataio tiers
--check`` marks the tier up again once the server is back."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from click.testing import CliRunner

import servers
import strataio
from strataio.cli import main
from strataio.errors import StrataError
from strataio.storage import create_bucket

SHAPE, CHUNKS, ROUNDS = (80, 80), (10, 10), 6


def version(k):
    return np.arange(SHAPE[0] * SHAPE[1], dtype="f4").reshape(SHAPE) + 1000.0 * k


@pytest.fixture
def seaweed():
    if servers.find_weed() is None:
        servers.missing("SeaweedFS 'weed' binary not installed")
    with servers.SeaweedServer() as srv:
        create_bucket(srv.endpoint, "tiers", srv.access_key, srv.secret_key, srv.region)
        yield srv


def write_config(tmp_path, srv):
    path = tmp_path / "strataio.toml"
    path.write_text(
        f"""
[catalog]
url = "cat.db"

[[tiers]]
name = "local"
kind = "posix"
role = "localdisk"
path = "local"

[[tiers]]
name = "objstore"
kind = "s3"
role = "remotedisk"
bucket = "tiers"
endpoint = "{srv.endpoint}"
region = "{srv.region}"
credentials = {{ access_key_id = "{srv.access_key}", secret_access_key = "{srv.secret_key}" }}

[[tiers]]
name = "archive"
kind = "posix"
role = "remotetape"
path = "archive"
"""
    )
    return path


def test_object_store_dies_mid_run(tmp_path, seaweed, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = write_config(tmp_path, seaweed)
    runner = CliRunner()
    with strataio.Session(config) as s:
        ds = s.create_dataset("run", SHAPE, "f4", CHUNKS, hint="REMOTEDISK")
        for k in range(1, ROUNDS + 1):
            if k == 3:  # the server dies while round 3 is being written
                threading.Timer(0.02, seaweed.kill).start()
            ds[...] = version(k)
            ds.flush()
        assert not s.tiers["objstore"].up and s.tiers["objstore"].last_error
        # the catalog tells where each chunk went: rounds after the failure landed on the
        # archive (the next tier the REMOTEDISK hint allows), not on the dead object store
        assert s.catalog.tiers()[1].state == "down"
        rows = s.catalog.residency("run")
        assert {c.tier for c in rows} == {"archive"} and len(rows) == 64
        assert {c.state for c in rows} == {"dirty"}  # not at the hint's home tier
        np.testing.assert_array_equal(ds[...], version(ROUNDS))  # reads use the valid copies
        ds.close()
        # the read staged the archive chunks to local disk (APRIL's read path)
        rows = s.catalog.residency("run")
        assert {c.tier for c in rows} == {"archive", "local"} and len(rows) == 128
    # a fresh session believes the catalog: the tier stays down until checked
    result = runner.invoke(main, ["tiers"])
    assert result.exit_code == 1 and "down" in result.output
    with strataio.Session(config) as s:
        ds = s.open_dataset("run")
        np.testing.assert_array_equal(ds[...], version(ROUNDS))
        ds.close()
    seaweed.restart()
    result = runner.invoke(main, ["tiers", "--check"])
    assert result.exit_code == 0, result.output
    with strataio.Session(config) as s:
        assert [t.state for t in s.catalog.tiers()] == ["up", "up", "up"]
    # copies of rounds 1-2 stranded on the object store are orphans now; no live session has
    # the dataset open, so fsck removes them at once
    result = runner.invoke(main, ["fsck", "--repair"])
    assert result.exit_code == 0, result.output
    assert "orphan" in result.output and "in flight" not in result.output
    result = runner.invoke(main, ["fsck"])
    assert result.exit_code == 0 and "0 problems" in result.output, result.output
    # new writes go to the object store again
    with strataio.Session(config) as s:
        ds = s.open_dataset("run", "r+")
        ds[0:10, 0:10] = 5.0
        ds.close()
        assert {c.tier for c in s.catalog.residency("run") if c.key == "c/0/0"} == {"objstore"}


def test_a_create_on_an_s3_tier_with_a_wrong_secret_says_why_and_what_stays(tmp_path, s3_server):
    # the only tier refuses every request (a wrong secret): the create's error names the
    # tier and the server's reason, not an outage, and says the dataset stays catalogued
    good = servers.s3_tier_toml(s3_server, "wrong-secret")
    bad = good.replace(s3_server.secret_key, "not-the-secret")
    config = tmp_path / "strataio.toml"
    head = f'[catalog]\nurl = "{tmp_path / "cat.db"}"\n\n[[tiers]]\nname = "objstore"\n'
    config.write_text(head + 'role = "remotedisk"\n' + bad + "\n")
    with strataio.Session(config) as s, pytest.raises(strataio.errors.BackendError) as refused:
        s.create_dataset("run", SHAPE, "f4", CHUNKS)
    text = str(refused.value)
    assert "objstore" in text and "check the credentials" in text, text
    assert "open_dataset" in text, text
    assert s3_server.secret_key not in text
    # what the message says stays: once the secret is right, the dataset opens and takes writes
    config.write_text(head + 'role = "remotedisk"\n' + good + "\n")
    with strataio.Session(config) as s:
        ds = s.open_dataset("run", "r+")
        ds[...] = version(1)
        ds.close()
        np.testing.assert_array_equal(s.open_dataset("run")[...], version(1))


def test_a_read_only_s3_tier_whose_credentials_may_not_list_is_up_and_read(
    tmp_path, s3_server, monkeypatch
):
    """Credentials that may read objects but not list them (a common policy for a store
    read by many): the read-only tier's probe takes the look-up's answer, so the tier is up
    and its chunks read; only a listing that says the bucket does not exist counts."""
    monkeypatch.chdir(tmp_path)
    writer = servers.s3_tier_toml(s3_server, "shared")
    reader = writer.replace(s3_server.access_key, s3_server.reader_key).replace(
        s3_server.secret_key, s3_server.reader_secret
    )
    head = '[catalog]\nurl = "cat.db"\n\n[[tiers]]\nname = "archive"\nrole = "remotetape"\n'
    (tmp_path / "strataio.toml").write_text(head + writer + "\n")
    with strataio.Session() as s:
        s.create_dataset("run", SHAPE, "f4", CHUNKS)[...] = version(3)
    (tmp_path / "strataio.toml").write_text(head + "read_only = true\n" + reader + "\n")
    result = CliRunner().invoke(main, ["tiers", "--check"])
    assert result.exit_code == 0, result.output
    with strataio.Session() as s:
        assert s.tiers["archive"].check()
        np.testing.assert_array_equal(s.open_dataset("run")[...], version(3))


def test_a_read_only_s3_tier_whose_bucket_does_not_exist_is_found_down(
    tmp_path, s3_server, monkeypatch
):
    # a HEAD has no body to tell a missing bucket from a missing object: the read-only
    # tier's probe does not take the bucket's "not found" for an answer
    monkeypatch.chdir(tmp_path)
    tier = servers.s3_tier_toml(s3_server, "typo").replace(
        f'bucket = "{s3_server.bucket}"', 'bucket = "no-such-bucket-here"'
    )
    (tmp_path / "strataio.toml").write_text(
        f'[catalog]\nurl = "cat.db"\n\n[[tiers]]\nname = "local"\nkind = "posix"\n'
        f'role = "localdisk"\npath = "local"\n\n[[tiers]]\nname = "archive"\n'
        f'role = "remotetape"\nread_only = true\n{tier}\n'
    )
    result = CliRunner().invoke(main, ["tiers", "--check"])
    assert result.exit_code == 1, result.output
    assert "tiers down: archive" in result.output, result.output
    with strataio.Session() as s:
        assert not s.tiers["archive"].check()
        assert "bucket 'no-such-bucket-here' does not exist" in s.tiers["archive"].last_error


def _local_and_s3(tmp_path, s3_server, prefix):
    """A config of a local disk tier over an S3 tier (under ``prefix``) and the S3 tier's
    backend, seen from outside strataio (to lose objects behind its back)."""
    from strataio.storage.s3 import S3Backend

    (tmp_path / "strataio.toml").write_text(
        f'[catalog]\nurl = "{tmp_path / "cat.db"}"\n\n[[tiers]]\nname = "local"\n'
        f'kind = "posix"\nrole = "localdisk"\npath = "{tmp_path / "local"}"\n\n'
        f'[[tiers]]\nname = "objstore"\nrole = "remotedisk"\n'
        + servers.s3_tier_toml(s3_server, prefix)
        + "\n"
    )
    outside = S3Backend(
        s3_server.bucket,
        prefix,
        endpoint=s3_server.endpoint,
        access_key=s3_server.access_key,
        secret_key=s3_server.secret_key,
        allow_http=True,
    )
    with strataio.Session(tmp_path / "strataio.toml") as s:
        ds = s.create_dataset("run", SHAPE, "f4", CHUNKS, hint="REMOTEDISK")
        ds[...] = version(1)
        ds.close()
        ds = s.open_dataset("run")
        assert ds.stage(to="local").wait().ok
        ds.close()
    return tmp_path / "strataio.toml", outside


def test_a_migrate_onto_a_copy_whose_object_is_gone_puts_it_again_before_deleting(
    tmp_path, s3_server, monkeypatch
):
    # the S3 object of a catalogued copy is gone (a lifecycle rule, a bucket emptied): a
    # migrate there finds it missing and puts it again before the local copy goes
    monkeypatch.chdir(tmp_path)
    config, outside = _local_and_s3(tmp_path, s3_server, "migrate-onto-lost")
    outside.delete("run/c/0/0")
    with strataio.Session(config) as s:
        ds = s.open_dataset("run")
        assert ds.migrate(to="objstore").wait().ok
        assert {c.tier for c in s.catalog.residency("run")} == {"objstore"}
        np.testing.assert_array_equal(ds[...], version(1))
        ds.close()
    assert outside.exists("run/c/0/0")
    # one truncated there: the migrate fails that chunk and deletes nothing of it
    with strataio.Session(config) as s:
        ds = s.open_dataset("run")
        assert ds.stage(to="local").wait().ok
        ds.close()
    outside.put("run/c/0/1", bytes(outside.get("run/c/0/1"))[:50])
    with strataio.Session(config) as s:
        ds = s.open_dataset("run")
        got = ds.migrate(to="objstore").result()
        assert [k for k, _ in got.failed] == ["c/0/1"], got
        assert "fsck" in got.failed[0][1], got
        rows = {(c.key, c.tier) for c in s.catalog.residency("run")}
        assert ("c/0/1", "local") in rows
        ds.close()
    # fsck drops the truncated object's copy; the local one, kept, reads
    result = CliRunner().invoke(main, ["fsck", "--repair"])
    assert result.exit_code == 0, result.output
    with strataio.Session(config) as s:
        np.testing.assert_array_equal(s.open_dataset("run")[...], version(1))


def test_an_evict_whose_other_copy_s_object_is_gone_writes_the_chunk_back_first(
    tmp_path, s3_server
):
    config, outside = _local_and_s3(tmp_path, s3_server, "evict-onto-lost")
    outside.delete("run/c/0/0")
    with strataio.Session(config) as s:
        ds = s.open_dataset("run")
        assert ds.evict(tier="local").wait().ok
        assert {c.tier for c in s.catalog.residency("run")} == {"objstore"}
        np.testing.assert_array_equal(ds[...], version(1))
        ds.close()
    assert outside.exists("run/c/0/0")


def test_an_s3_key_over_1024_bytes_fails_its_object_and_leaves_the_tier_up(tmp_path, s3_server):
    """A PUT answered KeyTooLongError (an S3 key over 1024 bytes) is that object's refusal,
    not the tier's failure: it marked the tier down in the catalog for every process, so no
    dataset could be written there. It fails that object's move, naming the tier and the
    limit, and the tier stays up and takes other datasets' chunks."""
    head = f'[catalog]\nurl = "{tmp_path / "cat.db"}"\n\n'
    local = '[[tiers]]\nname = "local"\nkind = "posix"\nrole = "localdisk"\n'
    local += f'path = "{tmp_path / "local"}"\n\n'
    config = tmp_path / "strataio.toml"
    config.write_text(head + local)
    # 5 parts of 250 bytes: a name a file system holds, and an S3 key of over 1024 bytes
    name = "/".join(c * 250 for c in "abcde")
    with strataio.Session(config) as s:
        with s.create_dataset(name, (4,), "f4", (4,), hint="LOCALDISK") as ds:
            ds[...] = 1.0
        with s.create_dataset("short", (4,), "f4", (4,), hint="LOCALDISK") as ds:
            ds[...] = 2.0
    objstore = '[[tiers]]\nname = "objstore"\nrole = "remotedisk"\n'
    objstore += servers.s3_tier_toml(s3_server, "keys-too-long") + "\n"
    config.write_text(head + local + objstore)
    with strataio.Session(config) as s:
        with s.open_dataset(name, "r+") as ds:
            with pytest.raises(StrataError, match="over the 1024 bytes an S3 key") as refused:
                ds.migrate(..., to="objstore").wait()
            assert "tier 'objstore'" in str(refused.value), str(refused.value)
            assert "S3 key of 1272 bytes" in str(refused.value), str(refused.value)
            np.testing.assert_array_equal(ds[...], 1.0)
        assert s.tiers["objstore"].up
        assert {t.name: t.state for t in s.catalog.tiers()}["objstore"] == "up"
        with s.open_dataset("short", "r+") as ds:
            ds.migrate(..., to="objstore").wait()
        assert {c.tier for c in s.catalog.residency("short") if c.key == "c/0"} == {"objstore"}
    with strataio.Session(config) as s:
        assert s.tiers["objstore"].up
        np.testing.assert_array_equal(s.open_dataset("short")[...], 2.0)
        np.testing.assert_array_equal(s.open_dataset(name)[...], 1.0)


def test_a_name_too_long_for_a_configured_tier_is_refused_at_create(tmp_path, s3_server):
    """A name whose parts each fit a file name can still make an S3 key over 1024 bytes (or
    a path over PATH_MAX): such a name is refused at create, naming the tier and the limit,
    before anything is catalogued or stored; a name that fits is taken."""
    from strataio.errors import ArgumentError

    config = tmp_path / "strataio.toml"
    config.write_text(
        f'[catalog]\nurl = "{tmp_path / "cat.db"}"\n\n'
        f'[[tiers]]\nname = "local"\nkind = "posix"\nrole = "localdisk"\n'
        f'path = "{tmp_path / "local"}"\n\n'
        '[[tiers]]\nname = "objstore"\nrole = "remotedisk"\n'
        + servers.s3_tier_toml(s3_server, "names-too-long")
        + "\n"
    )
    name = "/".join(c * 250 for c in "abcde")  # (1254 bytes)
    with strataio.Session(config) as s:
        with pytest.raises(ArgumentError, match="over the 1024 bytes an S3 key") as refused:
            s.create_dataset(name, (4,), "f4", (2,), hint="LOCALDISK")
        assert "tier 'objstore'" in str(refused.value), str(refused.value)
        with pytest.raises(ArgumentError, match="tier 'objstore'"):
            s.superfile(name, hint="LOCALDISK")
        assert s.catalog.list_datasets() == []
        assert all(t.up for t in s.tiers)
        fits = "/".join(c * 240 for c in "abcd")  # (963 bytes, and the prefix and keys)
        with s.create_dataset(fits, (4,), "f4", (2,), hint="REMOTEDISK") as ds:
            ds[...] = 3.0
        with s.superfile(fits + "-sf", hint="REMOTEDISK") as sf:
            sf.put("m", b"x")
    with strataio.Session(config) as s:
        assert all(t.state == "up" for t in s.catalog.tiers())
        np.testing.assert_array_equal(s.open_dataset(fits)[...], 3.0)
        assert s.superfile(fits + "-sf", "r").get("m") == b"x"
