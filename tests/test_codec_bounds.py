"""A compressed chunk decodes to its chunk's size or fails: a corrupt or hostile chunk whose
header declares more (or that would inflate without end) is refused before the bytes are
made, so it costs neither memory nor time; one that decodes to less is refused too."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from strataio.arrays.codecs import CodecPipeline, _zstd_content_size, normalize_codecs
from strataio.errors import CodecError

CHUNK = (16, 16)  # 1 KiB of float32
CODECS = ["zstd", "zstd+crc32c", "gzip", "blosc", "lz4"]


def _pipeline(codec: str, shape: tuple[int, ...] = CHUNK, dtype: str = "f4") -> CodecPipeline:
    return CodecPipeline(normalize_codecs(codec, np.dtype(dtype)), np.dtype(dtype), shape)


@pytest.mark.parametrize("codec", CODECS)
def test_a_chunk_round_trips(codec: str) -> None:
    chunk = np.random.default_rng(0).random(CHUNK).astype("f4")
    pipe = _pipeline(codec)
    np.testing.assert_array_equal(pipe.decode(pipe.encode(chunk)), chunk)


def _refused_cheaply(pipe, stored: bytes) -> None:
    """``pipe`` refuses ``stored`` with CodecError having allocated under 4 MiB."""
    tracemalloc.start()
    try:
        with pytest.raises(CodecError):
            pipe.decode(stored)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, peak


@pytest.mark.parametrize("codec", CODECS)
def test_a_chunk_that_would_inflate_far_past_its_size_is_refused_cheaply(codec: str) -> None:
    """The stored bytes of a 64 MiB chunk (zeros: a few kilobytes compressed) read as a 1 KiB
    chunk: CodecError, and the 64 MiB never allocated."""
    bomb = _pipeline(codec, (64 << 20,), "u1").encode(np.zeros(64 << 20, dtype="u1"))
    stored = bytes(bomb)
    _refused_cheaply(_pipeline(codec, (1024,), "u1"), stored)


@pytest.mark.parametrize("codec", CODECS)
def test_a_chunk_that_decodes_short_is_refused(codec: str) -> None:
    short = bytes(_pipeline(codec, (100,), "u1").encode(np.arange(100, dtype="u1")))
    with pytest.raises(CodecError):
        _pipeline(codec, (1024,), "u1").decode(short)


def test_a_zstd_frame_without_a_declared_size_decodes_to_the_chunk_or_fails() -> None:
    """A streaming writer's frame states no size (RFC 8878: Frame_Content_Size absent): it is
    decoded into a buffer of the chunk's size, and fails where it holds more or less."""
    frame = b"(\xb5/\xfd\x00Xa\x00\x00Hello World!"  # one raw block, no size in the header
    assert _zstd_content_size(frame) is None
    got = _pipeline("zstd", (12,), "u1").decode(frame)
    assert got.tobytes() == b"Hello World!"
    for size in (11, 13, 4096):
        with pytest.raises(CodecError):
            _pipeline("zstd", (size,), "u1").decode(frame)


@pytest.mark.parametrize("nbytes", [1, 255, 256, 65791, 65792, 2**32 + 7])
def test_zstd_header_sizes_read_as_declared(nbytes: int) -> None:
    """Every width of the header's size field (1, 2 with its 256 offset, 4, 8 bytes)."""
    import numcodecs

    if nbytes > 1 << 20:  # (too large to compress here: a header written by hand)
        header = bytes([0x28, 0xB5, 0x2F, 0xFD, 0xE0]) + nbytes.to_bytes(8, "little")
        assert _zstd_content_size(header) == nbytes
        return
    frame = bytes(numcodecs.Zstd(level=1).encode(np.zeros(nbytes, dtype="u1")))
    assert _zstd_content_size(frame) == nbytes


@pytest.mark.parametrize("codec", ["zstd+zstd", "crc32c+zstd", "gzip+blosc", "zstd+gzip"])
def test_a_later_codec_that_would_inflate_far_past_the_chunk_is_refused_cheaply(
    codec: str,
) -> None:
    """The last codec of a pipeline with two compressors (decoded first) gives back no more
    than the codecs before it can encode the chunk to: a frame of 64 MiB of zeros stored as
    a 1 KiB chunk is a CodecError, the 64 MiB never allocated."""
    outer = _pipeline(codec.split("+")[-1], (64 << 20,), "u1")
    stored = bytes(outer.encode(np.zeros(64 << 20, dtype="u1")))
    _refused_cheaply(_pipeline(codec, (1024,), "u1"), stored)


@pytest.mark.parametrize("codec", ["zstd+zstd", "crc32c+zstd", "gzip+blosc", "zstd+gzip"])
@pytest.mark.parametrize("kind", ["noise", "zeros"])
def test_a_chunk_of_two_compressors_round_trips(codec: str, kind: str) -> None:
    rng = np.random.default_rng(1)
    chunk = rng.integers(0, 256, 4096, dtype="u1") if kind == "noise" else np.zeros(4096, "u1")
    pipe = _pipeline(codec, (4096,), "u1")
    np.testing.assert_array_equal(pipe.decode(pipe.encode(chunk)), chunk)
