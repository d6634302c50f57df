"""How long the property tests and state machines hunt.

Each runs a budget of examples that keeps ``make test`` within CI's 15 minutes on two cores.
``STRATAIO_HUNT=N make test`` multiplies every budget by N (``STRATAIO_HUNT=10`` hunts ten
times as long, as before a release); ``pytest -m slow`` also runs the long variants kept
beside some of them. Hypothesis draws new examples on every run (none is derandomized), so
the short runs add up over CI's runs; a failing example it finds is kept in
``.hypothesis/`` and tried first on the next run on that machine.
"""

from __future__ import annotations

import os


def _multiplier(text: str) -> float:
    """``STRATAIO_HUNT``'s value as a positive number, or an error that names it."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise ValueError(f"STRATAIO_HUNT={text!r}: give a positive number (1 is the default)")
    return value


#: the multiplier of every budget (``STRATAIO_HUNT``, default 1)
HUNT = _multiplier(os.environ.get("STRATAIO_HUNT") or "1")


def examples(n: int) -> int:
    """``n`` examples times :data:`HUNT`, at least one."""
    return max(1, round(n * HUNT))
