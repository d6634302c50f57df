"""``strataio.File`` against a model: a numpy byte array of the file.

Every rank of the job runs the same derandomized steps (under mpiexec, see
``tests/mpi_scripts/file_machine.py``; in this process, alone): views of random filetypes
(contiguous, vector, subarray, hindexed; each rank's data disjoint from the others'),
collective and independent writes and reads at explicit offsets and at the individual file
pointer, ``set_size`` growing and shrinking the file, ``sync``, and closing and reopening it
with other hints (collective buffering and data sieving on or off, ``cb_nodes``, small
``cb_buffer_size``, persistent realms and the realm cache). What each rank writes is drawn from
its own generator, so the ranks move different bytes and counts.

After every step ``get_size`` is the model's size and every rank's collective read of the
whole file through a contiguous view is the model (zeros past its end). Checks are agreed
across the ranks, so a failure raises on all of them and hypothesis shrinks on all alike.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from mpi4py import MPI

import strataio
from mpirun import run_mpi
from strataio.collective.driver import LayeredDriver
from strataio.errors import StrataError

#: the job the machine runs on (every rank of it runs the same steps)
COMM = MPI.COMM_WORLD

ETYPES = {1: MPI.BYTE, 4: MPI.INT}
SWITCH = st.sampled_from(["enable", "disable", "automatic"])
BASE_HINTS = st.fixed_dictionaries(
    {
        "cb_nodes": st.integers(1, 2).map(str),
        "cb_buffer_size": st.sampled_from(["16", "64", "4096", str(1 << 20)]),
        "romio_cb_read": SWITCH,
        "romio_cb_write": SWITCH,
        "romio_ds_read": SWITCH,
        "romio_ds_write": SWITCH,
        "ind_rd_buffer_size": st.sampled_from(["32", "4096"]),
        "ind_wr_buffer_size": st.sampled_from(["32", "4096"]),
    }
)
#: persistent realms (dynamic ones among them) and the realm cache, or neither
REALMS = st.one_of(
    st.just({}),
    st.fixed_dictionaries(
        {
            "romio_cb_pfr": st.just("enable"),
            "strataio_realm_cache": st.sampled_from(["0", "1024", "4096", str(1 << 20)]),
        },
        optional={"strataio_realms": st.just("dynamic")},
    ),
)
HINTS = st.builds(lambda a, b: a | b, BASE_HINTS, REALMS)


@st.composite
def views(draw: st.DrawFn) -> tuple:
    """A view's recipe, the same on every rank: ``(kind, etype size, disp, params)``."""
    kind = draw(st.sampled_from(["contiguous", "vector", "subarray", "hindexed"]))
    es = draw(st.sampled_from([1, 4]))
    disp = draw(st.integers(0, 20))
    if kind == "contiguous":
        params: tuple = (draw(st.integers(1, 12)),)
    elif kind == "vector":
        params = (draw(st.integers(1, 5)), draw(st.integers(1, 4)), draw(st.integers(0, 3)))
    elif kind == "subarray":
        params = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    else:  # units of lengths, each owned by a rank or by none (a hole)
        units = draw(st.lists(st.tuples(st.integers(1, 5), st.integers(-1, 7)), max_size=12))
        params = (tuple(units),)
    return kind, es, disp, params


def build_view(recipe: tuple, rank: int, nprocs: int) -> tuple[int, MPI.Datatype, np.ndarray, int]:
    """This rank's ``(disp, filetype, tile, extent)`` of ``recipe``: ``tile`` the byte offsets
    of the filetype's data in one tile, in stream order."""
    kind, es, disp, params = recipe
    et = ETYPES[es]
    if kind == "contiguous":  # rank r's block of b etypes in every P * b
        (b,) = params
        base = et.Create_contiguous(b)
        ft = base.Create_resized(0, nprocs * b * es)
        disp += rank * b * es
        tile = np.arange(b * es)
    elif kind == "vector":  # c blocks of b etypes, ranks interleaved, gap etypes after each
        c, b, gap = params
        stride = nprocs * b + gap
        base = et.Create_vector(c, b, stride)
        ft = base.Create_resized(0, c * stride * es)
        disp += rank * b * es
        tile = (np.arange(c)[:, None] * stride * es + np.arange(b * es)).ravel()
    elif kind == "subarray":  # a rows x (P * cols) array, rank r's columns
        rows, cols = params
        base = None
        ft = et.Create_subarray([rows, nprocs * cols], [rows, cols], [0, rank * cols])
        row = nprocs * cols * es
        tile = (np.arange(rows)[:, None] * row + rank * cols * es + np.arange(cols * es)).ravel()
    else:
        (units,) = params
        units = list(units) + [(1, p) for p in range(nprocs)]  # (every rank owns some)
        lens = np.array([n for n, _ in units])
        starts = np.concatenate(([0], np.cumsum(lens)[:-1]))
        mine = [i for i, (_, owner) in enumerate(units) if owner % (nprocs + 1) == rank]
        base = et.Create_hindexed([int(lens[i]) for i in mine], [int(starts[i]) * es for i in mine])
        ft = base.Create_resized(0, int(lens.sum()) * es)
        tile = np.concatenate([np.arange(starts[i] * es, (starts[i] + lens[i]) * es) for i in mine])
    if base is not None:
        ft.Commit()
        base.Free()
    else:
        ft.Commit()
    return disp, ft, tile.astype(np.int64), ft.extent


