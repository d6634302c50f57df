"""The Astro3D pipeline, the multi-storage paper's application (its Figure 2 and Table 2), as
strataio runs it: one producer and three consumers over the storage hierarchy.

- **Astro3D**, the producer: at steps ``0 … iterations`` it writes, every ``freq`` steps, the
  analysis datasets (``press temp rho ux uy uz``, float32), the visualization datasets
  (``vr_*``, uint8) and the checkpoint datasets (``restart_*``, float32; rewritten in place,
  the paper's ``over_write``). Each is a cube of ``size`` elements a side, block-distributed
  over the ranks (pattern ``BBB``, :class:`~strataio.predict.workload.Partition`); each
  dump is one collective ``write_all`` of every rank's block into a Session dataset chunked by
  the block, so one dump of one dataset is one chunk per rank. The analysis and visualization
  datasets keep every dump (shape ``(dumps, size, size, size)``).
- **MSE analysis**: reads the ``temp`` dumps in order and computes, for each pair of
  consecutive dumps, the mean and the maximum square error (the paper names it "Maximum
  Square Error").
- **Volren**, a volume-rendering stand-in: reads each ``vr_temp`` dump and projects it along
  its last axis (maximum intensity) into one 2-D ``uint8`` image per dump, written into a
  superfile (rank 0, which gathers the image).
- **viewer**: reads the images back from the superfile (a fresh session, so the first read
  brings the container from its tier).

Placement follows one of the paper's Figure 9 scenarios (:data:`SCENARIOS`). A DISABLEd
dataset is created but not dumped (the paper: "this dataset not be dumped"; the producer asks
the dataset's hint and skips the call, which strataio would otherwise accept and drop after the
collective exchange), and a consumer whose input is DISABLEd does not run. Only I/O is timed, between barriers (so an access lasts as long
as its slowest rank): the producer's ``write_all`` + ``flush``, the consumers' ``read_all``,
the superfile's puts and its close, the viewer's gets.

The field values are a function of the global index and the step (:func:`field`), so a test can
recompute with numpy what each consumer must find.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

import numpy as np

__all__ = [
    "ANALYSIS",
    "CHECKPOINT",
    "SCENARIOS",
    "VISUAL",
    "DemoParams",
    "expected_images",
    "expected_mse",
    "field",
    "image_digest",
    "placement",
    "render",
]

ANALYSIS = ("press", "temp", "rho", "ux", "uy", "uz")
VISUAL = ("vr_scalar", "vr_press", "vr_rho", "vr_temp", "vr_mach", "vr_ek", "vr_logrho")
CHECKPOINT = tuple(f"restart_{v}" for v in ANALYSIS)
ALL = ANALYSIS + VISUAL + CHECKPOINT

#: the paper's Figure 9: scenario -> (what it does, hint of each dataset)
SCENARIOS: dict[int, tuple[str, Callable[[str], str]]] = {
    1: ("all datasets to remote tapes", lambda n: "REMOTETAPE"),
    2: (
        "temp to remote disks, all others to remote tapes",
        lambda n: "REMOTEDISK" if n == "temp" else "REMOTETAPE",
    ),
    3: (
        "only temp and press, to remote disks (others DISABLE)",
        lambda n: "REMOTEDISK" if n in ("temp", "press") else "DISABLE",
    ),
    4: (
        "vr_temp to local disks, all others to remote tapes",
        lambda n: "LOCALDISK" if n == "vr_temp" else "REMOTETAPE",
    ),
    5: (
        "only vr_temp to local disks and vr_press to remote disks",
        lambda n: {"vr_temp": "LOCALDISK", "vr_press": "REMOTEDISK"}.get(n, "DISABLE"),
    ),
}


def placement(scenario: int, name: str) -> str:
    """The location hint of dataset ``name`` in Figure 9's ``scenario``."""
    return SCENARIOS[scenario][1](name)


@dataclass(frozen=True, slots=True)
class DemoParams:
    """The run-time parameters (the paper's Table 2: 128³, 120 iterations, every 6)."""

    size: int = 128
    iterations: int = 120
    freq: int = 6
    ranks: int = 4

    @property
    def dumps(self) -> int:
        """Dumps of each dataset: steps ``0 … iterations`` every ``freq`` (``N // freq + 1``)."""
        return self.iterations // self.freq + 1

    @property
    def dims(self) -> tuple[int, int, int]:
        return (self.size,) * 3


