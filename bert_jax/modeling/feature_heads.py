"""Feature-based use of the encoder (the BERT paper's CoNLL-2003 ablation): which hidden states
a head reads and how they are combined, a learned scalar mix, and a BiLSTM tagger.

Hidden states are numbered as ``BertModel(..., output_hidden_states=True)`` returns them:
state 0 is the embedding output, state ``i`` the output of layer ``i`` (1..L).

``feature_layers`` names (fine-tuning's config field and :func:`layer_selection`):

    last            state L (what fine-tuning's usual head reads)
    second_to_last  state L-1
    embeddings      state 0
    sum4            the sum of states L-3..L
    last4           the concatenation of states L-3..L (width 4 x hidden)
    mix4            a learned scalar mix of states L-3..L
    sum_all         the sum of states 1..L (every layer, not the embeddings)
    mix             a learned scalar mix of states 1..L

A learned scalar mix (Peters et al. 2018) is ``gamma * sum_j softmax(w)_j * h_j`` with ``w``
(zeros at init: an even mix) and ``gamma`` (1 at init) trained with the head.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.config import BertConfig
from bert_jax.errors import BertJaxError
from bert_jax.modeling.encoder import BertModel, dense, hidden_dropout, ones, zeros

FEATURE_LAYERS = ("last", "second_to_last", "embeddings", "sum4", "last4", "mix4", "sum_all",
                  "mix")
FEATURE_HEADS = ("linear", "bilstm")


def layer_selection(name: str, num_states: int) -> tuple[list[int], str]:
    """(hidden-state indices, how: "one" | "sum" | "concat" | "mix") of a ``feature_layers``
    name for a model with ``num_states`` hidden states (embeddings + L layers)."""
    last = num_states - 1
    four = list(range(max(0, num_states - 4), num_states))
    table = {"last": ([last], "one"), "second_to_last": ([max(last - 1, 0)], "one"),
             "embeddings": ([0], "one"), "sum4": (four, "sum"), "last4": (four, "concat"),
             "mix4": (four, "mix"), "sum_all": (list(range(1, num_states)), "sum"),
             "mix": (list(range(1, num_states)), "mix")}
    if name not in table:
        raise BertJaxError(f"feature_layers={name!r}: choose one of {', '.join(FEATURE_LAYERS)}")
    return table[name]


def combine(states: Sequence[jax.Array], how: str, weights=None) -> jax.Array:
    """Selected hidden states [..., D] -> one feature tensor: the single state, their sum,
    their concatenation [..., n x D], their stack [..., n, D] or ``sum_j weights[j] * h_j``."""
    if how == "one":
        return states[0]
    if how == "sum":
        return sum(states[1:], states[0])
    if how == "concat":
        return jnp.concatenate(list(states), axis=-1)
    if how == "stack":
        return jnp.stack(list(states), axis=-2)
    if how == "weighted":
        return sum(w * s for w, s in zip(weights, states, strict=True))
    raise BertJaxError(f"unknown combination {how!r}")


class ScalarMix(nn.Module):
    """``gamma * sum_j softmax(weights)_j * states[j]``; the states' dtype is kept."""

    @nn.compact
    def __call__(self, states: Sequence[jax.Array]) -> jax.Array:
        w = self.param("weights", zeros((None,)), (len(states),), jnp.float32)
        gamma = self.param("gamma", ones(()), (), jnp.float32)
        mixed = combine(states, "weighted", jax.nn.softmax(w) * gamma)
        return mixed.astype(states[0].dtype)


def mix_weights(mix_params: dict) -> list[float]:
    """Effective per-state weights ``gamma * softmax(w)`` of trained ScalarMix parameters (the
    values ``bert-jax embed --layer mix:w0,w1,...`` takes)."""
    mix_params = nn.unbox(mix_params)
    w = jax.nn.softmax(jnp.asarray(mix_params["weights"], jnp.float32))
    return [float(x) for x in w * jnp.asarray(mix_params["gamma"], jnp.float32)]


class FeatureLayers(nn.Module):
    """Hidden states (tuple of [B, S, D]) -> the feature tensor of ``feature_layers``."""

    feature_layers: str = "last"

    @nn.compact
    def __call__(self, hidden_states: Sequence[jax.Array]) -> jax.Array:
        indices, how = layer_selection(self.feature_layers, len(hidden_states))
        states = [hidden_states[i] for i in indices]
        if how == "mix":
            return ScalarMix(name="mix")(states)
        return combine(states, how)


class BiLSTM(nn.Module):
    """``num_layers`` bidirectional LSTM layers over right-padded sequences: each direction
    sees only the real tokens (``lengths``), so padding never changes a real token's output.
    Output [B, S, 2 x hidden] (forward and backward states concatenated); padded positions
    are zero."""

    hidden_size: int = 768
    num_layers: int = 2
    dropout: float = 0.0

    @nn.compact
    def __call__(self, x, lengths, deterministic: bool = True):
        x = x.astype(jnp.float32)
        valid = (jnp.arange(x.shape[1])[None, :] < lengths[:, None])[..., None]
        for i in range(self.num_layers):
            if i:
                x = nn.Dropout(self.dropout)(x, deterministic=deterministic)
            forward = nn.RNN(nn.OptimizedLSTMCell(self.hidden_size, name=f"forward_{i}"))
            backward = nn.RNN(nn.OptimizedLSTMCell(self.hidden_size, name=f"backward_{i}"),
                              reverse=True, keep_order=True)
            x = jnp.concatenate([forward(x, seq_lengths=lengths),
                                 backward(x, seq_lengths=lengths)], axis=-1)
            x = jnp.where(valid, x, 0.0)
        return x


