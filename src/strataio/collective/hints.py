"""I/O hints: ROMIO's names and defaults, parsed once into a typed, frozen :class:`Hints`.

Hints arrive as a dict or an ``MPI.Info`` (string values, as MPI passes them; ints and bools
are accepted too). Unknown keys are ignored, as MPI does; a known key with a value that cannot
be used raises :class:`~strataio.errors.HintError` naming the hint. :meth:`Hints.as_dict`
gives every hint in force as strings, the way ``MPI_File_get_info`` reports them. Every rank
of a file must pass the same hints, as ROMIO requires: they decide which collective path a
call takes, and ranks on different paths would wait for each other forever. Only the hints
of a rank's own independent I/O (:data:`PER_RANK`: data sieving and its buffer sizes) may
differ.

Defaults are ROMIO's on a node-local UFS driver (``cb_buffer_size`` 16 MiB, one aggregator per
node, independent sieving buffers of 4 MiB for reads and 512 KiB for writes, sieving and
collective buffering ``automatic``). ``strataio_*`` hints configure engines ROMIO lacks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mpi4py import MPI

from strataio.errors import HintError

__all__ = ["AUTOMATIC", "DISABLE", "ENABLE", "PER_RANK", "Hints", "differences", "parse_hints"]

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
    """Number of aggregators (clamped to the communicator size); a file opened without it gets
    one per node (see :func:`parse_hints`)."""
    romio_cb_read: str = AUTOMATIC
    romio_cb_write: str = AUTOMATIC
    romio_ds_read: str = AUTOMATIC
    """Data sieving for independent reads: enable / disable / automatic (cost model)."""
    romio_ds_write: str = AUTOMATIC
    ind_rd_buffer_size: int = 4194304
    """Largest span one sieving read covers."""
    ind_wr_buffer_size: int = 524288
    """Largest span one sieving read-modify-write covers (and holds locked)."""
    romio_no_indep_rw: bool = False
    """Promise that the file sees only collective I/O (deferred open on non-aggregators)."""
    cb_config_list: str = "*:1"
    romio_cb_pfr: str = DISABLE
    """Persistent file realms: keep the realms of the first collective call."""
    romio_cb_fr_types: str = "aar"
    """How file realms are laid out (ROMIO: ``aar``, aggregate access region)."""
    romio_cb_fr_alignment: int = 1
    romio_cb_ds_threshold: int = 0
    striping_unit: int = 0
    """File system stripe size, 0 when unknown; realms align to it when set."""
    striping_factor: int = 0
    strataio_realms: str = "even"
    """File-realm policy of two-phase I/O (see ``collective.realms``)."""
    strataio_realm_alignment: int = 0
    """Align realm boundaries to this many bytes (0: ``striping_unit`` or none)."""
    strataio_cb_overlap: str = AUTOMATIC
    """Two-phase aggregators read or write each window in an I/O thread while the next one is
    exchanged: enable / disable / automatic (when every node has a spare core per aggregator).
    Overlapping keeps two ``cb_buffer_size`` buffers per aggregator instead of one."""
    strataio_pipeline_groups: int = 1
    strataio_cache: str = DISABLE
    strataio_trace: str = DISABLE

    def as_dict(self) -> dict[str, str]:
        """Every hint in force, as MPI-style string values."""
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            out[f.name] = ("true" if v else "false") if isinstance(v, bool) else str(v)
        return out

    def as_info(self) -> MPI.Info:
        """A new ``MPI.Info`` holding :meth:`as_dict` (the caller frees it)."""
        info = MPI.Info.Create()
        for k, v in self.as_dict().items():
            info.Set(k, v)
        return info


# name -> (kind, minimum); kinds: "int" (at least minimum), "switch", "bool", "str"
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
    "romio_cb_pfr": ("switch", 0),
    "romio_cb_fr_types": ("str", 0),
    "romio_cb_fr_alignment": ("int", 1),
    "romio_cb_ds_threshold": ("int", 0),
    "striping_unit": ("int", 0),
    "striping_factor": ("int", 0),
    "strataio_realms": ("str", 0),
    "strataio_realm_alignment": ("int", 0),
    "strataio_cb_overlap": ("switch", 0),
    "strataio_pipeline_groups": ("int", 1),
    "strataio_cache": ("switch", 0),
    "strataio_trace": ("switch", 0),
}


def _items(user: Mapping[str, Any] | MPI.Info | None) -> dict[str, Any]:
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


def _parse_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool):
        raise HintError(f"hint {name}={value!r}: expected an integer")
    try:
        n = int(str(value).strip()) if not isinstance(value, int) else value
    except ValueError:
        raise HintError(f"hint {name}={value!r}: expected an integer") from None
    if n < minimum:
        raise HintError(f"hint {name}={value!r}: must be at least {minimum}")
    return n


def _parse(name: str, kind: str, minimum: int, value: Any) -> Any:
    if kind == "int":
        return _parse_int(name, value, minimum)
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


def parse_hints(
    user: Mapping[str, Any] | MPI.Info | None,
    nprocs: int = 1,
    base: Hints | None = None,
    nodes: int = 1,
) -> Hints:
    """Hints in force for ``user``'s settings on a communicator of ``nprocs`` processes on
    ``nodes`` nodes, over ``base`` (the hints already in force; default: ROMIO's defaults,
    ``cb_nodes`` one aggregator per node).

    Unknown keys are ignored; ``cb_nodes`` is clamped to ``nprocs``. Raises
    :class:`~strataio.errors.HintError` for a known hint with an unusable value.
    """
    values: dict[str, Any] = {}
    for key, raw in _items(user).items():
        spec = _SPEC.get(key)
        if spec is None:
            continue
        values[key] = _parse(key, spec[0], spec[1], raw)
    base = Hints(cb_nodes=max(int(nodes), 1)) if base is None else base
    values["cb_nodes"] = min(values.get("cb_nodes", base.cb_nodes), max(int(nprocs), 1))
    return dataclasses.replace(base, **values)


#: hints that only shape a rank's own independent I/O: they may differ between ranks
PER_RANK = frozenset(
    {"romio_ds_read", "romio_ds_write", "ind_rd_buffer_size", "ind_wr_buffer_size"}
)


def differences(mine: Hints, reference: Hints) -> str:
    """The hints other than :data:`PER_RANK` whose values differ between ``mine`` and
    ``reference`` ("" when none), e.g. ``cb_buffer_size=1048576 (against 4194304)``."""
    a, b = mine.as_dict(), reference.as_dict()
    return ", ".join(
        f"{k}={a[k]} (against {b[k]})" for k in a if a[k] != b[k] and k not in PER_RANK
    )