class FailingWrites(LayeredDriver):
    """``inner`` whose writes fail (a full disk), its reads as they are."""

    def readv(self, plan, buf) -> None:  # type: ignore[no-untyped-def]
        self.inner.readv(plan, buf)

    def pread(self, buf, offset):  # type: ignore[no-untyped-def]
        return self.inner.pread(buf, offset)

    def writev(self, plan, buf) -> None:  # type: ignore[no-untyped-def]
        raise OSError(28, "injected: no space left")

    def pwrite(self, buf, offset) -> None:  # type: ignore[no-untyped-def]
        raise OSError(28, "injected: no space left")


class FileMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.rank, self.nprocs = COMM.Get_rank(), COMM.Get_size()
        self.dir = COMM.bcast(tempfile.mkdtemp(prefix="file-sm-") if self.rank == 0 else None)
        self.path = os.path.join(self.dir, "f.bin")
        self.model = np.zeros(0, np.uint8)
        self.types: list[MPI.Datatype] = []
        self.f = strataio.File.open(COMM, self.path, "w")
        self.recipe: tuple = ("contiguous", 1, 0, (1,))
        self._apply_view(self.recipe)

    def teardown(self) -> None:
        self.f.close()
        for t in self.types:
            t.Free()
        COMM.Barrier()
        if self.rank == 0:
            shutil.rmtree(self.dir, ignore_errors=True)

    # ----------------------------------------------------------------- helpers
    def _apply_view(self, recipe: tuple) -> None:
        disp, ft, tile, ext = build_view(recipe, self.rank, self.nprocs)
        self.types.append(ft)
        self.f.set_view(disp, ETYPES[recipe[1]], ft)
        self.recipe, self.disp, self.tile, self.ext, self.es = recipe, disp, tile, ext, recipe[1]
        self.pos = 0  # (the individual file pointer, in etypes)

    def _positions(self, offset: int, nbytes: int) -> np.ndarray:
        """File bytes of this rank's view stream bytes from ``offset`` etypes on."""
        k, j = np.divmod(offset * self.es + np.arange(nbytes), self.tile.size)
        return self.disp + k * self.ext + self.tile[j]

    def _data(self, seed: int, most: int) -> tuple[int, np.ndarray]:
        """This rank's own ``(offset, bytes)`` of a write from ``seed``."""
        rng = np.random.default_rng([seed, self.rank])
        n = int(rng.integers(0, most + 1)) * self.es
        return int(rng.integers(0, 16)), rng.integers(0, 256, n, dtype=np.uint8)

    def _apply(self, pos: np.ndarray, data: np.ndarray) -> None:
        """Every rank's write of ``data`` at file bytes ``pos`` into the model."""
        for p, d in COMM.allgather((pos, data)):
            if p.size:
                if int(p.max()) >= self.model.size:
                    self.model = np.concatenate(
                        (self.model, np.zeros(int(p.max()) + 1 - self.model.size, np.uint8))
                    )
                self.model[p] = d

    def _check(self, ok: bool, what: str) -> None:
        """Raise on every rank when ``ok`` is false on any."""
        bad = [w for w in COMM.allgather(None if ok else f"rank {self.rank}: {what}") if w]
        assert not bad, "; ".join(bad)

    def _check_read(self, pos: np.ndarray, buf: np.ndarray, got: int, what: str) -> None:
        inside = pos < self.model.size
        want = int(np.argmin(inside)) if not inside.all() else pos.size
        exp = np.zeros(pos.size, np.uint8)
        exp[inside] = self.model[pos[inside]]
        self._check(
            got == want and np.array_equal(buf, exp),
            f"{what} returned {got} (want {want}); bytes equal: {np.array_equal(buf, exp)}",
        )

    # ----------------------------------------------------------------- rules
    @rule(recipe=views())
    def set_view(self, recipe: tuple) -> None:
        self._apply_view(recipe)

    @rule(seed=st.integers(0, 2**32 - 1), at=st.booleans())
    def write_all(self, seed: int, at: bool) -> None:
        offset, data = self._data(seed, 40)
        if not at:
            offset = self.pos
        got = self.f.write_at_all(offset, data) if at else self.f.write_all(data)
        pos = self._positions(offset, data.size)
        if not at:
            self.pos += data.size // self.es
        self._apply(pos, data)
        self._check(got == data.size, f"write returned {got} of {data.size}")
        self._check(self.f.get_position() == self.pos, "file pointer moved wrongly")

    @rule(seed=st.integers(0, 2**32 - 1), at=st.booleans())
    def read_all(self, seed: int, at: bool) -> None:
        offset, data = self._data(seed, 60)
        if not at:
            offset = self.pos
        buf = np.full(data.size, 0xAA, np.uint8)
        got = self.f.read_at_all(offset, buf) if at else self.f.read_all(buf)
        if not at:
            self.pos += got // self.es
        self._check_read(self._positions(offset, buf.size), buf, got, "collective read")

    @rule(seed=st.integers(0, 2**32 - 1))
    def write_at(self, seed: int) -> None:
        """Independent writes (of disjoint bytes: each rank's view is its own), made visible
        to the other ranks by sync-barrier-sync as MPI asks."""
        offset, data = self._data(seed, 40)
        got = self.f.write_at(offset, data)
        self._apply(self._positions(offset, data.size), data)
        self._check(got == data.size, f"write_at returned {got} of {data.size}")
        self.f.sync()
        COMM.Barrier()
        self.f.sync()

    @rule(seed=st.integers(0, 2**32 - 1))
    def read_at(self, seed: int) -> None:
        offset, data = self._data(seed, 60)
        buf = np.full(data.size, 0xAA, np.uint8)
        got = self.f.read_at(offset, buf)
        self._check_read(self._positions(offset, buf.size), buf, got, "read_at")

    @rule(data=st.data())
    def set_size(self, data: st.DataObject) -> None:
        size = data.draw(st.integers(0, self.model.size + 64), label="size")
        self.f.set_size(size)
        if size <= self.model.size:
            self.model = self.model[:size].copy()
        else:
            self.model = np.concatenate((self.model, np.zeros(size - self.model.size, np.uint8)))

    @rule()
    def sync(self) -> None:
        self.f.sync()

    @rule(data=st.data(), recipe=views())
    def cache_write_back_fails(self, data: st.DataObject, recipe: tuple) -> None:
        """A ``set_size``, or a new view and a collective read (dynamic realms retire, writing
        their cache back), while every write-back of the realm caches fails: the call raises
        on every rank or on none, and a call that raised loses no byte cached before it."""
        cache = self.f.realm_cache
        inner = cache.inner if cache is not None else None
        if cache is not None:
            cache.inner = FailingWrites(inner)
        failed = False
        try:
            if data.draw(st.booleans(), label="set_size"):
                size = data.draw(st.integers(0, self.model.size + 64), label="size")
                try:
                    self.f.set_size(size)
                except StrataError:
                    failed = True
                else:
                    self.model = self.model[:size].copy()
                    self.model = np.concatenate(
                        (self.model, np.zeros(size - self.model.size, np.uint8))
                    )
            else:
                self._apply_view(recipe)
                buf = np.zeros(64, np.uint8)
                try:
                    self.f.read_at_all(0, buf)
                except StrataError:
                    failed = True
        finally:
            if cache is not None:
                cache.inner = inner
        self._check(len(set(COMM.allgather(failed))) == 1, "the call failed on some ranks only")

    @rule(hints=HINTS)
    def reopen(self, hints: dict[str, str]) -> None:
        self.f.close()
        self.f = strataio.File.open(COMM, self.path, "r+", hints)
        self._apply_view(self.recipe)

    @rule(pos=st.integers(0, 40))
    def seek(self, pos: int) -> None:
        """(No precondition on this rank's pointer: the ranks' pointers differ, and every
        rank must draw the same steps.)"""
        self.pos = pos
        self.f.seek(pos)

    # ----------------------------------------------------------------- invariants
    @invariant()
    def file_reads_as_the_model(self) -> None:
        size = self.f.get_size()
        self._check(size == self.model.size, f"get_size {size}, model {self.model.size}")
        view = self.f.get_view()
        self.f.set_view(0, MPI.BYTE, MPI.BYTE)
        buf = np.full(self.model.size + 16, 0xAA, np.uint8)
        got = self.f.read_at_all(0, buf)
        self._check_read(np.arange(buf.size), buf, got, "read of the whole file")
        self.f.set_view(*view)
        self.f.seek(self.pos)


FileMachine.TestCase.settings = settings(max_examples=15, stateful_step_count=15, deadline=None)
test_file_model = FileMachine.TestCase


@pytest.mark.mpi
def test_file_model_on_two_ranks():
    """The same steps on two ranks at once: collective calls through the two-phase engine,
    independent ones beside each other's."""
    assert run_mpi(2, "file_machine.py", 30, timeout=180).strip() == "ok"
