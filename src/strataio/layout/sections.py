"""Section: a rectilinear N-D box, ``start`` inclusive and ``stop`` exclusive, in element units."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from strataio.errors import SelectionError


@dataclass(frozen=True, slots=True)
class Section:
    """The box ``start[d] <= i[d] < stop[d]`` of an N-D array.

    ``squeeze`` lists the axes that a numpy index selected with an integer; they count in the
    box (length 1) and are dropped from :attr:`result_shape`, as numpy drops them.
    """

    start: tuple[int, ...]
    stop: tuple[int, ...]
    squeeze: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if len(self.start) != len(self.stop):
            raise SelectionError(
                f"section start has {len(self.start)} dimensions, stop has {len(self.stop)}"
            )
        for d, (a, b) in enumerate(zip(self.start, self.stop)):
            if a < 0 or b < a:
                raise SelectionError(f"section dimension {d}: invalid range [{a}, {b})")

    # ----------------------------------------------------------------- construction
    @classmethod
    def from_bounds(
        cls, start: Sequence[int], stop: Sequence[int], shape: Sequence[int] | None = None
    ) -> Section:
        """A section from explicit corners; with ``shape``, checked to lie inside the array."""
        try:
            a = tuple(operator.index(x) for x in start)
            b = tuple(operator.index(x) for x in stop)
        except TypeError as exc:
            raise SelectionError(f"section corners must be integers: {exc}") from None
        if shape is not None:
            if len(a) != len(shape) or len(b) != len(shape):
                raise SelectionError(
                    f"section of {len(a)}/{len(b)} dimensions for an array of {len(shape)}"
                )
            for d, (x, y, n) in enumerate(zip(a, b, shape)):
                if not (0 <= x <= y <= n):
                    raise SelectionError(
                        f"section [{x}, {y}) out of bounds in dimension {d} of size {n}"
                    )
        return cls(a, b)

    @classmethod
    def full(cls, shape: Sequence[int]) -> Section:
        return cls(tuple(0 for _ in shape), tuple(int(n) for n in shape))

    @classmethod
    def from_index(cls, index: Any, shape: Sequence[int]) -> Section:
        """The section a numpy basic index selects in an array of ``shape``.

        Accepts integers (negative counts from the end), slices of step 1 and Ellipsis, alone
        or in a tuple shorter than the rank. Unlike numpy, a slice bound beyond the array is
        an error rather than silently clipped: a section that asks for data the array does not
        have is a bug in the caller.
        """
        shape = tuple(int(n) for n in shape)
        nd = len(shape)
        if not isinstance(index, tuple):
            index = (index,)
        n_ellipsis = sum(1 for x in index if x is Ellipsis)
        if n_ellipsis > 1:
            raise SelectionError("an index can only have a single ellipsis ('...')")
        explicit = len(index) - n_ellipsis
        if explicit > nd:
            raise SelectionError(f"too many indices: {explicit} for an array of {nd} dimensions")
        expanded: list[Any] = []
        for x in index:
            if x is Ellipsis:
                expanded.extend([slice(None)] * (nd - explicit))
            else:
                expanded.append(x)
        expanded.extend([slice(None)] * (nd - len(expanded)))
        start, stop, squeeze = [], [], []
        for d, (x, n) in enumerate(zip(expanded, shape)):
            if isinstance(x, slice):
                a, b = _slice_bounds(x, n, d)
            elif isinstance(x, bool):  # numpy reads a bool as a mask, not as the integer 0/1
                raise SelectionError(f"boolean index {x!r} in dimension {d} is not a section")
            else:
                try:
                    i = operator.index(x)
                except TypeError:
                    raise SelectionError(
                        f"unsupported index {x!r} in dimension {d}: only integers, slices of "
                        "step 1 and '...' select a section"
                    ) from None
                if not -n <= i < n:
                    raise SelectionError(
                        f"index {i} is out of bounds for dimension {d} of size {n}"
                    )
                a = i + n if i < 0 else i
                b = a + 1
                squeeze.append(d)
            start.append(a)
            stop.append(b)
        return cls(tuple(start), tuple(stop), tuple(squeeze))

    # ----------------------------------------------------------------- geometry
    @property
    def ndim(self) -> int:
        return len(self.start)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(b - a for a, b in zip(self.start, self.stop))

    @property
    def result_shape(self) -> tuple[int, ...]:
        """The shape numpy would return for the index this section came from."""
        return tuple(n for d, n in enumerate(self.shape) if d not in self.squeeze)

    @property
    def size(self) -> int:
        s = 1
        for n in self.shape:
            s *= n
        return s

    @property
    def is_empty(self) -> bool:
        return any(b <= a for a, b in zip(self.start, self.stop))

    def intersect(self, other: Section) -> Section | None:
        """The common box, or None when the two do not overlap."""
        if other.ndim != self.ndim:
            raise SelectionError("cannot intersect sections of different rank")
        a = tuple(max(x, y) for x, y in zip(self.start, other.start))
        b = tuple(min(x, y) for x, y in zip(self.stop, other.stop))
        if any(y <= x for x, y in zip(a, b)):
            return None
        return Section(a, b)

    def contains(self, other: Section) -> bool:
        return all(
            sa <= oa and ob <= sb
            for sa, sb, oa, ob in zip(self.start, self.stop, other.start, other.stop)
        )

    def relative_to(self, origin: Sequence[int]) -> Section:
        """This box with ``origin`` subtracted from its corners."""
        return Section(
            tuple(a - o for a, o in zip(self.start, origin)),
            tuple(b - o for b, o in zip(self.stop, origin)),
        )

    def to_slices(self) -> tuple[slice, ...]:
        """The numpy index of this box (integer axes come back as length-1 slices)."""
        return tuple(slice(a, b) for a, b in zip(self.start, self.stop))

    def __str__(self) -> str:
        return "[" + ", ".join(f"{a}:{b}" for a, b in zip(self.start, self.stop)) + "]"


def _slice_bounds(s: slice, n: int, d: int) -> tuple[int, int]:
    """The bounds ``[a, b)`` that slice ``s`` of dimension ``d`` (of size ``n``) selects; a
    step other than None or the integer 1 (a float ``1.0`` included, as numpy) is refused."""
    try:
        step = None if s.step is None else operator.index(s.step)
    except TypeError:
        raise SelectionError(f"slice step {s.step!r} in dimension {d} is not an integer") from None
    if step not in (None, 1):
        raise SelectionError(
            f"stepped slice {s} in dimension {d}: only step 1 selects a rectilinear section"
        )

    def bound(v: Any, default: int) -> int:
        if v is None:
            return default
        try:
            i = operator.index(v)
        except TypeError:
            raise SelectionError(f"slice bound {v!r} in dimension {d} is not an integer") from None
        if not -n <= i <= n:
            raise SelectionError(f"slice bound {i} is out of bounds for dimension {d} of size {n}")
        return i + n if i < 0 else i

    a = bound(s.start, 0)
    b = bound(s.stop, n)
    return a, max(a, b)
