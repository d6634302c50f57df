"""Differential check of strataio.File against ROMIO (mpi4py.MPI.File), run under mpiexec.

For each seeded case every rank builds a random file view (a random datatype, nested up to two
constructors deep, interleaved across ranks or in per-rank blocks) and a random memory
datatype (some running backwards in memory), then writes the same buffer through strataio and
through ROMIO into two files that start with identical random bytes; the files must end
byte-identical. Then both read the ROMIO file back through random memory types; the buffers
must be identical. Hints (buffer size, aggregators, collective buffering on/off/automatic)
are random and given to both.

Prints ``ok <cases>`` on rank 0 when every case matched; exits 1 with the first differences.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

import numpy as np
from mpi4py import MPI

import strataio
from strataio.layout.datatypes import flatten

BASES = [MPI.BYTE, MPI.SHORT, MPI.INT, MPI.DOUBLE]
KINDS = [
    "contiguous", "vector", "hvector", "indexed", "hindexed", "indexed_block",
    "hindexed_block", "struct", "subarray_c", "subarray_f", "darray", "resized", "resized_lb",
    "dup",
]  # fmt: skip


def _incr(rng: np.random.Generator, n: int, lo_gap: int, hi_gap: int, width: np.ndarray) -> list:
    """n increasing displacements, each block ``width[i]`` wide plus a random gap."""
    gaps = rng.integers(lo_gap, hi_gap + 1, n)
    d = np.cumsum(np.concatenate(([0], width[:-1]))) + np.cumsum(gaps) - gaps[0]
    return [int(x) for x in d]


def gen_type(rng: np.random.Generator, base: MPI.Datatype, depth: int) -> MPI.Datatype:
    """A random datatype with non-negative, non-decreasing, non-overlapping type map."""
    if depth == 0:
        return base.Dup() if rng.random() < 0.2 else base
    child = gen_type(rng, base, depth - 1)
    lb, ext = child.Get_extent()
    kind = KINDS[int(rng.integers(len(KINDS)))]
    n = int(rng.integers(1, 4))
    if kind == "contiguous":
        t = child.Create_contiguous(n)
    elif kind == "vector":
        bl = int(rng.integers(1, 3))
        t = child.Create_vector(n, bl, bl + int(rng.integers(0, 3)))
    elif kind == "hvector":
        bl = int(rng.integers(1, 3))
        t = child.Create_hvector(n, bl, bl * ext + int(rng.integers(0, 9)))
    elif kind == "indexed":
        bls = rng.integers(1, 3, n)
        t = child.Create_indexed([int(b) for b in bls], _incr(rng, n, 0, 2, bls))
    elif kind == "hindexed":
        bls = rng.integers(1, 3, n)
        t = child.Create_hindexed([int(b) for b in bls], _incr(rng, n, 0, 7, bls * ext))
    elif kind == "indexed_block":
        bl = int(rng.integers(1, 3))
        t = child.Create_indexed_block(bl, _incr(rng, n, 0, 2, np.full(n, bl)))
    elif kind == "hindexed_block":
        bl = int(rng.integers(1, 3))
        t = child.Create_hindexed_block(bl, _incr(rng, n, 0, 7, np.full(n, bl * ext)))
    elif kind == "dup":  # of a derived type (depth 0 dups predefined ones)
        t = child.Dup()
    elif kind == "struct":
        types = [child, base][: int(rng.integers(1, 3))]
        exts = np.array([ty.Get_extent()[1] for ty in types])
        bls = rng.integers(1, 3, len(types))
        t = MPI.Datatype.Create_struct(
            [int(b) for b in bls], _incr(rng, len(types), 0, 5, bls * exts), types
        )
    elif kind in ("subarray_c", "subarray_f"):
        nd = int(rng.integers(1, 4))
        sizes = [int(x) for x in rng.integers(1, 5, nd)]
        sub = [int(rng.integers(1, s + 1)) for s in sizes]
        starts = [int(rng.integers(0, s - u + 1)) for s, u in zip(sizes, sub)]
        order = MPI.ORDER_C if kind == "subarray_c" else MPI.ORDER_FORTRAN
        t = child.Create_subarray(sizes, sub, starts, order=order)
    elif kind == "darray":
        nd = int(rng.integers(1, 3))
        psizes = [int(x) for x in rng.integers(1, 3, nd)]
        size = int(np.prod(psizes))
        gsizes = [int(x) for x in rng.integers(2, 7, nd)]
        choices = [MPI.DISTRIBUTE_BLOCK, MPI.DISTRIBUTE_CYCLIC, MPI.DISTRIBUTE_NONE]
        distribs = [choices[int(rng.integers(3))] for _ in range(nd)]
        psizes = [1 if d == MPI.DISTRIBUTE_NONE else p for d, p in zip(distribs, psizes)]
        size = int(np.prod(psizes))
        dargs = [
            int(rng.integers(1, 3)) if d == MPI.DISTRIBUTE_CYCLIC else MPI.DISTRIBUTE_DFLT_DARG
            for d in distribs
        ]
        order = MPI.ORDER_C if rng.random() < 0.5 else MPI.ORDER_FORTRAN
        t = child.Create_darray(
            size, int(rng.integers(size)), gsizes, distribs, dargs, psizes, order=order
        )
    elif kind == "resized":  # extent at least the true upper bound
        tlb, text = child.Get_true_extent()
        t = child.Create_resized(0, max(tlb + text, ext) + int(rng.integers(0, 9)))
    else:  # resized_lb: a lower bound inside the leading gap, extent past the data
        tlb, text = child.Get_true_extent()
        lb = int(rng.integers(0, max(tlb, 0) + 1))
        t = child.Create_resized(lb, max(tlb + text - lb, ext) + int(rng.integers(0, 9)))
    t.Commit()
    if not _monotonic(t):
        t.Free()
        return child
    return t


def _monotonic(t: MPI.Datatype) -> bool:
    f = flatten(t)
    e = f.extents
    if len(e) == 0:
        return False
    return bool(
        int(e.offsets.min()) >= 0
        and np.all(e.offsets[1:] >= e.ends[:-1])
        and f.true_lb >= 0
        and f.extent >= f.true_lb + f.true_extent
    )


def make_filetype(
    pat: MPI.Datatype, nprocs: int, rank: int, interleaved: bool, reach: int, disp0: int
) -> tuple[MPI.Datatype, int]:
    """This rank's filetype and displacement for the access pattern ``pat``: interleaved (rank
    ``r`` owns slot ``r`` of every tile) or in per-rank blocks ``reach`` bytes apart."""
    if interleaved:
        tlb, text = pat.Get_true_extent()
        ext = max(pat.Get_extent()[1], tlb + text)
        ft = MPI.Datatype.Create_struct([1], [rank * ext], [pat]).Create_resized(0, nprocs * ext)
        ft.Commit()
        return ft, disp0
    return pat, disp0 + rank * reach


def make_memtype(rng: np.random.Generator, esize: int, cap: int) -> tuple[MPI.Datatype, int]:
    """A random memory datatype and a count whose bytes are a whole number of etypes."""
    base = BASES[int(rng.integers(len(BASES)))]
    mt = gen_type(rng, base, int(rng.integers(0, 3)))
    if rng.random() < 0.25:  # memory types may run backwards (MPI orders only file types)
        n = int(rng.integers(2, 4))
        tlb, text = mt.Get_true_extent()
        step = max(mt.Get_extent()[1], tlb + text) + int(rng.integers(0, 9))
        mt = mt.Create_hindexed([1] * n, [(n - 1 - i) * step for i in range(n)]).Commit()
    size = mt.Get_size()
    step = esize // np.gcd(size, esize)
    count = step * int(rng.integers(1, max(2, cap // max(size * step, 1)) + 1))
    return mt, count


def mem_buffer(mt: MPI.Datatype, count: int, rng: np.random.Generator) -> np.ndarray:
    lb, ext = mt.Get_extent()
    tlb, text = mt.Get_true_extent()
    need = tlb + (count - 1) * ext + text if count else 0
    return rng.integers(0, 256, need + int(rng.integers(0, 16)), dtype=np.uint8)


def run_case(comm: MPI.Comm, seed: int, workdir: str) -> list[str]:
    rank, nprocs = comm.Get_rank(), comm.Get_size()
    shared = np.random.default_rng(seed)
    mine = np.random.default_rng([seed, rank])
    base = BASES[int(shared.integers(len(BASES)))]
    etype = base if shared.random() < 0.6 else MPI.BYTE
    if shared.random() < 0.15:  # an etype with a hole of its own: filetypes made of it
        etype = base = base.Create_vector(2, 1, 2).Commit()
    esize = etype.Get_size()
    own_pattern = shared.random() < 0.3  # ranks with different patterns go in blocks
    interleaved = not own_pattern and shared.random() < 0.7
    pat = gen_type(mine if own_pattern else shared, base, int(shared.integers(0, 3)))
    hints = {
        "cb_buffer_size": str(int(shared.choice([64, 512, 4096, 1 << 20]))),
        "cb_nodes": str(int(shared.integers(1, nprocs + 1))),
        "cb_config_list": str(shared.choice(["*:1", "*:2", "*:*"])),
        "romio_cb_write": str(shared.choice(["enable", "disable", "automatic"])),
        "romio_cb_read": str(shared.choice(["enable", "disable", "automatic"])),
        "romio_ds_write": str(shared.choice(["enable", "disable", "automatic"])),
        "romio_ds_read": str(shared.choice(["enable", "disable", "automatic"])),
        "ind_rd_buffer_size": str(int(shared.choice([256, 4096, 1 << 22]))),
        "ind_wr_buffer_size": str(int(shared.choice([256, 4096, 1 << 19]))),
        # strataio's own: aggregators' I/O in a background thread (ROMIO ignores it)
        "strataio_cb_overlap": str(shared.choice(["enable", "disable", "automatic"])),
    }
    op = str(shared.choice(["write_all", "write_at_all", "write_at"]))
    offset = int(shared.integers(0, 5))
    mt, count = make_memtype(mine, esize, 6000)
    buf = mem_buffer(mt, count, mine)
    pa, pb = (os.path.join(workdir, f"c{seed}_{x}.bin") for x in "ab")
    # ROMIO's sieving leaves undefined bytes in holes past end-of-file (writes) and may leave
    # a read's buffer past end-of-file unspecified, so every case starts from a file that
    # already covers every byte any rank can touch.
    rt, rcount = make_memtype(mine, esize, 6000)
    fill = mem_buffer(rt, rcount, mine)
    most = max(count * mt.Get_size(), rcount * rt.Get_size())
    tlb, text = pat.Get_true_extent()
    pext = max(pat.Get_extent()[1], tlb + text)
    tiles = -(-(offset * esize + most) // pat.Get_size()) + 1
    reach = comm.allreduce(tiles * pext, op=MPI.MAX)
    disp0 = int(shared.integers(0, 64))
    ft, disp = make_filetype(pat, nprocs, rank, interleaved, reach, disp0)
    bound = disp0 + nprocs * reach
    isize = bound + int(shared.integers(0, 64))
    if rank == 0:
        init = np.random.default_rng([seed, 7]).integers(0, 256, isize, dtype=np.uint8)
        for p in (pa, pb):
            with open(p, "wb") as fh:
                fh.write(init.tobytes())
    comm.Barrier()
    info = MPI.Info.Create()
    for k, v in hints.items():
        info.Set(k, v)
    errors: list[str] = []
    where = f"seed={seed} op={op} ranks={nprocs}"

    # ---- write through both
    with strataio.File.open(comm, pa, "r+", hints=hints) as f:
        f.set_view(disp, etype, ft)
        spec = [buf, count, mt]
        if op == "write_all":
            f.seek(offset)
            f.write_all(spec)
        elif op == "write_at_all":
            f.write_at_all(offset, spec)
        else:
            f.write_at(offset, spec)
        pos_s = f.get_position()
    fh = MPI.File.Open(comm, pb, MPI.MODE_RDWR, info)
    fh.Set_view(disp, etype, ft, "native", info)
    if op == "write_all":
        fh.Seek(offset)
        fh.Write_all(spec)
    elif op == "write_at_all":
        fh.Write_at_all(offset, spec)
    else:
        fh.Write_at(offset, spec)
    pos_r = fh.Get_position()
    fh.Close()
    if pos_s != pos_r:
        errors.append(f"{where}: file pointer {pos_s} != ROMIO {pos_r}")
    comm.Barrier()
    if rank == 0:
        a, b = (np.fromfile(p, dtype=np.uint8) for p in (pa, pb))
        if a.size != b.size:
            errors.append(f"{where}: file sizes {a.size} != ROMIO {b.size}")
        elif not np.array_equal(a, b):
            bad = np.flatnonzero(a != b)
            errors.append(f"{where}: {bad.size} bytes differ, first at {bad[0]}")

    # ---- read the ROMIO file through both, into identical random buffers
    rop = str(shared.choice(["read_all", "read_at_all", "read_at"]))
    out_s, out_r = fill.copy(), fill.copy()
    with strataio.File.open(comm, pb, "r", hints=hints) as f:
        f.set_view(disp, etype, ft)
        if rop == "read_all":
            f.seek(offset)
            f.read_all([out_s, rcount, rt])
        else:
            getattr(f, rop)(offset, [out_s, rcount, rt])
    fh = MPI.File.Open(comm, pb, MPI.MODE_RDONLY, info)
    fh.Set_view(disp, etype, ft, "native", info)
    if rop == "read_all":
        fh.Seek(offset)
        fh.Read_all([out_r, rcount, rt])
    elif rop == "read_at_all":
        fh.Read_at_all(offset, [out_r, rcount, rt])
    else:
        fh.Read_at(offset, [out_r, rcount, rt])
    fh.Close()
    if not np.array_equal(out_s, out_r):
        bad = np.flatnonzero(out_s != out_r)
        errors.append(f"{where} {rop} rank {rank}: {bad.size} buffer bytes differ at {bad[0]}")
    comm.Barrier()
    if rank == 0:
        for p in (pa, pb):
            os.unlink(p)
    info.Free()
    return errors


def main(case: Callable[[MPI.Comm, int, str], list[str]] = run_case) -> int:
    """Run ``--cases`` seeded cases of ``case`` (errors on every rank; none: passed)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cases", type=int, default=20)
    ap.add_argument("--dir", required=True)
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    errors: list[str] = []
    for c in range(args.cases):
        errors += case(comm, args.seed * 100003 + c, args.dir)
    everyone = comm.gather(errors, root=0)
    if comm.Get_rank() == 0:
        flat = [e for errs in everyone for e in errs]
        if flat:
            print("\n".join(flat[:20]))
            print(f"FAILED {len(flat)} of {args.cases} cases")
            return 1
        print(f"ok {args.cases}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
