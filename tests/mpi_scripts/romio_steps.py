"""Step-by-step differential check of strataio.File against ROMIO, run under mpiexec.

Each seeded case opens one file through strataio and its twin through ROMIO (mpi4py's
``MPI.File``), both starting from identical random bytes that cover every byte the case can
touch, with the same random hints (collective buffering on/off, ``cb_nodes``, small
``cb_buffer_size`` for many rounds, data sieving on/off and its buffer sizes, persistent realms
and the realm cache on strataio's side), and runs the same random sequence of steps on both:
new views (interleaved or per-rank blocks, some with hints of their own given to
``set_view``), seeks, collective and independent reads and writes at explicit offsets and at
the individual file pointer, ``get_size``. After every write both files are synced and must be
byte-identical; every read must fill identical buffers and return ROMIO's byte count; the file
pointers must agree after every step.

Prints ``ok <cases> cases, <checks> checks`` on rank 0 when everything matched.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
from mpi4py import MPI
from realms_vs_romio import report
from romio_diff import BASES, gen_type, make_filetype, make_memtype, mem_buffer

import strataio

#: hints of strataio's own (and realm hints ROMIO here cannot take): not given to ROMIO
OURS = ("romio_cb_pfr", "romio_cb_fr_types", "romio_cb_fr_alignment", "romio_cb_ds_threshold")
CAP = 1500  # most bytes one access moves


def _info(hints: dict[str, str]) -> MPI.Info:
    info = MPI.Info.Create()
    for k, v in hints.items():
        if k not in OURS and not k.startswith("strataio_"):
            info.Set(k, v)
    return info


def _hints(shared: np.random.Generator, nprocs: int) -> dict[str, str]:
    hints = {
        "cb_buffer_size": str(int(shared.choice([64, 512, 4096, 1 << 20]))),
        "cb_nodes": str(int(shared.integers(1, nprocs + 1))),
        "cb_config_list": str(shared.choice(["*:1", "*:*"])),
        "romio_cb_write": str(shared.choice(["enable", "disable", "automatic"])),
        "romio_cb_read": str(shared.choice(["enable", "disable", "automatic"])),
        "romio_ds_write": str(shared.choice(["enable", "disable", "automatic"])),
        "romio_ds_read": str(shared.choice(["enable", "disable", "automatic"])),
        "ind_rd_buffer_size": str(int(shared.choice([256, 4096]))),
        "ind_wr_buffer_size": str(int(shared.choice([256, 4096]))),
        "strataio_cb_overlap": str(shared.choice(["enable", "disable"])),
    }
    r = shared.random()
    if r < 0.25:
        hints |= {"romio_cb_pfr": "enable", "romio_cb_fr_types": str(shared.choice(["aar", "64"]))}
        hints["strataio_realm_cache"] = str(int(shared.choice([0, 16384, 1 << 20])))
    elif r < 0.4:
        hints["romio_cb_fr_alignment"] = str(int(shared.choice([8, 64])))
    if shared.random() < 0.2:
        hints["romio_cb_ds_threshold"] = str(int(shared.integers(0, 101)))
    return hints


def _view_hints(shared: np.random.Generator) -> dict[str, str] | None:
    """Hints a ``set_view`` may bring (the same on every rank), or None. Not
    ``cb_buffer_size``: ROMIO (MPICH 4) keeps the collective buffer it allocated at open, and
    a larger size given to ``MPI_File_set_view`` overruns it (heap corruption in later calls).
    Nor buffers below 64 (``cb_buffer_size``) and 256 bytes (``ind_*_buffer_size``), which
    corrupt ROMIO's heap as well."""
    if shared.random() < 0.6:
        return None
    return {
        "romio_cb_write": str(shared.choice(["enable", "disable", "automatic"])),
        "romio_cb_read": str(shared.choice(["enable", "disable", "automatic"])),
        "romio_ds_write": str(shared.choice(["enable", "disable"])),
    }


