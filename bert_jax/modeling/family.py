"""Pretraining models of the BERT family beyond BERT/RoBERTa/ALBERT: SpanBERT's span
boundary objective, ELECTRA's generator + discriminator, and DistilBERT's student/teacher
pair. Every model keeps its encoder under ``bert`` (for ELECTRA the discriminator, for
DistilBERT the student), so ``bert-jax finetune`` starts from it; all new parameters name
logical axes so they shard like BERT's.

Packed rows (``bert_jax/data/packing.py``): every model takes the packing inputs
(``heads.PACKING_KEYS``) and passes them to each of its encoders, so each example of a row
is encoded as it would be alone; the span boundaries stay inside each example.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.config import BertConfig
from bert_jax.modeling.encoder import BertModel, dense, initializer, layer_norm, zeros
from bert_jax.modeling.heads import (
    BertForPreTraining,
    MaskedLMHead,
    MLMDecoder,
    decoder_logits,
    gather_positions,
    masked_bias,
)


def span_boundaries(masked_lm_positions, masked_lm_weights, seq_len: int, example_ids=None):
    """For each prediction [batch, P]: the positions of the unmasked tokens just left and right
    of its contiguous masked run, and its 1-based offset from the left boundary (SpanBERT's
    x_{s-1}, x_{e+1} and p_{i-s+1}). Adjacent masked spans form one run, as the model sees no
    boundary between them. A run that reaches the row's first (last) position takes that
    position as its left (right) boundary. Packed rows (``example_ids`` [batch, seq], 1..k per
    example, 0 at padding): each example's first and last tokens are such edges, so a run
    and its boundaries stay inside one example."""
    hits = jax.nn.one_hot(masked_lm_positions, seq_len, dtype=jnp.float32)  # [b, P, seq]
    masked = jnp.einsum("bps,bp->bs", hits, masked_lm_weights.astype(jnp.float32)) > 0
    index = jnp.arange(seq_len)[None, :]
    if example_ids is None:
        first, last = index == 0, index == seq_len - 1
    else:  # [b, seq]: where the example changes from the token before / to the token after
        edge = example_ids[:, 1:] != example_ids[:, :-1]
        first = jnp.pad(edge, ((0, 0), (1, 0)), constant_values=True)
        last = jnp.pad(edge, ((0, 0), (0, 1)), constant_values=True)
    # the last unmasked token or example start <= s; the first unmasked token or example
    # end >= s
    left_of = jax.lax.cummax(jnp.where(masked & ~first, -1, index), axis=1)
    right_of = jax.lax.cummin(jnp.where(masked & ~last, seq_len, index), axis=1, reverse=True)
    left = jnp.take_along_axis(left_of, masked_lm_positions, axis=1)
    right = jnp.take_along_axis(right_of, masked_lm_positions, axis=1)
    return left, right, masked_lm_positions - left


class SpanBoundaryHead(nn.Module):
    """SpanBERT's SBO: y_i = f(x_{s-1}, x_{e+1}, p_{i-s+1}) with f a 2-layer feed-forward
    network, GELU and LayerNorm after each layer (Joshi et al. 2020, eq. 1), decoded against
    the tied word embeddings with its own bias. Relative positions past
    ``max_relative_position - 1`` share the last embedding. Packed rows pass ``example_ids``
    (:func:`span_boundaries`)."""

    config: BertConfig
    max_relative_position: int = 32

    @nn.compact
    def __call__(self, sequence, masked_lm_positions, masked_lm_weights, embedding_table,
                 example_ids=None) -> MLMDecoder:
        cfg = self.config
        left, right, offset = span_boundaries(masked_lm_positions, masked_lm_weights,
                                              sequence.shape[1], example_ids)
        offset = jnp.clip(offset, 0, self.max_relative_position - 1)
        relative = nn.Embed(self.max_relative_position, cfg.hidden_size, dtype=cfg.param_dtype,
                            param_dtype=cfg.param_dtype,
                            embedding_init=initializer(cfg, (None, "embed")),
                            name="relative_position_embeddings")(offset)
        h = jnp.concatenate([gather_positions(sequence, left),
                             gather_positions(sequence, right),
                             relative.astype(sequence.dtype)], axis=-1)  # [b, P, 3 * hidden]
        h = dense(cfg, cfg.hidden_size, ("mlp", "embed"), "layer_0", activation="gelu")(h)
        h = layer_norm(cfg, "layer_0_norm")(h)
        h = dense(cfg, cfg.embedding_dim, ("embed", "mlp"), "layer_1", activation="gelu")(h)
        h = layer_norm(cfg, "layer_1_norm")(h)
        bias = self.param("bias", zeros(("vocab",)), (cfg.padded_vocab_size,),
                          cfg.param_dtype)
        return MLMDecoder(h, embedding_table.astype(h.dtype), masked_bias(bias, cfg.vocab_size))


class SpanBertForPreTraining(nn.Module):
    """Encoder + MLM head + span boundary head, single segment, no NSP (SpanBERT)."""

    config: BertConfig
    max_relative_position: int = 32

    @nn.compact
    def __call__(self, input_ids, input_mask, segment_ids, masked_lm_positions,
                 masked_lm_weights, *, deterministic: bool = True, example_ids=None,
                 position_ids=None, cls_positions=None) -> dict[str, Any]:
        bert = BertModel(self.config, name="bert")
        out = bert(input_ids, input_mask, segment_ids, deterministic=deterministic,
                   example_ids=example_ids, position_ids=position_ids,
                   cls_positions=cls_positions)
        table = bert.word_embedding_table()
        seq = gather_positions(out["sequence_output"], masked_lm_positions)
        decoder = MaskedLMHead(self.config, name="mlm")(seq, table, logits=False)
        out["mlm_decoder"] = decoder
        out["mlm_logits"] = decoder_logits(decoder, self.config.vocab_size)
        sbo = SpanBoundaryHead(self.config, self.max_relative_position, name="sbo")(
            out["sequence_output"], masked_lm_positions, masked_lm_weights, table, example_ids)
        out["sbo_decoder"] = sbo
        out["sbo_logits"] = decoder_logits(sbo, self.config.vocab_size)
        return out


# ---- ELECTRA ------------------------------------------------------------------------------
# The generator shares the discriminator's token and position embeddings (Clark et al. 2020,
# section 3.2). Flax gives each module its own parameters, so the generator's two tables are
# dropped from the stored tree (``untie_generator_embeddings``) and the discriminator's are
# put in their place before every apply (``tie_generator_embeddings``): one stored copy, and
# both models' gradients reach it.
TIED_TABLES = ("word_embeddings", "position_embeddings")


def generator_config(config: BertConfig, fraction: float) -> BertConfig:
    """The generator: the discriminator's depth and embedding width, ``fraction`` of its
    hidden size (ELECTRA: 1/4 for Small and Large, 1/3 for Base), 64-wide heads."""
    hidden = max(64, int(round(config.hidden_size * fraction)))
    heads = max(1, min(config.num_attention_heads, hidden // 64))
    while hidden % heads:
        heads -= 1
    return config.replace(hidden_size=hidden, num_attention_heads=heads,
                          intermediate_size=4 * hidden, embedding_size=config.embedding_dim)


def untie_generator_embeddings(params: dict) -> dict:
    embeddings = dict(params["generator"]["embeddings"])
    for name in TIED_TABLES:
        embeddings.pop(name, None)
    return {**params, "generator": {**params["generator"], "embeddings": embeddings}}


def tie_generator_embeddings(params: dict) -> dict:
    shared = {name: params["bert"]["embeddings"][name] for name in TIED_TABLES}
    embeddings = {**params["generator"]["embeddings"], **shared}
    return {**params, "generator": {**params["generator"], "embeddings": embeddings}}


def replace_masked(input_ids, masked_lm_positions, masked_lm_weights, new_ids):
    """input_ids [b, seq] with ``new_ids`` [b, P] written at the real masked positions."""
    hits = jax.nn.one_hot(masked_lm_positions, input_ids.shape[1], dtype=jnp.int32)
    hits = hits * (masked_lm_weights > 0).astype(jnp.int32)[..., None]  # [b, P, seq]
    written = jnp.sum(hits, axis=1) > 0
    values = jnp.einsum("bps,bp->bs", hits, new_ids.astype(jnp.int32))
    return jnp.where(written, values, input_ids)


class ElectraForPreTraining(nn.Module):
    """Generator (masked LM) + discriminator (replaced-token detection).

    The generator predicts the masked tokens; a sample from its softmax (``categorical`` with
    ``sample_rng``, outside the gradient) replaces each masked token, and the discriminator
    labels every token original (0) or replaced (1). A sampled token equal to the original
    counts as original (ELECTRA, section 2).
    """

    config: BertConfig
    generator: BertConfig

    @nn.compact
    def __call__(self, input_ids, input_mask, segment_ids, masked_lm_positions,
                 masked_lm_ids, masked_lm_weights, sample_rng, *,
                 deterministic: bool = True, example_ids=None, position_ids=None,
                 cls_positions=None) -> dict[str, Any]:
        packing = dict(example_ids=example_ids, position_ids=position_ids,
                       cls_positions=cls_positions)
        gen = BertModel(self.generator, add_pooler=False, name="generator")
        gen_out = gen(input_ids, input_mask, segment_ids, deterministic=deterministic,
                      **packing)
        seq = gather_positions(gen_out["sequence_output"], masked_lm_positions)
        decoder = MaskedLMHead(self.generator, name="generator_mlm")(
            seq, gen.word_embedding_table(), logits=False)
        logits = decoder_logits(decoder, self.generator.vocab_size)  # [b, P, vocab]
        sampled = jax.random.categorical(sample_rng, jax.lax.stop_gradient(logits))
        sampled = jax.lax.stop_gradient(sampled)
        original = replace_masked(input_ids, masked_lm_positions, masked_lm_weights,
                                  masked_lm_ids)
        corrupted = replace_masked(input_ids, masked_lm_positions, masked_lm_weights, sampled)
        out = BertModel(self.config, name="bert")(corrupted, input_mask, segment_ids,
                                                  deterministic=deterministic, **packing)
        h = dense(self.config, self.config.hidden_size, ("embed", "mlp"), "rtd_dense",
                  activation=self.config.hidden_act)(out["sequence_output"])
        rtd = dense(self.config, 1, ("mlp", None), "rtd_output")(h)[..., 0]
        out.update(mlm_decoder=decoder, mlm_logits=logits, rtd_logits=rtd.astype(jnp.float32),
                   rtd_labels=(corrupted != original).astype(jnp.int32),
                   corrupted_ids=corrupted, sampled_ids=sampled)
        return out


# ---- DistilBERT ---------------------------------------------------------------------------
class DistillationPair(nn.Module):
    """A student (``bert`` + ``mlm``, the names of ``BertForPreTraining``) and its teacher
    (``teacher``, a ``BertForPreTraining`` without pair head) run on the same batch. The
    teacher's outputs carry no gradient; its parameters are frozen by the optimizer."""

    config: BertConfig
    teacher: BertConfig

    @nn.compact
    def __call__(self, input_ids, input_mask, segment_ids, masked_lm_positions, *,
                 deterministic: bool = True, example_ids=None, position_ids=None,
                 cls_positions=None) -> dict[str, Any]:
        packing = dict(example_ids=example_ids, position_ids=position_ids,
                       cls_positions=cls_positions)
        bert = BertModel(self.config, add_pooler=False, name="bert")
        out = bert(input_ids, input_mask, segment_ids, deterministic=deterministic, **packing)
        seq = gather_positions(out["sequence_output"], masked_lm_positions)
        decoder = MaskedLMHead(self.config, name="mlm")(seq, bert.word_embedding_table(),
                                                       logits=False)
        out["mlm_decoder"] = decoder
        out["mlm_logits"] = decoder_logits(decoder, self.config.vocab_size)
        teacher = BertForPreTraining(self.teacher, pair_head=False, name="teacher")(
            input_ids, input_mask, segment_ids, masked_lm_positions, deterministic=True,
            **packing)
        out["teacher_mlm_logits"] = jax.lax.stop_gradient(teacher["mlm_logits"])
        out["teacher_sequence_output"] = jax.lax.stop_gradient(teacher["sequence_output"])
        return out
