"""Export that round-trips: the tokenizer travels with the model in a form
``transformers.AutoTokenizer`` loads and that encodes exactly as bert-jax does (WordPiece and
SentencePiece), the report names the checkpoint read and the directory written, files are
world-readable; and inference and export take every checkpoint kind fine-tuning takes."""

from __future__ import annotations

import os
import stat

import jax
import numpy as np
import pytest
import transformers
from flax import linen as nn
from hf_helpers import make_hf_model

from bert_jax import modeling
from bert_jax.checkpoint.store import save_model
from bert_jax.cli import main
from bert_jax.config import BertConfig
from bert_jax.tokenization import load_tokenizer
from bert_jax.tokenization.sentencepiece import SentencePieceTokenizer, train_sentencepiece

SENTENCES = ["The cat sat on the mat.", "A dog, a cat and 1,000 birds!", "Café naïve résumé",
             "  spaces   between   words  ", "Nobody expected the second sentence."]


def _spm_model_dir(tmp_path) -> str:
    """A bert-jax model directory with a SentencePiece tokenizer and a random model."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(SENTENCES * 3 + [
        "the quick brown fox jumps over the lazy dog", "she sells sea shells by the sea shore",
        "a stitch in time saves nine", "all that glitters is not gold"] * 5) + "\n")
    prefix = str(tmp_path / "spm" / "spm")
    train_sentencepiece([str(corpus)], prefix, 60, character_coverage=1.0)
    tokenizer = SentencePieceTokenizer(prefix + ".model")
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=1,
                        num_attention_heads=4, intermediate_size=48,
                        max_position_embeddings=32)
    ids = np.ones((1, 8), np.int32)
    params = nn.unbox(modeling.BertForPreTraining(config).init(jax.random.key(0), ids))[
        "params"]
    directory = str(tmp_path / "bj")
    save_model(directory, jax.device_get(params), config, tokenizer)
    return directory


def _same_encoding(hf_dir, ours) -> None:
    hf_tok = transformers.AutoTokenizer.from_pretrained(hf_dir, model_max_length=512)
    for text in SENTENCES:
        assert hf_tok(text)["input_ids"] == ours.encode(text, max_length=512).input_ids, text
    assert hf_tok.mask_token_id == ours.mask_id and hf_tok.pad_token_id == ours.pad_id


def test_sentencepiece_export_round_trips(tmp_path, capsys):
    source = _spm_model_dir(tmp_path)
    old = os.umask(0o022)
    try:
        assert main(["export", source, "--output", str(tmp_path / "hf")]) == 0
    finally:
        os.umask(old)
    out = capsys.readouterr().out
    assert f"source: {source}" in out
    assert f"output: {tmp_path / 'hf'} (model.safetensors, config.json, spiece.model, " \
           "tokenizer_config.json)" in out
    for name in ("model.safetensors", "config.json", "spiece.model", "tokenizer_config.json"):
        assert stat.S_IMODE(os.stat(tmp_path / "hf" / name).st_mode) == 0o644, name
    # No bert-jax metadata that transformers would mistake for its own tokenizer.json.
    assert not (tmp_path / "hf" / "tokenizer.json").exists()
    _same_encoding(tmp_path / "hf", load_tokenizer(os.path.join(source, "tokenizer")))
    model = transformers.BertForPreTraining.from_pretrained(tmp_path / "hf")
    assert model.config.vocab_size == 60


def test_wordpiece_export_and_hf_input(hf_pretraining_dir, tmp_path, capsys):
    source, _ = hf_pretraining_dir
    # Export takes a Hugging Face directory as it is (like finetune), tokenizer included.
    assert main(["export", str(source), "--output", str(tmp_path / "hf2")]) == 0
    assert "architecture: BertForPreTraining" in capsys.readouterr().out
    _same_encoding(tmp_path / "hf2", load_tokenizer(str(source)))


@pytest.fixture
def hf_encoder_dir(tmp_path):
    """An encoder without an MLM head (as sentence-embedding models ship), vocab included."""
    from hf_helpers import HF_CONFIGS, write_vocab

    model = make_hf_model("BertModel", "2L-32H-4A")
    directory = tmp_path / "encoder"
    model.save_pretrained(directory)
    write_vocab(directory, size=HF_CONFIGS["2L-32H-4A"]["vocab_size"])
    return directory


def test_inference_takes_hugging_face_directories(hf_pretraining_dir, hf_encoder_dir, tmp_path,
                                                  capsys):
    source, _ = hf_pretraining_dir
    assert main(["fill-mask", str(source), "--text", "the cat [MASK] on the mat",
                 "--top-k", "2", "--json"]) == 0
    assert '"masks"' in capsys.readouterr().out
    out = tmp_path / "v.npy"
    assert main(["embed", str(hf_encoder_dir), "--text", "the cat sat", "--pooling", "mean",
                 "--output", str(out)]) == 0
    assert np.load(out).shape == (1, 32)
    capsys.readouterr()
    # An encoder-only checkpoint: fill-mask says why not and what works instead.
    assert main(["fill-mask", str(hf_encoder_dir), "--text", "the [MASK] sat"]) == 2
    err = capsys.readouterr().err
    assert "no masked-LM head" in err and "bert-jax embed" in err
    assert "BertForMaskedLM" in err and err.count("\n") == 1
