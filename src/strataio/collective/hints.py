"""I/O hints: ROMIO's names and defaults, parsed once into a typed, frozen :class:`Hints`.

Hints arrive as a dict or an ``MPI.Info`` (string values, as MPI passes them; ints and bools
are accepted too). Unknown keys are ignored, as MPI does (``striping_factor`` among them: a
node-local file system has no stripes to set); a known key with a value that cannot be used
raises :class:`~strataio.errors.HintError` naming the hint. Every hint :class:`Hints` holds
changes what happens; hints of engines strataio does not have yet (:data:`PLANNED`) are
refused with a :class:`~strataio.errors.HintError` rather than silently ignored. :meth:`Hints.as_dict`
gives every hint in force as strings, the way ``MPI_File_get_info`` reports them. Every rank
of a file must pass the same hints, as ROMIO requires: they decide which collective path a
call takes, and ranks on different paths would wait for each other forever. Only the hints
of a rank's own independent I/O (:data:`PER_RANK`: data sieving and its buffer sizes) may
differ.

Defaults are ROMIO's on a node-local UFS driver (``cb_buffer_size`` 16 MiB, one aggregator per
node, independent sieving buffers of 4 MiB for reads and 512 KiB for writes, sieving and
collective buffering ``automatic``), except ``romio_cb_ds_threshold``: ROMIO's ``0`` sieves
every two-phase window, strataio's ``automatic`` follows a rule measured on this machine. As in
ROMIO, ``romio_no_indep_rw=true`` turns collective
buffering on for reads and writes, and ``cb_nodes`` and ``cb_config_list`` are read at open
only (a view's hints cannot change the aggregators). ``strataio_*`` hints configure engines
ROMIO lacks; ``strataio_driver`` picks the storage driver
(:mod:`strataio.collective.driver`), whose ``strataio_driver_*`` parameters are only taken (and
only shown) with ``strataio_driver=shaped``.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mpi4py import MPI

from strataio.errors import HintError

__all__ = [
    "AUTOMATIC",
    "DISABLE",
    "ENABLE",
    "MAX_READ_THREADS",
    "PER_RANK",
    "PLANNED",
    "Hints",
    "differences",
    "parse_config_list",
    "parse_fr_type",
    "parse_hints",
]

ENABLE = "enable"
DISABLE = "disable"
AUTOMATIC = "automatic"
_SWITCH = (ENABLE, DISABLE, AUTOMATIC)
_TRUE = {"true", "1", "yes", "on", "enable"}
_FALSE = {"false", "0", "no", "off", "disable"}


@dataclass(frozen=True, slots=True)
class Hints:
    """The hints in force for one open file. Sizes are in bytes."""

    cb_buffer_size: int = 16777216
    """Collective buffer per aggregator per two-phase iteration."""
    cb_nodes: int = 1
    """Number of aggregators: at most this many of those ``cb_config_list`` names (clamped to
    the communicator size); an open file shows how many it got (ROMIO's default: one per
    node)."""
    romio_cb_read: str = AUTOMATIC
    romio_cb_write: str = AUTOMATIC
    romio_ds_read: str = AUTOMATIC
    """Data sieving for independent reads: enable / disable / automatic (cost model)."""
    romio_ds_write: str = AUTOMATIC
    ind_rd_buffer_size: int = 4194304
    """Largest span one sieving read covers."""
    ind_wr_buffer_size: int = 1048576
    """Largest span one sieving read-modify-write covers (and holds locked). ROMIO's default
    is 512 KiB; each span costs a lock, a read and a write from Python, and 1 MiB spans were
    faster on every HPIO write measured (open to close, new file, one process, ms at 512 KiB
    -> 1 MiB, median of 11: 4 KiB regions 19.3 -> 16.8, 512-byte regions 24.9 -> 22.7; at 2
    and 4 ranks within the runs' spread or faster; 2 MiB no better with several ranks)."""
    romio_no_indep_rw: bool = False
    """Promise that the file sees only collective I/O: only aggregators open it, collective
    calls always aggregate, and independent reads and writes raise
    :class:`~strataio.errors.HintError`."""
    cb_config_list: str = "*:1"
    """Which processes may aggregate, ROMIO's syntax: comma-separated ``host:n`` (``n``
    processes of that host; ``host`` alone means ``host:1``), ``*`` for every host not named
    yet, ``n = *`` for all of a host's processes (see :func:`parse_config_list`)."""
    striping_unit: int = 0
    """File system stripe size, 0 when unknown; realms align to it when
    ``romio_cb_fr_alignment`` is not set."""
    romio_cb_pfr: str = DISABLE
    """Persistent file realms: ``enable`` fixes striped realms at the first two-phase call
    until close (``collective.realms.striped``); ``disable`` / ``automatic``: per call."""
    romio_cb_fr_types: str = "aar"
    """Stripe of persistent realms: ``aar`` (the first call's aggregate access region over the
    aggregators), ``-1`` (the impending file size over the aggregators) or a size in bytes;
    once realms are fixed, the size chosen (as ROMIO writes it back). ROMIO's own source
    spells the key ``romio_cb_fr_type``; both are read."""
    romio_cb_fr_alignment: int = 1
    """Align realm boundaries (and persistent stripes) to this many bytes (1: to
    ``striping_unit`` when set, else none)."""
    strataio_realms: str = "even"
    """``even`` (ROMIO's per-call realms) or ``dynamic`` (with ``romio_cb_pfr=enable``:
    persistent realms recomputed when the view or the memory datatype changes)."""
    strataio_realm_cache: int = 64 * 1024 * 1024
    """Bytes of realm cache per aggregator with persistent realms (``romio_cb_pfr=enable`` at
    open; 0 otherwise, and shown so): LRU pages of the realm kept across collective calls,
    written back on ``sync``, ``close``, eviction and ``set_size``
    (:mod:`strataio.collective.realm_cache`). 0 disables it."""
    strataio_cb_overlap: str = AUTOMATIC
    """Two-phase aggregators read or write each window in an I/O thread while the next one is
    exchanged: enable / disable / automatic (when every node has a spare core per aggregator).
    Overlapping keeps two ``cb_buffer_size`` buffers per aggregator instead of one."""
    romio_cb_ds_threshold: str = AUTOMATIC
    """Data sieving inside two-phase I/O, per aggregator window: ROMIO's percent (0-100) of
    the window's covering extent that must be data for the window to be sieved (below it:
    one call per piece; a number outside 0-100 is refused); *automatic* (strataio's default;
    ROMIO's is 0, always sieve): the rule on the window's datatype extent and density
    measured on this machine (:func:`strataio.collective.fileio.window_spans`)."""
    strataio_pipeline_groups: int = 1
    """Pipelined collective I/O: the ranks in this many groups, each with about as many of
    the aggregators, taking turns at the file while the others exchange
    (:mod:`strataio.collective.pipeline`); an open file shows it clamped to ``cb_nodes``.
    1: plain two-phase I/O."""
    strataio_duplicate_writes: str = "error"
    """A collective write through indirection arrays (``File.write_items``) that names one
    index on several ranks: ``error`` (:class:`~strataio.errors.DuplicateWriteError` on every
    rank, nothing written) or ``last-rank`` (the highest rank's value is written)."""
    strataio_read_threads: str = AUTOMATIC
    """Threads a rank shares a read of 8 MiB or more among (POSIX driver): *automatic* (one
    more per core its node has to spare beside the job's processes there), or a number; at
    most :data:`MAX_READ_THREADS` (4) either way, 1 reads on the calling thread only. A larger
    number is taken as that many and shown so, as ``cb_nodes`` and
    ``strataio_pipeline_groups`` show the number in force; *automatic* is shown as given.
    The number in force is the driver's ``threads`` (it may differ between ranks)."""
    strataio_preallocate: str = AUTOMATIC
    """A write whose part past the end of the file is 256 KiB or more, and which fills at
    least 3/4 of its span, allocates that part first, in one ``fallocate`` (the size is left
    to the write): enable / disable / automatic (on ext4, where it made writes into a new file
    1.2-1.45 times as fast; elsewhere unmeasured, or slower: tmpfs). Read at open; a file
    system that refuses it turns it off for that file. Unsynced bytes then reach the disk at
    the kernel's pace even in a file truncated at open (:mod:`strataio.storage.preallocate`)."""
    strataio_driver: str = "posix"
    """Storage driver: ``posix``, or ``shaped`` (POSIX under a cost model)."""
    strataio_driver_bandwidth: int = 200_000_000
    """Shaped driver: bytes per second."""
    strataio_driver_latency: float = 0.0
    """Shaped driver: seconds per system call."""
    strataio_driver_concurrency: int = 0
    """Shaped driver: data calls of one process at once (0: no limit)."""
    strataio_driver_time_scale: float = 1.0
    """Shaped driver: factor on every delay (0: account the model's time, do not sleep)."""

    def as_dict(self) -> dict[str, str]:
        """Every hint in force, as MPI-style string values."""
        out = {}
        shaped = self.strataio_driver == "shaped"
        for f in dataclasses.fields(self):
            if f.name.startswith(_DRIVER_PARAM) and not shaped:
                continue  # (parameters of a driver not in use: they would change nothing)
            v = getattr(self, f.name)
            out[f.name] = ("true" if v else "false") if isinstance(v, bool) else str(v)
        return out

    def as_info(self) -> MPI.Info:
        """A new ``MPI.Info`` holding :meth:`as_dict` (the caller frees it)."""
        info = MPI.Info.Create()
        for k, v in self.as_dict().items():
            info.Set(k, v)
        return info


# name -> (kind, minimum); kinds: "int" (at least minimum), "float" (at least minimum),
# "switch", "bool", "str", "percent" (automatic or an int from minimum to 100, kept as text)
# and "count" (automatic or an int of at least minimum, kept as text)
_SPEC: dict[str, tuple[str, int]] = {
    "cb_buffer_size": ("int", 1),
    "cb_nodes": ("int", 1),
    "romio_cb_read": ("switch", 0),
    "romio_cb_write": ("switch", 0),
    "romio_ds_read": ("switch", 0),
    "romio_ds_write": ("switch", 0),
    "ind_rd_buffer_size": ("int", 1),
    "ind_wr_buffer_size": ("int", 1),
    "romio_no_indep_rw": ("bool", 0),
    "cb_config_list": ("str", 0),
    "striping_unit": ("int", 0),
    "romio_cb_pfr": ("switch", 0),
    "romio_cb_fr_types": ("frtype", 0),
    "romio_cb_fr_alignment": ("int", 1),
    "strataio_realms": ("str", 0),
    "strataio_realm_cache": ("int", 0),
    "strataio_cb_overlap": ("switch", 0),
    "romio_cb_ds_threshold": ("percent", 0),
    "strataio_pipeline_groups": ("int", 1),
    "strataio_duplicate_writes": ("str", 0),
    "strataio_read_threads": ("count", 1),
    "strataio_preallocate": ("switch", 0),
    "strataio_driver": ("str", 0),
    "strataio_driver_bandwidth": ("int", 1),
    "strataio_driver_latency": ("float", 0),
    "strataio_driver_concurrency": ("int", 0),
    "strataio_driver_time_scale": ("float", 0),
}

_DRIVER_PARAM = "strataio_driver_"
_DRIVERS = ("posix", "shaped")
_DUPLICATE_WRITES = ("error", "last-rank")

#: the smallest realm cache (bytes): its page table and a few pages
MIN_REALM_CACHE = 1024

#: most threads one rank's read is shared among (a few saturate a node's memory bandwidth):
#: ``strataio_read_threads`` above it is taken, and shown, as this many
MAX_READ_THREADS = 4

#: hints of engines not built yet -> what they would do; given, they raise HintError
PLANNED: dict[str, str] = {
    "strataio_trace": "I/O tracing",
}

#: hints read at open only: the aggregators (as in ROMIO), who opened the file, its driver
_OPEN_ONLY = (
    "cb_nodes",
    "strataio_realm_cache",
    "cb_config_list",
    "romio_no_indep_rw",
    "strataio_driver",
    "strataio_read_threads",
    "strataio_preallocate",
    "romio_cb_pfr",  # (persistent realms last from the first two-phase call to close)
    "romio_cb_fr_types",
)

#: other spellings read for a hint (ROMIO's source reads ``romio_cb_fr_type``)
_ALIASES = {"romio_cb_fr_type": "romio_cb_fr_types"}
#: hints strataio once had under another name: refused with the name to use
_RENAMED = {"strataio_realm_alignment": "romio_cb_fr_alignment"}


def hint_items(user: Mapping[str, Any] | MPI.Info | None) -> dict[str, Any]:
    """The hints ``user`` gives (a mapping, an ``MPI.Info`` or None) as a dict; anything
    else raises :class:`~strataio.errors.HintError`."""
    if user is None:
        return {}
    if isinstance(user, MPI.Info):
        if user == MPI.INFO_NULL:
            return {}
        out = {}
        for i in range(user.Get_nkeys()):
            key = user.Get_nthkey(i)
            out[key] = user.Get(key)
        return out
    if isinstance(user, Mapping):
        return {str(k): v for k, v in user.items()}
    raise HintError(f"hints must be a dict or MPI.Info, not {type(user).__name__}")


#: the largest integer hint: sizes and offsets are 64-bit signed integers (MPI_Offset)
_MAX_INT = 2**63 - 1


def _parse_int(name: str, value: Any, minimum: int, maximum: int | None = None) -> int:
    """``value`` as an integer of at least ``minimum`` and, given one, at most ``maximum`` (a
    percentage: the message then names the range)."""
    if isinstance(value, bool):
        raise HintError(f"hint {name}={value!r}: expected an integer")
    try:
        n = int(str(value).strip()) if not isinstance(value, int) else value
    except ValueError:
        raise HintError(f"hint {name}={value!r}: expected an integer") from None
    if maximum is not None and not minimum <= n <= maximum:
        raise HintError(f"hint {name}={value!r}: must be from {minimum} to {maximum}")
    if n < minimum:
        raise HintError(f"hint {name}={value!r}: must be at least {minimum}")
    if n > _MAX_INT:  # (taken, it would fail every transfer later, deep in the planning)
        raise HintError(f"hint {name}={value!r}: must be at most 2**63 - 1")
    return n


def parse_int_hint(name: str, value: Any, minimum: int) -> int:
    """``value`` of the integer hint ``name``: at least ``minimum`` and at most 2**63 - 1, else
    :class:`~strataio.errors.HintError` naming it (a bool, a fraction, a word)."""
    return _parse_int(name, value, minimum)


def _parse_float(name: str, value: Any, minimum: float) -> float:
    if isinstance(value, bool):
        raise HintError(f"hint {name}={value!r}: expected a number")
    try:
        x = float(str(value).strip()) if not isinstance(value, int | float) else float(value)
    except ValueError:
        raise HintError(f"hint {name}={value!r}: expected a number") from None
    if not x >= minimum or x == float("inf"):
        raise HintError(f"hint {name}={value!r}: must be a finite number of at least {minimum}")
    return x


def _parse(name: str, kind: str, minimum: int, value: Any) -> Any:
    if kind == "int":
        return _parse_int(name, value, minimum)
    if kind == "float":
        return _parse_float(name, value, minimum)
    if kind == "frtype":
        return parse_fr_type(value)
    if kind in ("percent", "count"):  # automatic, or an integer (ROMIO reads it with atoi)
        if str(value).strip().lower() == AUTOMATIC:
            return AUTOMATIC
        return str(_parse_int(name, value, minimum, 100 if kind == "percent" else None))
    text = str(value).strip().lower() if not isinstance(value, bool) else str(value).lower()
    if kind == "switch":
        if value is True:
            return ENABLE
        if value is False:
            return DISABLE
        if text not in _SWITCH:
            raise HintError(f"hint {name}={value!r}: expected one of {', '.join(_SWITCH)}")
        return text
    if kind == "bool":
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise HintError(f"hint {name}={value!r}: expected true or false")
    raw = str(value).strip()
    if not raw:
        raise HintError(f"hint {name}: empty value")
    return raw


def parse_fr_type(value: Any) -> str:
    """``romio_cb_fr_types`` in canonical form: ``aar`` (also ``0``, ROMIO's
    ``ADIOI_FR_AAR``), ``-1`` (also ``fsize``: ``ADIOI_FR_FSZ``, the impending file size) or
    a positive byte count of at most 2**63 - 1; else :class:`~strataio.errors.HintError`."""
    text = str(value).strip().lower()
    if text in ("aar", "0"):
        return "aar"
    if text in ("-1", "fsize"):
        return "-1"
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1 or isinstance(value, bool):
        raise HintError(
            f"hint romio_cb_fr_types={value!r}: expected aar, -1 (file size) or a positive "
            "realm size in bytes"
        )
    if n > _MAX_INT:  # (taken, the first two-phase call would fail, and close after it)
        raise HintError(f"hint romio_cb_fr_types={value!r}: must be at most 2**63 - 1")
    return str(n)


def parse_config_list(text: str) -> list[tuple[str | None, int | None]]:
    """``cb_config_list`` as ``(host, count)`` entries in order: host None for ``*`` (every
    host not yet named), count None for ``*`` (all its processes). Raises
    :class:`~strataio.errors.HintError` for a list ROMIO would not read in full (an empty
    entry, a count that is not a number, a host with a ``*`` in it)."""
    entries: list[tuple[str | None, int | None]] = []
    for item in text.split(","):
        host, colon, count = item.strip().partition(":")
        host, count = host.strip(), count.strip()
        if not host or (colon and not count) or ("*" in host and host != "*") or ":" in count:
            raise HintError(
                f"hint cb_config_list={text!r}: entry {item!r} is not host[:count] "
                "(host a name or *, count a number or *)"
            )
        n: int | None = 1
        if count == "*":
            n = None
        elif count:
            n = _parse_int("cb_config_list", count, 0)
        entries.append((None if host == "*" else host, n))
    return entries


def parse_hints(
    user: Mapping[str, Any] | MPI.Info | None,
    nprocs: int = 1,
    base: Hints | None = None,
    nodes: int = 1,
) -> Hints:
    """Hints in force for ``user``'s settings on a communicator of ``nprocs`` processes on
    ``nodes`` nodes, over ``base`` (the hints already in force; default: ROMIO's defaults).

    Unknown keys are ignored. Without ``base`` (at open) ``cb_nodes`` is the most aggregators
    ``cb_config_list`` may name, clamped to ``nprocs``: by default ``nodes`` (one per node)
    under the default list, ``nprocs`` under a list the user gives (the open file replaces it
    with the number it got: :func:`strataio.collective.realms.config_aggregators`). Over a
    ``base`` (a view's hints) ``cb_nodes`` and ``cb_config_list`` are ignored, as ROMIO does,
    and so are ``romio_no_indep_rw`` and the driver hints (they decided how the file was
    opened). ``romio_no_indep_rw=true`` sets ``romio_cb_read`` and ``romio_cb_write`` to
    ``enable``, as ROMIO does. Hints with an upper limit on what is used show the value in
    force, as ROMIO shows ``cb_nodes``: ``strataio_read_threads`` at most
    :data:`MAX_READ_THREADS`, ``strataio_pipeline_groups`` at most ``cb_nodes``.
    Raises :class:`~strataio.errors.HintError` for a known hint with an unusable value and for
    hints of :data:`PLANNED` engines.
    """
    values: dict[str, Any] = {}
    for key, raw in hint_items(user).items():
        key = _ALIASES.get(key, key)
        if key in _RENAMED:
            raise HintError(f"hint {key}={raw!r} is now called {_RENAMED[key]}")
        if key in PLANNED:
            raise HintError(
                f"hint {key}={raw!r}: {PLANNED[key]} is not supported yet; remove the hint"
            )
        spec = _SPEC.get(key)
        if spec is None or (base is not None and key.startswith(_OPEN_ONLY)):
            continue
        values[key] = _parse(key, spec[0], spec[1], raw)
    if "cb_config_list" in values:
        parse_config_list(values["cb_config_list"])
    if 0 < values.get("strataio_realm_cache", 0) < MIN_REALM_CACHE:
        raise HintError(
            f"hint strataio_realm_cache={values['strataio_realm_cache']}: a realm cache needs "
            f"at least {MIN_REALM_CACHE} bytes (0 disables it)"
        )
    dup = values.get("strataio_duplicate_writes")
    if dup is not None:
        dup = values["strataio_duplicate_writes"] = dup.lower()
    if dup is not None and dup not in _DUPLICATE_WRITES:
        raise HintError(
            f"hint strataio_duplicate_writes={dup!r}: expected one of {', '.join(_DUPLICATE_WRITES)}"
        )
    driver = values.get("strataio_driver", base.strataio_driver if base else "posix")
    if driver not in _DRIVERS:
        raise HintError(f"hint strataio_driver={driver!r}: expected one of {', '.join(_DRIVERS)}")
    stray = sorted(k for k in values if k.startswith(_DRIVER_PARAM))
    if stray and driver != "shaped":
        raise HintError(
            f"hint {stray[0]} configures the shaped driver: it needs strataio_driver=shaped"
        )
    if values.get("romio_no_indep_rw") or (base is not None and base.romio_no_indep_rw):
        values["romio_cb_read"] = values["romio_cb_write"] = ENABLE
    if base is None:
        limit = values.get("cb_nodes", nprocs if "cb_config_list" in values else nodes)
        values["cb_nodes"] = min(limit, max(int(nprocs), 1))
        base = Hints()
    threads = values.get("strataio_read_threads", AUTOMATIC)
    if threads != AUTOMATIC and int(threads) > MAX_READ_THREADS:  # (shown as taken)
        values["strataio_read_threads"] = str(MAX_READ_THREADS)
    if "strataio_pipeline_groups" in values:  # (a group per aggregator at most)
        values["strataio_pipeline_groups"] = min(
            values["strataio_pipeline_groups"], values.get("cb_nodes", base.cb_nodes)
        )
    return dataclasses.replace(base, **values)


def check_hint(key: str, value: Any) -> None:
    """Raise :class:`~strataio.errors.HintError` where ``value`` is no value hint ``key``
    takes, judged alone: the rules between hints (a shaped driver's parameters need
    ``strataio_driver=shaped``, which a caller may add) are :func:`parse_hints`'s, with all
    of them. Unknown keys pass, as in :func:`parse_hints`."""
    alone = {key: value}
    if key.startswith(_DRIVER_PARAM):
        alone["strataio_driver"] = "shaped"
    parse_hints(alone)


#: hints that only shape a rank's own I/O: they may differ between ranks
PER_RANK = frozenset(
    {
        "romio_ds_read",
        "romio_ds_write",
        "ind_rd_buffer_size",
        "ind_wr_buffer_size",
        "strataio_read_threads",
        "strataio_preallocate",
    }
)


_SHARED = tuple(f.name for f in dataclasses.fields(Hints) if f.name not in PER_RANK)


def shared_digest(hints: Hints) -> int:
    """A 62-bit digest of the hints other than :data:`PER_RANK`: equal on two ranks when (up
    to a collision of 2**-62) :func:`differences` finds nothing, so one ``Allreduce`` of it
    checks a communicator."""
    text = repr(tuple(getattr(hints, name) for name in _SHARED)).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") >> 2


def differences(mine: Hints, reference: Hints) -> str:
    """The hints other than :data:`PER_RANK` whose values differ between ``mine`` and
    ``reference`` ("" when none), e.g. ``cb_buffer_size=1048576 (against 4194304)``."""
    a, b = mine.as_dict(), reference.as_dict()
    return ", ".join(
        f"{k}={a[k]} (against {b[k]})" for k in a if a[k] != b[k] and k not in PER_RANK
    )
