"""Fine-tuning from converted RoBERTa (byte-level BPE, <s> A </s></s> B </s>) and DistilBERT
(no token types, no pooler) checkpoints: `convert`, then `finetune` / `evaluate` / `predict`
on a toy SST-2 task, and a pair task (MRPC layout) straight from the Hugging Face directory."""

from __future__ import annotations

import json
import os

import pytest
import transformers

from bert_jax.checkpoint import store
from bert_jax.cli import main
from tests.finetune import helpers as H

FAST = ["--config.max_seq_length=32", "--config.log_every=0", "--config.eval_batch_size=32"]


@pytest.fixture(scope="module")
def sst2(tmp_path_factory):
    return H.write_sst2(str(tmp_path_factory.mktemp("sst2") / "SST-2"), n_train=240, n_dev=40,
                        n_test=10)


def _roberta(root):
    from bert_jax.checkpoint.families import _write_bpe_tokenizer
    from bert_jax.config import BertConfig
    from bert_jax.tokenization.bpe import train_bpe

    texts, _ = H.sentences(200, 7)
    (root / "corpus.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    tok, _ = train_bpe([str(root / "corpus.txt")], vocab_size=300, min_frequency=1)
    config = transformers.RobertaConfig(
        vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=66, type_vocab_size=1, pad_token_id=1)
    transformers.RobertaForMaskedLM(config).save_pretrained(root / "hf")
    _write_bpe_tokenizer(tok, str(root / "hf"), BertConfig(vocab_size=tok.vocab_size))


def _distilbert(root):
    config = transformers.DistilBertConfig(vocab_size=len(H.VOCAB), dim=32, n_layers=2,
                                           n_heads=2, hidden_dim=64, max_position_embeddings=64)
    transformers.DistilBertForMaskedLM(config).save_pretrained(root / "hf")
    H.write_vocab(str(root / "hf"))


def test_roberta_convert_then_finetune_evaluate_predict(sst2, tmp_path, capsys):
    _roberta(tmp_path)
    ckpt, workdir = str(tmp_path / "ckpt"), str(tmp_path / "run")
    assert main(["convert", str(tmp_path / "hf"), "--output", ckpt]) == 0
    assert main(["finetune", "--config", "experiments/glue.py:sst2", "--workdir", workdir,
                 f"--config.init_checkpoint={ckpt}", f"--config.data_dir={sst2}",
                 "--config.epochs=1", *FAST]) == 0
    out = capsys.readouterr().out
    assert "restored 29 encoder tensors" in out  # embeddings (no token-type rows), 2 layers
    metrics = json.load(open(os.path.join(workdir, "metrics.json")))
    assert metrics["dev_examples"] == {"dev": 40}
    _, cfg, tok, _ = store.load_model(workdir)
    assert (cfg.model_type, cfg.position_offset, tok.kind) == ("roberta", 2, "bpe")
    assert main(["evaluate", "--workdir", workdir]) == 0
    assert json.loads(capsys.readouterr().out)["dev"]["accuracy"] == pytest.approx(
        metrics["best"]["value"])
    assert main(["predict", "--workdir", workdir, "--output", str(tmp_path / "pred")]) == 0
    rows = open(tmp_path / "pred" / "SST-2.tsv").read().splitlines()
    assert rows[0] == "index\tprediction" and len(rows) == 11


@pytest.mark.parametrize("family", ["roberta", "distilbert"])
def test_converted_encoder_restored_exactly_for_a_pair_task(family, tmp_path):
    """The task model built from a converted checkpoint holds its encoder bit for bit (no
    token-type table for DistilBERT, a fresh pooler where the checkpoint has none), and pair
    inputs follow the family's layout."""
    import jax
    import numpy as np

    from bert_jax.modeling.params import flatten_params
    from bert_jax.tasks import get_task
    from bert_jax.tasks.config import load_config
    from bert_jax.tasks.model_init import initial_model, merge_encoder
    from bert_jax.tasks.trainer import build_finetuner

    {"roberta": _roberta, "distilbert": _distilbert}[family](tmp_path)
    ckpt = str(tmp_path / "ckpt")
    assert main(["convert", str(tmp_path / "hf"), "--output", ckpt]) == 0
    c = load_config("experiments/glue.py:mrpc", [*FAST, f"--config.init_checkpoint={ckpt}"])
    task = get_task("mrpc")
    model_cfg, tokenizer, pretrained, _ = initial_model(task, c)
    finetuner = build_finetuner(task, c, model_cfg, None)
    fresh = jax.device_get(finetuner.init_params(jax.random.PRNGKey(0)))
    merged, lines = merge_encoder(fresh, pretrained, model_cfg)
    placed = flatten_params(jax.device_get(finetuner.place_params(merged)))
    expected = flatten_params(store.load_model(ckpt)[0])
    encoder = [p for p in expected if p.startswith("bert/")]
    assert encoder and all(np.array_equal(placed[p], expected[p]) for p in encoder)
    assert "bert/pooler/kernel" in placed and "bert/pooler/kernel" not in expected
    has_types = "bert/embeddings/token_type_embeddings/embedding" in placed
    assert has_types == (family == "roberta")
    enc = tokenizer.encode("the cat sits", "a dog runs")
    if family == "roberta":
        first_sep = enc.input_ids.index(tokenizer.sep_id)
        assert enc.input_ids[first_sep + 1] == tokenizer.sep_id and set(enc.segment_ids) == {0}
    else:
        assert enc.input_ids.count(tokenizer.sep_id) == 2 and set(enc.segment_ids) == {0, 1}
