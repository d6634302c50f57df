"""Shaped backend: any backend made to cost what a remote disk or a tape library costs.

:class:`Shaped` wraps a backend and, around every data access, sleeps for the time the
paper's equation (1) gives for one I/O call on the modelled resource::

    T(s) = T_conn + T_open + T_seek + s / bandwidth + T_fileclose + T_connclose

(X. Shen, A. Choudhary, C. Matarazzo, P. Sinha, "A distributed multi-storage resource
architecture and I/O performance prediction for scientific computing", §4.1). Every delay is
multiplied by ``time_scale``, so tests and benchmarks keep the model's proportions at a
fraction of its wall time, and ``time_scale=0`` only accounts. A shaped archive tier
(``remote_tape_2002``) stands in for a tape library in tests and benchmarks: each object access
mounts (``open``), and at most ``drives`` accesses proceed at once, the rest queue for a drive.

What is charged: ``get``/``put`` pay open + transfer + close (a whole object streams from its
start, no seek); ``read``/``write`` of Extents pay one seek per disjoint run of bytes as well.
Metadata calls (``size``, ``exists``, ``list``, ``delete``) only pay the connection setup.
The connection is set up once per backend (first request) and closed by ``close()``, or per
request with ``connect_per_request=True`` (the paper's SRB calls connect each time).

Presets (:data:`PRESETS`), from the paper's Table 1 (seconds; SRB access from Argonne's SP2 to
SDSC in 2002; "-" taken as 0):

==================  ======  ======  =================  =====================  =========
preset              conn    open    seek               close (read / write)   connclose
==================  ======  ======  =================  =====================  =========
remote_disk_2002    0.44    0.42    0.40 (read only)   0.63 / 0.83            0.0002
remote_tape_2002    0.81    6.17    -                  0.46 / 0.42            0.0002
==================  ======  ======  =================  =====================  =========

Bandwidth is not in Table 1 (the paper plots it in Figures 7 and 8, absent from its text). It
is derived from the worked example of equation (3): a 2 MB write to remote disk takes 8.47 s,
leaving 8.47 - 0.44 - 0.42 - 0.83 - 0.0002 = 6.78 s for 2 MiB, i.e. 0.309 MB/s. That rate is
used for both directions and both presets (tape data crossed the same SRB/WAN path; the tape's
own rate is an assumption). The tape preset has one drive; pass ``drives=`` to
:meth:`CostModel.from_preset` for a larger library.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import numbers
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from strataio.errors import ArgumentError
from strataio.layout.extents import Extents
from strataio.storage.base import Backend, BytesLike, Capabilities, Version


@dataclass(frozen=True, slots=True)
class OpCost:
    """Per-call costs of one direction (read or write); seconds, and bytes per second."""

    open: float = 0.0
    seek: float = 0.0
    close: float = 0.0
    bandwidth: float = math.inf

    def time(self, nbytes: int, seeks: int = 0) -> float:
        """Seconds for one call moving ``nbytes`` with ``seeks`` repositionings (no connection)."""
        return self.open + seeks * self.seek + nbytes / self.bandwidth + self.close


@dataclass(frozen=True, slots=True)
class CostModel:
    """Equation (1) of the multi-storage paper for one storage resource.

    ``connect`` / ``disconnect``: communication setup and teardown (s); ``read`` / ``write``:
    :class:`OpCost` per direction; ``drives``: accesses that can proceed at once (tape drives;
    None = unlimited); ``connect_per_request``: pay the connection on every call instead of
    once per backend.
    """

    name: str = "custom"
    connect: float = 0.0
    disconnect: float = 0.0
    read: OpCost = OpCost()
    write: OpCost = OpCost()
    drives: int | None = None
    connect_per_request: bool = False

    def __post_init__(self) -> None:
        if self.drives is not None and self.drives < 1:
            raise ArgumentError(f"CostModel {self.name!r}: drives must be >= 1 or None")
        for op in (self.read, self.write):
            if min(op.open, op.seek, op.close) < 0 or op.bandwidth <= 0:
                raise ArgumentError(f"CostModel {self.name!r}: negative time or bandwidth")

    def call_time(self, nbytes: int, *, write: bool = False, seeks: int = 0) -> float:
        """Seconds of one call per equation (1), connection included (as if per request)."""
        op = self.write if write else self.read
        return self.connect + op.time(nbytes, seeks) + self.disconnect

    @property
    def latency(self) -> float:
        """Fixed seconds of a small read (what :class:`Capabilities` calls latency)."""
        fixed = self.read.open + self.read.seek + self.read.close
        if self.connect_per_request:
            fixed += self.connect + self.disconnect
        return fixed

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> CostModel:
        """A model from :data:`PRESETS`, with fields replaced by ``overrides``;
        :class:`ArgumentError` naming the known presets for an unknown ``name``."""
        try:
            model = PRESETS[name]
        except (KeyError, TypeError):
            raise ArgumentError(
                f"unknown cost model preset {name!r}; known: {', '.join(sorted(PRESETS))}"
            ) from None
        return dataclasses.replace(model, **overrides) if overrides else model


# Table 1 of the multi-storage paper; the bandwidth derivation is in the module docstring.
_WAN_BANDWIDTH = (2 * (1 << 20)) / (8.47 - 0.44 - 0.42 - 0.83 - 0.0002)

PRESETS: dict[str, CostModel] = {
    "remote_disk_2002": CostModel(
        name="remote_disk_2002",
        connect=0.44,
        disconnect=0.0002,
        read=OpCost(open=0.42, seek=0.40, close=0.63, bandwidth=_WAN_BANDWIDTH),
        write=OpCost(open=0.42, seek=0.0, close=0.83, bandwidth=_WAN_BANDWIDTH),
    ),
    "remote_tape_2002": CostModel(
        name="remote_tape_2002",
        connect=0.81,
        disconnect=0.0002,
        read=OpCost(open=6.17, seek=0.0, close=0.46, bandwidth=_WAN_BANDWIDTH),
        write=OpCost(open=6.17, seek=0.0, close=0.42, bandwidth=_WAN_BANDWIDTH),
        drives=1,
    ),
}


class Drives:
    """``n`` drives handed out first come, first served (a tape library's mount queue; a plain
    semaphore would let one busy client keep re-taking a drive ahead of waiting ones)."""

    def __init__(self, n: int) -> None:
        self._free = n
        self._queue: deque[object] = deque()
        self._cond = threading.Condition()

    def __enter__(self) -> None:
        ticket = object()
        with self._cond:
            self._queue.append(ticket)
            while self._queue[0] is not ticket or self._free == 0:
                self._cond.wait()
            self._queue.popleft()
            self._free -= 1
            self._cond.notify_all()

    def __exit__(self, *exc: object) -> None:
        with self._cond:
            self._free += 1
            self._cond.notify_all()


@dataclass(frozen=True, slots=True)
class ShapedStats:
    """Counters since creation or :meth:`Shaped.reset_stats`.

    ``simulated``: model seconds charged (before ``time_scale``); ``drive_wait``: wall seconds
    spent queueing for a drive.
    """

    requests: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    connects: int = 0
    simulated: float = 0.0
    drive_wait: float = 0.0


class Shaped(Backend):
    """``inner`` with the delays of ``model`` (scaled by ``time_scale``) added to each call.

    ``model`` is a :class:`CostModel` or the name of one of :data:`PRESETS`; an unknown name
    or a ``time_scale`` that is not a finite number >= 0 raises :class:`ArgumentError`."""

    def __init__(self, inner: Backend, model: CostModel | str, time_scale: float = 1.0) -> None:
        if isinstance(model, str):
            model = CostModel.from_preset(model)
        if not isinstance(model, CostModel):
            raise ArgumentError(
                f"model must be a CostModel or a preset name ({', '.join(sorted(PRESETS))}), "
                f"got {model!r}"
            )
        if (
            not isinstance(time_scale, numbers.Real)
            or isinstance(time_scale, bool)
            or not 0 <= time_scale < math.inf
        ):
            raise ArgumentError(f"time_scale must be a finite number >= 0, got {time_scale!r}")
        self.inner = inner
        self.model = model
        self.time_scale = float(time_scale)
        self.url = f"shaped[{model.name}]:{inner.url}"
        inner_caps = inner.capabilities
        # below bandwidth x latency bytes, the fixed cost of a call dominates: merge requests
        bw = min(model.read.bandwidth, model.write.bandwidth)
        merge = int(bw * model.latency) if math.isfinite(bw) else 0
        self.capabilities = Capabilities(
            partial_write=inner_caps.partial_write,
            append=inner_caps.append,
            preferred_io_size=max(inner_caps.preferred_io_size, merge),
            latency=inner_caps.latency + model.latency * self.time_scale,
        )
        self._drives = Drives(model.drives) if model.drives is not None else None
        self._lock = threading.Lock()
        self._connected = False
        self._stats = ShapedStats()
        self._pool: ThreadPoolExecutor | None = None

    def __repr__(self) -> str:
        return f"Shaped({self.inner.url!r}, {self.model.name!r}, time_scale={self.time_scale})"

    # ----------------------------------------------------------------- accounting
    def stats(self) -> ShapedStats:
        with self._lock:
            return self._stats

    def reset_stats(self) -> None:
        with self._lock:
            self._stats = ShapedStats()

    def _add(self, **delta: float) -> None:
        with self._lock:
            s = self._stats
            self._stats = dataclasses.replace(s, **{k: getattr(s, k) + v for k, v in delta.items()})

    def _connection(self) -> float:
        """Seconds of connection setup/teardown this call pays."""
        m = self.model
        if m.connect_per_request:
            self._add(connects=1)
            return m.connect + m.disconnect
        with self._lock:
            if self._connected:
                return 0.0
            self._connected = True
        self._add(connects=1)
        return m.connect

    def _sleep(self, seconds: float) -> None:
        self._add(simulated=seconds)
        if self.time_scale > 0 and seconds > 0:
            time.sleep(seconds * self.time_scale)

    @contextlib.contextmanager
    def _drive(self) -> Iterator[None]:
        if self._drives is None:
            yield
            return
        t0 = time.perf_counter()
        with self._drives:
            self._add(drive_wait=time.perf_counter() - t0)
            yield

    def _access(self, op: OpCost, nbytes: int, seeks: int) -> None:
        """Charge one data access (the caller holds a drive)."""
        self._sleep(self._connection() + op.time(nbytes, seeks))

    @staticmethod
    def _runs(extents: Extents) -> int:
        return max(1, len(extents.union()))

    # ----------------------------------------------------------------- Backend
    def read(self, key: str, extents: Extents) -> BytesLike:
        with self._drive():
            out = self.inner.read(key, extents)
            self._access(self.model.read, extents.nbytes, self._runs(extents))
        self._add(requests=1, bytes_read=extents.nbytes)
        return out

    def write(self, key: str, extents: Extents, data: BytesLike) -> None:
        with self._drive():
            self.inner.write(key, extents, data)
            self._access(self.model.write, extents.nbytes, self._runs(extents))
        self._add(requests=1, bytes_written=extents.nbytes)

    def get(self, key: str) -> BytesLike:
        with self._drive():
            out = self.inner.get(key)
            n = memoryview(out).nbytes
            self._access(self.model.read, n, 0)
        self._add(requests=1, bytes_read=n)
        return out

    def put(self, key: str, data: BytesLike, *, durable: bool = False) -> None:
        self._put(self.inner.put, key, data, durable)

    # Reads here keep no versions (each reads its object whole, as the modelled store's
    # GET does), but the checks that keep two processes from deleting or replacing each
    # other's objects use the inner store's (object_versions).
    def put_versioned(self, key: str, data: BytesLike, *, durable: bool = False) -> Version | None:
        return self._put(self.inner.put_versioned, key, data, durable)

    def put_new(self, key: str, data: BytesLike, *, durable: bool = False) -> Version | None:
        return self._put(self.inner.put_new, key, data, durable)

    def put_if(
        self, key: str, data: BytesLike, version: Version | None, *, durable: bool = False
    ) -> Version | None:
        return self._put(functools.partial(self.inner.put_if, version=version), key, data, durable)

    def object_versions(self, keys: Sequence[str]) -> list[Version | None] | None:
        self._meta()
        return self.inner.object_versions(keys)

    def delete_if(self, key: str, version: Version) -> bool:
        self._meta()
        return self.inner.delete_if(key, version)

    def _put(self, put: Any, key: str, data: BytesLike, durable: bool) -> Any:
        """``put`` (the inner backend's) of ``data``, charged as one write; what it returns."""
        n = memoryview(data).nbytes
        with self._drive():
            got = put(key, data, durable=durable)
            self._access(self.model.write, n, 0)
        self._add(requests=1, bytes_written=n)
        return got

    def _meta(self) -> None:
        self._sleep(self._connection())
        self._add(requests=1)

    def size(self, key: str) -> int:
        self._meta()
        return self.inner.size(key)

    def exists(self, key: str) -> bool:
        self._meta()
        return self.inner.exists(key)

    def delete(self, key: str) -> None:
        self._meta()
        self.inner.delete(key)

    def list(self, prefix: str = "") -> Iterator[str]:
        self._meta()
        return self.inner.list(prefix)

    def remove_empty_folders(self, prefix: str) -> int:
        self._meta()
        return self.inner.remove_empty_folders(prefix)

    def sync(self, keys: Iterable[str] | None = None) -> None:
        self.inner.sync(keys)

    def key_problem(self, key: str) -> str:
        return self.inner.key_problem(key)

    def get_many(self, keys: Iterable[str]) -> list[BytesLike | None]:
        """Whole objects, overlapped up to ``drives`` at a time (8 when unlimited)."""
        keys = list(keys)

        def one(k: str) -> BytesLike | None:
            try:
                return self.get(k)
            except FileNotFoundError:
                return None

        if len(keys) < 2:
            return [one(k) for k in keys]
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.model.drives or 8, thread_name_prefix="shp")
            pool = self._pool
        return list(pool.map(one, keys))

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
            connected, self._connected = self._connected, False
        if pool is not None:
            pool.shutdown(wait=True)
        if connected and not self.model.connect_per_request:
            self._sleep(self.model.disconnect)
        self.inner.close()
