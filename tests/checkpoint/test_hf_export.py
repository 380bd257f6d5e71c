"""Export to Hugging Face: transformers loads it with no missing/unexpected keys and gives
bert-jax's numbers; bert-jax -> HF -> bert-jax is exact; the WordPiece vocab travels."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import linen as nn
from hf_helpers import WORDS, make_batch, write_vocab

from bert_jax import modeling
from bert_jax.checkpoint.hf import export_hf, load_hf
from bert_jax.config import BertConfig
from bert_jax.errors import BertJaxError
from bert_jax.tokenization.wordpiece import WordPieceTokenizer

CONFIG = BertConfig(vocab_size=150, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=48, max_position_embeddings=32)


def _random_params(module, config, *inputs, seed=0):
    """Noise in the shapes of the module's params (LayerNorm scales near 1)."""
    params = nn.unbox(jax.eval_shape(module.init, jax.random.key(seed), *inputs))["params"]
    rng = np.random.default_rng(seed)

    def noise(path, x):
        name = jax.tree_util.keystr(path)
        base = 1.0 if "scale" in name else 0.0
        return (base + rng.normal(0, 0.1, x.shape)).astype(np.float32)

    return jax.tree_util.tree_map_with_path(noise, params)


def _inputs(config, seed=0):
    ids, mask, segments = make_batch(config.vocab_size, seed=seed)
    return ids, mask, segments, (jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(segments))


@pytest.mark.parametrize("scan_layers", [False, True])
def test_export_loads_in_transformers_and_round_trips(tmp_path, scan_layers):
    config = CONFIG.replace(scan_layers=scan_layers)
    ids, mask, segments, inputs = _inputs(config)
    model = modeling.BertForPreTraining(config)
    params = _random_params(model, config, *inputs)
    tokenizer = WordPieceTokenizer(write_vocab(tmp_path, size=config.vocab_size))
    report = export_hf(params, config, tmp_path / "hf", tokenizer)
    assert report.architecture == "BertForPreTraining" and report.unused == []

    hf_model, info = transformers.BertForPreTraining.from_pretrained(
        tmp_path / "hf", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert not info["mismatched_keys"]
    hf_model.eval()
    out = model.apply({"params": params}, *inputs)
    with torch.no_grad():
        ref = hf_model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                       token_type_ids=torch.tensor(segments))
    mlm = np.asarray(out["mlm_logits"])[..., :config.vocab_size]
    assert np.abs(mlm - ref.prediction_logits.numpy()).max() <= 1e-4
    assert np.abs(np.asarray(out["nsp_logits"]) - ref.seq_relationship_logits.numpy()).max() \
        <= 1e-4

    back, back_config, back_tok, back_report = load_hf(tmp_path / "hf",
                                                       scan_layers=scan_layers)
    assert back_config == config and back_report.unused == []
    assert back_tok.vocab == tokenizer.vocab
    v = config.vocab_size

    def check(path, original, restored):
        name = jax.tree_util.keystr(path)
        if "word_embeddings" in name or name.endswith("['mlm']['bias']"):
            np.testing.assert_array_equal(restored[:v], original[:v])
            assert not np.any(restored[v:]), f"{name}: vocab padding rows must be zero"
        else:
            np.testing.assert_array_equal(restored, original, err_msg=name)

    assert jax.tree_util.tree_structure(back) == jax.tree_util.tree_structure(params)
    jax.tree_util.tree_map_with_path(check, params, back)


def test_exported_vocab_tokenizes_like_bert_jax(tmp_path):
    tokenizer = WordPieceTokenizer(write_vocab(tmp_path, size=CONFIG.vocab_size))
    _, _, _, inputs = _inputs(CONFIG)
    model = modeling.BertForPreTraining(CONFIG)
    export_hf(_random_params(model, CONFIG, *inputs), CONFIG, tmp_path / "hf", tokenizer)
    hf_tok = transformers.BertTokenizer.from_pretrained(tmp_path / "hf")
    text = "The cats sat on the mat, running!"
    assert hf_tok(text)["input_ids"] == tokenizer.encode(text).input_ids
    assert WORDS[7] in hf_tok.vocab


