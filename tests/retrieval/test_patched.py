"""A patched array reads as the plain array it stands for, after any run of changes and growths,
folded or not, and a version once made never changes when later ones are made from it."""

from __future__ import annotations

import numpy as np
import pytest

from ragwarden.retrieval import patched
from ragwarden.retrieval.patched import Patched


@pytest.mark.parametrize("fold_min", [4, 10_000], ids=["folding often", "never folding"])
@pytest.mark.parametrize("shape", [(), (2,)], ids=["values", "pairs"])
def test_a_patched_array_reads_as_the_array_it_stands_for_and_old_versions_stay_as_they_were(
    fold_min: int, shape: tuple[int, ...], monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(patched, "FOLD_MIN", fold_min)
    rng = np.random.default_rng(len(shape) * 7 + fold_min)
    plain = rng.integers(-1, 9, size=(50, *shape)).astype(np.int32)
    current = Patched.of(plain.copy(), fill=-1)
    history = [(current, plain.copy())]
    for step in range(60):
        length = len(plain) + (int(rng.integers(0, 6)) if step % 3 == 0 else 0)
        at = rng.integers(0, length, size=int(rng.integers(0, 8)))
        values = rng.integers(-1, 9, size=(len(at), *shape)).astype(np.int32)
        grown = np.full((length, *shape), -1, np.int32)
        grown[: len(plain)] = plain
        for position, value in zip(at, values, strict=True):  # repeated positions: the last wins
            grown[position] = value
        plain, current = grown, current.with_values(at, values, length=length)
        history.append((current, plain.copy()))
    for version, expected in history:
        assert len(version) == len(expected)
        assert np.array_equal(version.dense(), expected)
        asked = rng.integers(0, len(expected), size=30)
        assert np.array_equal(version.take(asked), expected[asked])
        if not shape:
            table = np.arange(-1, 9, dtype=np.int64) * 10  # index -1 reads the last entry, as numpy's does
            assert np.array_equal(version.mapped(table), table[expected])
            mask = rng.random(len(expected) + 3) < 0.5
            assert version.sum_where(mask) == float(expected[mask[: len(expected)]].sum())


def test_an_empty_base_grows_by_its_patch_alone():
    grown = Patched.of(np.empty(0, np.int32), fill=-1).with_values([2, 0], [5, 7], length=4)
    assert grown.dense().tolist() == [7, -1, 5, -1]
    assert grown.sum_where(np.array([True, True, True, False])) == 11.0
    assert grown.take(np.array([3, 2])).tolist() == [-1, 5]


def test_a_patch_past_its_share_is_folded_into_a_new_base(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(patched, "FOLD_MIN", 10)
    base = Patched.of(np.zeros(100, np.int32), fill=0)
    small = base.with_values(np.arange(5), np.ones(5))
    assert small.base is base.base and len(small.slots) == 5  # the base shared, not copied
    large = small.with_values(np.arange(5, 20), np.ones(15))
    assert large.base is not base.base and len(large.slots) == 0 and large.dense()[:20].sum() == 20