# -- the data -------------------------------------------------------------------------------


def field(name: str, dump: int, box: tuple[slice, ...]) -> np.ndarray:
    """Dataset ``name``'s values at dump ``dump`` over the global index ``box`` (3 slices):
    float32 for analysis and checkpoint datasets, uint8 for visualization ones."""
    base = name.removeprefix("vr_").removeprefix("restart_")
    phase = (sum(map(ord, base)) % 17) / 17.0
    x, y, z = np.ogrid[box[0], box[1], box[2]]
    t = 0.1 * dump
    v = (
        np.sin(0.21 * x + t + phase) * np.cos(0.17 * y - 0.5 * t) + 0.5 * np.sin(0.13 * z + phase)
    ).astype(np.float32)
    if name.startswith("vr_"):
        return np.clip((v + 1.5) * 85.0, 0, 255).astype(np.uint8)
    return v


def render(block: np.ndarray) -> np.ndarray:
    """Volren's projection of a ``vr_*`` block: maximum along the last axis (uint8, 2-D)."""
    return block.max(axis=2)


def image_digest(image: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(image, dtype=np.uint8).tobytes()).hexdigest()[:16]


def expected_mse(params: DemoParams) -> list[tuple[float, float]]:
    """(mean, max) square error of consecutive ``temp`` dumps, by numpy on whole arrays."""
    whole = tuple(slice(0, params.size) for _ in range(3))
    steps = [field("temp", k, whole).astype(np.float64) for k in range(params.dumps)]
    return [
        (float(np.mean((b - a) ** 2)), float(np.max((b - a) ** 2)))
        for a, b in zip(steps, steps[1:])
    ]


def expected_images(params: DemoParams) -> list[str]:
    """Digests of Volren's images, by numpy on whole arrays."""
    whole = tuple(slice(0, params.size) for _ in range(3))
    return [image_digest(render(field("vr_temp", k, whole))) for k in range(params.dumps)]


# -- the ranks' side ------------------------------------------------------------------------


