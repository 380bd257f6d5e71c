"""A plain, untuned Flax BERT pretraining step as a same-machine reference for bert-jax.

bf16 compute, cuDNN attention, the MLM head on the gathered masked positions, optax AdamW,
unrolled layers, nothing else: the step written the way a Flax user would write it from the
BERT paper (linen modules, ``jax.nn.dot_product_attention``), so that it runs on the same card
in the same process tree as ``bench step pretrain`` and ``bench peers transformers`` instead
of being compared with numbers from another machine:

* float32 parameters, bfloat16 activations (``dtype``), Flax ``LayerNorm`` and ``Dense``;
  embedding lookups in float32 (``nn.Embed``'s default; in bfloat16 their backward is a
  bfloat16 scatter-add, 2.6x slower on an H200), the sum's LayerNorm in bfloat16;
* attention through ``jax.nn.dot_product_attention`` (``implementation="cudnn"`` on GPUs,
  padding passed as key lengths), which has no attention dropout;
* the GELU as ``nn.gelu(approximate=False)`` (BERT's erf form), hidden dropout
  ``--hidden-dropout`` (default 0: the plain step trains without dropout);
* the decoder tied to the word embeddings (``Embed.attend``) with an output bias, the
  vocabulary unpadded (``--vocab-size``, default 30,522), MLM cross-entropy over the
  gathered positions in float32, NSP on the tanh pooler;
* ``optax.adamw`` (BERT's warmup + linear decay, weight decay 0.01), no clipping, no
  donation, ``jax.jit`` of the whole step on one device.

FLOPs, timing and MFU are counted exactly as for bert-jax (``bench.common``,
``bench.pretrain.time_steps`` / ``matmul_peak_tflops``). ``params_from_hf_state`` fills the
model from a Hugging Face ``BertForPreTraining`` state dict: ``tests/bench`` uses it to check
that this step computes the same function as bert-jax's model. Records go to OUT/peers.jsonl.

  python -m bench peers flax --model large --seq-len 512 --batch-size 32
"""

from __future__ import annotations

import argparse
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from bench.common import (
    MODELS,
    VOCAB,
    add_out_argument,
    masked_positions,
    results_file,
    train_flops_per_sequence,
    write_result,
)
from bench.pretrain import (
    environment,
    matmul_peak_tflops,
    peak_memory_gib,
    random_pretraining_batch,
    time_steps,
)

INIT = nn.initializers.normal(0.02)


def _dense(features: int, dtype, name: str) -> nn.Dense:
    return nn.Dense(features, dtype=dtype, kernel_init=INIT, name=name)


def _norm(dtype, name: str) -> nn.LayerNorm:
    return nn.LayerNorm(epsilon=1e-12, dtype=dtype, name=name)


class Layer(nn.Module):
    """One post-LayerNorm Transformer layer: self-attention, then the GELU MLP."""

    hidden: int
    heads: int
    intermediate: int
    dropout: float
    attention: str | None
    dtype: Any

    @nn.compact
    def __call__(self, x, lengths, deterministic: bool):
        b, t, _ = x.shape
        d = self.hidden // self.heads

        def split(name):
            return _dense(self.hidden, self.dtype, name)(x).reshape(b, t, self.heads, d)

        context = jax.nn.dot_product_attention(
            split("query"), split("key"), split("value"), key_value_seq_lengths=lengths,
            implementation=self.attention)
        out = _dense(self.hidden, self.dtype, "attention_output")(context.reshape(b, t, -1))
        out = nn.Dropout(self.dropout)(out, deterministic=deterministic)
        x = _norm(self.dtype, "attention_norm")(x + out)
        h = nn.gelu(_dense(self.intermediate, self.dtype, "intermediate")(x), approximate=False)
        h = nn.Dropout(self.dropout)(_dense(self.hidden, self.dtype, "output")(h),
                                     deterministic=deterministic)
        return _norm(self.dtype, "output_norm")(x + h)


