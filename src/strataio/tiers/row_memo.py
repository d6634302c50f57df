"""The catalog rows a session's closed datasets learned, for its next opens of them.

A dataset opened by one process learns each chunk's rows, with the checks recorded for its
copies, at the chunk's first lookup (:class:`~strataio.tiers.residency.Residency`). A loop
of open → read → close would ask the catalog for the same rows at every pass. The catalog
numbers each dataset's state instead (:meth:`Catalog.generation`, moved on by every commit
that changes the dataset's rows): a dataset closed here leaves the rows it learned to the
session's :class:`RowMemo`, with the generation they were learned at, when no commit
changed them while it was open. While the memo holds rows of the dataset, the next handle
(:class:`RowLoader`) asks for the generation at each of its chunk lookups (one small query)
and, while it is still that one, takes the rows from the memo instead of the catalog. So a
chunk's rows are what the catalog holds at the chunk's first lookup, as with a query, and a
reopened dataset's section costs one small query instead of its rows.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from strataio.catalog.base import Catalog, ChunkCopy, VerifiedCopy


@dataclass
class LearnedRows:
    """The catalog rows of some chunks of a dataset at catalog ``generation``: ``rows`` per
    chunk key, by tier (empty: the chunk has none), the checks of copies known then, per
    ``(key, tier)`` as ``(checksum, version)``, and ``whole`` where every chunk with rows is
    among them. The mappings are the closed handle's own, taken over, never changed after."""

    generation: int
    rows: dict[str, dict[str, ChunkCopy]]
    checks: dict[tuple[str, str], tuple[str, Any]]
    whole: bool = False

    @property
    def size(self) -> int:
        return len(self.rows)


class RowMemo:
    """A session's :class:`LearnedRows` per dataset name, at most :attr:`MAX_CHUNKS` chunks in
    all (the datasets kept longest ago go first). Thread-safe."""

    #: chunks whose rows the memo keeps, over every dataset
    MAX_CHUNKS = 1 << 16

    def __init__(self) -> None:
        self._kept: dict[str, LearnedRows] = {}  # (insertion order: the oldest first)
        self._size = 0
        self._lock = threading.Lock()

    def get(self, name: str) -> LearnedRows | None:
        with self._lock:
            return self._kept.get(name)

    def take(
        self, name: str, generation: int, keys: Sequence[str] | None
    ) -> tuple[list[ChunkCopy], dict[tuple[str, str], tuple[str, Any]], list[str] | None] | None:
        """The rows and checks (as :attr:`LearnedRows.checks`) kept of chunks ``keys`` of
        dataset ``name`` (every chunk where None) and the keys of which nothing is kept
        (None: every chunk's rows are needed and not all are kept), where the rows kept are
        of catalog ``generation``; else None."""
        with self._lock:
            kept = self._kept.get(name)
            if kept is None:
                return None
            if kept.generation != generation:
                # (the catalog moved on: these rows serve no one any more)
                del self._kept[name]
                self._size -= kept.size
                return None
            have, seen = kept.rows, kept.checks
            if keys is None:
                if not kept.whole:
                    return [], {}, None
                keys = list(have)
            rows: list[ChunkCopy] = []
            checks: dict[tuple[str, str], tuple[str, Any]] = {}
            rest: list[str] = []
            for k in keys:
                per = have.get(k)
                if per is None:
                    if not kept.whole:
                        rest.append(k)
                    continue
                for t, c in per.items():
                    rows.append(c)
                    if (check := seen.get((k, t))) is not None:
                        checks[k, t] = check
        return rows, checks, rest

    def keep(self, name: str, learned: LearnedRows) -> None:
        """Keep ``learned`` for dataset ``name``: added to what is kept of it at the same
        generation (both are the catalog's then), else in its place."""
        with self._lock:
            old = self._kept.pop(name, None)
            if old is not None:
                self._size -= old.size
                if old.generation == learned.generation:
                    old.rows.update(learned.rows)
                    old.checks.update(learned.checks)
                    old.whole = old.whole or learned.whole
                    learned = old
            if learned.size > self.MAX_CHUNKS:
                return
            self._kept[name] = learned
            self._size += learned.size
            while self._size > self.MAX_CHUNKS:
                oldest = next(iter(self._kept))
                self._size -= self._kept.pop(oldest).size

    def forget(self, name: str | None = None) -> None:
        """Drop what is kept of dataset ``name`` (of every dataset where None)."""
        with self._lock:
            if name is None:
                self._kept.clear()
                self._size = 0
            elif (old := self._kept.pop(name, None)) is not None:
                self._size -= old.size

    def __len__(self) -> int:
        with self._lock:
            return len(self._kept)


class RowLoader:
    """The ``load`` of one handle's :class:`Residency` (rows with their checks, as
    :meth:`Catalog.residency_checked`): from the session's memo while the catalog's
    generation of the dataset is the memo's, else from the catalog. It also notes the
    generation at the handle's first lookup, so that :meth:`learned` can tell whether the
    handle's rows still hold at its close."""

    def __init__(self, catalog: Catalog, name: str, memo: RowMemo) -> None:
        self.catalog = catalog
        self.name = name
        self.memo = memo
        self.first_generation: int | None = None  # at the first lookup
        self.looked = False  # (a lookup made: first_generation, if None, is unknown)
        #: whether any rows came from the catalog (else the memo holds all it learned)
        self.fetched = False
        self._lock = threading.Lock()

    def __call__(self, keys: Sequence[str] | None) -> tuple[list[ChunkCopy], Any]:
        """The rows of chunks ``keys`` (all where None), and their checks: a list of
        :class:`VerifiedCopy`, or a mapping as :attr:`LearnedRows.checks`."""
        generation: int | None = None
        if self.memo.get(self.name) is not None:  # (else no small query: see _fetch)
            generation = self.catalog.generation(self.name)
            self._note(generation)
            got = None if generation is None else self.memo.take(self.name, generation, keys)
            if got is not None and got[2] is not None:
                rows, checks, rest = got
                if rest:
                    more, more_checks = self._fetch(rest)
                    rows += more
                    checks.update({(v.key, v.tier): (v.checksum, v.version) for v in more_checks})
                return rows, checks
        return self._fetch(keys)

    def _fetch(self, keys: Sequence[str] | None) -> tuple[list[ChunkCopy], list[VerifiedCopy]]:
        self.fetched = True
        rows, checks, generation = self.catalog.residency_checked(self.name, keys)
        self._note(generation)
        return rows, checks

    def _note(self, generation: int | None) -> None:
        with self._lock:
            if not self.looked:
                self.looked = True
                self.first_generation = generation

    def learned(
        self,
        rows: dict[str, dict[str, ChunkCopy]],
        checks: dict[tuple[str, str], tuple[str, Any]],
        *,
        whole: bool = False,
    ) -> LearnedRows | None:
        """What a handle closing now learned (``rows``: per chunk key learned, its rows on
        persistent tiers by tier; ``checks``: the copies it found or took as checked), as
        :class:`LearnedRows` at the generation of its first lookup; None where that is not
        known or the catalog has moved on since (another process's commit, or the handle's
        own)."""
        if self.first_generation is None:
            return None
        if self.catalog.generation(self.name) != self.first_generation:
            return None
        return LearnedRows(self.first_generation, rows, checks, whole)
