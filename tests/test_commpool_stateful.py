"""The pool of open files' private communicators (strataio.collective.commpool) in one process,
against a model: per communicator opened on, the agreements kept for it (last kept, first
taken), and the agreements in use.

Files are opened (``take``) and closed (``give_back``) on several communicators, which are
also freed: after every step each communicator keeps at most :data:`commpool.KEEP`, exactly
the model's, each over a live duplicate of it that no open file uses; an agreement in use
is no other's; and an agreement let go (beyond the bound, or kept by a communicator since
freed) is freed.
"""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from mpi4py import MPI

from mpirun import run_mpi
from strataio.collective import commpool
from strataio.collective.agreement import Agreement

PARENTS = 3
#: the communicators files are opened on duplicate this one (every rank of it runs the same
#: steps: run under mpiexec with derandomized examples)
BASE = MPI.COMM_WORLD


class CommPoolModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.parents = [BASE.Dup() for _ in range(PARENTS)]
        self.kept: list[list[Agreement]] = [[] for _ in range(PARENTS)]
        self.open: list[tuple[int, Agreement]] = []  # (parent, agreement) of open files
        self.released: list[Agreement] = []

    def teardown(self) -> None:
        for _, a in self.open:
            a.free()
            a.comm.Free()
        for p in self.parents:
            if p != MPI.COMM_NULL:
                p.Free()
        self.check_released()

    # ----------------------------------------------------------------- rules
    @rule(i=st.integers(0, PARENTS - 1))
    def open_file(self, i: int) -> None:
        if self.parents[i] == MPI.COMM_NULL:
            self.parents[i] = BASE.Dup()  # (a new communicator in its place)
        a = commpool.take(self.parents[i])
        if self.kept[i]:
            assert a is self.kept[i].pop()
        else:
            assert all(a is not b for _, b in self.open)
        self.open.append((i, a))

    @precondition(lambda self: self.open)
    @rule(data=st.data())
    def close_file(self, data: st.DataObject) -> None:
        i, a = self.open.pop(data.draw(st.integers(0, len(self.open) - 1)))
        commpool.give_back(self.parents[i], a)
        if self.parents[i] == MPI.COMM_NULL or len(self.kept[i]) >= commpool.KEEP:
            self.released.append(a)
        else:
            self.kept[i].append(a)

    @rule(i=st.integers(0, PARENTS - 1))
    def free_communicator(self, i: int) -> None:
        """The application frees a communicator files were opened on (some maybe still
        open): what it kept is freed with it."""
        if self.parents[i] == MPI.COMM_NULL:
            return
        self.parents[i].Free()
        self.released += self.kept[i]
        self.kept[i] = []

    # ----------------------------------------------------------------- invariants
    @invariant()
    def each_communicator_keeps_the_model_s(self) -> None:
        for p, want in zip(self.parents, self.kept):
            if p == MPI.COMM_NULL:
                continue
            pool = commpool._pool(p)
            assert len(pool) <= commpool.KEEP
            assert len(pool) == len(want) and all(a is b for a, b in zip(pool, want))
            for a in pool:
                assert a.comm != MPI.COMM_NULL
                assert MPI.Comm.Compare(a.comm, p) == MPI.CONGRUENT  # a duplicate of it

    @invariant()
    def no_agreement_serves_two(self) -> None:
        alive = [a for _, a in self.open] + [a for kept in self.kept for a in kept]
        assert len({id(a) for a in alive}) == len(alive)
        assert len({id(a.comm) for a in alive}) == len(alive)
        for _, a in self.open:
            assert a.comm != MPI.COMM_NULL

    @invariant()
    def check_released(self) -> None:
        for a in self.released:
            assert a.comm == MPI.COMM_NULL and a._request is None


CommPoolModel.TestCase.settings = settings(max_examples=100, stateful_step_count=30, deadline=None)
test_commpool_model = CommPoolModel.TestCase


@pytest.mark.mpi
def test_commpool_model_on_two_ranks():
    """The same steps on two ranks at once (collective duplicates, persistent Allgathers)."""
    assert run_mpi(2, "commpool_machine.py", 100, timeout=120).strip() == "ok"
