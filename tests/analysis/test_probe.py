"""Probes find the layer that holds a label linearly and miss the one that does not; the
probe command end to end on a CoNLL fixture."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from bert_jax.analysis.probe import read_conll_columns, train_probes
from bert_jax.cli import main
from bert_jax.errors import BertJaxError
from tests.finetuning import helpers as H


def _synthetic(n, seed):
    """State 0: noise; state 1: the label linearly (a class direction + noise)."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    directions = np.random.default_rng(99).normal(size=(3, 16))
    x = rng.normal(size=(n, 2, 16)).astype(np.float32)
    x[:, 1] += 3.0 * directions[y]
    return x, y.astype(np.int32)


@pytest.mark.parametrize("probe", ["linear", "mlp"])
def test_probe_finds_the_informative_layer(probe):
    x, y = _synthetic(600, 0)
    xd, yd = _synthetic(300, 1)
    result = train_probes(x, y, xd, yd, 3, probe=probe, hidden=32, steps=300, batch_size=128,
                          learning_rate=1e-2, mix=probe == "linear")
    noise, signal = result["layers"]
    assert signal["accuracy"] > 0.95 and signal["macro_f1"] > 0.95
    assert noise["accuracy"] < 0.5  # chance is 1/3
    if probe == "linear":
        assert result["mix"]["accuracy"] > 0.95
        weights = result["mix"]["weights"]
        assert weights[1] > weights[0] and sum(weights) == pytest.approx(1.0, abs=1e-5)


def test_conll_column_reader(tmp_path):
    path = tmp_path / "x.txt"
    path.write_text("-DOCSTART- -X- O\n\nJohn NNP B-PER\nruns VBZ O\n\nOk UH O\n")
    assert read_conll_columns(str(path), 1) == [(["John", "runs"], ["NNP", "VBZ"]),
                                               (["Ok"], ["UH"])]
    assert read_conll_columns(str(path), -1)[0][1] == ["B-PER", "O"]
    with pytest.raises(BertJaxError, match=r"x.txt:3: 3 columns, no label column 5"):
        read_conll_columns(str(path), 5)


def test_probe_command_on_conll(tmp_path, capsys):
    ckpt = H.write_checkpoint(str(tmp_path / "ckpt"))
    conll = H.write_conll(str(tmp_path / "conll"), n=30)
    out = tmp_path / "probe"
    rc = main(["probe", ckpt, "--train", os.path.join(conll, "train.txt"), "--dev-file",
               os.path.join(conll, "valid.txt"), "--label-column", "1", "--output", str(out),
               "--steps", "150", "--learning-rate", "1e-2", "--mix", "--batch-size", "0",
               "--cache", str(tmp_path / "feats.npz")])
    assert rc == 0
    result = json.load(open(out / "probe_results.json"))
    assert result["level"] == "token" and result["labels"] == [".", "NN", "NNP", "VB"]
    assert [r["layer"] for r in result["layers"]] == [0, 1, 2]
    # POS here is a function of the word: the embedding layer alone gets it.
    assert result["layers"][0]["accuracy"] > 0.9
    assert len(result["mix"]["weights"]) == 3
    assert os.path.getsize(out / "probe_layers.png") > 1000
    cached = np.load(tmp_path / "feats.npz")
    assert cached["train"].shape[1:] == (3, 32) and len(cached["train"]) == result["train_rows"]
    capsys.readouterr()
    assert main(["probe", ckpt, "--train", os.path.join(conll, "train.txt"),
                 "--label-column", "pos", "--output", str(out)]) == 2
    assert "0-based column number" in capsys.readouterr().err