class PlainBertForPreTraining(nn.Module):
    """BERT with its MLM head on the gathered masked positions and the NSP head."""

    layers: int
    hidden: int
    heads: int
    intermediate: int
    vocab: int = VOCAB
    max_positions: int = 512
    dropout: float = 0.0
    attention: str | None = None
    dtype: Any = jnp.bfloat16

    @nn.compact
    def __call__(self, input_ids, input_mask, segment_ids, masked_lm_positions,
                 deterministic: bool = True):
        # Lookups in the tables' float32 (nn.Embed's default dtype): a lookup in bfloat16
        # differentiates into a bfloat16 scatter-add, whose atomics serialize on GPUs (2.5x
        # slower steps at Base/128); the LayerNorm returns bfloat16.
        word = nn.Embed(self.vocab, self.hidden, embedding_init=INIT, name="word_embeddings")
        position = nn.Embed(self.max_positions, self.hidden, embedding_init=INIT,
                            name="position_embeddings")
        segment = nn.Embed(2, self.hidden, embedding_init=INIT, name="token_type_embeddings")
        x = (word(input_ids) + position(jnp.arange(input_ids.shape[1]))[None]
             + segment(segment_ids))
        x = _norm(self.dtype, "embeddings_norm")(x)
        x = nn.Dropout(self.dropout)(x, deterministic=deterministic)
        lengths = jnp.sum(input_mask, axis=-1).astype(jnp.int32)
        for i in range(self.layers):
            x = Layer(self.hidden, self.heads, self.intermediate, self.dropout, self.attention,
                      self.dtype, name=f"layer_{i}")(x, lengths, deterministic)
        pooled = jnp.tanh(_dense(self.hidden, self.dtype, "pooler")(x[:, 0]))
        nsp_logits = _dense(2, self.dtype, "nsp")(pooled)
        h = jnp.take_along_axis(x, masked_lm_positions[..., None], axis=1)
        h = nn.gelu(_dense(self.hidden, self.dtype, "transform")(h), approximate=False)
        h = _norm(self.dtype, "transform_norm")(h)
        bias = self.param("mlm_bias", nn.initializers.zeros, (self.vocab,), jnp.float32)
        table = word.embedding.astype(self.dtype)
        mlm_logits = (h @ table.T).astype(jnp.float32) + bias
        return mlm_logits, nsp_logits.astype(jnp.float32)


def pretraining_loss(model, params, batch, rng, deterministic: bool = False):
    """Mean MLM cross-entropy over the weighted predictions + mean NSP cross-entropy."""
    mlm_logits, nsp_logits = model.apply(
        {"params": params}, batch["input_ids"], batch["input_mask"], batch["segment_ids"],
        batch["masked_lm_positions"], deterministic=deterministic, rngs={"dropout": rng})
    weights = batch["masked_lm_weights"]
    mlm = optax.softmax_cross_entropy_with_integer_labels(mlm_logits, batch["masked_lm_ids"])
    mlm = jnp.sum(mlm * weights) / jnp.maximum(jnp.sum(weights), 1.0)
    nsp = optax.softmax_cross_entropy_with_integer_labels(
        nsp_logits, batch["next_sentence_labels"]).mean()
    return mlm + nsp


def make_optimizer(learning_rate: float = 1e-4, warmup: int = 1_000, total: int = 100_000):
    schedule = optax.join_schedules(
        [optax.linear_schedule(0.0, learning_rate, warmup),
         optax.linear_schedule(learning_rate, 0.0, total - warmup)], [warmup])
    return optax.adamw(schedule, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01)


def make_train_step(model, tx, dropout: float):
    """``(params, opt_state), batch, rng -> ((params, opt_state), loss)``, not yet jitted."""
    def step(state, batch, rng):
        params, opt_state = state
        loss, grads = jax.value_and_grad(
            lambda p: pretraining_loss(model, p, batch, rng, deterministic=dropout == 0.0))(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), {"loss": loss}

    return step


def params_from_hf_state(state: dict[str, np.ndarray], layers: int) -> dict[str, Any]:
    """This model's params from a Hugging Face ``BertForPreTraining`` state dict (numpy,
    ``bert.``/``cls.`` names; Linear weights are [out, in], Flax kernels [in, out])."""

    def dense(key):
        return {"kernel": np.asarray(state[f"{key}.weight"]).T,
                "bias": np.asarray(state[f"{key}.bias"])}

    def norm(key):
        return {"scale": np.asarray(state[f"{key}.weight"]),
                "bias": np.asarray(state[f"{key}.bias"])}

    e = "bert.embeddings"
    params: dict[str, Any] = {
        name: {"embedding": np.asarray(state[f"{e}.{name}.weight"])}
        for name in ("word_embeddings", "position_embeddings", "token_type_embeddings")}
    params["embeddings_norm"] = norm(f"{e}.LayerNorm")
    for i in range(layers):
        p = f"bert.encoder.layer.{i}"
        params[f"layer_{i}"] = {
            "query": dense(f"{p}.attention.self.query"),
            "key": dense(f"{p}.attention.self.key"),
            "value": dense(f"{p}.attention.self.value"),
            "attention_output": dense(f"{p}.attention.output.dense"),
            "attention_norm": norm(f"{p}.attention.output.LayerNorm"),
            "intermediate": dense(f"{p}.intermediate.dense"),
            "output": dense(f"{p}.output.dense"),
            "output_norm": norm(f"{p}.output.LayerNorm")}
    params["pooler"] = dense("bert.pooler.dense")
    params["nsp"] = dense("cls.seq_relationship")
    params["transform"] = dense("cls.predictions.transform.dense")
    params["transform_norm"] = norm("cls.predictions.transform.LayerNorm")
    params["mlm_bias"] = np.asarray(state["cls.predictions.bias"])
    return params


