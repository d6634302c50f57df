"""``cb_config_list``, ``cb_nodes`` and ``romio_no_indep_rw`` against ROMIO (mpi4py ``MPI.File``).

For each hint set both open the same file: the aggregators strataio chooses must be ROMIO's
(its ``romio_aggregator_list`` info key), ``cb_nodes`` and ``romio_cb_read`` / ``romio_cb_write``
must read as ROMIO reports them, and a list that names no process must fail in both. With
``romio_no_indep_rw=true`` only aggregators open the file, collective writes and reads still
give ROMIO's bytes, and independent I/O raises ``HintError`` on every rank. Rank 0 prints
``ok N`` or the differences.
"""

from __future__ import annotations

import os
import sys

import numpy as np
from mpi4py import MPI

import strataio
from strataio.errors import HintError


def romio(comm: MPI.Comm, path: str, hints: dict[str, str]) -> dict[str, str] | None:
    info = MPI.Info.Create()
    for k, v in hints.items():
        info.Set(k, v)
    try:
        fh = MPI.File.Open(comm, path, MPI.MODE_RDWR | MPI.MODE_CREATE, info)
    except MPI.Exception:
        return None
    finally:
        info.Free()
    got = fh.Get_info()
    keys = ("romio_aggregator_list", "cb_nodes", "romio_cb_read", "romio_cb_write")
    out = {k: got.Get(k) for k in keys}
    got.Free()
    fh.Close()
    return out


def main(workdir: str) -> None:
    comm = MPI.COMM_WORLD
    rank, nprocs = comm.Get_rank(), comm.Get_size()
    host = MPI.Get_processor_name()
    cases = [
        {},
        {"cb_nodes": "2"},
        {"cb_config_list": "*:2"},
        {"cb_config_list": "*:*"},
        {"cb_config_list": "*:*", "cb_nodes": "2"},
        {"cb_config_list": f"{host}:3"},
        {"cb_config_list": "nosuchhost:1,*:3"},
        {"cb_config_list": "nosuchhost:1"},
        {"cb_config_list": "*:0"},
        {"romio_no_indep_rw": "true"},
        {"romio_no_indep_rw": "true", "romio_cb_write": "disable", "cb_config_list": "*:2"},
    ]
    failed: list[str] = []
    path = os.path.join(workdir, "agg.bin")
    for hints in cases:
        theirs = romio(comm, path, hints)
        try:
            f = strataio.File.open(comm, path, "w", hints=hints)
        except HintError as exc:
            if theirs is not None:
                failed.append(f"{hints}: strataio refused ({exc}), ROMIO opened")
            continue
        ours = {
            "romio_aggregator_list": "".join(f"{r} " for r in f.aggregators),
            **{k: f.hints[k] for k in ("cb_nodes", "romio_cb_read", "romio_cb_write")},
        }
        if theirs is None:
            failed.append(f"{hints}: ROMIO refused, strataio opened with {ours}")
        elif ours != theirs:
            failed.append(f"{hints}: strataio {ours}, ROMIO {theirs}")
        if f.hints["romio_no_indep_rw"] == "true":
            failed += no_indep_rw(comm, f, hints)
        f.close()
    everyone = comm.gather(failed)
    if rank == 0:
        flat = [m for ms in everyone for m in ms]
        print("\n".join(flat) if flat else f"ok {len(cases)} on {nprocs} ranks")


def no_indep_rw(comm: MPI.Comm, f: strataio.File, hints: dict[str, str]) -> list[str]:
    rank = comm.Get_rank()
    failed = []
    opened = f.driver is not None
    if opened != (rank in f.aggregators):
        failed.append(f"{hints}: rank {rank} opened={opened}, aggregators {f.aggregators}")
    data = np.full(1000, rank + 1, np.uint8)
    f.write_at_all(rank * 1000, data)
    back = np.zeros(1000, np.uint8)
    f.read_at_all(((rank + 1) % comm.Get_size()) * 1000, back)
    if not np.array_equal(back, np.full(1000, (rank + 1) % comm.Get_size() + 1, np.uint8)):
        failed.append(f"{hints}: rank {rank} read back the wrong bytes")
    for call in (f.write_at, f.read_at):
        try:
            call(0, data)
            failed.append(f"{hints}: independent {call.__name__} on rank {rank} went through")
        except HintError:
            pass
    return failed


if __name__ == "__main__":
    main(sys.argv[1])