class _Clock:
    """I/O seconds per component, timed between barriers on every rank (rank 0's count)."""

    def __init__(self, comm: Any) -> None:
        self.comm = comm
        self.seconds: dict[str, float] = {}

    def timed(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``, its seconds added to component ``what``."""
        out, seconds = _between_barriers(self.comm, fn, *args)
        self.seconds[what] = self.seconds.get(what, 0.0) + seconds
        return out


def _between_barriers(comm: Any, fn: Callable[..., Any], *args: Any) -> tuple[Any, float]:
    """``fn(*args)`` on every rank, and its seconds from a barrier before to one after."""
    comm.Barrier()
    t0 = time.perf_counter()
    out = fn(*args)
    comm.Barrier()
    return out, time.perf_counter() - t0


def _produce(session: Any, params: DemoParams, scenario: int, box: tuple, clock: _Clock) -> None:
    """Astro3D: every dataset, every ``freq`` steps, one collective write of each block."""
    from strataio.predict.workload import Partition

    part = Partition.of(params.dims, "BBB", params.ranks)
    made = {}
    for name in ALL:
        series = not name.startswith("restart_")
        dtype = "uint8" if name.startswith("vr_") else "float32"
        shape = ((params.dumps,) if series else ()) + params.dims
        chunks = ((1,) if series else ()) + part.block
        made[name] = session.create_dataset(
            f"s{scenario}/{name}", shape, dtype, chunks, hint=placement(scenario, name)
        )
    step_box = box if any(s.stop > s.start for s in box) else None
    for step in range(params.iterations + 1):
        if step % params.freq:
            continue  # the computation of a step: not I/O, not modelled
        k = step // params.freq
        for name, ds in made.items():
            if ds.hint == "DISABLE":
                continue  # "this dataset not be dumped": the application asks, and skips it
            data = field(name, k, box)
            sel = None
            if step_box is not None:
                sel = ((k,) if ds.ndim == 4 else ()) + tuple(step_box)
            clock.timed("producer", _dump, ds, sel, data)
        _progress(session.comm, 1)
    for ds in made.values():
        ds.close()


def _dump(ds: Any, selection: Any, data: np.ndarray) -> None:
    """One dump of one dataset: the collective write, made durable."""
    ds.write_all(selection, data)
    ds.flush()


def _put_image(sf: Any, k: int | None, image: np.ndarray | None) -> None:
    """Rank 0 puts image ``k`` into the superfile (``k`` None: closes it); others do nothing."""
    if sf is None:
        return
    if k is None:
        sf.close()
    else:
        sf.put(f"image_{k:04d}", image)


def _analysis(session: Any, params: DemoParams, scenario: int, box: tuple, clock: _Clock) -> list:
    """MSE of consecutive ``temp`` dumps: (mean, max) square error per pair."""
    from mpi4py import MPI

    comm = session.comm
    ds = session.open_dataset(f"s{scenario}/temp")
    n = math.prod(params.dims)
    out, prev = [], None
    for k in range(params.dumps):
        block = clock.timed("analysis", ds.read_all, (k, *box))
        cur = block.astype(np.float64)
        if prev is not None:
            sq = (cur - prev) ** 2
            total = comm.allreduce(float(sq.sum()), op=MPI.SUM)
            peak = comm.allreduce(float(sq.max()) if sq.size else 0.0, op=MPI.MAX)
            out.append((total / n, peak))
        prev = cur
        _progress(comm, 1)
    ds.close()
    return out


def _volren(
    session: Any, sf: Any, params: DemoParams, scenario: int, box: tuple, clock: _Clock
) -> list[str]:
    """Volren: read each ``vr_temp`` dump, project it, rank 0 writes the image (superfile)."""
    from mpi4py import MPI

    comm = session.comm
    ds = session.open_dataset(f"s{scenario}/vr_temp")
    digests = []
    for k in range(params.dumps):
        block = clock.timed("volren", ds.read_all, (k, *box))
        partial = np.zeros(params.dims[:2], dtype=np.uint8)
        if block.size:
            partial[box[0], box[1]] = render(block)
        image = np.zeros_like(partial) if comm.Get_rank() == 0 else None
        comm.Reduce(partial, image, op=MPI.MAX, root=0)
        clock.timed("volren", _put_image, sf, k, image)
        if image is not None:
            digests.append(image_digest(image))
        _progress(comm, 1)
    ds.close()
    clock.timed("volren", _put_image, sf, None, None)
    return digests


def _view(config: Any, params: DemoParams, scenario: int, clock: _Clock) -> list[str]:
    """The viewer (rank 0, a session of its own): read every image back."""
    from strataio.session import Session

    digests: list[str] = []
    session = Session(config) if clock.comm.Get_rank() == 0 else None

    def read() -> None:
        if session is None:
            return
        with session.superfile(f"s{scenario}/images", "r") as sf:
            for k in range(params.dumps):
                digests.append(image_digest(np.asarray(sf.get(f"image_{k:04d}"))))

    clock.timed("viewer", read)
    if session is not None:
        session.close()
    _progress(clock.comm, params.dumps)
    return digests


def _progress(comm: Any, k: int) -> None:
    if comm.Get_rank() == 0:
        print(json.dumps({"progress": k}), flush=True)


def run_scenario(config_path: str, params: DemoParams, scenario: int) -> dict[str, Any]:
    """Run the pipeline of ``scenario`` on the ranks of ``COMM_WORLD`` (every rank calls it);
    rank 0's result: measured seconds per component, the MSE pairs, the image digests as
    Volren wrote them and as the viewer read them. The scenario's datasets are deleted after."""
    from mpi4py import MPI

    from strataio.config import load_config
    from strataio.predict.workload import Partition
    from strataio.session import Session

    comm = MPI.COMM_WORLD
    config = load_config(config_path)
    box = Partition.of(params.dims, "BBB", params.ranks).box(comm.Get_rank())
    clock = _Clock(comm)
    result: dict[str, Any] = {"scenario": scenario, "mse": [], "images": [], "viewed": []}
    with Session(config, comm=comm, stage_on_read=False) as session:
        _produce(session, params, scenario, box, clock)
        if placement(scenario, "temp") != "DISABLE":
            result["mse"] = _analysis(session, params, scenario, box, clock)
        volren = placement(scenario, "vr_temp") != "DISABLE"
        if volren:
            # the image superfile is placed where its input is; it belongs to rank 0
            writer = Session(config) if comm.Get_rank() == 0 else None
            sf = None
            if writer is not None:
                sf = writer.superfile(f"s{scenario}/images", hint=placement(scenario, "vr_temp"))
            result["images"] = _volren(session, sf, params, scenario, box, clock)
            if writer is not None:
                writer.close()
            result["viewed"] = _view(config, params, scenario, clock)
        comm.Barrier()
        for name in (*ALL, "images"):
            if name != "images" or volren:
                session.delete_dataset(f"s{scenario}/{name}")
    result["measured"] = clock.seconds
    return result


#: the location hint that sends a dataset to a tier of each role
ROLE_HINTS = {"localdisk": "LOCALDISK", "remotedisk": "REMOTEDISK", "remotetape": "REMOTETAPE"}


def measure_access_costs(config_path: str, params: DemoParams, repeat: int = 6) -> dict:
    """Seconds of one collective access of one dump (a float32 block per rank) through a
    Session dataset on each tier, as the producer and the consumers make them: a dump of a
    new step (``write_all`` + ``flush``), a rewrite in place (a checkpoint's), and a cold read
    (``read_all`` from a freshly opened dataset). Each is the mean of ``repeat`` accesses
    but the first (which sets the connection up). Rank 0's result: ``{tier: {"write",
    "rewrite", "read", "nbytes"}}``."""
    from mpi4py import MPI

    from strataio.config import load_config
    from strataio.predict.workload import Partition
    from strataio.session import Session

    comm = MPI.COMM_WORLD
    config = load_config(config_path)
    part = Partition.of(params.dims, "BBB", params.ranks)
    box = part.box(comm.Get_rank())
    out: dict[str, dict[str, float]] = {}

    def mean(fn: Callable[..., Any], *args: Callable[[int], Any]) -> float:
        times = [_between_barriers(comm, fn, *(a(k) for a in args))[1] for k in range(repeat)]
        return float(np.mean(times[1:]))

    with Session(config, comm=comm, stage_on_read=False) as session:
        for tier in config.tiers:
            hint = ROLE_HINTS.get(tier.role)
            if hint is None:
                continue
            name = f"access-cost/{tier.name}"
            shape, chunks = (repeat, *params.dims), (1, *part.block)
            ds = session.create_dataset(name, shape, "float32", chunks, hint=hint)
            write = mean(partial(_dump, ds), lambda k: (k, *box), lambda k: field("temp", k, box))
            ds.close()
            ds = session.open_dataset(name)
            read = mean(ds.read_all, lambda k: (k, *box))
            ds.close()
            ds = session.create_dataset(
                name + "-restart", params.dims, "float32", part.block, hint=hint
            )
            rewrite = mean(partial(_dump, ds), lambda k: box, lambda k: field("temp", k, box))
            ds.close()
            for n in (name, name + "-restart"):
                session.delete_dataset(n)
            nbytes = 4 * math.prod(part.block)
            out[tier.name] = {"write": write, "rewrite": rewrite, "read": read, "nbytes": nbytes}
    return out


def _rank_main(argv: list[str]) -> None:
    from mpi4py import MPI

    from strataio.predict.ranks import report, whole_job

    # (a rank failing alone ends the job: the others would wait for it at a barrier forever)
    with whole_job(MPI.COMM_WORLD):
        params = DemoParams(**json.loads(argv[1]))
        if argv[2] == "access-costs":
            result: dict[str, Any] = {"costs": measure_access_costs(argv[0], params)}
        else:
            result = run_scenario(argv[0], params, int(argv[2]))
    report(MPI.COMM_WORLD, result)


def launch_args(config_path: str, params: DemoParams, what: int | str) -> list[str]:
    """The arguments the ranks take on the command line: a scenario to run
    (:func:`run_scenario`), or ``"access-costs"`` (:func:`measure_access_costs`)."""
    return [config_path, json.dumps(asdict(params)), str(what)]


if __name__ == "__main__":
    _rank_main(sys.argv[1:])
