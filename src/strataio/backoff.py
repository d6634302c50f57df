"""Waits that try again: pauses that double between tries, within a deadline."""

from __future__ import annotations

import time

__all__ = ["Backoff"]


class Backoff:
    """The pauses of a wait of ``seconds`` at most: ``first`` s, doubling up to ``most``
    s between tries (:meth:`pause`); :attr:`expired` once the ``seconds`` have passed."""

    def __init__(self, seconds: float, first: float, most: float) -> None:
        self.deadline = time.monotonic() + seconds
        self._next = first
        self._most = most

    @property
    def expired(self) -> bool:
        return time.monotonic() > self.deadline

    def pause(self) -> None:
        """Sleep before the next try, each pause twice the one before (to the most)."""
        time.sleep(self._next)
        self._next = min(self._next * 2, self._most)
