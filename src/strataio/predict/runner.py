"""Measured runs: a workload executed under ``mpiexec`` on its tiers, each access timed.

:func:`run_workload` launches ``ranks`` processes that follow the paper's Figure 1(a) loop over
steps ``0 … N``: at step ``i`` each dataset with ``i % freq == 0`` is written or read by the
run's method (as :mod:`strataio.predict.model` describes them), then the step computes for
``compute_s`` seconds. An access is timed between barriers on rank 0, so it lasts as long as
its slowest rank; a dataset's measured time is the sum of its accesses. What is not an access
is not timed: creating the files, writing the data a ``read`` dataset reads, and dropping the
pages of the file before each read access (reads are cold, as calibration's are).

- ``naive``: :class:`strataio.File` opened on every rank, each rank's block moved with one
  independent ``write_at`` / ``read_at`` per contiguous run, then closed.
- ``collective``: the File opened with ``cb_nodes`` aggregators (any rank may aggregate:
  ``cb_config_list`` ``*:*``), ``cb_buffer_size`` and collective buffering enabled, each
  rank's block as a subarray view (its type made once per run), one ``write_at_all`` /
  ``read_at_all``, closed.
- ``chunked``: a dataset over the tier's backend, chunked by the block shape and uncompressed,
  created once; each access is one collective ``write_all`` / ``read_all`` of every rank's block.

Files live under the tier's ``.strataio-predict`` folder (named by the dataset's place in the
workload, not by its name) and are removed at the end. A run holds the lock of each tier it
uses, as a calibration does (:func:`~strataio.predict.native.lock_tiers`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import numpy as np

from strataio.predict.workload import DatasetSpec, Partition, Workload

__all__ = ["predict_and_measure", "run_workload", "workload_to_toml"]


def workload_to_toml(workload: Workload) -> str:
    """The TOML text of ``workload`` (what :func:`~strataio.predict.workload.parse_workload`
    reads back)."""
    run = asdict(workload.run)
    lines = ["[run]"] + [f"{k} = {json.dumps(v)}" for k, v in run.items()]
    for ds in workload.datasets:
        lines.append("\n[[dataset]]")
        d = asdict(ds)
        d["dtype"] = ds.dtype.str
        d["dims"] = list(ds.dims)
        for k, v in d.items():
            if v is not None:
                lines.append(f"{k} = {json.dumps(v)}")
    return "\n".join(lines) + "\n"


def run_workload(
    workload: Workload,
    config: Any,
    *,
    timeout: float | None = None,
    wait: float = 0.0,
    on_wait: Callable[[str], None] | None = None,
) -> dict[str, float]:
    """Run ``workload`` under ``mpiexec -n ranks`` on the tiers of ``config`` (a loaded
    :class:`~strataio.config.Config`); measured seconds per dataset name.

    The run holds the lock of each tier it uses (:func:`~strataio.predict.native.lock_tiers`,
    the lock a calibration holds): a calibration or another measured run of one of them at
    once would be timed with this one. A tier another process holds is waited for up to
    ``wait`` seconds (``on_wait(message)`` says so), then
    :class:`~strataio.errors.BusyError` names that process."""
    from strataio.predict.native import lock_tiers
    from strataio.predict.ranks import launch

    tiers = [config.tier(workload.tier_of(ds)) for ds in workload.datasets]
    _check_room(workload, tiers)
    what = f"measured run of {workload.source}"
    with (
        lock_tiers(tiers, what, wait=wait, on_wait=on_wait),
        tempfile.TemporaryDirectory(prefix="strataio-workload-") as tmp,
    ):
        path = os.path.join(tmp, "workload.toml")
        with open(path, "w") as f:
            f.write(workload_to_toml(workload))
        got = launch(
            workload.run.ranks,
            "strataio.predict.runner",
            [config.source or "", path],
            timeout=timeout,
        )
    return {k: float(v) for k, v in got["measured"].items()}


def _check_room(workload: Workload, tiers: list[Any]) -> None:
    """Raise :class:`~strataio.errors.StrataError` if the ranks cannot hold the datasets in
    the node's memory (each rank holds its block to write and one to read into), or a tier
    (``tiers[i]``: dataset ``i``'s) the files of its datasets in its free space."""
    from strataio.errors import StrataError
    from strataio.predict.native import tier_dir
    from strataio.sizes import format_size

    total = sum(ds.nbytes for ds in workload.datasets)
    room = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    if 2 * total > room:
        raise StrataError(
            f"{workload.source}: a measured run holds its datasets ({format_size(total)}) "
            f"twice in the ranks' memory, {format_size(2 * total)}, more than this node's "
            f"{format_size(room)}: measure smaller dims"
        )
    on: dict[str, int] = {}
    for ds, tc in zip(workload.datasets, tiers):
        on[tc.name] = on.get(tc.name, 0) + ds.nbytes
    for tc in {tc.name: tc for tc in tiers}.values():
        if not os.path.isdir(tier_dir(tc)):
            continue  # (the lock says it is missing)
        free = shutil.disk_usage(tc.path).free
        if on[tc.name] > free:
            raise StrataError(
                f"tier {tc.name!r}: a measured run of {workload.source} writes "
                f"{format_size(on[tc.name])} there, more than its {format_size(free)} free"
            )


def predict_and_measure(
    wl: Workload,
    perf: Any,
    config: Any = None,
    *,
    wait: float = 0.0,
    on_wait: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Predicted (and, with ``config``, measured) seconds of workload ``wl`` per dataset and
    in total, as ``strataio predict --json`` prints them: ``{"datasets": [{"name",
    "predicted_s", "measured_s"}...], "predicted_total_s", "measured_total_s"}`` (measured
    values ``None`` without ``config``). ``wait`` and ``on_wait`` are
    :func:`run_workload`'s."""
    from strataio.predict.model import predict

    prediction = predict(wl, perf)
    measured = run_workload(wl, config, wait=wait, on_wait=on_wait) if config is not None else None
    rows = [
        {
            "name": d.spec.name,
            "predicted_s": d.predicted_s,
            "measured_s": None if measured is None else measured[d.spec.name],
        }
        for d in prediction.datasets
    ]
    return {
        "datasets": rows,
        "predicted_total_s": prediction.total_s,
        "measured_total_s": None if measured is None else sum(measured.values()),
    }


# -- the ranks' side ------------------------------------------------------------------------


class _Access:
    """One dataset of a measured run: set up once, then accessed at its steps. Its file (or
    chunk folder) in the tier's work folder is named ``key``, not by the dataset's name: a
    name is a label (a path such as ``/home/me`` or ``..`` would name a folder the run then
    removes)."""

    def __init__(self, workload: Workload, ds: DatasetSpec, tc: Any, comm: Any, key: str) -> None:
        from strataio.predict.native import work_path

        self.ds, self.tc, self.comm, self.key = ds, tc, comm, key
        self.run = workload.run
        self.part: Partition = workload.partition(ds)
        rank = comm.Get_rank()
        self.box = self.part.box(rank)
        shape = self.part.shape(rank)
        self.data = np.random.default_rng(rank).random(shape).astype(ds.dtype)
        self.out = np.empty_like(self.data)
        self.path = work_path(tc, key)
        self.write = ds.mode == "write"
        if rank == 0:
            _remove(self.path)
        comm.Barrier()
        self.filetype = self._filetype() if self.run.method == "collective" else None
        if self.run.method == "chunked":
            self._make_dataset()
        elif self.run.method == "naive":
            self._runs()
        if not self.write:
            self.access(write=True)  # the data a read reads, written once, untimed

    # -------------------------------------------------------------- set-up
    def _runs(self) -> None:
        """Byte offsets of this rank's contiguous runs in the file, and their length."""
        rank = self.comm.Get_rank()
        item = self.ds.dtype.itemsize
        self.run_bytes = self.part.runs(rank)[1] * item
        self.offsets = self.part.run_offsets(rank) * item

    def _make_dataset(self) -> None:
        from strataio.arrays.dataset import Dataset
        from strataio.arrays.metadata import ArrayMetadata
        from strataio.arrays.store import BackendChunkStore
        from strataio.predict.native import WORK_DIR, tier_backend

        meta = ArrayMetadata.create(self.part.dims, self.ds.dtype, self.part.block, None)
        self.backend = tier_backend(self.tc)
        store = BackendChunkStore(self.backend, f"{WORK_DIR}/{self.key}")
        if self.comm.Get_rank() == 0:
            store.put_meta(meta.to_json())
        self.comm.Barrier()
        self.dataset = Dataset(store, meta, "r+", comm=self.comm)

    def _hints(self, write: bool) -> dict[str, str]:
        from strataio.predict.native import file_hints

        hints = file_hints(self.tc, write)
        if self.run.method == "collective":
            hints.update(
                cb_nodes=str(self.run.cb_nodes),
                cb_config_list="*:*",  # every rank may aggregate: cb_nodes decides how many
                cb_buffer_size=str(self.run.cb_buffer_size),
                romio_cb_write="enable",
                romio_cb_read="enable",
            )
        return hints

    # -------------------------------------------------------------- one access
    def prepare(self) -> None:
        """Untimed work before a timed access: a read starts cold."""
        from strataio.predict.native import drop_cached

        if self.write:
            return
        if self.run.method == "chunked":
            self.dataset.clear_cache()
        if self.comm.Get_rank() == 0:
            drop_cached(self.path)
        self.comm.Barrier()

    def access(self, write: bool | None = None) -> None:
        """One access: the dataset's mode, or a write when ``write`` says so."""
        write = self.write if write is None else write
        if self.run.method == "chunked":
            mine = None if self.data.size == 0 else self.box  # a rank beyond the grid: nothing
            if write:
                self.dataset.write_all(mine, self.data if mine is not None else None)
                self.dataset.flush()
            else:
                self.dataset.read_all(mine)
            return
        from strataio.collective.file import File

        f = File.open(self.comm, self.path, "w" if write else "r", self._hints(write))
        try:
            if self.run.method == "naive":
                flat = (self.data if write else self.out).reshape(-1).view(np.uint8)
                n = self.run_bytes
                call = f.write_at if write else f.read_at
                for k, off in enumerate(self.offsets.tolist()):  # naive: one call per run
                    call(off, flat[k * n : (k + 1) * n])
            else:
                self._collective(f, write)
        finally:
            f.close()

    def _filetype(self) -> Any:
        """This rank's block of the file as a subarray of bytes, made once per run as an
        application makes its view type once (None for a rank without a block)."""
        from mpi4py import MPI

        item = self.ds.dtype.itemsize
        shape = [s.stop - s.start for s in self.box]
        if 0 in shape:
            return None
        dims = list(self.part.dims)
        sizes = dims[:-1] + [dims[-1] * item]
        sub = shape[:-1] + [shape[-1] * item]
        starts = [s.start for s in self.box]
        starts[-1] *= item
        return MPI.BYTE.Create_subarray(sizes, sub, starts).Commit()

    def _collective(self, f: Any, write: bool) -> None:
        from mpi4py import MPI

        buf = (self.data if write else self.out).reshape(-1).view(np.uint8)
        # set_view is collective: a rank without a block takes the plain byte view
        f.set_view(0, MPI.BYTE, self.filetype if self.filetype is not None else MPI.BYTE)
        (f.write_at_all if write else f.read_at_all)(0, buf)

    def close(self) -> None:
        if self.filetype is not None:
            self.filetype.Free()
        if self.run.method == "chunked":
            self.dataset.close()
            self.backend.close()
        self.comm.Barrier()
        if self.comm.Get_rank() == 0:
            _remove(self.path)


def _remove(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            os.remove(path)


def _rank_main(argv: list[str]) -> None:
    from mpi4py import MPI

    from strataio.config import load_config
    from strataio.predict.ranks import report, whole_job
    from strataio.predict.workload import load_workload

    comm = MPI.COMM_WORLD
    with whole_job(comm):
        config = load_config(argv[0] or None)
        workload = load_workload(argv[1])
        accesses: list[_Access] = []
        measured = {ds.name: 0.0 for ds in workload.datasets}
        try:
            for i, ds in enumerate(workload.datasets):
                tc = config.tier(workload.tier_of(ds))
                accesses.append(_Access(workload, ds, tc, comm, f"dataset-{i}"))
            for i in range(workload.run.iterations + 1):
                for a in accesses:
                    if i % a.ds.frequency:
                        continue
                    a.prepare()
                    comm.Barrier()
                    t0 = time.perf_counter()
                    a.access()
                    comm.Barrier()
                    measured[a.ds.name] += time.perf_counter() - t0
                if workload.run.compute_s:
                    time.sleep(workload.run.compute_s)
        except Exception:
            # (no barrier, as close has: the other ranks may be inside a call this rank will
            # not make; the job ends, see strataio.predict.ranks.whole_job)
            for a in accesses:
                _remove(a.path)
            raise
        for a in accesses:
            a.close()
    report(comm, {"measured": measured})


if __name__ == "__main__":
    _rank_main(sys.argv[1:])
