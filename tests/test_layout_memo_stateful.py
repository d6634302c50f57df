"""LayoutMemo (strataio.layout.memo) against an exact model: an LRU of results keyed by the
identity of their sources and plain numbers.

The rules ask for results of sources from a small pool, whose objects the caller also
drops and replaces (CPython soon gives a new object a freed one's id): after every step the
memo holds the model's entries in LRU order, at most its size, each under its sources' ids
with its sources held, and a result is made exactly on a miss and is the model's on a hit:
never one made for another object that once had the same id.
"""

from __future__ import annotations

from collections import OrderedDict

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from strataio.layout.memo import LayoutMemo

POOL = 4


class Source:
    """A long-lived object a layout is computed from (a datatype, Extents)."""


class LayoutMemoModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.memo: LayoutMemo[object] | None = None
        self.pool = [Source() for _ in range(POOL)]
        # key -> (sources, result); sources compared by identity
        self.model: OrderedDict[tuple, tuple[tuple[object, ...], object]] = OrderedDict()

    @initialize(size=st.integers(1, 5))
    def make(self, size: int) -> None:
        self.memo = LayoutMemo(size)
        self.size = size

    def _find(self, sources: tuple[object, ...], numbers: tuple[int, ...]) -> tuple | None:
        for key, (held, _) in self.model.items():
            same = len(held) == len(sources) and all(a is b for a, b in zip(held, sources))
            if key[1] == numbers and same:
                return key
        return None

    @rule(
        which=st.lists(st.integers(0, POOL - 1), min_size=0, max_size=2),
        numbers=st.lists(st.integers(0, 3), max_size=2).map(tuple),
    )
    def get(self, which: list[int], numbers: tuple[int, ...]) -> None:
        sources = tuple(self.pool[i] for i in which)
        made: list[object] = []

        def make() -> object:
            made.append(object())
            return made[-1]

        got = self.memo.get(sources, numbers, make)
        key = self._find(sources, numbers)
        if key is not None:
            assert made == [] and got is self.model[key][1]
            self.model.move_to_end(key)
        else:
            assert len(made) == 1 and got is made[0]
            self.model[(tuple(map(id, sources)), numbers)] = (sources, got)
            while len(self.model) > self.size:
                self.model.popitem(last=False)

    @rule(which=st.lists(st.integers(0, POOL - 1), min_size=1, max_size=2), tail=st.integers(0, 3))
    def get_with_an_id_among_the_numbers(self, which: list[int], tail: int) -> None:
        """Numbers are plain numbers, whatever their values: one that is an object's id does
        not make a result of fewer sources another's with that object among its sources."""
        self.get(which[1:], (id(self.pool[which[0]]), tail))

    @rule(i=st.integers(0, POOL - 1))
    def replace_source(self, i: int) -> None:
        """The caller drops an object (its memory free unless the memo holds it) and makes a
        new one, often at the same address."""
        self.pool[i] = None
        self.pool[i] = Source()

    # ----------------------------------------------------------------- invariants
    @invariant()
    def holds_the_model_s_entries(self) -> None:
        if self.memo is None:
            return
        table = list(self.memo._table.items())
        assert len(table) <= self.size
        assert len(table) == len(self.model)
        for (key, (held, value)), (mheld, mvalue) in zip(table, self.model.values()):
            assert value is mvalue
            assert len(held) == len(mheld) and all(a is b for a, b in zip(held, mheld))
            assert key[: len(held) + 1] == (len(held), *map(id, held))


LayoutMemoModel.TestCase.settings = settings(
    max_examples=200, stateful_step_count=40, deadline=None
)
test_layout_memo_model = LayoutMemoModel.TestCase


def test_a_number_equal_to_an_object_s_id_is_no_source():
    """Results of one source and of none, whose numbers begin with that source's id, are
    two results (they shared one key, so the second call got the first's result)."""
    memo: LayoutMemo[str] = LayoutMemo(4)
    x = Source()
    assert memo.get((x,), (1,), lambda: "one source") == "one source"
    assert memo.get((), (id(x), 1), lambda: "no source") == "no source"
    assert memo.get((x,), (1,), lambda: "made again") == "one source"
