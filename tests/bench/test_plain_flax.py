"""The plain Flax step of ``bench peers flax``, the same-machine reference: it computes
the same function as bert-jax's BertForPreTraining (so the comparison is between two
implementations of one model), it trains, and its record counts FLOPs as bert-jax's does."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn

from bench import plain_flax
from bench.common import train_flops_per_sequence
from bert_jax import modeling
from bert_jax.checkpoint.hf import params_to_hf_state
from bert_jax.config import BertConfig

CONFIG = BertConfig(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=64, max_position_embeddings=24)


def _batch(rng, batch=3, seq=16, predictions=4, vocab=97):
    lengths = np.array([seq, seq - 5, 9])[:batch]
    mask = (np.arange(seq)[None] < lengths[:, None]).astype(np.int32)
    positions = np.stack([np.sort(rng.choice(np.arange(1, n - 1), predictions, replace=False))
                          for n in lengths]).astype(np.int32)
    return {"input_ids": rng.integers(5, vocab, (batch, seq)).astype(np.int32) * mask,
            "input_mask": mask,
            "segment_ids": (np.arange(seq)[None] >= lengths[:, None] // 2).astype(np.int32) * mask,
            "masked_lm_positions": positions,
            "masked_lm_ids": rng.integers(5, vocab, (batch, predictions)).astype(np.int32),
            "masked_lm_weights": np.ones((batch, predictions), np.float32),
            "next_sentence_labels": np.array([0, 1, 1])[:batch].astype(np.int32)}


def _plain(config, dtype=jnp.float32):
    return plain_flax.PlainBertForPreTraining(
        config.num_hidden_layers, config.hidden_size, config.num_attention_heads,
        config.intermediate_size, vocab=config.vocab_size,
        max_positions=config.max_position_embeddings, dtype=dtype)


def test_plain_step_computes_bert_jax_model():
    """bert-jax params -> Hugging Face names -> the plain model: the same MLM and NSP logits
    (float32, right-padded rows: the plain model's key lengths vs bert-jax's mask)."""
    batch = _batch(np.random.default_rng(0))
    inputs = (batch["input_ids"], batch["input_mask"], batch["segment_ids"],
              batch["masked_lm_positions"])
    model = modeling.BertForPreTraining(CONFIG)
    # jitted: one compile each instead of one per op
    params = nn.unbox(jax.jit(model.init)(jax.random.key(0), *inputs))["params"]
    # noise everywhere (zero-initialised biases would hide a swapped or missing bias)
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    params = jax.tree.unflatten(tree, [x + 0.05 * jax.random.normal(k, x.shape, x.dtype)
                                       for x, k in zip(leaves, keys, strict=True)])
    want = jax.jit(model.apply)({"params": params}, *inputs)
    state, dropped = params_to_hf_state(params, CONFIG, "BertForPreTraining")
    assert dropped == []
    plain = plain_flax.params_from_hf_state(state, CONFIG.num_hidden_layers)
    plain_apply = jax.jit(_plain(CONFIG).apply)
    mlm, nsp = plain_apply({"params": plain}, *inputs)
    np.testing.assert_allclose(mlm, want["mlm_logits"][..., :CONFIG.vocab_size], atol=2e-4,
                               rtol=2e-4)
    np.testing.assert_allclose(nsp, want["nsp_logits"], atol=2e-4, rtol=2e-4)
    # the comparison can fail: another layer's weights give other logits
    plain["layer_0"], plain["layer_1"] = plain["layer_1"], plain["layer_0"]
    other, _ = plain_apply({"params": plain}, *inputs)
    assert float(jnp.max(jnp.abs(other - mlm))) > 1e-2


def test_plain_step_trains_in_bf16():
    """The jitted bf16 step (AdamW, hidden dropout) brings the loss of a fixed batch down."""
    batch = jax.tree.map(jnp.asarray, _batch(np.random.default_rng(1)))
    # one layer: the step's code is the same for every layer, and the layers themselves are
    # compared with bert-jax's above
    model = plain_flax.PlainBertForPreTraining(1, 32, 4, 64, vocab=97, max_positions=24,
                                               dropout=0.1)
    params = jax.jit(model.init)(jax.random.key(0), batch["input_ids"], batch["input_mask"],
                                 batch["segment_ids"], batch["masked_lm_positions"])["params"]
    assert jax.tree.leaves(params)[0].dtype == jnp.float32
    tx = optax.adamw(3e-3)
    step = jax.jit(plain_flax.make_train_step(model, tx, dropout=0.1))
    state = (params, tx.init(params))
    losses = []
    for i in range(30):
        state, metrics = step(state, batch, jax.random.key(i))
        losses.append(float(metrics["loss"]))
    assert math.isfinite(losses[0]) and abs(losses[0] - (math.log(97) + math.log(2))) < 0.5
    assert losses[-1] < 0.5 * losses[0]


def test_plain_benchmark_record(tmp_path):
    r = plain_flax.main(["--model", "tiny", "--seq-len", "32", "--batch-size", "8", "--steps",
                         "2", "--repeats", "1", "--warmup", "1", "--peak-size", "128",
                         "--layers", "1", "--vocab-size", "100", "--out", str(tmp_path)])
    assert r["framework"] == "plain-flax" and math.isfinite(r["loss"])
    assert (r["layers"], r["vocab_size"]) == (1, 100)
    assert r["flops_per_seq"] == train_flops_per_sequence(1, 128, 32, 100, 5)
    assert r["seq_per_s"] > 0 and r["mfu"] > 0 and "warning" not in r
