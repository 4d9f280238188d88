"""An array that successive versions of the resident state share: a base no version writes, and
each version's changes since, as a small sorted patch.

Why: the state moves once per commit, and a search may still hold the version before. Copying a
per-row array to change 100 rows of it is work that grows with the table (four such arrays at
1M rows were 24 MB copied per commit, and the first commits after a load paid for fresh pages
too); a patch costs what the commit changed. When the patch outgrows ``FOLD_SHARE`` of the rows it
is folded into a new base: one copy every many commits.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FOLD_SHARE = 1 / 32
"""A patch larger than this share of the rows (and than ``FOLD_MIN``) is folded into a new base."""
FOLD_MIN = 4_096


@dataclass(frozen=True, kw_only=True)
class Patched:
    """``length`` values: ``base`` (positions past it ``fill``), except at ``slots`` (sorted,
    unique), which hold ``values``. Never written in place."""

    base: np.ndarray
    slots: np.ndarray
    values: np.ndarray
    length: int
    fill: int

    @classmethod
    def of(cls, array: np.ndarray, *, fill: int) -> Patched:
        return cls(base=array, slots=np.empty(0, np.int64), values=array[:0].copy(), length=len(array), fill=fill)

    def __len__(self) -> int:
        return self.length

    @property
    def dtype(self) -> np.dtype:
        return self.base.dtype

    @property
    def nbytes(self) -> int:
        return int(self.base.nbytes + self.slots.nbytes + self.values.nbytes)

    def take(self, at: np.ndarray) -> np.ndarray:
        """The values at positions ``at``: work of ``len(at)`` (times the log of the patch's size)."""
        at = np.asarray(at, dtype=np.int64)
        inside = at < len(self.base)
        found = np.full((len(at), *self.base.shape[1:]), self.fill, dtype=self.base.dtype)
        found[inside] = self.base[at[inside]]
        if len(self.slots) and len(at):
            where = np.minimum(np.searchsorted(self.slots, at), len(self.slots) - 1)
            hit = self.slots[where] == at
            found[hit] = self.values[where[hit]]
        return found

    def mapped(self, table: np.ndarray) -> np.ndarray:
        """``table[value]`` for every position, in order (one pass over the rows, as ``table[array]``)."""
        mapped = np.empty(self.length, dtype=table.dtype)
        mapped[: len(self.base)] = table[self.base]
        mapped[len(self.base) :] = table[self.fill]
        mapped[self.slots] = table[self.values]
        return mapped

    def dense(self) -> np.ndarray:
        """Every value, as one new array."""
        dense = np.full((self.length, *self.base.shape[1:]), self.fill, dtype=self.base.dtype)
        dense[: len(self.base)] = self.base
        dense[self.slots] = self.values
        return dense

    def sum_where(self, mask: np.ndarray) -> float:
        """The sum of the values at the positions ``mask`` (of at least ``length``) holds."""
        mask = mask[: self.length]
        total = float(self.base[mask[: len(self.base)]].sum()) + float(self.fill) * int(np.count_nonzero(mask[len(self.base) :]))
        chosen = mask[self.slots]
        if chosen.any():
            slots = self.slots[chosen]
            under = np.full(len(slots), self.fill, dtype=np.float64)  # what the patch replaced
            inside = slots < len(self.base)
            under[inside] = self.base[slots[inside]]
            total += float(self.values[chosen].sum()) - float(under.sum())
        return total

    def with_values(self, at: np.ndarray, values: np.ndarray, *, length: int | None = None) -> Patched:
        """A new version: the values at ``at`` set (of repeated positions, the last given wins),
        ``length`` grown to when given (new positions ``fill``). This one is left as it was."""
        at = np.asarray(at, dtype=np.int64)
        values = np.asarray(values, dtype=self.base.dtype)
        length = max(self.length, length or 0)
        if not len(at) and length == self.length:
            return self
        order = np.argsort(at, kind="stable")
        at, values = at[order], values[order]
        last = np.ones(len(at), dtype=bool)
        last[:-1] = at[1:] != at[:-1]
        at, values = at[last], values[last]
        kept = ~np.isin(self.slots, at, assume_unique=True)
        slots = np.concatenate([self.slots[kept], at])
        values = np.concatenate([self.values[kept], values])
        order = np.argsort(slots, kind="stable")
        patched = Patched(base=self.base, slots=slots[order], values=values[order], length=length, fill=self.fill)
        if len(slots) > max(FOLD_MIN, FOLD_SHARE * length):
            return Patched.of(patched.dense(), fill=self.fill)
        return patched
