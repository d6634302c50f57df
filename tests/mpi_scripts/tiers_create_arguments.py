"""Run under ``mpiexec -n 2``: a Session whose ranks pass other tiers raises ArgumentError on
every rank and leaves no writer registered, and one whose configuration a rank cannot read
raises on every rank; a Session's create_dataset, open_dataset and
delete_dataset are collective, so ranks passing different arguments (dtype, shape, chunks, attrs, hint, name,
mode) raise ArgumentError on every rank, naming the argument and the ranks, and nothing is
created or deleted; the same calls with the same arguments on every rank work, and what every
rank wrote reads back.

Prints ``ok`` on rank 0 when the checks pass.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from disk_and_tape import disk_and_tape
from mpi4py import MPI

import strataio
from strataio.errors import ArgumentError

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
root = Path(sys.argv[1])


def refused(call, *says: str) -> None:
    """``call`` raises ArgumentError on this rank, saying each of ``says``."""
    try:
        got = call()
    except ArgumentError as exc:
        for word in says:
            assert word in str(exc), (word, str(exc))
        comm.Barrier()  # (no rank went on into a collective the others skipped)
        return
    got.close()
    raise AssertionError(f"rank {rank}: {says} did not raise ArgumentError")


# rank 1's tiers under another directory: it would put its chunks where no rank reads them
refused(
    lambda: strataio.Session(
        tiers=disk_and_tape(root / ["", "elsewhere"][rank]), catalog=root / "cat.db", comm=comm
    ),
    "Session",
    "place of tier 'disk'",
    "rank 1",
    "elsewhere",
)
# a configuration rank 1 cannot read: every rank raises (rank 0 waited in its catalog's
# agreement for good)
good = root / "strataio.toml"
if rank == 0:
    good.write_text(
        "[catalog]\nurl = 'other.db'\n"
        "[[tiers]]\nname = 'disk'\nkind = 'posix'\nrole = 'localdisk'\npath = 'cfgdisk'\n"
    )
comm.Barrier()
try:
    strataio.Session([good, root / "missing.toml"][rank], comm=comm).close()
    said = ""
except strataio.StrataError as exc:
    said = str(exc)
assert "missing.toml" in said, (rank, said)
assert rank == 1 or "raised on rank 1" in said, said
assert not (root / "other.db").exists()
with strataio.Session(tiers=disk_and_tape(root), catalog=root / "cat.db", comm=comm) as s:
    if rank == 0:  # (the refused Session's writer released)
        assert [w.id for w in s.catalog.writers()] == [s.writer], s.catalog.writers()
    for arg, kwargs in (
        ("dtype", dict(shape=(64, 64), dtype=["f4", "i4"][rank], chunks=(16, 16))),
        ("shape", dict(shape=[(64, 64), (64, 65)][rank], dtype="f4", chunks=(16, 16))),
        ("chunks", dict(shape=(64, 64), dtype="f4", chunks=[(16, 16), (32, 16)][rank])),
        ("attrs", dict(shape=(64, 64), dtype="f4", chunks=(16, 16), attrs={"r": rank})),
        (
            "hint",
            dict(shape=(64, 64), dtype="f4", chunks=(16, 16), hint=["AUTO", "REMOTETAPE"][rank]),
        ),
    ):
        refused(lambda kw=kwargs: s.create_dataset("u", **kw), arg, "rank 1", "rank 0")
    refused(lambda: s.create_dataset(["c", "d"][rank], (8,), "f4", (4,)), "name", "rank 1")
    assert s.list_datasets() == [], s.list_datasets()  # (nothing created)
    assert not (root / "disk" / "u").exists() and not (root / "tape" / "u").exists()

    # the same arguments on every rank: created, written by both, read back by both
    ds = s.create_dataset("u", (64, 64), "f4", (16, 16), hint="LOCALDISK")
    ds.write_all(np.s_[rank * 32 : (rank + 1) * 32], np.full((32, 64), 7 + rank, "f4"))
    ds.close()
    other = s.create_dataset("v", (8,), "i4", (4,), hint="LOCALDISK")
    other.close()

    refused(lambda: s.open_dataset(["u", "v"][rank]), "name", "rank 1", "'u'", "'v'")
    refused(lambda: s.open_dataset("u", ["r", "r+"][rank]), "mode", "rank 1")
    ds = s.open_dataset("u", "r")
    got = ds.read_all(np.s_[...])
    assert ds.dtype == np.dtype("f4") and got.shape == (64, 64), (ds.dtype, got.shape)
    assert (got[:32] == 7).all() and (got[32:] == 8).all(), got
    ds.close()

    refused(lambda: s.delete_dataset(["u", "v"][rank]), "name", "rank 1")
    assert sorted(r.name for r in s.list_datasets()) == ["u", "v"]  # (nothing deleted)
    s.delete_dataset("v")
    assert [r.name for r in s.list_datasets()] == ["u"]
if rank == 0:
    print("ok", flush=True)
