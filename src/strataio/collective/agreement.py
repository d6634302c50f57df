"""The agreement of a collective call: every rank's five numbers, known to every rank.

Before any byte of a collective call moves, the ranks exchange one row each (error code, first
and last byte touched, bytes, pieces; :mod:`strataio.collective.access`) in one ``Allgather``.
An error anywhere is then known everywhere, and the same numbers drive the choice of path
(:mod:`strataio.collective.choice`), so every rank takes the same one.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from strataio.collective.access import ERR, ROW, Access, AccessPlan

_I64 = np.int64


def agreement_row(access: Access | None, err: int) -> bytes:
    """This rank's five agreement numbers (see the module docstring), packed."""
    if access is None:
        return ROW.pack(err, 0, 0, 0, 0)
    plan = access.plan if access.plan is not None else AccessPlan(access.file)
    if err == 0:
        return plan.row
    return ROW.pack(err, *plan.summary)


class Agreement:
    """The agreement of one file's collective calls: a persistent (MPI-4) ``Allgather`` of the
    ranks' rows, set up once when the file opens (collective) and only started and waited for
    per call. After a multi-megabyte copy has flushed the caches, as in every benchmark call,
    that costs 21-24 us against 60-62 us for a plain ``Allgather`` (2 ranks); inside a
    collective read of 2 MB per rank the agreement took 25-42 us instead of 41-54. Without
    persistent collectives in the MPI library, a plain ``Allgather`` per call.

    A call's own work stays in plain Python (its rows in, lists out): with cold caches every
    numpy call costs 10-30 us, more than the whole choice it serves."""

    __slots__ = ("_comm", "_request", "_rows", "_send", "_send_row", "_sent", "errors", "table")

    def __init__(self, comm: MPI.Comm) -> None:
        self._comm = comm
        nprocs = comm.Get_size()
        self.table = np.zeros((nprocs, 5), dtype=_I64)
        """Every rank's row of the last call, ``(nprocs, 5)`` (overwritten by the next)."""
        self._rows = memoryview(self.table)
        self.errors = self._rows.cast("B").cast("q")[ERR::5]
        """Every rank's error code of the last call (a view of :attr:`table`)."""
        send = self.table[0] if nprocs == 1 else np.zeros(5, dtype=_I64)
        self._send_row = send  # (what MPI is given: five int64, the type of the table's rows)
        self._send = memoryview(send).cast("B")
        self._sent: bytes | None = None  # the row in the send buffer (an AccessPlan's, often)
        self._request: MPI.Prequest | None = None
        if nprocs > 1:
            try:
                self._request = comm.Allgather_init(send, self.table)
            except NotImplementedError:  # an MPI before 4.0
                self._request = None

    def __call__(self, row: bytes) -> list[list[int]]:
        """All ranks' rows (see :func:`agreement_row`), as lists; also in :attr:`table`. With
        one rank no communication happens."""
        if row is not self._sent:  # a call repeating a layout sends the same row object
            self._send[:] = row
            self._sent = row
        if self._request is not None:
            self._request.Start()
            self._request.Wait()
        elif self.table.shape[0] > 1:
            self._comm.Allgather(self._send_row, self.table)
        return self._rows.tolist()

    @property
    def comm(self) -> MPI.Comm:
        """The communicator the rows are exchanged on."""
        return self._comm

    def free(self) -> None:
        """Release the persistent request (local)."""
        if self._request is not None:
            self._request.Free()
            self._request = None
