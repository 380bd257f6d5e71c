"""Task heads and the full models built from the encoder.

Pretraining: the masked-LM head runs only on gathered ``masked_lm_positions`` and decodes
against the tied word embeddings (own bias); NSP/SOP classify the pooled output. Fine-tuning:
sequence classification/regression, token classification, span QA and multiple choice.
Parameter trees: ``{"bert": encoder, <head name>: head}`` so a pretrained encoder merges
into freshly initialised heads.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.config import BertConfig
from bert_jax.modeling.encoder import BertModel, activation, dense, layer_norm, zeros

NEG_INF = -1e9


def gather_positions(sequence, positions):
    """[batch, seq, hidden], [batch, P] -> [batch, P, hidden], as a one-hot product: its
    backward is a matmul, not a scatter-add (padded predictions all point at position 0)."""
    one_hot = jax.nn.one_hot(positions, sequence.shape[1], dtype=sequence.dtype)  # [b, P, seq]
    return jnp.einsum("bps,bsh->bph", one_hot, sequence)


def mask_padded_vocab(logits, vocab_size: int):
    """Excludes the vocabulary padding rows from every softmax, loss and argmax."""
    if logits.shape[-1] == vocab_size:
        return logits
    valid = jnp.arange(logits.shape[-1]) < vocab_size
    return jnp.where(valid, logits, NEG_INF)


class MaskedLMHead(nn.Module):
    """Transform (dense + activation + LayerNorm) then the tied decoder with its own bias."""

    config: BertConfig

    @nn.compact
    def __call__(self, hidden, embedding_table):
        cfg = self.config
        h = dense(cfg, cfg.embedding_dim, ("embed", "mlp"), "transform")(hidden)
        h = activation(cfg.hidden_act)(h)
        h = layer_norm(cfg, "transform_norm")(h)
        bias = self.param("bias", zeros(("vocab",)), (cfg.padded_vocab_size,),
                          cfg.param_dtype)
        # [..., padded_vocab]: decode against the tied word embeddings
        logits = jnp.einsum("...e,ve->...v", h, embedding_table.astype(h.dtype),
                            preferred_element_type=jnp.float32)
        logits = logits + bias.astype(jnp.float32)
        return mask_padded_vocab(logits, cfg.vocab_size)  # [..., padded_vocab] float32


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

    @nn.compact
    def __call__(self, input_ids, input_mask=None, segment_ids=None, masked_lm_positions=None,
                 *, deterministic: bool = True, output_hidden_states: bool = False,
                 output_attentions: bool = False) -> dict[str, Any]:
        bert = BertModel(self.config, name="bert")
        out = bert(input_ids, input_mask, segment_ids, deterministic=deterministic,
                        output_hidden_states=output_hidden_states,
                        output_attentions=output_attentions)
        seq = out["sequence_output"]
        if masked_lm_positions is not None:
            seq = gather_positions(seq, masked_lm_positions)  # [batch, P, hidden]
        out["mlm_logits"] = MaskedLMHead(self.config, name="mlm")(seq, bert.word_embedding_table())
        if self.pair_head:
            out["nsp_logits"] = PairHead(self.config, name="nsp")(out["pooled_output"])
        return out


class BertForSequenceClassification(nn.Module):
    """Pooled output -> dropout -> dense. ``num_labels=1`` is regression (STS-B)."""

    config: BertConfig
    num_labels: int
    freeze_encoder: bool = False

    @nn.compact
    def __call__(self, input_ids, input_mask=None, segment_ids=None, *,
                 deterministic: bool = True) -> dict[str, Any]:
        out = BertModel(self.config, name="bert")(input_ids, input_mask, segment_ids,
                                                   deterministic=deterministic)
        pooled = _maybe_freeze(out["pooled_output"], self.freeze_encoder)
        pooled = nn.Dropout(self.config.hidden_dropout_prob)(pooled, deterministic=deterministic)
        logits = dense(self.config, self.num_labels, ("embed", "classes"), "classifier")(pooled)
        out["logits"] = logits.astype(jnp.float32)
        return out


class BertForTokenClassification(nn.Module):
    """Per-token labels (NER)."""

    config: BertConfig
    num_labels: int
    freeze_encoder: bool = False

    @nn.compact
    def __call__(self, input_ids, input_mask=None, segment_ids=None, *,
                 deterministic: bool = True) -> dict[str, Any]:
        out = BertModel(self.config, add_pooler=False, name="bert")(
            input_ids, input_mask, segment_ids, deterministic=deterministic)
        seq = _maybe_freeze(out["sequence_output"], self.freeze_encoder)
        seq = nn.Dropout(self.config.hidden_dropout_prob)(seq, deterministic=deterministic)
        logits = dense(self.config, self.num_labels, ("embed", "classes"), "classifier")(seq)
        out["logits"] = logits.astype(jnp.float32)  # [batch, seq, labels]
        return out


class BertForQuestionAnswering(nn.Module):
    """Span extraction: start and end logits for every token (SQuAD)."""

    config: BertConfig
    freeze_encoder: bool = False

    @nn.compact
    def __call__(self, input_ids, input_mask=None, segment_ids=None, *,
                 deterministic: bool = True) -> dict[str, Any]:
        out = BertModel(self.config, add_pooler=False, name="bert")(
            input_ids, input_mask, segment_ids, deterministic=deterministic)
        seq = _maybe_freeze(out["sequence_output"], self.freeze_encoder)
        logits = dense(self.config, 2, ("embed", "classes"), "qa_outputs")(seq)
        logits = logits.astype(jnp.float32)
        out["start_logits"], out["end_logits"] = logits[..., 0], logits[..., 1]
        return out


class BertForMultipleChoice(nn.Module):
    """Inputs [batch, choices, seq]; one score per choice from the pooled output (SWAG)."""

    config: BertConfig
    freeze_encoder: bool = False

    @nn.compact
    def __call__(self, input_ids, input_mask=None, segment_ids=None, *,
                 deterministic: bool = True) -> dict[str, Any]:
        batch, choices, seq_len = input_ids.shape
        flat = lambda a: None if a is None else a.reshape(batch * choices, seq_len)
        out = BertModel(self.config, name="bert")(flat(input_ids), flat(input_mask),
                                                   flat(segment_ids), deterministic=deterministic)
        pooled = _maybe_freeze(out["pooled_output"], self.freeze_encoder)
        pooled = nn.Dropout(self.config.hidden_dropout_prob)(pooled, deterministic=deterministic)
        logits = dense(self.config, 1, ("embed", "classes"), "classifier")(pooled)
        out["logits"] = logits.reshape(batch, choices).astype(jnp.float32)
        return out


def _maybe_freeze(x, freeze: bool):
    """Feature-based use: no gradient flows into the encoder."""
    import jax

    return jax.lax.stop_gradient(x) if freeze else x
