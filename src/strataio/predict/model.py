"""I/O-time prediction: the multi-storage paper's equations (1) and (2) over strataio's methods.

Equation (1), the time of one native I/O call of ``s`` bytes::

    T(s) = T_conn + T_open + T_seek + T_read/write(s) + T_fileclose + T_connclose

Equation (2), the I/O time of a run of ``N`` steps over datasets ``j`` accessed every
``freq(j)`` steps::

    T = Σ_j (N / freq(j) + 1) · n(j) · t_j(s)

``n(j)`` native calls of ``s`` bytes per access, on the busiest process (processes work in
parallel, so an access lasts as long as its busiest process), ``t_j(s)`` the unit time from the
performance database (:class:`~strataio.predict.perfdb.PerfTable`) at the concurrency the access
runs with. ``N / freq(j) + 1`` is taken as ``N // freq(j) + 1``, the accesses of steps
``0 … N`` (:meth:`DatasetSpec.accesses`).

Which terms of equation (1) a call pays depends on the native interface. The paper's SRB calls
connect, open and close for every call. strataio's are cheaper: a :class:`strataio.File` is
opened and closed once per access (``open`` and ``close`` are charged once per access, not per
call), the write or read inside it is the measured transfer; a chunk is one whole-object put or
get whose measured time already includes what the tier's backend pays per object (the shaped
tiers' open and close among it), and the connection is set up once per process, outside any
access. So here ::

    time of one access = T_open + T_close + Σ_groups n · t(s)        (naive)
                       = T_open + T_view + T_close + Σ_groups n · t(s)   (collective)
                       = Σ_groups n · t(s)                           (chunked)

The methods (``n`` and ``s`` from the dataset's shape, pattern and the run); every rank takes
part in every access, so unit times are those measured with ``ranks`` processes at once:

- ``naive``: each rank writes or reads its block with one independent call per contiguous run
  (C order) of the block in the file; ``n`` = the busiest rank's runs, ``s`` = a run's bytes,
  ``t`` = the ``write`` / ``read`` series.
- ``collective``: two-phase I/O with ``cb_nodes`` aggregators, each owning a realm of
  ``ceil(D / cb_nodes)`` bytes of the dataset's ``D`` (ROMIO's even file domains), moved in
  windows of ``cb_buffer_size``: ``n`` = the windows of a realm, ``s`` = ``cb_buffer_size``
  (the last window: the rest), ``t`` = the ``write_all`` / ``read_all`` series (one collective
  call of one window through one aggregator, the exchange included). Aggregators work their
  windows in parallel, so a round of windows costs one window's time.
- ``chunked``: sub-filed chunks, one per rank's block (the chunk shape is the block shape), each
  written or read whole by its owner through collective dataset calls: ``n`` = 1, ``s`` = the
  block's bytes, ``t`` = the ``put`` / ``get`` series.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from strataio.predict.perfdb import PerfTable
from strataio.predict.workload import DatasetSpec, Workload

__all__ = [
    "Calls",
    "DatasetPrediction",
    "Prediction",
    "access_time",
    "equation1",
    "equation2",
    "native_calls",
    "predict",
    "predict_dataset",
]


def equation1(
    conn: float = 0.0,
    open: float = 0.0,
    seek: float = 0.0,
    transfer: float = 0.0,
    fileclose: float = 0.0,
    connclose: float = 0.0,
) -> float:
    """Equation (1): the seconds of one native call, the sum of its six terms."""
    return conn + open + seek + transfer + fileclose + connclose


def equation2(terms: list[tuple[int, int, int, float]]) -> float:
    """Equation (2): ``Σ_j (N / freq(j) + 1) · n(j) · t_j`` over ``(N, freq, n, t)`` terms,
    ``N / freq`` taken as the whole accesses ``N // freq``."""
    return sum((N // f + 1) * n * t for N, f, n, t in terms)


@dataclass(frozen=True, slots=True)
class Calls:
    """What one access of a dataset asks of its tier: ``groups`` of ``(n, s)`` native calls
    (``n`` calls of ``s`` bytes on the busiest process) of perf op ``op``, made by
    ``concurrency`` processes at once, plus the constant ops ``per_access`` paid once."""

    op: str
    groups: tuple[tuple[int, int], ...]
    concurrency: int
    per_access: tuple[str, ...]

    @property
    def n(self) -> int:
        return sum(n for n, _ in self.groups)

    @property
    def unit_size(self) -> int:
        """The size of the most frequent call (the ``s`` of equation (2))."""
        return max(self.groups)[1] if self.groups else 0


def native_calls(workload: Workload, ds: DatasetSpec) -> Calls:
    """The native calls one access of ``ds`` makes under the run's method (see module docs)."""
    run = workload.run
    part = workload.partition(ds)
    item = ds.dtype.itemsize
    write = ds.mode == "write"
    # (rank 0 is the busiest: its block is the whole block in every dimension, the others'
    # are as large or cut short; asking each of millions of ranks took minutes)
    if run.method == "naive":
        count, elems = part.runs(0)
        op = "write" if write else "read"
        return Calls(op, ((count, elems * item),), run.ranks, ("open", "close"))
    if run.method == "collective":
        aggr = min(run.cb_nodes, run.ranks)
        realm = -(-ds.nbytes // aggr)
        full, rest = divmod(realm, run.cb_buffer_size)
        groups = [(full, run.cb_buffer_size)] if full else []
        if rest:
            groups.append((1, rest))
        op = "write_all" if write else "read_all"
        return Calls(op, tuple(groups), run.ranks, ("open", "view", "close"))
    if run.method == "chunked":
        biggest = math.prod(part.shape(0)) * item
        return Calls("put" if write else "get", ((1, biggest),), run.ranks, ())
    raise ValueError(f"unknown method {run.method!r}")


def access_time(perf: PerfTable, tier: str, calls: Calls) -> float:
    """Seconds of one access: the constant ops once, then each group's ``n · t(s)``."""
    fixed = sum(perf.time(tier, op, 0, calls.concurrency) for op in calls.per_access)
    return fixed + sum(
        n * perf.time(tier, calls.op, s, calls.concurrency) for n, s in calls.groups if n
    )


@dataclass(frozen=True, slots=True)
class DatasetPrediction:
    """One row of the paper's Figure 11: the dataset, where it lives, and its predicted time."""

    spec: DatasetSpec
    tier: str
    accesses: int
    calls: Calls
    access_s: float

    @property
    def predicted_s(self) -> float:
        return self.accesses * self.access_s


@dataclass(frozen=True, slots=True)
class Prediction:
    """Equation (2) for a whole workload: one row per dataset and their sum."""

    workload: Workload
    datasets: tuple[DatasetPrediction, ...]

    @property
    def total_s(self) -> float:
        return sum(d.predicted_s for d in self.datasets)


def predict_dataset(workload: Workload, ds: DatasetSpec, perf: PerfTable) -> DatasetPrediction:
    """Equation (2)'s term of one dataset."""
    tier = workload.tier_of(ds)
    calls = native_calls(workload, ds)
    return DatasetPrediction(
        ds, tier, ds.accesses(workload.run.iterations), calls, access_time(perf, tier, calls)
    )


def predict(workload: Workload, perf: PerfTable) -> Prediction:
    """Predicted I/O seconds of ``workload`` per dataset and in total (equation (2));
    :class:`~strataio.predict.perfdb.UncalibratedError` if a tier it uses has no calibration."""
    return Prediction(
        workload, tuple(predict_dataset(workload, ds, perf) for ds in workload.datasets)
    )
