"""The strataio.File state machine (tests/test_file_stateful.py) on every rank of the job at
once: every rank runs the same derandomized steps, so the collective calls meet as in a
program. Arguments: the number of examples, and optionally of steps and ``debug``. Rank 0 prints ``ok``."""

from __future__ import annotations

import sys
from pathlib import Path

from hypothesis import HealthCheck, Verbosity, settings
from hypothesis.stateful import run_state_machine_as_test
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from test_file_stateful import FileMachine  # noqa: E402

run_state_machine_as_test(
    FileMachine,
    settings=settings(
        max_examples=int(sys.argv[1]),
        stateful_step_count=int(sys.argv[2]) if len(sys.argv) > 2 else 15,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
        verbosity=Verbosity.debug if len(sys.argv) > 3 else Verbosity.normal,
    ),
)
if MPI.COMM_WORLD.Get_rank() == 0:
    print("ok")
