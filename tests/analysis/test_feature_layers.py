"""Layer combinations for feature-based use: embed's --layer options against the hidden
states, the learned scalar mix, and the BiLSTM tagger's masking and directions."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.checkpoint import store
from bert_jax.config import get_preset
from bert_jax.errors import BertJaxError
from bert_jax.inference import embed
from bert_jax.modeling import BertForPreTraining, BertModel
from bert_jax.modeling.feature_heads import (
    BertFeatureTagger,
    BiLSTM,
    embed_layer_spec,
    layer_selection,
    mix_weights,
)
from bert_jax.tokenization.wordpiece import WordPieceTokenizer

# One worker runs the module: its module fixtures are computed once (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("feature_layers")

WORDS = ["the", "cat", "sat", "on", "mat", "dog", "ran", "a", "big", "red", "."]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS
    tokenizer = WordPieceTokenizer(vocab, do_lower_case=True)
    config = get_preset("tiny", vocab_size=len(vocab), num_hidden_layers=5)
    # Compiled: op by op, a model's init and apply cost more than one compile each.
    params = nn.unbox(jax.jit(BertForPreTraining(config).init)(
        jax.random.key(0), np.ones((1, 8), np.int32))["params"])
    path = str(tmp_path_factory.mktemp("ckpt"))
    store.save_model(path, params, config, tokenizer)
    return path, params, config, tokenizer


def test_layer_selection_names():
    assert layer_selection("last", 13) == ([12], "one")
    assert layer_selection("second_to_last", 13) == ([11], "one")
    assert layer_selection("embeddings", 13) == ([0], "one")
    assert layer_selection("sum4", 13) == ([9, 10, 11, 12], "sum")
    assert layer_selection("last4", 13) == ([9, 10, 11, 12], "concat")
    assert layer_selection("sum_all", 7) == ([1, 2, 3, 4, 5, 6], "sum")
    assert layer_selection("mix", 7) == ([1, 2, 3, 4, 5, 6], "mix")
    with pytest.raises(BertJaxError, match="choose one of"):
        layer_selection("top", 13)
    with pytest.raises(BertJaxError, match="needs the mix weights.*feature_layers=mix"):
        embed_layer_spec("mix", 7)
    with pytest.raises(BertJaxError, match="3 weights for a model with 7 hidden states"):
        embed_layer_spec("mix:1,2,3", 7)


TEXTS = ["the cat sat", "a big red dog ran on the mat ."]


@pytest.fixture(scope="module")
def hidden_states(checkpoint):
    """The model's hidden states of TEXTS[1] alone: [6, S, D]."""
    _, params, config, tokenizer = checkpoint
    enc = tokenizer.encode(TEXTS[1])
    hs = jax.jit(BertModel(config).apply, static_argnames="output_hidden_states")(
        {"params": params["bert"]}, np.array([enc.input_ids]),
        output_hidden_states=True)["hidden_states"]
    return np.stack([np.asarray(h[0]) for h in hs])


@pytest.mark.parametrize("layer", ["sum4", "all", "mix:0.5,0,0,0,0,0.25", "mix:1,0,0,0,2"])
def test_embed_layer_options_match_hidden_states(checkpoint, hidden_states, layer):
    path = checkpoint[0]
    tokens, lengths = embed(path, TEXTS, layer=layer, pooling="none")
    means, _ = embed(path, TEXTS, layer=layer, pooling="mean")
    hs = hidden_states  # [6, S, D]
    expected = {"sum4": hs[2:].sum(0), "all": hs.transpose(1, 0, 2),
                "mix:0.5,0,0,0,0,0.25": 0.5 * hs[0] + 0.25 * hs[5],
                "mix:1,0,0,0,2": hs[1] + 2 * hs[5],
                "last4": np.concatenate(list(hs[2:]), -1), "-2": hs[4]}[layer]
    assert lengths.tolist() == [5, 11]
    np.testing.assert_allclose(tokens[1], expected, atol=2e-5)
    np.testing.assert_allclose(means[1], expected.mean(0), atol=2e-5)


def test_bilstm_padding_does_not_change_real_tokens_and_reverse_is_right():
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(2, 7, 5)), jnp.float32)
    lengths = jnp.array([4, 7], jnp.int32)
    lstm = BiLSTM(hidden_size=3, num_layers=2)
    variables = jax.jit(lstm.init)(jax.random.key(1), x, lengths)
    apply = jax.jit(lstm.apply)
    out = apply(variables, x, lengths)
    assert out.shape == (2, 7, 6)
    # Padding (positions 4..6 of row 0) holds garbage: the real tokens' outputs don't change.
    noisy = x.at[0, 4:].set(100.0)
    np.testing.assert_allclose(apply(variables, noisy, lengths)[0, :4], out[0, :4],
                               atol=1e-6)
    np.testing.assert_array_equal(np.asarray(out[0, 4:]), 0.0)
    # The same row alone, unpadded, gives the same outputs.
    alone = apply(variables, x[:1, :4], jnp.array([4]))
    np.testing.assert_allclose(alone[0], out[0, :4], atol=1e-6)
    # One layer: the backward half equals a forward LSTM over the reversed sequence.
    one = BiLSTM(hidden_size=3, num_layers=1)
    v1 = jax.jit(one.init)(jax.random.key(2), x, lengths)
    both = jax.jit(one.apply)(v1, x, lengths)
    rev = _run_cell(v1["params"]["backward_0"], x[0, :4][::-1])
    np.testing.assert_allclose(both[0, :4, 3:], rev[::-1], atol=1e-6)
    fwd = _run_cell(v1["params"]["forward_0"], x[0, :4])
    np.testing.assert_allclose(both[0, :4, :3], fwd, atol=1e-6)


def _run_cell(params, xs):
    """An LSTM cell stepped by hand over xs [T, F] from a zero state: [T, hidden]."""
    step = jax.jit(nn.OptimizedLSTMCell(3).apply)
    carry = (jnp.zeros((3,)), jnp.zeros((3,)))
    outs = []
    for x_t in xs:
        carry, y = step({"params": params}, carry, x_t)
        outs.append(y)
    return jnp.stack(outs)


def test_feature_tagger_shapes_mix_and_frozen_encoder():
    config = get_preset("tiny", vocab_size=32, num_hidden_layers=3)
    model = BertFeatureTagger(config, num_labels=5, freeze_encoder=True, feature_layers="mix",
                              feature_head="bilstm", lstm_hidden_size=8, lstm_layers=2)
    ids = jnp.array([[2, 7, 8, 9, 3, 0], [2, 5, 3, 0, 0, 0]], jnp.int32)
    mask = (ids != 0).astype(jnp.int32)
    params = nn.unbox(jax.jit(model.init)(jax.random.key(0), ids, mask)["params"])
    assert set(params) == {"bert", "feature_mix", "bilstm", "classifier"}
    assert params["feature_mix"]["mix"]["weights"].shape == (3,)
    np.testing.assert_allclose(mix_weights(params["feature_mix"]["mix"]), [1 / 3] * 3,
                               rtol=1e-6)
    logits = jax.jit(model.apply)({"params": params}, ids, mask)["logits"]
    assert logits.shape == (2, 6, 5)

    def loss(p):
        return model.apply({"params": p}, ids, mask)["logits"].sum()

    grads = jax.jit(jax.grad(loss))(params)
    assert all(float(jnp.abs(g).max()) == 0 for g in jax.tree.leaves(grads["bert"]))
    assert float(jnp.abs(grads["feature_mix"]["mix"]["weights"]).max()) > 0
