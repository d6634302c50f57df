"""``strataio bench compress`` at a tiny scale: the ranks run under mpiexec, the 8:1 dataset
reads back as written (the benchmark checks it), the achieved ratios follow the asked ones and
the JSON rows carry what the table shows."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from strataio.bench.compress import RATIOS, codec_spec, slab
from strataio.cli import main
from strataio.errors import ArgumentError, CodecError


@pytest.mark.mpi
def test_compress_bench_at_two_ranks(tmp_path: Path) -> None:
    out = tmp_path / "compress.json"
    args = ["bench", "compress", "--ranks", "2", "--per-rank", "512KiB", "--repeat", "1"]
    result = CliRunner().invoke(main, [*args, "--workdir", str(tmp_path), "--json", str(out)])
    assert result.exit_code == 0, result.output
    got = json.loads(out.read_text())
    assert got["verified"] and got["ranks"] == 2
    rows = got["rows"]
    labels = ["uncompressed", *(f"{r}:1" for r in RATIOS)]
    assert [(r["storage"], r["mode"], r["ratio"]) for r in rows] == [
        (s, m, x) for s in ("local", "shaped") for m in ("plain", "pipelined") for x in labels
    ]
    for r in rows:
        assert r["seconds"] > 0 and r["bandwidth"] == pytest.approx(got["bytes"] / r["seconds"])
        if r["ratio"] == "8:1":
            assert r["achieved"] > 5  # the synthetic data compresses about as asked
    assert "speed-up" in result.output
    assert not list(tmp_path.glob("strataio-bench-compress-*"))  # the work directory is gone


def test_synthetic_data_compresses_as_asked() -> None:
    import numcodecs

    codec = numcodecs.Blosc(cname="lz4", clevel=1, shuffle=0)
    for ratio in RATIOS:
        data = slab(0, 64, 4096, ratio, 0)
        achieved = data.nbytes / len(codec.encode(np.ascontiguousarray(data)))
        assert 0.75 * ratio <= achieved <= 1.1 * ratio
    assert codec_spec("zstd:3") == [{"name": "zstd", "configuration": {"level": 3}}]
    with pytest.raises(ArgumentError, match="unknown codec 'lzma'"):
        codec_spec("lzma")
    with pytest.raises(ArgumentError, match="level 'x' is not an integer"):
        codec_spec("zstd:x")
    with pytest.raises(CodecError, match="codec 'zstd': level 99 is out of range"):
        codec_spec("zstd:99")
    with pytest.raises(CodecError, match="clevel 12"):
        codec_spec("lz4:12")


@pytest.mark.parametrize(
    "codec, says",
    [("bogus:1", "unknown codec 'bogus:1'"), ("zstd:99", "codec 'zstd': level 99 is out of range")],
)
def test_a_codec_is_refused_before_any_rank_starts(codec, says, tmp_path, monkeypatch) -> None:
    """--codec is checked in the command: a usage error naming it, no mpiexec launched (not a
    traceback from every rank)."""
    from strataio.cli import bench_cmd

    def launched(*a, **k):
        raise AssertionError("mpiexec launched")

    monkeypatch.setattr(bench_cmd, "run_ranks", launched)
    res = CliRunner().invoke(main, ["bench", "compress", "--ranks", "2", "--codec", codec])
    assert res.exit_code == 2, res.output
    assert "Invalid value for '--codec'" in res.stderr and says in res.stderr
    assert "Traceback" not in res.output
