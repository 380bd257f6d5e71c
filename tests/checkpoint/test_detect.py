"""Checkpoint-format detection and loading: bert-jax model dirs, training workdirs, step
folders and Hugging Face directories."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from bert_jax.checkpoint import store
from bert_jax.checkpoint.detect import is_hf_directory, load_checkpoint
from bert_jax.config import get_preset
from bert_jax.errors import BertJaxError

PARAMS = {"bert": {"w": np.arange(6, dtype=np.float32).reshape(2, 3)},
          "mlm": {"bias": np.ones(4, np.float32)}}


def _tiny():
    return get_preset("tiny", vocab_size=16)


def test_hf_directory_detected(hf_pretraining_dir):
    directory, _ = hf_pretraining_dir
    assert is_hf_directory(str(directory))
    params, config, tokenizer, report = load_checkpoint(str(directory))
    assert config.num_hidden_layers == 2 and config.hidden_size == 32
    assert "bert" in params and tokenizer is not None
    assert report and all(line.startswith("Hugging Face checkpoint: ") for line in report)


def test_not_hf_directory(tmp_path):
    model_dir = str(tmp_path / "model")
    store.save_model(model_dir, PARAMS, _tiny())
    assert not is_hf_directory(model_dir)  # bert-jax's config.json, even beside HF weights
    open(os.path.join(model_dir, "model.safetensors"), "wb").close()
    assert not is_hf_directory(model_dir)
    no_weights = tmp_path / "no_weights"
    no_weights.mkdir()
    (no_weights / "config.json").write_text(json.dumps({"model_type": "bert"}))
    assert not is_hf_directory(str(no_weights))
    (no_weights / "pytorch_model.bin").write_bytes(b"")
    assert is_hf_directory(str(no_weights))
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    (broken / "model.safetensors").write_bytes(b"")
    assert not is_hf_directory(str(broken))
    assert not is_hf_directory(str(tmp_path / "missing"))


def test_bert_jax_model_dir_workdir_and_step_folder(tmp_path):
    model_dir = str(tmp_path / "model")
    store.save_model(model_dir, PARAMS, _tiny())
    params, config, tokenizer, report = load_checkpoint(model_dir)
    assert np.array_equal(params["bert"]["w"], PARAMS["bert"]["w"])
    assert config == _tiny() and tokenizer is None
    assert report == [f"bert-jax checkpoint: {os.path.join(model_dir, 'params')}"]

    # A training workdir: config.json at the root, parameters per step; the newest wins.
    workdir = tmp_path / "work"
    store.write_config(str(workdir), _tiny())
    for step, scale in ((5, 1.0), (9, 2.0)):
        step_dir = str(workdir / "checkpoints" / str(step))
        store.save_model(step_dir, {"bert": {"w": PARAMS["bert"]["w"] * scale}}, _tiny())
        os.remove(os.path.join(step_dir, "config.json"))
    params, _, _, report = load_checkpoint(str(workdir))
    assert np.array_equal(params["bert"]["w"], 2 * PARAMS["bert"]["w"])
    assert report[0].endswith(os.path.join("checkpoints", "9", "params"))
    params, _, _, _ = load_checkpoint(str(workdir / "checkpoints" / "5"))
    assert np.array_equal(params["bert"]["w"], PARAMS["bert"]["w"])

    shutil.rmtree(workdir / "checkpoints")
    with pytest.raises(BertJaxError, match="no bert-jax checkpoint found"):
        load_checkpoint(str(workdir))
