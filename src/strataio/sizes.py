"""Sizes in bytes written the way people write them: ``"10GiB"``, ``"500 MB"``, ``4096``;
read by :func:`parse_size`, shown by :func:`format_size`. Counts of things in messages are
written by :func:`counted` (``1 chunk``, ``2 chunks``)."""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

from strataio.errors import ConfigError

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "pb": 10**15,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "pib": 2**50,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*$")
#: the largest size a catalog stores (a signed 64-bit integer: 8 EiB less one byte)
MAX_SIZE = 2**63 - 1


def parse_size(value: Any, *, where: str = "size") -> int | None:
    """Bytes from an int or a string like ``"10GiB"``, ``"500 MB"``, ``"1.5TiB"``.

    Decimal units (kB, MB, GB, TB, PB) are powers of 1000, binary ones (KiB ... PiB) of 1024.
    ``None``, ``"unlimited"`` and ``"none"`` mean unbounded.
    """
    if value is None:
        return None
    if isinstance(value, bool):
        raise ConfigError(f"{where}: expected a size in bytes or a string like '10GiB'")
    n: int | None = None
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(f"{where}: size {value} is negative")
        n = value
    elif isinstance(value, str):
        if value.strip().lower() in ("unlimited", "none"):
            return None
        m = _SIZE.match(value)
        unit = _UNITS.get(m.group(2).lower()) if m else None
        if m and unit is not None:
            exact = Fraction(m.group(1)) * unit  # (exact: no float rounding of large sizes)
            if exact.denominator != 1:
                raise ConfigError(f"{where}: {value!r} is not a whole number of bytes")
            n = int(exact)
    if n is not None:
        if n > MAX_SIZE:
            raise ConfigError(
                f"{where}: {value!r} is larger than the largest size supported (8 EiB)"
            )
        return n
    raise ConfigError(
        f"{where}: cannot read {value!r} as a size (use bytes or a number with a unit: "
        "B, kB, MB, GB, TB, KiB, MiB, GiB, TiB)"
    )


_BINARY = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def format_size(n: float | None, *, raw: bool = False, none: str = "-") -> str:
    """Bytes for people: ``512 B``, ``1.5 MiB`` (binary units, one decimal); with ``raw`` the
    plain number of bytes. ``None`` (unbounded) shows as ``none``."""
    if n is None:
        return none
    if raw:
        return str(int(n))
    size = float(n)
    for unit in _BINARY:
        if abs(size) < 1024 or unit == _BINARY[-1]:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and ``noun`` for a message, the noun plural unless ``n`` is 1: ``1 chunk``,
    ``0 chunks``; ``plural`` where adding an s does not make it (``copy``, ``copies``)."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"
