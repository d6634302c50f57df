"""Persistent file realms against ROMIO's default path, run under mpiexec.

ROMIO's own persistent realms cannot be the oracle (``romio_cb_pfr=enable`` aborts in
``ad_coll_build_req_new.c`` in the MPICH installed here), and realms never change the bytes a
correct engine leaves: so each case opens one file through strataio with a realm policy and a
twin through ROMIO with its defaults, both starting from identical random bytes, and runs the
same random sequence of steps on both: new views (interleaved across ranks or per-rank
blocks), collective and independent reads and writes through random memory types at random
offsets, with no sync in between (a barrier only, as the sequence of MPI calls orders them).
Every read buffer must equal ROMIO's, and the files must end byte-identical. Then the
thesis's Figure 3.1 scenario: read all, write the first half through an interleaved view,
read all again, checked against a numpy oracle and ROMIO.

Prints ``ok <cases> cases, <checks> checks`` on rank 0 when everything matched.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
from mpi4py import MPI
from romio_diff import BASES, gen_type, make_filetype, make_memtype, mem_buffer

import strataio

#: realm policies under test (strataio's hints; ROMIO gets none of them)
POLICIES: list[dict[str, str]] = [
    {},
    {"romio_cb_pfr": "enable", "romio_cb_fr_types": "aar"},
    {"romio_cb_pfr": "enable", "romio_cb_fr_types": "-1"},
    {"romio_cb_pfr": "enable", "romio_cb_fr_types": "64"},
    {"romio_cb_pfr": "enable", "romio_cb_fr_types": "7"},
    {"romio_cb_pfr": "enable", "romio_cb_fr_types": "100", "romio_cb_fr_alignment": "32"},
    {"romio_cb_pfr": "enable", "romio_cb_fr_types": "aar", "strataio_realms": "dynamic"},
    {"romio_cb_fr_alignment": "16"},
]
OURS = ("romio_cb_pfr", "romio_cb_fr_types", "romio_cb_fr_alignment", "strataio_realms")


class Twins:
    """One strataio file and its ROMIO twin, driven through the same calls."""

    def __init__(self, comm: MPI.Comm, pa: str, pb: str, hints: dict[str, str]) -> None:
        self.s = strataio.File.open(comm, pa, "r+", hints=hints)
        info = MPI.Info.Create()
        for k, v in hints.items():
            if k not in OURS and not k.startswith("strataio_"):
                info.Set(k, v)
        self.r = MPI.File.Open(comm, pb, MPI.MODE_RDWR, info)
        info.Free()

    def view(self, disp: int, etype: MPI.Datatype, ft: MPI.Datatype) -> None:
        self.s.set_view(disp, etype, ft)
        self.r.Set_view(disp, etype, ft, "native")

    def close(self) -> None:
        self.s.close()
        self.r.Close()


def _romio(op: str) -> str:
    return {"write_at": "Write_at", "write_at_all": "Write_at_all",
            "read_at": "Read_at", "read_at_all": "Read_at_all"}[op]  # fmt: skip


def _reach(comm: MPI.Comm, pat: MPI.Datatype, esize: int, cap: int) -> int:
    """Bytes of file a view of ``pat`` tiles for the largest access of a case, on any rank."""
    tlb, text = pat.Get_true_extent()
    pext = max(pat.Get_extent()[1], tlb + text)
    tiles = -(-(4 * esize + cap) // pat.Get_size()) + 1
    return int(comm.allreduce(tiles * pext, op=MPI.MAX))


def run_case(
    comm: MPI.Comm, seed: int, policy: dict[str, str], workdir: str
) -> tuple[list[str], int]:
    rank, nprocs = comm.Get_rank(), comm.Get_size()
    shared = np.random.default_rng(seed)
    mine = np.random.default_rng([seed, rank])
    hints = {
        "cb_buffer_size": str(int(shared.choice([64, 256, 4096]))),
        "cb_nodes": str(int(shared.integers(1, nprocs + 1))),
        "cb_config_list": "*:*",
        "romio_cb_write": str(shared.choice(["enable", "enable", "automatic", "disable"])),
        "romio_cb_read": str(shared.choice(["enable", "enable", "automatic", "disable"])),
        "romio_ds_write": str(shared.choice(["enable", "disable", "automatic"])),
        "romio_ds_read": str(shared.choice(["enable", "disable", "automatic"])),
        "strataio_cb_overlap": str(shared.choice(["enable", "disable"])),
        **policy,
    }
    cap = 2000
    size = 64 + nprocs * 4 * (cap + 512)  # room for any view below (checked per view)
    pa, pb = (os.path.join(workdir, f"r{seed}_{x}.bin") for x in "ab")
    if rank == 0:
        init = np.random.default_rng([seed, 7]).integers(0, 256, size, dtype=np.uint8)
        for p in (pa, pb):
            with open(p, "wb") as fh:
                fh.write(init.tobytes())
    comm.Barrier()
    where = f"seed={seed} policy={policy} ranks={nprocs}"
    errors: list[str] = []
    checks = 0
    f = Twins(comm, pa, pb, hints)
    esize, fixed = 1, None
    try:
        for step in range(int(shared.integers(4, 9))):
            kind = str(shared.choice(["view", "coll", "coll", "indep"])) if step else "view"
            if kind == "view":
                base = BASES[int(shared.integers(len(BASES)))]
                etype = base if shared.random() < 0.5 else MPI.BYTE
                esize = etype.Get_size()
                own = shared.random() < 0.3
                pat = gen_type(mine if own else shared, base, int(shared.integers(0, 3)))
                disp0 = int(shared.integers(0, 64))
                reach = _reach(comm, pat, esize, cap)
                if disp0 + nprocs * reach > size:  # a sparse pattern: the base type instead
                    pat = base
                    reach = _reach(comm, pat, esize, cap)
                ft, disp = make_filetype(pat, nprocs, rank, not own, reach, disp0)
                f.view(disp, etype, ft)
                continue
            op = str(shared.choice(["write_at", "read_at"]))
            offset = int(shared.integers(0, 4))
            if kind == "coll":
                op += "_all"
            elif mine.random() < 0.4:  # an independent call: some ranks only
                comm.Barrier()
                continue
            mt, count = make_memtype(mine, esize, cap)
            buf = mem_buffer(mt, count, mine)
            if op.startswith("write"):
                getattr(f.s, op)(offset, [buf, count, mt])
                getattr(f.r, _romio(op))(offset, [buf, count, mt])
            else:
                out_s, out_r = buf.copy(), buf.copy()
                getattr(f.s, op)(offset, [out_s, count, mt])
                getattr(f.r, _romio(op))(offset, [out_r, count, mt])
                checks += 1
                if not np.array_equal(out_s, out_r):
                    bad = np.flatnonzero(out_s != out_r)
                    errors.append(f"{where} step {step} {op} rank {rank}: {bad.size} bytes differ")
            if policy.get("romio_cb_pfr") == "enable" and f.s.last_path == "two-phase":
                realms = f.s.realms
                shown = f.s.hints["romio_cb_fr_types"]
                if realms is None or shown != str(realms.stripe):
                    errors.append(f"{where}: realms {realms} shown as {shown}")
                elif fixed is not None and realms != fixed and "strataio_realms" not in policy:
                    errors.append(f"{where}: persistent realms changed {fixed} -> {realms}")
                fixed = realms
            comm.Barrier()
    finally:
        f.close()
    comm.Barrier()
    if rank == 0:
        a, b = (np.fromfile(p, dtype=np.uint8) for p in (pa, pb))
        checks += 1
        if a.size != b.size or not np.array_equal(a, b):
            errors.append(f"{where}: files differ ({a.size} / {b.size} bytes)")
        for p in (pa, pb):
            os.unlink(p)
    return errors, checks


def figure_3_1(comm: MPI.Comm, policy: dict[str, str], workdir: str) -> tuple[list[str], int]:
    """Read all, write the first half through an interleaved view, read all (no sync)."""
    rank, nprocs = comm.Get_rank(), comm.Get_size()
    n = 4096 * nprocs
    hints = {"cb_buffer_size": "1024", "romio_cb_write": "enable", "romio_cb_read": "enable",
             "cb_config_list": "*:*", **policy}  # fmt: skip
    pa, pb = (os.path.join(workdir, f"fig31_{x}.bin") for x in "ab")
    init = np.random.default_rng(31).integers(0, 256, n, dtype=np.uint8)
    if rank == 0:
        for p in (pa, pb):
            init.tofile(p)
    comm.Barrier()
    block = n // nprocs
    new = np.random.default_rng([31, rank]).integers(0, 256, n // 2 // nprocs, dtype=np.uint8)
    oracle = init.copy()
    halves = comm.allgather(new.view(np.int32))
    ints = oracle[: n // 2].view(np.int32)
    for r, h in enumerate(halves):
        ints[r::nprocs] = h
    f = Twins(comm, pa, pb, hints)
    ft = MPI.Datatype.Create_struct([1], [4 * rank], [MPI.INT]).Create_resized(0, 4 * nprocs)
    ft.Commit()
    errors: list[str] = []
    first_s, first_r = np.zeros(block, np.uint8), np.zeros(block, np.uint8)
    f.s.read_at_all(rank * block, first_s)
    f.r.Read_at_all(rank * block, first_r)
    f.view(0, MPI.INT, ft)
    f.s.write_at_all(0, new)
    f.r.Write_at_all(0, new)
    f.view(0, MPI.BYTE, MPI.BYTE)
    again_s, again_r = np.zeros(block, np.uint8), np.zeros(block, np.uint8)
    f.s.read_at_all(rank * block, again_s)
    f.r.Read_at_all(rank * block, again_r)
    f.close()
    want = oracle[rank * block : (rank + 1) * block]
    for name, got in (("first read", first_s), ("read after write", again_s)):
        ref = init[rank * block : (rank + 1) * block] if name == "first read" else want
        if not np.array_equal(got, ref):
            errors.append(f"figure 3.1 {policy} rank {rank}: {name} differs from the oracle")
    if not np.array_equal(again_r, want):
        errors.append(f"figure 3.1 rank {rank}: ROMIO itself differs from the oracle")
    comm.Barrier()
    if rank == 0:
        a = np.fromfile(pa, dtype=np.uint8)
        if not np.array_equal(a, oracle):
            errors.append(f"figure 3.1 {policy}: file differs from the oracle")
        for p in (pa, pb):
            os.unlink(p)
    ft.Free()
    return errors, 3


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cases", type=int, default=3)
    ap.add_argument("--dir", required=True)
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    errors: list[str] = []
    cases = checks = 0
    for p, policy in enumerate(POLICIES):
        for c in range(args.cases):
            e, k = run_case(comm, (args.seed * 1009 + p) * 101 + c, policy, args.dir)
            errors += e
            checks += k
            cases += 1
        e, k = figure_3_1(comm, policy, args.dir)
        errors += e
        checks += k
    everyone = comm.gather(errors, root=0)
    total = comm.reduce(checks, root=0)
    if comm.Get_rank() == 0:
        flat = [e for errs in everyone for e in errs]
        if flat:
            print("\n".join(flat[:20]))
            print(f"FAILED {len(flat)} checks")
            return 1
        print(f"ok {cases} cases, {total} checks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
