"""Which processes aggregate: ROMIO's ``cb_config_list`` and ``cb_nodes`` (``cb_config_list.c``)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from strataio.collective.hints import parse_config_list
from strataio.errors import HintError


def config_aggregators(config: str, names: Sequence[str], limit: int) -> np.ndarray:
    """The ranks that aggregate, in realm order, as ROMIO chooses them (``cb_config_list.c``).

    ``config``: a ``cb_config_list`` (:func:`~strataio.collective.hints.parse_config_list`);
    ``names``: each rank's processor name (``MPI.Get_processor_name``); ``limit``: at most this
    many (``cb_nodes``). Entries are taken in order: ``host:n`` takes the first ``n`` ranks of
    ``host`` not yet taken; ``*:n`` goes through the hosts not named before, in order of their
    first rank, taking ``n`` from each; a count ``*`` takes them all. Once an entry has
    looked at a host, later ``*`` entries pass it by. Raises
    :class:`~strataio.errors.HintError` when the list names no rank (as ROMIO refuses the open).
    """
    nprocs = len(names)
    limit = max(0, min(int(limit), nprocs))
    if config.strip() == "*:*":
        return np.arange(limit, dtype=np.int64)
    chosen: list[int] = []
    used = [False] * nprocs  # a rank taken, or passed by with its host
    for host, count in parse_config_list(config):
        if len(chosen) >= limit:
            break
        hosts = [host] if host is not None else _unused_hosts(names, used)
        for h in hosts:
            want = limit if count is None else count
            for r in range(nprocs):
                if names[r] == h and not used[r]:
                    if want > 0 and len(chosen) < limit:
                        chosen.append(r)
                        want -= 1
                    used[r] = True
            if len(chosen) >= limit:
                break
    if not chosen:
        raise HintError(
            f"hint cb_config_list={config!r}: no process matches (processes run on "
            f"{', '.join(sorted(set(names)))})"
        )
    return np.asarray(chosen, dtype=np.int64)


def _unused_hosts(names: Sequence[str], used: list[bool]) -> list[str]:
    """Hosts with a rank not yet taken or passed by, in order of that rank."""
    return list(dict.fromkeys(n for n, u in zip(names, used) if not u))
