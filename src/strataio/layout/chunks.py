"""ChunkGrid: an array shape cut into chunks (the APRIL "sub-files"), and section covers."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from strataio.errors import ArgumentError, SelectionError
from strataio.layout.sections import Section


def chunk_key(coords: Sequence[int], separator: str = "/") -> str:
    """The Zarr v3 default-encoded key of the chunk at grid ``coords`` (``c/1/2``; ``c`` for
    a 0-d array's single chunk)."""
    return "c" + "".join(separator + str(int(c)) for c in coords)


class ChunkCover:
    """The chunks a section touches, in C order of chunk coordinates.

    Per chunk ``i``: ``coords[i]`` its grid coordinate; ``local_start/local_stop`` the part of
    the section inside it in chunk-local element coordinates; ``out_start/out_stop`` the same
    part relative to the section's start. As arrays these are int64 ``(nchunks, ndim)``;
    :meth:`rows` yields the same per chunk as plain tuples, for per-chunk work without numpy
    overhead.
    """

    __slots__ = ("_arrays", "_per_dim")

    def __init__(self, per_dim: list[tuple[list[int], ...]]) -> None:
        # per_dim[d] = (coords, local_start, local_stop, out_start, out_stop) along dimension d
        self._per_dim = per_dim
        self._arrays: list[np.ndarray] | None = None

    def __len__(self) -> int:
        n = 1  # a 0-d array's section covers its single chunk
        for dim in self._per_dim:
            n *= len(dim[0])
        return n

    def rows(self) -> Iterator[tuple[tuple[int, ...], ...]]:
        """Per chunk: ``(coords, local_start, local_stop, out_start, out_stop)`` tuples."""
        per_dim = [list(zip(*dim)) for dim in self._per_dim]
        for combo in itertools.product(*per_dim):
            yield tuple(zip(*combo)) if combo else ((), (), (), (), ())

    def _array(self, field: int) -> np.ndarray:
        if self._arrays is None:
            nd = len(self._per_dim)
            if len(self) == 0 or nd == 0:
                z = np.zeros((len(self), nd), dtype=np.int64)
                self._arrays = [z] * 5
            else:
                counts = [len(d[0]) for d in self._per_dim]
                grids = np.indices(counts, dtype=np.int64).reshape(nd, -1)
                self._arrays = [
                    np.stack(
                        [
                            np.asarray(dim[f], dtype=np.int64)[grids[d]]
                            for d, dim in enumerate(self._per_dim)
                        ],
                        axis=1,
                    )
                    for f in range(5)
                ]
        return self._arrays[field]

    @property
    def coords(self) -> np.ndarray:
        return self._array(0)

    @property
    def local_start(self) -> np.ndarray:
        return self._array(1)

    @property
    def local_stop(self) -> np.ndarray:
        return self._array(2)

    @property
    def out_start(self) -> np.ndarray:
        return self._array(3)

    @property
    def out_stop(self) -> np.ndarray:
        return self._array(4)

    def full_mask(self, grid: ChunkGrid) -> np.ndarray:
        """True for chunks the section covers completely (no read-modify-write needed)."""
        shapes = grid.chunk_shapes(self.coords)
        return np.all((self.local_start == 0) & (self.local_stop == shapes), axis=1)

    def __iter__(self) -> Iterator[tuple[tuple[int, ...], tuple[slice, ...], tuple[slice, ...]]]:
        """Yield ``(coords, chunk-local slices, caller slices)`` per chunk."""
        for c, ls, le, os_, oe in self.rows():
            yield (
                c,
                tuple(slice(a, b) for a, b in zip(ls, le)),
                tuple(slice(a, b) for a, b in zip(os_, oe)),
            )


@dataclass(frozen=True, slots=True)
class ChunkGrid:
    """A regular grid of chunks of ``chunks`` elements over an array of ``shape``.

    Edge chunks are logically full size (as in Zarr); :meth:`chunk_shapes` gives the part of
    each that lies inside the array.
    """

    shape: tuple[int, ...]
    chunks: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.shape) != len(self.chunks):
            raise ArgumentError(
                f"chunk shape {self.chunks} has {len(self.chunks)} dimensions, "
                f"array shape {self.shape} has {len(self.shape)}"
            )
        if any(c <= 0 for c in self.chunks):
            raise ArgumentError(f"chunk shape {self.chunks} must be positive in every dimension")
        if any(n < 0 for n in self.shape):
            raise ArgumentError(f"array shape {self.shape} must be non-negative")

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def grid_shape(self) -> tuple[int, ...]:
        """Number of chunks along each dimension."""
        return tuple(-(-n // c) for n, c in zip(self.shape, self.chunks))

    @property
    def nchunks(self) -> int:
        return math.prod(self.grid_shape)  # (Python ints: exact, and cheaper than numpy's)

    def chunk_section(self, coords: Sequence[int]) -> Section:
        """The part of the array chunk ``coords`` holds (clipped at the array's edge)."""
        gs = self.grid_shape
        if len(coords) != self.ndim or any(not 0 <= c < g for c, g in zip(coords, gs)):
            raise SelectionError(f"chunk {tuple(coords)} outside the grid {gs}")
        a = tuple(c * k for c, k in zip(coords, self.chunks))
        b = tuple(min(x + k, n) for x, k, n in zip(a, self.chunks, self.shape))
        return Section(a, b)

    def chunk_shapes(self, coords: np.ndarray) -> np.ndarray:
        """In-array shape of each chunk in ``coords`` (``(n, ndim)`` int64)."""
        ch = np.asarray(self.chunks, dtype=np.int64)
        starts = np.asarray(coords, dtype=np.int64) * ch
        return np.minimum(starts + ch, np.asarray(self.shape, dtype=np.int64)) - starts

    def all_coords(self) -> np.ndarray:
        """Every chunk coordinate in C order, ``(nchunks, ndim)``."""
        return self.cover(Section.full(self.shape)).coords

    def cover(self, section: Section) -> ChunkCover:
        """The chunks ``section`` touches and, per chunk, the sub-box in both coordinate frames."""
        if section.ndim != self.ndim:
            raise SelectionError(
                f"section of {section.ndim} dimensions for an array of {self.ndim}"
            )
        if any(b > n for b, n in zip(section.stop, self.shape)):
            raise SelectionError(f"section {section} exceeds the array shape {self.shape}")
        if section.is_empty:
            return ChunkCover([([], [], [], [], []) for _ in range(self.ndim)])
        per_dim = []
        for a, b, k in zip(section.start, section.stop, self.chunks):
            cs = list(range(a // k, (b - 1) // k + 1))
            lo = [max(c * k, a) for c in cs]
            hi = [min((c + 1) * k, b) for c in cs]
            per_dim.append(
                (
                    cs,
                    [x - c * k for x, c in zip(lo, cs)],
                    [x - c * k for x, c in zip(hi, cs)],
                    [x - a for x in lo],
                    [x - a for x in hi],
                )
            )
        return ChunkCover(per_dim)
