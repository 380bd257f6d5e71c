"""Attention statistics against hand-computed values, and analyze-attention end to end."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

from bert_jax.analysis.attention import attention_sums, finish, is_punctuation
from bert_jax.cli import main
from tests.finetuning import helpers as H


def _hand_built():
    """One layer, two heads; text 0 = [CLS] a , [SEP] (4 real), text 1 = [CLS] b [SEP] pad."""
    mask = np.array([[1, 1, 1, 1], [1, 1, 1, 0]], np.float32)
    is_cls = np.array([[1, 0, 0, 0], [1, 0, 0, 0]], np.float32)
    is_sep = np.array([[0, 0, 0, 1], [0, 0, 1, 0]], np.float32)
    is_punct = np.array([[0, 0, 1, 0], [0, 0, 0, 0]], np.float32)
    attn = np.zeros((2, 1, 2, 4, 4), np.float32)
    # head 0: every query attends fully to [CLS]
    attn[:, 0, 0, :, 0] = 1.0
    # head 1: text 0 uniform over its 4 tokens; text 1: each query attends to itself
    attn[0, 0, 1] = 0.25
    attn[1, 0, 1, :3, :3] = np.eye(3)
    attn[1, 0, 1, 3, 3] = 1.0  # the padding query: must not count
    return attn, mask, is_cls, is_sep, is_punct


def test_statistics_match_hand_computation():
    stats = finish({k: np.asarray(v, np.float64)
                    for k, v in attention_sums(*_hand_built()).items()})
    assert stats["queries"] == 7
    # head 0: all attention on [CLS]; its self-attention only at q=0 (2 of 7 queries).
    np.testing.assert_allclose(stats["cls"][0], [1.0, (4 * 0.25 + 1) / 7], atol=1e-6)
    np.testing.assert_allclose(stats["sep"][0], [0.0, (4 * 0.25 + 1) / 7], atol=1e-6)
    np.testing.assert_allclose(stats["punct"][0], [0.0, 1.0 / 7], atol=1e-6)
    np.testing.assert_allclose(stats["self"][0], [2 / 7, (1.0 + 3) / 7], atol=1e-6)
    # prev: queries with a previous token: 3 (text 0) + 2 (text 1) = 5.
    # head 0: only q=1 attends to q-1=0 (once per text) -> 2/5; head 1: 3 * 0.25 / 5.
    np.testing.assert_allclose(stats["prev"][0], [2 / 5, 0.75 / 5], atol=1e-6)
    # next: 3 + 2 pairs; head 0 never attends forward (all on [CLS]); head 1: 3 * 0.25 / 5.
    np.testing.assert_allclose(stats["next"][0], [0.0, 0.75 / 5], atol=1e-6)
    np.testing.assert_allclose(stats["entropy"][0], [0.0, 4 * math.log(4) / 7], atol=1e-6)
    # distance: head 0 = q for each query: (0+1+2+3) + (0+1+2) = 9 over 7 queries;
    # head 1: text 0 uniform: mean |q-k| per q = (6/4, 4/4, 4/4, 6/4) -> 5; text 1: 0.
    np.testing.assert_allclose(stats["distance"][0], [9 / 7, 5 / 7], atol=1e-6)
    np.testing.assert_allclose(stats["uniform_entropy"],
                               (4 * math.log(4) + 3 * math.log(3)) / 7, atol=1e-6)


def test_punctuation_tokens():
    assert is_punctuation(".") and is_punctuation("##,") and is_punctuation("...")
    assert is_punctuation("▁?") and is_punctuation("«")
    assert not is_punctuation("a.") and not is_punctuation("[SEP]")
    assert not is_punctuation("##") and not is_punctuation("$")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return H.write_checkpoint(str(tmp_path_factory.mktemp("attn") / "ckpt"))


def test_analyze_attention_cli_writes_stats_and_figures(checkpoint, tmp_path, capsys):
    texts, _ = H.sentences(11, 0)
    tsv = tmp_path / "in.tsv"
    tsv.write_text("id\tsentence\n" + "".join(f"{i}\t{t}\n" for i, t in enumerate(texts)))
    out = tmp_path / "out"
    rc = main(["analyze-attention", checkpoint, "--input", str(tsv), "--text-column",
               "sentence", "--output", str(out), "--batch-size", "4", "--layer", "2",
               "--head", "2", "--sentence-index", "3"])
    assert rc == 0
    stats = json.load(open(out / "attention_stats.json"))
    assert stats["texts"] == 11 and stats["num_layers"] == 2 and stats["num_heads"] == 2
    lengths = [len(t.split()) + 2 for t in texts]  # every word is one token here
    assert stats["queries"] == sum(lengths)
    assert np.asarray(stats["cls"]).shape == (2, 2)
    # Each query's attention sums to 1, and [CLS]/[SEP]/punctuation are disjoint keys.
    total = np.asarray(stats["cls"]) + np.asarray(stats["sep"]) + np.asarray(stats["punct"])
    assert (total <= 1 + 1e-5).all() and (total > 0).all()
    assert np.all(np.asarray(stats["entropy"]) >= 0)
    assert np.all(np.asarray(stats["entropy"]).mean() <= stats["uniform_entropy"] + 1e-4)
    for name in ("special_tokens.png", "heads.png", "entropy.png",
                 "sentence3_layer2_head2.png"):
        assert os.path.getsize(out / name) > 1000
    assert main(["analyze-attention", checkpoint, "--input", str(tsv), "--text-column",
                 "text", "--output", str(out)]) == 2
    assert "in.tsv:1: no column 'text'" in capsys.readouterr().err
    assert main(["analyze-attention", checkpoint, "--input", str(tsv), "--text-column",
                 "sentence", "--output", str(out), "--layer", "3"]) == 2
    assert "--layer 3: the model has layers 1..2" in capsys.readouterr().err