def attention_implementation(choice: str) -> str | None:
    """``auto``: cuDNN on GPUs, JAX's choice (XLA) elsewhere."""
    if choice == "auto":
        return "cudnn" if jax.default_backend() == "gpu" else None
    return None if choice == "xla" else choice


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench peers flax",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="base", choices=sorted(MODELS))
    ap.add_argument("--layers", type=int, default=0, help="encoder layers (0: the preset's)")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--steps", type=int, default=20, help="timed steps per repeat")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps (first compiles)")
    ap.add_argument("--vocab-size", type=int, default=VOCAB,
                    help="vocabulary size (default: BERT's uncased WordPiece, 30,522)")
    ap.add_argument("--hidden-dropout", type=float, default=0.0,
                    help="hidden dropout rate (the plain step has no attention dropout)")
    ap.add_argument("--attention", default="auto", choices=["auto", "cudnn", "xla"])
    ap.add_argument("--peak-size", type=int, default=0,
                    help="matmul size for the measured peak (0: 8192 on GPU/TPU, 1024 on CPU)")
    ap.add_argument("--tag", default="plain", help="free-form label stored in the record")
    add_out_argument(ap)
    args = ap.parse_args(argv)
    args.out = results_file(args.out, "peers")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    layers, hidden, heads, intermediate = MODELS[args.model]
    layers = args.layers or layers
    model = PlainBertForPreTraining(layers, hidden, heads, intermediate,
                                    vocab=args.vocab_size, dropout=args.hidden_dropout,
                                    attention=attention_implementation(args.attention))
    p = masked_positions(args.seq_len)
    host_rng = np.random.default_rng(0)
    batches = [jax.device_put(random_pretraining_batch(host_rng, args.batch_size, args.seq_len,
                                                       p, args.vocab_size))
               for _ in range(2)]
    first = batches[0]
    params = jax.jit(lambda key: model.init(
        key, first["input_ids"], first["input_mask"], first["segment_ids"],
        first["masked_lm_positions"])["params"])(jax.random.PRNGKey(0))
    tx = make_optimizer()
    state = (params, tx.init(params))
    step = jax.jit(make_train_step(model, tx, args.hidden_dropout))
    state, metrics, compile_s, median, times = time_steps(
        step, state, batches, jax.random.PRNGKey(1), args.steps, args.repeats, args.warmup)
    loss = float(jax.device_get(metrics["loss"]))
    peak_mem = peak_memory_gib()
    peak = matmul_peak_tflops(args.peak_size)
    seq_per_s = args.batch_size * args.steps / median
    flops = train_flops_per_sequence(layers, hidden, args.seq_len, args.vocab_size, p)
    record = {
        **environment(), "framework": "plain-flax", "task": "pretrain", "model": args.model,
        "seq_len": args.seq_len, "batch_size": args.batch_size, "predictions": p,
        "layers": layers, "vocab_size": args.vocab_size, "devices": 1, "attention": args.attention,
        "attention_dropout": 0.0,
        "hidden_dropout_rate": args.hidden_dropout, "tag": args.tag,
        "compile_and_first_step_s": compile_s, "step_time_s": median / args.steps,
        "seq_per_s": seq_per_s, "tokens_per_s": seq_per_s * args.seq_len,
        "flops_per_seq": flops, "tflops": seq_per_s * flops / 1e12,
        "matmul_peak_tflops": peak, "mfu": seq_per_s * flops / 1e12 / peak,
        "peak_memory_gib": peak_mem, "loss": loss, "repeat_times_s": times,
    }
    if not np.isfinite(loss):
        record["warning"] = "non-finite loss: the timing is not a valid step"
    write_result(args.out, record)
    return record


if __name__ == "__main__":
    main()
