"""The packing algorithm: every example placed exactly once, rows within their length and
example limits, deterministic given a seed, and the packed arrays of pack_features."""

from __future__ import annotations

import numpy as np
import pytest

from bert_jax.data import packing


@pytest.mark.parametrize("seed", [0, 1])
def test_every_example_once_within_limits(seed):
    lengths = np.random.default_rng(seed).integers(1, 129, 2000)
    rows = packing.pack_lengths(lengths, 128, 4, seed=seed)
    placed = np.concatenate(rows)
    assert len(placed) == len(lengths) and len(set(placed.tolist())) == len(lengths)
    assert all(lengths[r].sum() <= 128 and 1 <= len(r) <= 4 for r in rows)
    # Best-fit decreasing stays close to the lower bound of rows.
    assert len(rows) <= 1.1 * np.ceil(lengths.sum() / 128)
    assert packing.padding_fraction(lengths, len(rows), 128) < 0.1


def test_deterministic_given_seed_and_example_limit():
    lengths = np.full(30, 3)
    a = packing.pack_lengths(lengths, 64, 5, seed=7)
    b = packing.pack_lengths(lengths, 64, 5, seed=7)
    c = packing.pack_lengths(lengths, 64, 5, seed=8)
    assert [r.tolist() for r in a] == [r.tolist() for r in b]
    assert [r.tolist() for r in a] != [r.tolist() for r in c]
    assert [len(r) for r in a] == [5] * 6  # the example limit, not the length, closes rows


def test_too_long_example_is_refused():
    with pytest.raises(ValueError, match=r"\[1, 8\]"):
        packing.pack_lengths([3, 9], 8, 2)


def test_pack_features_layout_and_unpack_order():
    mask = np.array([[1, 1, 1, 0, 0, 0], [1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0]], np.int32)
    ids = np.array([[2, 5, 6, 0, 0, 0], [2, 7, 0, 0, 0, 0], [2, 8, 9, 10, 0, 0]], np.int32)
    segs = np.array([[0, 0, 1, 0, 0, 0], [0, 1, 0, 0, 0, 0], [0, 0, 1, 1, 0, 0]], np.int32)
    labels = np.array([10, 11, 12], np.int32)
    rows = packing.pack_lengths(mask.sum(1), 6, 2)
    assert sorted(map(len, rows)) == [1, 2]
    out = packing.pack_features({"input_ids": ids, "input_mask": mask, "segment_ids": segs,
                                 "label_ids": labels}, rows, 2, ("label_ids",))
    two = [i for i, r in enumerate(rows) if len(r) == 2][0]
    first, second = rows[two]
    n1 = mask[first].sum()
    assert out["input_ids"][two].tolist() == (ids[first, :n1].tolist() + ids[second, :2].tolist()
                                              + [0] * (6 - n1 - 2))
    assert out["example_ids"][two].tolist() == [1] * n1 + [2] * 2 + [0] * (4 - n1)
    assert out["position_ids"][two].tolist() == list(range(n1)) + [0, 1] + [0] * (4 - n1)
    assert out["segment_ids"][two].tolist()[:n1 + 2] == (segs[first, :n1].tolist()
                                                         + segs[second, :2].tolist())
    assert out["cls_positions"][two].tolist() == [0, n1]
    assert out["input_mask"].sum() == mask.sum()
    assert out["label_ids"][two].tolist() == [labels[first], labels[second]]
    assert out["example_slots"].sum() == 3
    per_slot = np.where(out["example_index"] >= 0, out["example_index"] * 100, 0)
    assert packing.unpack_outputs(per_slot, out["example_index"], 3).tolist() == [0, 100, 200]
