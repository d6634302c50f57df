"""A session's RowMemo (strataio.tiers.row_memo) alone against an exact model: per dataset,
the rows kept, their generation and whether they are every chunk's, in the order kept.

Closing handles keep what they learned at some generation while the catalog's generation
moves on; after every step the memo holds the model's datasets in order, its chunk count is
theirs and within :attr:`RowMemo.MAX_CHUNKS`, and a take serves rows only at the generation
they were learned at (else drops them), never a chunk's rows from another generation.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from strataio.catalog.base import ChunkCopy
from strataio.tiers.row_memo import LearnedRows, RowMemo

NAMES = ("a", "b", "c")
KEYS = ("c/0", "c/1", "c/2", "c/3")
TIERS = ("fast", "slow")
MAX = 6


def row(name: str, key: str, tier: str, generation: int) -> ChunkCopy:
    """The row of a copy as the catalog held it at ``generation``."""
    return ChunkCopy(name, key, tier, generation, f"crc32c:{generation:08x}")


class RowMemoModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.memo = RowMemo()
        self.memo.MAX_CHUNKS = MAX
        self.generation = dict.fromkeys(NAMES, 0)  # the catalog's, per dataset
        # name -> (generation, {key: {tier: row}}, whole), in the order kept
        self.model: dict[str, tuple[int, dict[str, dict[str, ChunkCopy]], bool]] = {}

    def _rows(self, name: str, generation: int, keys: list[str]) -> dict:
        # (a chunk with an odd index has a copy on both tiers; c/3 none at all)
        return {
            k: {
                t: row(name, k, t, generation)
                for t in TIERS[: (0 if k == "c/3" else 1 + KEYS.index(k) % 2)]
            }
            for k in keys
        }

    # ----------------------------------------------------------------- rules
    @rule(name=st.sampled_from(NAMES))
    def commit(self, name: str) -> None:
        """A commit changes the dataset's rows: its generation moves on."""
        self.generation[name] += 1

    @rule(
        name=st.sampled_from(NAMES),
        keys=st.lists(st.sampled_from(KEYS), unique=True, max_size=4),
        whole=st.booleans(),
        behind=st.booleans(),
    )
    def keep(self, name: str, keys: list[str], whole: bool, behind: bool) -> None:
        """A handle closes, leaving what it learned (``behind``: at the generation before
        the catalog's, which a handle that saw a commit while open would not leave, but a
        memo must hold apart all the same)."""
        gen = self.generation[name] - (1 if behind else 0)
        if whole:
            keys = list(KEYS)
        rows = self._rows(name, gen, keys)
        checks = {(k, t): (c.checksum, gen) for k, per in rows.items() for t, c in per.items()}
        self.memo.keep(name, LearnedRows(gen, rows, checks, whole))
        old = self.model.pop(name, None)
        if old is not None and old[0] == gen:
            rows = {**old[1], **rows}
            whole = whole or old[2]
        if len(rows) > MAX:
            return
        self.model[name] = (gen, rows, whole)
        while sum(len(m[1]) for m in self.model.values()) > MAX:
            del self.model[next(iter(self.model))]

    @rule(name=st.sampled_from(NAMES), keys=st.none() | st.lists(st.sampled_from(KEYS)))
    def take(self, name: str, keys: list[str] | None) -> None:
        gen = self.generation[name]
        got = self.memo.take(name, gen, keys)
        kept = self.model.get(name)
        if kept is None:
            assert got is None
            return
        if kept[0] != gen:
            assert got is None
            del self.model[name]
            return
        _, have, whole = kept
        if keys is None:
            if not whole:
                assert got == ([], {}, None)
                return
            keys = list(have)
        rows, checks, rest = got
        assert rows == [c for k in keys for c in have.get(k, {}).values()]
        assert all(c.nbytes == gen for c in rows)  # (rows of this generation only)
        assert checks == {
            (k, t): (c.checksum, gen) for k in keys for t, c in have.get(k, {}).items()
        }
        assert rest == ([] if whole else [k for k in keys if k not in have])

    @rule(name=st.none() | st.sampled_from(NAMES))
    def forget(self, name: str | None) -> None:
        self.memo.forget(name)
        if name is None:
            self.model.clear()
        else:
            self.model.pop(name, None)

    # ----------------------------------------------------------------- invariants
    @invariant()
    def holds_the_model_s_datasets_in_order(self) -> None:
        assert list(self.memo._kept) == list(self.model)
        assert len(self.memo) == len(self.model)
        for name in NAMES:
            kept, want = self.memo.get(name), self.model.get(name)
            assert (kept is None) == (want is None)
            if kept is not None:
                assert (kept.generation, kept.rows, kept.whole) == want

    @invariant()
    def chunks_counted_and_within_the_bound(self) -> None:
        assert self.memo._size == sum(len(m[1]) for m in self.model.values()) <= MAX


RowMemoModel.TestCase.settings = settings(max_examples=300, stateful_step_count=30, deadline=None)
test_row_memo_model = RowMemoModel.TestCase
