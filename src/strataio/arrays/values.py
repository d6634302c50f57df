"""Storing values in a dataset's dtype: which conversions are allowed, and checked.

The rule (for writes and ``fill_value`` alike):

- the same dtype, or a conversion numpy calls safe (``int8`` → ``int32``, ``float32`` →
  ``float64``, ``bool`` → anything numeric), is stored as is;
- an integer of another width or signedness (``int64`` → ``int8``, ``int64`` → ``uint8``,
  including Python ints, which numpy makes ``int64``, objects beyond 64 bits, or ``float64``
  in a list with one beyond ``int64``, such as ``[2**64 - 1, 1]``) is stored
  when **every value fits** the dataset's dtype, and refused otherwise: numpy users expect
  ``ds[i] = 5`` to work on an ``int8`` dataset, and nobody expects 1000 to be stored as -24;
- integers into ``bool`` are stored when every value is 0 or 1 (False and True, as numpy and
  zarr-python take them, and as a Zarr v3 ``fill_value`` of ``false`` or ``true``), and
  refused otherwise: 2 is no bool, and would become True;
- a float or complex of more precision (``float64`` → ``float32``) is rounded as numpy rounds,
  but a finite value beyond the dataset's range (which would become ``inf``) is refused;
- everything else (floats into integers, complex into floats, floats into ``bool``, strings,
  objects, dates) is refused: the caller converts explicitly;
- a masked array (``numpy.ma``) with any element masked is refused: a dataset holds no mask,
  and the values under one are no data (``data.filled(value)`` says what to store there).
  One with nothing masked (as netCDF readers often return) is stored as its values.

Refusals raise :class:`~strataio.errors.DtypeMismatchError` before anything is stored; the
checks are whole-array reductions (min / max), never a loop per element.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from strataio.errors import ArgumentError, DtypeMismatchError, ShapeMismatchError

_NEVER = "OUSVMm"  # object, strings, void, datetime, timedelta


def to_dtype(value: Any, dtype: np.dtype, what: str) -> np.ndarray:
    """``value`` as an array that converts to ``dtype`` without loss (same shape; not yet
    converted when the conversion is checked), or :class:`DtypeMismatchError` naming
    ``what`` (e.g. ``"dataset 'run/a'"``), the dtypes and an offending value; a value numpy
    makes no array of (nested lists of unequal lengths) is a :class:`ShapeMismatchError`."""
    if isinstance(value, np.ma.MaskedArray) and np.ma.is_masked(value):
        n = int(np.ma.count_masked(value))
        raise ArgumentError(
            f"{what}: the data is a masked array with {n} of its {value.size} elements masked; "
            "a dataset stores no mask: say what to store there, e.g. data.filled(fill_value)"
        )
    try:
        arr = np.asarray(value)
    except ValueError as exc:  # (numpy: "setting an array element with a sequence ...")
        raise ShapeMismatchError(f"{what}: the data is no rectangular array: {exc}") from None
    src = arr.dtype
    if src.kind == "f" and dtype.kind in "iu" and not isinstance(value, np.ndarray):
        arr = _ints_made_floats(value, arr)
        src = arr.dtype
    if src.kind == "O" and dtype.kind in "iu":
        arr = _python_ints(arr, dtype, what)
        src = arr.dtype
    if src == dtype or (src.kind not in _NEVER and np.can_cast(src, dtype, "safe")):
        return arr
    if src.kind in "iu" and dtype.kind == "b":
        _check_bits(arr, what, str(src))
        return arr
    ints = src.kind in "biu" and dtype.kind in "iu"
    if src.kind in _NEVER or not (ints or np.can_cast(src, dtype, "same_kind")):
        raise DtypeMismatchError(
            f"{what}: cannot store {src} data in {dtype} without loss; convert it "
            f"explicitly (e.g. data.astype({str(dtype)!r}))"
        )
    if arr.size == 0:
        return arr
    if ints:
        _check_int_range(arr, dtype, what, str(src))
        return arr
    if dtype.kind in "fc":
        _check_float_range(arr, dtype, what)
    return arr


def _ints_made_floats(value: Any, arr: np.ndarray) -> np.ndarray:
    """``value`` (not an array) as an object array of its ints where numpy made ``arr``,
    float64, of Python ints only because one lies beyond int64 (``[2**64 - 1, 1]``); else
    ``arr``. (Checked only where a value reaches 2**63: below it numpy keeps ints ints.)"""
    if not arr.size or not float(np.fmax.reduce(np.abs(arr), axis=None)) >= 2.0**63:
        return arr
    try:
        objs = np.asarray(value, dtype=object)
    except ValueError:
        return arr
    if objs.shape != arr.shape or not all(
        isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)) for x in objs.flat
    ):
        return arr
    return objs


def _python_ints(arr: np.ndarray, dtype: np.dtype, what: str) -> np.ndarray:
    """An object array of Python ints (numpy makes one of ints beyond 64 bits, such as
    ``2**64``) as ``dtype`` when every value fits it, else :class:`DtypeMismatchError` naming
    the value out of range; any other object array is returned as is (and refused)."""
    if arr.size == 0 or not all(
        isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)) for x in arr.flat
    ):
        return arr
    _check_int_range(arr, dtype, what, "a Python int")
    return arr.astype(dtype)


def _check_int_range(arr: np.ndarray, dtype: np.dtype, what: str, source: str) -> None:
    """Refuse integers ``arr`` (not empty) of which one lies outside ``dtype``'s range,
    naming it and its ``source`` type."""
    info = np.iinfo(dtype)
    lo, hi = int(arr.min()), int(arr.max())
    if lo < info.min or hi > info.max:
        bad = lo if lo < info.min else hi
        raise DtypeMismatchError(
            f"{what}: value {bad} ({source}) is out of range for {dtype} "
            f"({info.min}..{info.max}); nothing was stored"
        )


def _check_bits(arr: np.ndarray, what: str, source: str) -> None:
    """Refuse integers ``arr`` of which one is neither 0 nor 1, naming it."""
    if arr.size == 0:
        return
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi > 1:
        bad = lo if lo < 0 else hi
        raise DtypeMismatchError(
            f"{what}: value {bad} ({source}) is not 0 or 1, so not a bool (False or True); "
            "nothing was stored"
        )


def _check_float_range(arr: np.ndarray, dtype: np.dtype, what: str) -> None:
    """Refuse finite values that ``dtype`` would turn into ``inf``."""
    top = float(np.finfo(dtype).max)
    real = np.finfo(dtype).dtype  # float32 for complex64
    for part in (arr.real, arr.imag) if arr.dtype.kind == "c" else (arr,):
        hi, lo = np.fmax.reduce(part, axis=None), np.fmin.reduce(part, axis=None)
        if -top <= lo and hi <= top:  # also False when all are NaN: then checked below
            continue
        with np.errstate(over="ignore", invalid="ignore"):
            bad = np.isfinite(part) & np.isinf(part.astype(real))
        if bad.any():
            value = part[bad].flat[0]
            raise DtypeMismatchError(
                f"{what}: value {value} ({arr.dtype}) is beyond the range of {dtype} "
                f"(±{top:.6g}) and would be stored as inf; nothing was stored"
            )
