"""``collective.node.layout`` against the CPUs the ranks may use (all ranks of a test run on one
node): rank 0 prints what it answered, what the affinity masks say, and whether the answer was
cached on the communicator and kept for the File opened on it."""

from __future__ import annotations

import dataclasses
import json
import os
import sys

from mpi4py import MPI

import strataio
from strataio.collective import node


def main(workdir: str) -> None:
    comm = MPI.COMM_WORLD
    cpus = set().union(*comm.allgather(os.sched_getaffinity(0)))
    expected = {
        "nodes": 1,
        "spare_cores": len(cpus) - comm.Get_size(),
        "names": [MPI.Get_processor_name()] * comm.Get_size(),
    }
    answer = node.layout(comm)
    cached = comm.Get_attr(node._KEYVAL)
    with strataio.File.open(comm, os.path.join(workdir, "f.bin"), "w") as f:
        in_file = f._nodes
    assert answer.crowded == (expected["spare_cores"] < 0)
    answer, cached, in_file = (dataclasses.asdict(x) for x in (answer, cached, in_file))
    if comm.Get_rank() == 0:
        print(
            json.dumps({"answer": answer, "expected": expected, "cached": cached, "file": in_file})
        )


if __name__ == "__main__":
    main(sys.argv[1])
