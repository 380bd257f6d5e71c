"""ELECTRA's replaced-token-detection head and the encoder + head model it sits on.

The head scores every token: dense (hidden -> hidden), the encoder's activation, dense
(hidden -> 1); a positive logit means "this token was replaced by the generator". Parameter
tree: ``{"bert": encoder, "rtd": {"dense", "prediction"}}``.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from bert_jax.config import BertConfig
from bert_jax.modeling.encoder import BertModel, dense


class ReplacedTokenHead(nn.Module):
    """[batch, seq, hidden] -> float32 logits [batch, seq]."""

    config: BertConfig

    @nn.compact
    def __call__(self, hidden):
        cfg = self.config
        h = dense(cfg, cfg.hidden_size, ("embed", "mlp"), "dense",
                  activation=cfg.hidden_act)(hidden)
        logits = dense(cfg, 1, ("mlp", "classes"), "prediction")(h)
        return logits[..., 0].astype(jnp.float32)


class BertForReplacedTokenDetection(nn.Module):
    """Encoder (no pooler) + :class:`ReplacedTokenHead` (ELECTRA's discriminator). Packed rows
    pass ``example_ids`` and ``position_ids`` (``BertModel``); the head is per token."""

    config: BertConfig

    @nn.compact
    def __call__(self, input_ids, input_mask=None, segment_ids=None, *,
                 deterministic: bool = True, example_ids=None, position_ids=None
                 ) -> dict[str, Any]:
        out = BertModel(self.config, add_pooler=False, name="bert")(
            input_ids, input_mask, segment_ids, deterministic=deterministic,
            example_ids=example_ids, position_ids=position_ids)
        out["rtd_logits"] = ReplacedTokenHead(self.config, name="rtd")(out["sequence_output"])
        return out
