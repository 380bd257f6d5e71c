"""The starting model of a run: the encoder restored exactly from bert-jax and Hugging Face
checkpoints into a fresh head, vocabulary and model-size mismatches, random init's tokenizer."""

from __future__ import annotations

import os

import jax
import numpy as np
import pytest

from bert_jax.checkpoint import store
from bert_jax.cli import main
from bert_jax.errors import BertJaxError
from bert_jax.finetuning.config import load_config
from bert_jax.finetuning.model_init import initial_model, merge_encoder
from bert_jax.finetuning.trainer import build_finetuner
from bert_jax.modeling.params import flatten_params
from bert_jax.tasks import get_task
from tests.finetuning import helpers as H

FAST = ["--config.max_seq_length=32", "--config.log_every=0", "--config.eval_batch_size=32"]


def config(spec, *overrides):
    return load_config(spec, [*FAST, *overrides])


def _hf_copy(ckpt: str, directory: str) -> str:
    from bert_jax.checkpoint.hf import export_hf

    params, cfg, tok, _ = store.load_model(ckpt)
    export_hf(params, cfg, directory, tokenizer=tok)
    return directory


@pytest.mark.parametrize("source", ["bert_jax", "hugging_face"])
def test_init_restores_encoder_exactly(data, tmp_path, source):
    path = data["ckpt"] if source == "bert_jax" else _hf_copy(data["ckpt"], str(tmp_path / "hf"))
    c = config("experiments/glue.py:mrpc", f"--config.init_checkpoint={path}")
    task = get_task("mrpc")
    model_cfg, tokenizer, pretrained, _ = initial_model(task, c)
    finetuner = build_finetuner(task, c, model_cfg, None)
    fresh = jax.device_get(finetuner.init_params(jax.random.PRNGKey(0)))
    merged, lines = merge_encoder(fresh, pretrained, model_cfg)
    placed = flatten_params(jax.device_get(finetuner.place_params(merged)))
    expected = flatten_params(store.load_model(data["ckpt"])[0])
    encoder = [p for p in placed if p.startswith("bert/")]
    rows = len(H.VOCAB)  # the HF import pads the vocabulary to a multiple of 128
    assert encoder and all(np.array_equal(placed[p][:rows], expected[p][:rows])
                           for p in encoder)
    assert np.array_equal(placed["classifier/kernel"], flatten_params(fresh)["classifier/kernel"])
    assert "head classifier freshly initialised" in lines[0]
    assert any("not used" in line and "mlm/bias" in line for line in lines)
    # What fine-tuning runs: the encoder merged into the abstract tree, then only the head
    # initialised (a program that computes those leaves only): the same values, bit for bit.
    abstract, abstract_lines = merge_encoder(finetuner.abstract_params, pretrained, model_cfg)
    assert abstract_lines == lines
    assert isinstance(flatten_params(abstract)["classifier/kernel"], jax.ShapeDtypeStruct)
    filled = flatten_params(finetuner.fill_fresh(abstract, jax.random.PRNGKey(0)))
    assert sorted(filled) == sorted(flatten_params(merged))
    for path, value in flatten_params(merged).items():
        assert filled[path].dtype == value.dtype and np.array_equal(filled[path], value), path


def test_reinitialize_keeps_named_tensors_fresh(data):
    c = config("experiments/glue.py:mrpc", f"--config.init_checkpoint={data['ckpt']}")
    task = get_task("mrpc")
    model_cfg, _, pretrained, _ = initial_model(task, c)
    finetuner = build_finetuner(task, c, model_cfg, None)
    fresh = jax.device_get(finetuner.init_params(jax.random.PRNGKey(123)))
    merged, lines = merge_encoder(fresh, pretrained, model_cfg, " bert/pooler/ ,")
    placed, start = flatten_params(merged), flatten_params(fresh)
    expected = flatten_params(store.load_model(data["ckpt"])[0])
    pooler = [p for p in placed if p.startswith("bert/pooler/")]
    assert pooler and all(np.array_equal(placed[p], start[p]) for p in pooler)
    assert not any(np.array_equal(placed[p], expected[p]) for p in pooler if "kernel" in p)
    others = [p for p in placed if p.startswith("bert/") and p not in pooler]
    assert others and all(np.array_equal(placed[p], expected[p]) for p in others
                          if "embeddings" not in p)
    assert any(f"re-initialised instead of restored ({len(pooler)})" in line for line in lines)
    assert not any("pooler" in line for line in lines if "not used" in line)
    with pytest.raises(BertJaxError, match=r"'bert/poole' names no encoder tensor.*bert/pooler"):
        merge_encoder(fresh, pretrained, model_cfg, "bert/poole")


def test_vocab_and_size_mismatches_are_reported(data, tmp_path, capsys):
    bigger = H.write_vocab(str(tmp_path / "bigger"), extra=("extra1", "extra2", "extra3"))
    base = ["finetune", "--config", "experiments/glue.py:sst2", "--workdir",
            str(tmp_path / "run"), f"--config.init_checkpoint={data['ckpt']}",
            f"--config.data_dir={data['sst2']}"]
    assert main([*base, f"--config.tokenizer={os.path.dirname(bigger)}"]) == 2
    err = capsys.readouterr().err
    assert "vocabulary mismatch" in err and f"has {len(H.VOCAB) + 3} tokens" in err
    assert f"vocab_size={len(H.VOCAB)}" in err
    assert main([*base, "--config.model.hidden_size=64"]) == 2
    err = capsys.readouterr().err
    assert "--config.model.hidden_size=64" in err and "hidden_size=32" in err




def test_random_init_needs_a_tokenizer(data):
    c = config("experiments/glue.py:sst2", "--config.init_checkpoint=",
               f"--config.data_dir={data['sst2']}")
    with pytest.raises(BertJaxError, match="needs --config.tokenizer"):
        initial_model(get_task("sst2"), c)
    c = config("experiments/glue.py:sst2", "--config.init_checkpoint=",
               f"--config.tokenizer={data['vocab_dir']}", "--config.model.preset=tiny")
    model_cfg, tokenizer, pretrained, lines = initial_model(get_task("sst2"), c)
    assert pretrained is None and model_cfg.vocab_size >= tokenizer.vocab_size == len(H.VOCAB)
    assert lines == ["random initialisation: preset tiny, seed 0"]
