"""The commpool state machine (tests/test_commpool_stateful.py) on every rank of the job at
once: every rank runs the same derandomized steps, so the communicators' duplicates and
frees, and the persistent collectives of the agreements, are collective as in a program.
Rank 0 prints ``ok``."""

from __future__ import annotations

import sys
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from test_commpool_stateful import CommPoolModel  # noqa: E402

run_state_machine_as_test(
    CommPoolModel,
    settings=settings(
        max_examples=int(sys.argv[1]),
        stateful_step_count=30,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    ),
)
if MPI.COMM_WORLD.Get_rank() == 0:
    print("ok")