@pytest.mark.parametrize("module,architecture", [
    (lambda c: modeling.BertForSequenceClassification(c, 3), "BertForSequenceClassification"),
    (modeling.BertForMultipleChoice, "BertForMultipleChoice"),
    (lambda c: modeling.BertForTokenClassification(c, 4), "BertForTokenClassification"),
    (modeling.BertForQuestionAnswering, "BertForQuestionAnswering"),
    (modeling.BertModel, "BertModel"),
])
def test_task_heads_export_cleanly(tmp_path, module, architecture):
    *_, inputs = _inputs(CONFIG)
    if architecture == "BertForMultipleChoice":
        inputs = tuple(x.reshape(2, 2, -1) for x in inputs)
    params = _random_params(module(CONFIG), CONFIG, *inputs)
    if architecture == "BertModel":
        params = {"bert": params}
    report = export_hf(params, CONFIG, tmp_path / "hf", architecture=(
        "BertForMultipleChoice" if architecture == "BertForMultipleChoice" else None))
    assert report.architecture == architecture and report.unused == []
    cls = getattr(transformers, architecture)
    _, info = cls.from_pretrained(tmp_path / "hf", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]


def test_export_reports_params_the_class_cannot_hold(tmp_path):
    _, _, _, inputs = _inputs(CONFIG)
    params = _random_params(modeling.BertForPreTraining(CONFIG), CONFIG, *inputs)
    report = export_hf(params, CONFIG, tmp_path / "hf", architecture="BertForMaskedLM")
    assert report.unused == ["bert/pooler", "nsp"]
    assert "NOT EXPORTED" in str(report) and "no tokenizer" in str(report)
    _, info = transformers.BertForMaskedLM.from_pretrained(tmp_path / "hf",
                                                           output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    with pytest.raises(BertJaxError, match=r"BertForQuestionAnswering needs the \['qa_outputs'\]"):
        export_hf(params, CONFIG, tmp_path / "qa", architecture="BertForQuestionAnswering")


def test_albert_style_params_cannot_be_exported(tmp_path):
    config = CONFIG.replace(embedding_size=16, share_layers=True)
    _, _, _, inputs = _inputs(config)
    params = _random_params(modeling.BertForPreTraining(config), config, *inputs)
    with pytest.raises(BertJaxError, match="ALBERT"):
        export_hf(params, config, tmp_path / "hf")


def test_masked_lm_only_run_exports_as_masked_lm_and_says_why(tmp_path):
    """A masked-LM-only run (make demo's: MLM head and a pooler, no NSP head) exports as
    BertForMaskedLM; its never-trained pooler is left out with the reason, not listed as
    NOT EXPORTED, and transformers' AutoModelForMaskedLM loads every key."""
    model = modeling.BertForPreTraining(CONFIG, pair_head=False, add_pooler=True)
    ids, mask, segments, inputs = _inputs(CONFIG)
    params = _random_params(model, CONFIG, *inputs)
    assert "pooler" in params["bert"] and "nsp" not in params
    tokenizer = WordPieceTokenizer(write_vocab(tmp_path, size=CONFIG.vocab_size))
    report = export_hf(params, CONFIG, tmp_path / "hf", tokenizer)
    assert report.architecture == "BertForMaskedLM" and report.unused == []
    text = str(report)
    assert "NOT EXPORTED" not in text
    assert "no next-sentence head" in text and "pooler" in text
    assert "AutoModelForMaskedLM" in text
    hf_model, info = transformers.AutoModelForMaskedLM.from_pretrained(
        tmp_path / "hf", output_loading_info=True)
    assert type(hf_model).__name__ == "BertForMaskedLM"
    assert not info["missing_keys"] and not info["unexpected_keys"]