class BertFeatureTagger(nn.Module):
    """Token labels from combined hidden states: ``feature_layers`` -> (BiLSTM) -> dropout ->
    dense, logits [B, S, labels] float32. With ``freeze_encoder`` no gradient reaches the
    encoder and it runs without dropout (the paper's feature-based rows); the head alone
    trains."""

    config: BertConfig
    num_labels: int
    freeze_encoder: bool = True
    feature_layers: str = "last"
    feature_head: str = "linear"
    lstm_hidden_size: int = 768
    lstm_layers: int = 2

    @nn.compact
    def __call__(self, input_ids, input_mask=None, segment_ids=None, *,
                 deterministic: bool = True) -> dict[str, Any]:
        cfg = self.config
        if self.feature_head not in FEATURE_HEADS:
            raise BertJaxError(f"feature_head={self.feature_head!r}: choose one of "
                               f"{', '.join(FEATURE_HEADS)}")
        # A frozen encoder gives its features as extracted: no dropout inside it.
        out = BertModel(cfg, add_pooler=False, name="bert")(
            input_ids, input_mask, segment_ids,
            deterministic=deterministic or self.freeze_encoder, output_hidden_states=True)
        states = out.pop("hidden_states")
        if self.freeze_encoder:
            states = [jax.lax.stop_gradient(s) for s in states]
        x = FeatureLayers(self.feature_layers, name="feature_mix")(states)
        if self.feature_head == "bilstm":
            lengths = (jnp.ones_like(input_ids) if input_mask is None else input_mask).sum(-1)
            x = BiLSTM(self.lstm_hidden_size, self.lstm_layers, cfg.hidden_dropout_prob,
                       name="bilstm")(x, lengths.astype(jnp.int32), deterministic)
            x = x.astype(cfg.dtype)
        x = hidden_dropout(cfg)(x, deterministic=deterministic)
        out["logits"] = dense(cfg, self.num_labels, ("embed", "classes"), "classifier")(
            x).astype(jnp.float32)
        return out


class BertFeatureClassifier(nn.Module):
    """Sequence labels (or a regression score) from the [CLS] vector of the combined hidden
    states: ``feature_layers`` -> [CLS] -> dropout -> dense."""

    config: BertConfig
    num_labels: int
    freeze_encoder: bool = True
    feature_layers: str = "last"

    @nn.compact
    def __call__(self, input_ids, input_mask=None, segment_ids=None, *,
                 deterministic: bool = True) -> dict[str, Any]:
        cfg = self.config
        # A frozen encoder gives its features as extracted: no dropout inside it.
        out = BertModel(cfg, add_pooler=False, name="bert")(
            input_ids, input_mask, segment_ids,
            deterministic=deterministic or self.freeze_encoder, output_hidden_states=True)
        states = out.pop("hidden_states")
        if self.freeze_encoder:
            states = [jax.lax.stop_gradient(s) for s in states]
        x = FeatureLayers(self.feature_layers, name="feature_mix")(states)[:, 0]
        x = hidden_dropout(cfg)(x, deterministic=deterministic)
        out["logits"] = dense(cfg, self.num_labels, ("embed", "classes"), "classifier")(
            x).astype(jnp.float32)
        return out


def embed_layer_spec(spec: str, num_states: int) -> tuple[list[int], str, list[float] | None]:
    """``bert-jax embed --layer`` -> (hidden-state indices, how, weights).

    An integer indexes the hidden states (0 = embeddings, -1 = last); ``last4`` concatenates
    and ``sum4`` sums the last four; ``all`` stacks every state ([..., L+1, D]);
    ``mix:w0,w1,...`` is ``sum_j w_j h_j`` over all L+1 states (or L weights: layers 1..L),
    weights used as given (a trained run's ``gamma * softmax(w)``, see :func:`mix_weights`);
    the other ``feature_layers`` names without learned weights (last, second_to_last,
    embeddings, sum_all) work too.
    """
    if spec == "all":
        return list(range(num_states)), "stack", None
    if spec == "mix" or spec == "mix4":
        raise BertJaxError(f"--layer {spec} needs the mix weights: pass --layer mix:w0,w1,... "
                           f"({num_states} numbers, embeddings first, or {num_states - 1} for "
                           "layers 1..L), or learn them by fine-tuning with "
                           "--config.feature_layers=mix --config.freeze_encoder=true")
    if spec.startswith("mix:"):
        try:
            weights = [float(x) for x in spec[4:].split(",")]
        except ValueError:
            raise BertJaxError(f"--layer {spec}: weights must be numbers separated by commas"
                               ) from None
        if len(weights) == num_states:
            return list(range(num_states)), "weighted", weights
        if len(weights) == num_states - 1:
            return list(range(1, num_states)), "weighted", weights
        raise BertJaxError(f"--layer {spec}: {len(weights)} weights for a model with "
                           f"{num_states} hidden states (give {num_states}, embeddings first, "
                           f"or {num_states - 1} for layers 1..L)")
    if spec in FEATURE_LAYERS:
        indices, how = layer_selection(spec, num_states)
        return indices, how, None
    try:
        index = int(spec)
    except ValueError:
        raise BertJaxError(f"--layer must be an integer, last4, sum4, all, mix:w0,w1,... or one "
                           f"of {', '.join(n for n in FEATURE_LAYERS if 'mix' not in n)}; got "
                           f"{spec!r}") from None
    if not -num_states <= index < num_states:
        raise BertJaxError(f"--layer {index} out of range for {num_states} hidden states "
                           "(embeddings + each layer)")
    return [index % num_states], "one", None
