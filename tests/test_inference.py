"""fill-mask and embed on a checkpoint the test writes (random tiny model + WordPiece vocab)."""

import json

import flax.linen as nn
import jax
import numpy as np
import pytest

from bert_jax.checkpoint import store
from bert_jax.cli import main
from bert_jax.config import get_preset
from bert_jax.inference import embed, fill_mask
from bert_jax.modeling import BertForPreTraining, BertModel
from bert_jax.tokenization.wordpiece import WordPieceTokenizer

# One worker runs the module: its module fixtures are computed once (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("inference")

WORDS = ["the", "cat", "sat", "on", "mat", "dog", "ran", "a", "big", "red", ".", ",", "##s"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS
    tokenizer = WordPieceTokenizer(vocab, do_lower_case=True)
    config = get_preset("tiny", vocab_size=len(vocab), num_hidden_layers=3)
    model = BertForPreTraining(config)
    ids = np.ones((1, 8), np.int32)
    # Compiled: op by op, the init's many small ops cost more than one compile.
    params = nn.unbox(jax.jit(model.init)(jax.random.key(0), ids)["params"])
    path = str(tmp_path_factory.mktemp("ckpt"))
    store.save_model(path, params, config, tokenizer)
    return path, params, config, tokenizer


def test_fill_mask_matches_direct_apply(checkpoint):
    path, params, config, tokenizer = checkpoint
    results = fill_mask(path, ["the cat [MASK] on the [MASK] .", "a [MASK] dog"], top_k=3)
    assert [len(r) for r in results] == [2, 1]
    ids = np.array([[2, 5, 6, 4, 8, 5, 4, 15, 3]], np.int32)  # unpadded
    assert [tokenizer.token_to_id(t) for t in ["the", "[MASK]", "."]] == [5, 4, 15]
    logits = jax.jit(BertForPreTraining(config).apply)({"params": params}, ids)["mlm_logits"]
    probs = jax.nn.softmax(logits[0, 3, :config.vocab_size])
    best = int(np.argmax(probs))
    assert results[0][0][0]["id"] == best
    np.testing.assert_allclose(results[0][0][0]["probability"], float(probs[best]), rtol=1e-4)
    assert results[0][0][0]["probability"] >= results[0][0][1]["probability"]


TEXTS = ["the cat sat", "a big red dog ran on the mat ."]


@pytest.fixture(scope="module")
def direct_outputs(checkpoint):
    """BertModel's outputs (with the hidden states) for TEXTS[0] alone, unpadded."""
    _, params, config, tokenizer = checkpoint
    enc = tokenizer.encode(TEXTS[0])
    return jax.jit(BertModel(config).apply, static_argnames="output_hidden_states")(
        {"params": params["bert"]}, np.array([enc.input_ids]), output_hidden_states=True)


@pytest.mark.parametrize("layer,pooling", [("-1", "none"), ("0", "mean"), ("last4", "cls"),
                                           ("2", "pooled")])
def test_embed_layers_and_pooling(checkpoint, direct_outputs, layer, pooling):
    path, params, config, tokenizer = checkpoint
    texts = TEXTS
    vectors, lengths = embed(path, texts, layer=layer, pooling=pooling)
    width = config.hidden_size * (4 if layer == "last4" else 1)
    assert lengths.tolist() == [5, 11]
    if pooling == "none":
        assert vectors.shape == (2, 11, width)
    else:
        assert vectors.shape == (2, width)
    out = direct_outputs
    if layer == "-1" and pooling == "none":
        np.testing.assert_allclose(vectors[0, :5], out["sequence_output"][0], atol=1e-5)
    if layer == "0" and pooling == "mean":
        np.testing.assert_allclose(vectors[0], out["hidden_states"][0][0].mean(0), atol=1e-5)
    if pooling == "pooled":
        np.testing.assert_allclose(vectors[0], out["pooled_output"][0], atol=1e-5)


def test_cli_commands(checkpoint, tmp_path, capsys):
    path = checkpoint[0]
    assert main(["fill-mask", path, "--text", "the [MASK] sat", "--top-k", "2", "--json"]) == 0
    line = json.loads(capsys.readouterr().out.strip())
    assert len(line["masks"][0]) == 2
    # Readable by default: the text, an arrow, each filler as text with its probability, in
    # the order and with the values of the JSON.
    assert main(["fill-mask", path, "--text", "the [MASK] sat", "--top-k", "2"]) == 0
    readable = capsys.readouterr().out
    first, second = line["masks"][0]
    assert readable == (f"the [MASK] sat  ->  {first['text']!r} {first['probability']:.2f}, "
                        f"{second['text']!r} {second['probability']:.2f}\n")
    out = tmp_path / "e.npy"
    assert main(["embed", path, "--text", "the cat", "--output", str(out),
                 "--pooling", "mean"]) == 0
    assert np.load(out).shape == (1, 128)
    assert main(["embed", path, "--text", "x", "--output", str(out), "--layer", "9"]) == 2
    assert "out of range" in capsys.readouterr().err
    assert main(["fill-mask", str(tmp_path / "missing"), "--text", "x"]) == 2


@pytest.mark.parametrize("text,hint", [("the cat sat", ""), ("the [mask] sat", "'[mask]'"),
                                       ("the <mask> sat", "'<mask>'")])
def test_fill_mask_without_the_mask_token_is_an_error_naming_it(checkpoint, text, hint,
                                                                 capsys):
    """A text without the tokenizer's mask token is one error line naming that token (and
    the wrong spelling the text used), not an empty result."""
    assert main(["fill-mask", checkpoint[0], "--text", text]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err
    assert err.startswith("error: no mask token in ") and err.count("\n") == 1
    assert "marks the token to predict as [MASK]" in err and hint in err