def _reach(comm: MPI.Comm, pat: MPI.Datatype, esize: int, stream: int) -> int:
    """Bytes of file a view of ``pat`` tiles for ``stream`` bytes of data, on any rank."""
    tlb, text = pat.Get_true_extent()
    pext = max(pat.Get_extent()[1], tlb + text)
    tiles = -(-stream // pat.Get_size()) + 1
    return int(comm.allreduce(tiles * pext, op=MPI.MAX))


def run_case(comm: MPI.Comm, seed: int, workdir: str) -> tuple[list[str], int]:
    rank, nprocs = comm.Get_rank(), comm.Get_size()
    shared = np.random.default_rng(seed)
    mine = np.random.default_rng([seed, rank])
    hints = _hints(shared, nprocs)
    stream = 4 * CAP  # view-stream bytes any rank may reach (pointer steps included)
    size = 64 + nprocs * 3 * (stream + 512)  # room for any view below (checked per view)
    pa, pb = (os.path.join(workdir, f"s{seed}_{x}.bin") for x in "ab")
    if rank == 0:
        init = np.random.default_rng([seed, 7]).integers(0, 256, size, dtype=np.uint8)
        for p in (pa, pb):
            init.tofile(p)
    comm.Barrier()
    where = f"seed={seed} ranks={nprocs} hints={hints}"
    errors: list[str] = []
    checks = 0
    info = _info(hints)
    s = strataio.File.open(comm, pa, "r+", hints=hints)
    r = MPI.File.Open(comm, pb, MPI.MODE_RDWR, info)
    info.Free()
    esize = 1
    trail: list[str] = []
    try:
        for step in range(int(shared.integers(5, 11))):
            kind = str(shared.choice(["view", "coll", "coll", "indep", "seek"])) if step else "view"
            if kind == "view":
                base = BASES[int(shared.integers(len(BASES)))]
                etype = base if shared.random() < 0.6 else MPI.BYTE
                if shared.random() < 0.1:  # an etype with a hole of its own
                    etype = base = base.Create_vector(2, 1, 2).Commit()
                esize = etype.Get_size()
                own = shared.random() < 0.3
                pat = gen_type(mine if own else shared, base, int(shared.integers(0, 3)))
                disp0 = int(shared.integers(0, 64))
                reach = _reach(comm, pat, esize, stream)
                if disp0 + nprocs * reach > size:  # a sparse pattern: the base type instead
                    pat = base
                    reach = _reach(comm, pat, esize, stream)
                ft, disp = make_filetype(pat, nprocs, rank, not own, reach, disp0)
                vh = _view_hints(shared)
                trail.append(f"view(disp={disp}, esize={esize}, hints={vh})")
                s.set_view(disp, etype, ft, info=vh)
                vinfo = _info(vh or {})
                r.Set_view(disp, etype, ft, "native", vinfo)
                vinfo.Free()
                continue
            skip = write = False
            if kind == "seek":
                pos = int(mine.integers(0, 4))
                whence = MPI.SEEK_SET if shared.random() < 0.5 else MPI.SEEK_CUR
                trail.append(f"seek({pos}, {whence})")
                s.seek(pos, whence)
                r.Seek(pos, whence)
            else:
                at = shared.random() < 0.5
                write = shared.random() < 0.5
                op = ("write" if write else "read") + ("_at" if at else "")
                coll = kind == "coll"
                if coll:
                    op += "_all"
                offset = int(shared.integers(0, 4))
                mt, count = make_memtype(mine, esize, CAP)
                nbytes = count * mt.Get_size()
                # stay inside the bytes the files hold (reads past the end differ by design)
                start = (offset if at else r.Get_position()) * esize
                fits = start + nbytes <= stream
                if coll:
                    fits = comm.allreduce(fits, op=MPI.LAND)
                skip = not fits or (not coll and mine.random() < 0.3)  # (some ranks only)
            if kind != "seek" and not skip:
                trail.append(f"{op}({offset if at else 'ptr'}, {nbytes} bytes)")
                buf = mem_buffer(mt, count, mine)
                romio = getattr(r, op[0].upper() + op[1:])

                args = (offset,) if at else ()
                status = MPI.Status()
                if write:
                    n = getattr(s, op)(*args, [buf, count, mt])
                    romio(*args, [buf, count, mt], status)
                else:
                    out_s, out_r = buf.copy(), buf.copy()
                    n = getattr(s, op)(*args, [out_s, count, mt])
                    romio(*args, [out_r, count, mt], status)
                    checks += 1
                    if not np.array_equal(out_s, out_r):
                        bad = np.flatnonzero(out_s != out_r)
                        errors.append(
                            f"{where} {trail} rank {rank}: {bad.size} read bytes differ "
                            f"(first at {bad[0]})"
                        )
                if n != status.Get_count(MPI.BYTE):
                    errors.append(f"{where} {trail}: moved {n} bytes, ROMIO {status.Get_count()}")
            wrote = kind != "seek" and write and not skip
            if comm.allreduce(wrote, op=MPI.LOR):  # synced, the files must be the same now
                s.sync()
                r.Sync()
                comm.Barrier()
                if rank == 0:
                    a, b = (np.fromfile(p, dtype=np.uint8) for p in (pa, pb))
                    checks += 1
                    if a.size != b.size or not np.array_equal(a, b):
                        bad = np.flatnonzero(a[: b.size] != b[: a.size])
                        errors.append(
                            f"{where} {trail}: files differ ({a.size} / {b.size} bytes, "
                            f"{bad.size} differ, first at {bad[:1]})"
                        )
            checks += 1
            if s.get_position() != r.Get_position():
                errors.append(f"{where} {trail} rank {rank}: position "
                              f"{s.get_position()} != ROMIO {r.Get_position()}")  # fmt: skip
            if s.get_size() != r.Get_size():
                errors.append(f"{where} {trail}: size {s.get_size()} != ROMIO {r.Get_size()}")
            if comm.allreduce(len(errors), op=MPI.MAX):
                break
    finally:
        s.close()
        r.Close()
    comm.Barrier()
    if rank == 0:
        a, b = (np.fromfile(p, dtype=np.uint8) for p in (pa, pb))
        checks += 1
        if a.size != b.size or not np.array_equal(a, b):
            errors.append(f"{where} {trail}: files differ at close ({a.size} / {b.size} bytes)")
        for p in (pa, pb):
            os.unlink(p)
    return errors, checks


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cases", type=int, default=10)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--first", type=int, default=0)
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    errors: list[str] = []
    checks = 0
    for c in range(args.first, args.cases):
        e, k = run_case(comm, args.seed * 100003 + c, args.dir)
        errors += e
        checks += k
        if comm.allreduce(len(errors), op=MPI.MAX):
            break
    return report(comm, errors, args.cases, checks)


if __name__ == "__main__":
    sys.exit(main())
