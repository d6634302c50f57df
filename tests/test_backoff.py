"""strataio.backoff: the pauses of a wait double up to their most, within a deadline."""

from __future__ import annotations

import strataio.backoff as backoff
from strataio.backoff import Backoff


def test_pauses_double_to_their_most_and_the_wait_expires(monkeypatch):
    now = [100.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    monkeypatch.setattr(backoff.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(backoff.time, "sleep", sleep)
    wait = Backoff(1.0, 0.1, 0.3)
    while not wait.expired:
        wait.pause()
    assert slept == [0.1, 0.2, 0.3, 0.3, 0.3]  # (1.2 s in all: past the 1 s allowed)
