"""Task heads and the full models built from the encoder.

Pretraining: the masked-LM head runs only on gathered ``masked_lm_positions`` and decodes
against the tied word embeddings (own bias); its outputs are the logits (``mlm_logits``) and
the decoder's operands (``mlm_decoder``), from which ``mlm_cross_entropy`` computes the loss
with the fused kernels of ``fused_xent.py`` on GPUs (under jit only the one used is
computed). NSP/SOP classify the pooled output. Fine-tuning:
sequence classification/regression, token classification, span QA and multiple choice.
Parameter trees: ``{"bert": encoder, <head name>: head}`` so a pretrained encoder merges
into freshly initialised heads.

Packed rows: ``BertForPreTraining`` and ``BertForSequenceClassification`` take the packing
inputs (``PACKING_KEYS``) and return per-example logits [batch, k, ...] gathered at
``cls_positions``; the MLM and token heads are per token already.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.config import BertConfig
from bert_jax.kernels import fused_xent
from bert_jax.kernels.reference import NEG_INF, decode, logits_cross_entropy
from bert_jax.modeling import placement
from bert_jax.modeling.encoder import (
    BertModel,
    dense,
    gather_positions,
    hidden_dropout,
    layer_norm,
    zeros,
)

# The optional inputs of packed rows (``data/packing.py``), passed through to ``BertModel``.
PACKING_KEYS = ("example_ids", "position_ids", "cls_positions")


def packing_inputs(batch) -> dict[str, Any]:
    """The packing inputs a batch carries (none for unpacked batches)."""
    return {k: batch[k] for k in PACKING_KEYS if k in batch}


def mask_padded_vocab(logits, vocab_size: int):
    """Excludes the vocabulary padding rows from every softmax, loss and argmax."""
    if logits.shape[-1] == vocab_size:
        return logits
    valid = jnp.arange(logits.shape[-1]) < vocab_size
    return jnp.where(valid, logits, NEG_INF)


class MLMDecoder(NamedTuple):
    """What the tied decoder multiplies: transformed hidden states [..., embed] and the word
    embeddings [padded_vocab, embed] in the compute dtype, and the float32 decoder bias
    [padded_vocab] with ``NEG_INF`` at the vocabulary padding (``masked_bias``)."""
    hidden: jax.Array
    table: jax.Array
    bias: jax.Array


def masked_bias(bias, vocab_size: int):
    """The decoder bias in float32 with the padding entries at ``NEG_INF``: logits ``h @ table.T
    + bias`` exclude them from every softmax (their gradient is zero)."""
    bias = bias.astype(jnp.float32)
    if bias.shape[-1] == vocab_size:
        return bias
    return jnp.where(jnp.arange(bias.shape[-1]) < vocab_size, bias, NEG_INF)


class MaskedLMHead(nn.Module):
    """Transform (dense + activation + LayerNorm) then the tied decoder with its own bias:
    logits [..., padded_vocab] float32, or with ``logits=False`` the decoder's operands
    (:class:`MLMDecoder`, for a loss that fuses the decoder matmul: ``mlm_cross_entropy``)."""

    config: BertConfig

    @nn.compact
    def __call__(self, hidden, embedding_table, logits: bool = True):
        cfg = self.config
        h = dense(cfg, cfg.embedding_dim, ("embed", "mlp"), "transform",
                  activation=cfg.hidden_act)(hidden)
        h = layer_norm(cfg, "transform_norm")(h)
        bias = self.param("bias", zeros(("vocab",)), (cfg.padded_vocab_size,),
                          cfg.param_dtype)
        decoder = MLMDecoder(h, embedding_table.astype(h.dtype),
                             masked_bias(bias, cfg.vocab_size))
        return decoder_logits(decoder, cfg.vocab_size) if logits else decoder


def decoder_logits(decoder: MLMDecoder, vocab_size: int):
    """[..., padded_vocab] float32 logits: decode against the tied word embeddings, plus the
    bias; the padding entries exactly ``NEG_INF``."""
    return mask_padded_vocab(decode(decoder.hidden, decoder.table) + decoder.bias, vocab_size)


def _use_fused_mlm_loss(decoder: MLMDecoder | None, fused: str) -> bool:
    """Whether the MLM loss runs as ``fused_xent.decode_cross_entropy`` (the decoder matmul and
    the softmax cross-entropy as one custom VJP whose passes over the logits are Pallas
    kernels): ``fused`` is ``BertConfig.kernels.fused_mlm_loss`` (auto: on GPUs where they
    apply, the vocabulary axis not split over a mesh; off: XLA's fusions over the float32
    logits; force: wherever they apply, any backend)."""
    if decoder is None or fused == "off":
        return False
    applies = fused_xent.supported(decoder.table.shape[0])
    if fused == "force":
        return applies
    return (applies and placement.target_platform() == "gpu"
            and placement.split_axes("vocab") is None)


def mlm_cross_entropy(outputs: dict[str, Any], ids, config: BertConfig):
    """Per-prediction ``(nll, correct)`` float32 [..., P] of the MLM head's outputs
    (``BertForPreTraining``): the softmax cross-entropy of the label and whether the label's
    logit is the maximum (ties count as correct). Through the fused kernels
    (``config.kernels.fused_mlm_loss``) from ``outputs["mlm_decoder"]`` where they apply, else XLA's
    passes over ``outputs["mlm_logits"]`` (the same values up to float32 summation order)."""
    decoder = outputs.get("mlm_decoder")
    if _use_fused_mlm_loss(decoder, config.kernels.fused_mlm_loss):
        return fused_xent.decode_cross_entropy(decoder.hidden, decoder.table, decoder.bias, ids,
                                               shards=placement.xent_shards())
    return logits_cross_entropy(outputs["mlm_logits"], ids)


class PairHead(nn.Module):
    """Two-way classifier on the pooled output: NSP (BERT) or sentence order (ALBERT SOP)."""

    config: BertConfig

    @nn.compact
    def __call__(self, pooled):
        return dense(self.config, 2, ("embed", "classes"), "dense")(pooled).astype(jnp.float32)


class BertForPreTraining(nn.Module):
    """Encoder + MLM head + NSP/SOP head (``pair_head=False`` for RoBERTa-style MLM only)."""

    config: BertConfig
    pair_head: bool = True
    add_pooler: bool = True  # False for checkpoints without one (RoBERTa/DistilBERT MLM)

    @nn.compact
    def __call__(self, input_ids, input_mask=None, segment_ids=None, masked_lm_positions=None,
                 *, deterministic: bool = True, output_hidden_states: bool = False,
                 output_attentions: bool = False, example_ids=None, position_ids=None,
                 cls_positions=None) -> dict[str, Any]:
        bert = BertModel(self.config, add_pooler=self.add_pooler or self.pair_head, name="bert")
        out = bert(input_ids, input_mask, segment_ids, deterministic=deterministic,
                        output_hidden_states=output_hidden_states,
                        output_attentions=output_attentions, example_ids=example_ids,
                        position_ids=position_ids, cls_positions=cls_positions)
        seq = out["sequence_output"]
        if masked_lm_positions is not None:
            seq = gather_positions(seq, masked_lm_positions)  # [batch, P, hidden]
        # The decoder's operands, and the logits from them (under jit, whichever of the two the
        # caller does not use costs nothing: ``mlm_cross_entropy`` reads one or the other).
        decoder = MaskedLMHead(self.config, name="mlm")(seq, bert.word_embedding_table(),
                                                       logits=False)
        out["mlm_decoder"] = decoder
        out["mlm_logits"] = decoder_logits(decoder, self.config.vocab_size)
        if self.pair_head:
            out["nsp_logits"] = PairHead(self.config, name="nsp")(out["pooled_output"])
        return out


def _encode(module: nn.Module, pooled: bool, input_ids, input_mask, segment_ids,
            deterministic: bool, **packing):
    """Runs the encoder as ``module``'s "bert" child; returns (outputs, features) where the
    features (pooled or per-token) are cut from the gradient when the encoder is frozen.
    ``packing``: the packing inputs of packed rows (``PACKING_KEYS``)."""
    out = BertModel(module.config, add_pooler=pooled, name="bert")(
        input_ids, input_mask, segment_ids, deterministic=deterministic, **packing)
    features = out["pooled_output" if pooled else "sequence_output"]
    return out, _maybe_freeze(features, module.freeze_encoder)


def _classify(module: nn.Module, features, num_outputs: int, deterministic: bool,
              name: str = "classifier", dropout: bool = True):
    """Dropout then a dense layer (``name`` keeps checkpoint paths), logits in float32."""
    cfg = module.config
    if dropout:
        features = hidden_dropout(cfg)(features, deterministic=deterministic)
    logits = dense(cfg, num_outputs, ("embed", "classes"), name)(features)
    return logits.astype(jnp.float32)


class BertForSequenceClassification(nn.Module):
    """Pooled output -> dropout -> dense. ``num_labels=1`` is regression (STS-B). Packed rows
    (``cls_positions`` [batch, k] and the other packing inputs): logits [batch, k, labels]."""

    config: BertConfig
    num_labels: int
    freeze_encoder: bool = False

    @nn.compact
    def __call__(self, input_ids, input_mask=None, segment_ids=None, *,
                 deterministic: bool = True, example_ids=None, position_ids=None,
                 cls_positions=None) -> dict[str, Any]:
        out, pooled = _encode(self, True, input_ids, input_mask, segment_ids, deterministic,
                              example_ids=example_ids, position_ids=position_ids,
                              cls_positions=cls_positions)
        out["logits"] = _classify(self, pooled, self.num_labels, deterministic)
        return out


class BertForTokenClassification(nn.Module):
    """Per-token labels (NER): logits [batch, seq, labels]."""

    config: BertConfig
    num_labels: int
    freeze_encoder: bool = False

    @nn.compact
    def __call__(self, input_ids, input_mask=None, segment_ids=None, *,
                 deterministic: bool = True) -> dict[str, Any]:
        out, seq = _encode(self, False, input_ids, input_mask, segment_ids, deterministic)
        out["logits"] = _classify(self, seq, self.num_labels, deterministic)
        return out


class BertForQuestionAnswering(nn.Module):
    """Span extraction: start and end logits for every token (SQuAD)."""

    config: BertConfig
    freeze_encoder: bool = False

    @nn.compact
    def __call__(self, input_ids, input_mask=None, segment_ids=None, *,
                 deterministic: bool = True) -> dict[str, Any]:
        out, seq = _encode(self, False, input_ids, input_mask, segment_ids, deterministic)
        logits = dense(span_head_config(self.config), 2, ("embed", "classes"),
                       "qa_outputs")(seq).astype(jnp.float32)
        out["start_logits"], out["end_logits"] = logits[..., 0], logits[..., 1]
        return out


# Standard deviation of a normal truncated at +-2 standard deviations, over the untruncated one.
TRUNCATED_NORMAL_STD = 0.87962566103423978


def span_head_config(config: BertConfig) -> BertConfig:
    """``config`` for the span head's dense layer: its kernel is drawn with standard deviation
    ``initializer_range``, as transformers draws it (normal(0, initializer_range)), instead of
    the 0.88x of Google's ``truncated_normal(initializer_range)`` that the rest keeps.

    Why it matters: at fine-tuning learning rates Adam moves each head weight by about the
    learning rate per step, far less than its initial size, so the head stays near its random
    draw and its scale multiplies how fast the start/end logits follow the encoder's updates.
    At 0.88x, SQuAD fine-tuning from a small model at lr 3e-5 trained slower than
    transformers from the same checkpoint."""
    return config.replace(initializer_range=config.initializer_range / TRUNCATED_NORMAL_STD)


class BertForMultipleChoice(nn.Module):
    """Inputs [batch, choices, seq]; one score per choice from the pooled output (SWAG)."""

    config: BertConfig
    freeze_encoder: bool = False

    @nn.compact
    def __call__(self, input_ids, input_mask=None, segment_ids=None, *,
                 deterministic: bool = True) -> dict[str, Any]:
        batch, choices, seq_len = input_ids.shape
        flat = lambda a: None if a is None else a.reshape(batch * choices, seq_len)
        out, pooled = _encode(self, True, flat(input_ids), flat(input_mask),
                              flat(segment_ids), deterministic)
        out["logits"] = _classify(self, pooled, 1, deterministic).reshape(batch, choices)
        return out


def _maybe_freeze(x, freeze: bool):
    """Feature-based use: no gradient flows into the encoder."""
    return jax.lax.stop_gradient(x) if freeze else x
