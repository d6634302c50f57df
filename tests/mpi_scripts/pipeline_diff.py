"""Pipelined collective I/O against plain two-phase and ROMIO, run under mpiexec.

For each seeded case every rank builds a random file view and memory datatype (as
``romio_diff.py`` does) and writes the same buffer collectively into files that start with
identical random bytes: through strataio with ``strataio_pipeline_groups`` = 1 (plain
two-phase), 2 and 4, and through ROMIO. Every rank aggregates (``cb_config_list=*:*``) and
windows are small, so there are several groups and several windows. The files must end
byte-identical; then each G reads the ROMIO file back and must fill the buffer ROMIO fills.

Prints ``ok <cases>`` on rank 0 when every case matched; exits 1 with the first differences.
"""

from __future__ import annotations

import os
import sys

import numpy as np
from mpi4py import MPI
from romio_diff import BASES, gen_type, main, make_filetype, make_memtype, mem_buffer

import strataio

GROUPS = (1, 2, 4)


def run_case(comm: MPI.Comm, seed: int, workdir: str) -> list[str]:
    rank, nprocs = comm.Get_rank(), comm.Get_size()
    shared = np.random.default_rng(seed)
    mine = np.random.default_rng([seed, rank])
    base = BASES[int(shared.integers(len(BASES)))]
    etype = base if shared.random() < 0.6 else MPI.BYTE
    esize = etype.Get_size()
    interleaved = shared.random() < 0.7
    pat = gen_type(shared, base, int(shared.integers(0, 3)))
    hints = {
        "cb_buffer_size": str(int(shared.choice([64, 512, 4096, 1 << 20]))),
        "cb_config_list": "*:*",
        "romio_cb_write": "enable",
        "romio_cb_read": "enable",
        "romio_ds_write": str(shared.choice(["enable", "disable", "automatic"])),
        "romio_ds_read": str(shared.choice(["enable", "disable", "automatic"])),
    }
    ours = {
        "strataio_cb_overlap": str(shared.choice(["enable", "disable", "automatic"])),
        "romio_cb_ds_threshold": str(shared.choice(["automatic", "0", "50", "100"])),
    }
    mt, count = make_memtype(mine, esize, 6000)
    buf = mem_buffer(mt, count, mine)
    rt, rcount = make_memtype(mine, esize, 6000)
    fill = mem_buffer(rt, rcount, mine)
    most = max(count * mt.Get_size(), rcount * rt.Get_size())
    tlb, text = pat.Get_true_extent()
    pext = max(pat.Get_extent()[1], tlb + text)
    tiles = -(-most // pat.Get_size()) + 1
    reach = comm.allreduce(tiles * pext, op=MPI.MAX)
    disp0 = int(shared.integers(0, 64))
    ft, disp = make_filetype(pat, nprocs, rank, interleaved, reach, disp0)
    isize = disp0 + nprocs * reach + int(shared.integers(0, 64))
    paths = {g: os.path.join(workdir, f"p{seed}_{g}.bin") for g in (*GROUPS, "romio")}
    if rank == 0:
        init = np.random.default_rng([seed, 7]).integers(0, 256, isize, dtype=np.uint8)
        for p in paths.values():
            init.tofile(p)
    comm.Barrier()
    where = f"seed={seed} ranks={nprocs} hints={ours} cb={hints['cb_buffer_size']}"
    errors: list[str] = []
    for g in GROUPS:
        with strataio.File.open(
            comm, paths[g], "r+", hints=hints | ours | {"strataio_pipeline_groups": g}
        ) as f:
            f.set_view(disp, etype, ft)
            f.write_all([buf, count, mt])
            shown = int(f.hints["strataio_pipeline_groups"])
            if shown != min(g, nprocs):
                errors.append(f"{where}: G={g} shown as {shown}")
            if f.last_path != "two-phase":
                errors.append(f"{where}: G={g} took the {f.last_path} path")
    info = MPI.Info.Create()
    for k, v in hints.items():
        info.Set(k, v)
    fh = MPI.File.Open(comm, paths["romio"], MPI.MODE_RDWR, info)
    fh.Set_view(disp, etype, ft, "native", info)
    fh.Write_all([buf, count, mt])
    fh.Close()
    comm.Barrier()
    if rank == 0:
        want = np.fromfile(paths["romio"], dtype=np.uint8)
        for g in GROUPS:
            got = np.fromfile(paths[g], dtype=np.uint8)
            if got.size != want.size or not np.array_equal(got, want):
                bad = np.flatnonzero(got[: want.size] != want[: got.size])
                errors.append(f"{where}: G={g} file differs from ROMIO's ({bad[:3]})")
    out_r = fill.copy()
    fh = MPI.File.Open(comm, paths["romio"], MPI.MODE_RDONLY, info)
    fh.Set_view(disp, etype, ft, "native", info)
    fh.Read_all([out_r, rcount, rt])
    fh.Close()
    info.Free()
    for g in GROUPS:
        out_s = fill.copy()
        with strataio.File.open(
            comm, paths["romio"], "r", hints=hints | ours | {"strataio_pipeline_groups": g}
        ) as f:
            f.set_view(disp, etype, ft)
            f.read_all([out_s, rcount, rt])
        if not np.array_equal(out_s, out_r):
            bad = np.flatnonzero(out_s != out_r)
            errors.append(f"{where}: G={g} rank {rank} read {bad.size} bytes unlike ROMIO")
    comm.Barrier()
    if rank == 0:
        for p in paths.values():
            os.unlink(p)
    return errors


if __name__ == "__main__":
    sys.exit(main(run_case))
