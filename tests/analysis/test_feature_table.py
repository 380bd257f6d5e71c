"""The feature-based NER table end to end on a tiny CoNLL fixture (CPU)."""

from __future__ import annotations

import json
import os

from bert_jax.analysis import feature_table
from bert_jax.checkpoint import store
from bert_jax.finetuning.config import load_config
from tests.finetuning import helpers as H


def test_rows_are_configs():
    c = load_config("experiments/feature_ner.py:mix4")
    assert (c.freeze_encoder, c.feature_layers, c.feature_head, c.lstm_hidden_size) == (
        True, "mix4", "bilstm", 768)
    c = load_config("experiments/feature_ner.py:finetune_quick")
    assert not c.freeze_encoder and c.feature_layers == "last" and c.epochs == 1


def test_table_end_to_end_and_resume(tmp_path, capsys):
    ckpt = H.write_checkpoint(str(tmp_path / "ckpt"))
    conll = H.write_conll(str(tmp_path / "conll"), n=16)
    out = str(tmp_path / "table")
    args = ["--checkpoint", ckpt, "--data", conll, "--out", out, "--rows", "mix",
            "--quick", "--config.lstm_hidden_size=8", "--config.max_seq_length=32",
            "--config.log_every=0", "--config.eval_batch_size=16"]
    assert feature_table.main(args) == 0
    table = json.load(open(os.path.join(out, "feature_table.json")))
    assert [r["row"] for r in table["rows"]] == ["mix"]
    assert all(0 <= r["dev_f1"] <= 100 for r in table["rows"])
    params, _, _, extra = store.load_model(os.path.join(out, "mix"))
    assert extra["finetune"]["feature_layers"] == "mix"
    assert params["feature_mix"]["mix"]["weights"].shape == (2,)  # layers 1..2 of the tiny model
    assert params["bilstm"]["forward_0"]["hi"]["kernel"].shape == (8, 8)
    md = open(os.path.join(out, "feature_table.md")).read()
    assert "| Weighted sum all layers | mix |" in md and "| 95.5 |" in md
    capsys.readouterr()
    # Run again: finished rows are reused, not trained again.
    assert feature_table.main(args) == 0
    assert "reusing" in capsys.readouterr().out
    assert feature_table.main([*args[:6], "--rows", "top"]) == 2
