"""Optimizers and learning-rate schedules for pretraining, as BERT/NVIDIA train it.

* AdamW with decoupled weight decay, excluding LayerNorm parameters and biases (matched by
  parameter path, as Google BERT's ``exclude_from_weight_decay``).
* LAMB with the same exclusion from weight decay and from the layer-wise trust ratio.
* Linear warmup, then linear, polynomial or cosine decay; clipping by global norm first.
"""

from __future__ import annotations

from typing import Any

import jax
import optax

from bert_jax.errors import BertJaxError

# Parameter names that get neither weight decay nor LAMB's trust ratio.
NO_DECAY_NAMES = ("bias", "scale")
NO_DECAY_MODULES = ("LayerNorm", "attention_norm", "output_norm", "transform_norm")


def _path_names(path) -> list[str]:
    return [str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey)]


def decay_mask(params) -> Any:
    """True for parameters that take weight decay (kernels and embeddings), False for
    LayerNorm scales/biases and every bias. Works on boxed (nn.Partitioned) trees too."""
    def decays(path, _):
        names = _path_names(path)
        return not (names[-1] in NO_DECAY_NAMES or any(n in NO_DECAY_MODULES for n in names))

    return jax.tree_util.tree_map_with_path(decays, params)


def make_schedule(cfg) -> optax.Schedule:
    """Linear warmup from 0 to ``learning_rate`` over ``warmup_steps``, then ``decay`` down to
    ``end_learning_rate`` at ``decay_steps`` (linear = polynomial with power 1)."""
    peak, warmup = float(cfg.learning_rate), int(cfg.warmup_steps)
    total = int(cfg.decay_steps)
    end = float(cfg.end_learning_rate)
    if total <= warmup:
        raise BertJaxError(f"optimizer.decay_steps={total} must exceed optimizer.warmup_steps="
                           f"{warmup}")
    if cfg.decay == "linear":
        decay = optax.polynomial_schedule(peak, end, 1.0, total - warmup)
    elif cfg.decay == "polynomial":
        decay = optax.polynomial_schedule(peak, end, float(cfg.power), total - warmup)
    elif cfg.decay == "cosine":
        decay = optax.cosine_decay_schedule(peak, total - warmup, alpha=end / peak if peak else 0)
    elif cfg.decay == "constant":
        decay = optax.constant_schedule(peak)
    else:
        raise BertJaxError(f"optimizer.decay={cfg.decay!r}: expected linear, polynomial, "
                           "cosine or constant")
    if warmup == 0:
        return decay
    return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup), decay], [warmup])


def make_optimizer(cfg) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """``cfg``: the ``optimizer`` section of an experiment config. Returns (tx, schedule)."""
    schedule = make_schedule(cfg)
    parts = []
    if cfg.clip_norm and cfg.clip_norm > 0:
        parts.append(optax.clip_by_global_norm(float(cfg.clip_norm)))
    adam = optax.scale_by_adam(b1=float(cfg.b1), b2=float(cfg.b2), eps=float(cfg.eps))
    wd = float(cfg.weight_decay)
    if cfg.name == "adamw":
        parts += [adam, optax.add_decayed_weights(wd, mask=decay_mask)]
    elif cfg.name == "lamb":
        parts += [adam, optax.add_decayed_weights(wd, mask=decay_mask),
                  optax.masked(optax.scale_by_trust_ratio(), decay_mask)]
    else:
        raise BertJaxError(f"optimizer.name={cfg.name!r}: expected 'adamw' or 'lamb'")
    parts.append(optax.scale_by_learning_rate(schedule))
    return optax.chain(*parts), schedule
