"""Converted RoBERTa and DistilBERT directories work end to end: `bert-jax convert` then
`fill-mask` (transformers' top fillers and probabilities) and `embed`."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers
from hf_helpers import randomize, write_vocab

from bert_jax.cli import main

TEXTS = ["the cat sat on the mat", "a dog sat on a cat", "the dogs run on the mat"]


@pytest.fixture(scope="module")
def roberta_dir(tmp_path_factory):
    """A random RobertaForMaskedLM with a byte-level BPE vocabulary trained by bert-jax."""
    from bert_jax.checkpoint.families import _write_bpe_tokenizer
    from bert_jax.config import BertConfig
    from bert_jax.tokenization.bpe import train_bpe

    root = tmp_path_factory.mktemp("roberta")
    (root / "corpus.txt").write_text("\n".join(TEXTS * 5) + "\n", encoding="utf-8")
    tok, _ = train_bpe([str(root / "corpus.txt")], vocab_size=280, min_frequency=1)
    config = transformers.RobertaConfig(
        vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=48, max_position_embeddings=34, type_vocab_size=1, pad_token_id=1,
        attn_implementation="eager")
    model = randomize(transformers.RobertaForMaskedLM(config))
    model.save_pretrained(root / "hf")
    _write_bpe_tokenizer(tok, str(root / "hf"), BertConfig(vocab_size=tok.vocab_size))
    return root / "hf", model, transformers.AutoTokenizer.from_pretrained(root / "hf")


@pytest.fixture(scope="module")
def distilbert_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("distilbert")
    config = transformers.DistilBertConfig(vocab_size=40, dim=32, n_layers=2, n_heads=4,
                                           hidden_dim=48, max_position_embeddings=32,
                                           attn_implementation="eager")
    model = randomize(transformers.DistilBertForMaskedLM(config))
    model.save_pretrained(root / "hf")
    write_vocab(root / "hf", size=40)
    return root / "hf", model, transformers.BertTokenizer(str(root / "hf" / "vocab.txt"))


def _fill_mask(capsys, directory, text):
    assert main(["fill-mask", str(directory), "--text", text, "--top-k", "3"]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])["masks"]


@pytest.mark.parametrize(("family", "text"), [
    ("roberta", "the cat sat on the <mask>."),
    ("distilbert", "the cat sat on the [MASK] ."),
])
def test_convert_then_fill_mask_matches_transformers(family, text, request, tmp_path, capsys):
    source, hf_model, hf_tok = request.getfixturevalue(f"{family}_dir")
    out = tmp_path / "ckpt"
    assert main(["convert", str(source), "--output", str(out)]) == 0
    assert f"architecture: {type(hf_model).__name__}" in capsys.readouterr().out
    masks = _fill_mask(capsys, out, text)
    enc = hf_tok(text, return_tensors="pt")
    with torch.no_grad():
        logits = hf_model.eval()(**{k: v for k, v in enc.items() if k != "token_type_ids"})
    position = enc["input_ids"][0].tolist().index(hf_tok.mask_token_id)
    probs = torch.softmax(logits.logits[0, position], -1).numpy()
    top = np.argsort(-probs)[:3]
    assert [m["id"] for m in masks[0]] == top.tolist()
    np.testing.assert_allclose([m["probability"] for m in masks[0]], probs[top], atol=1e-5)


def test_convert_then_embed(roberta_dir, tmp_path, capsys):
    source, hf_model, hf_tok = roberta_dir
    out = tmp_path / "ckpt"
    assert main(["convert", str(source), "--output", str(out)]) == 0
    assert main(["embed", str(out), "--text", TEXTS[0], "--output",
                 str(tmp_path / "v.npy"), "--pooling", "none"]) == 0
    vectors = np.load(tmp_path / "v.npy")
    enc = hf_tok(TEXTS[0], return_tensors="pt")
    with torch.no_grad():
        ref = hf_model.roberta(**enc).last_hidden_state[0].numpy()
    np.testing.assert_allclose(vectors[0, :ref.shape[0]], ref, atol=1e-5)


def test_convert_then_export_cli_round_trip(roberta_dir, tmp_path, capsys):
    """convert -> export --architecture: transformers loads model and tokenizer files back."""
    source, hf_model, hf_tok = roberta_dir
    assert main(["convert", str(source), "--output", str(tmp_path / "ckpt")]) == 0
    assert main(["export", str(tmp_path / "ckpt"), "--output", str(tmp_path / "hf"),
                 "--architecture", "RobertaModel"]) == 0
    assert "NOT EXPORTED" in capsys.readouterr().out  # the MLM head has no place in the class
    back = transformers.RobertaModel.from_pretrained(tmp_path / "hf", attn_implementation="eager")
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    text = "the cat <mask> on a mat\nend"
    assert tok(text)["input_ids"] == hf_tok(text)["input_ids"]
    enc = hf_tok(text, return_tensors="pt")
    with torch.no_grad():
        np.testing.assert_array_equal(back.eval()(**enc).last_hidden_state.numpy(),
                                      hf_model.roberta(**enc).last_hidden_state.numpy())
    assert main(["export", str(tmp_path / "ckpt"), "--output", str(tmp_path / "bad"),
                 "--architecture", "BertModel"]) == 2
    assert "does not fit this roberta model" in capsys.readouterr().err
