"""Sequence packing: effective (non-padding) tokens per second of the pretraining step (MLM +
NSP) and the sequence-classification fine-tuning step, packed against unpacked rows, on real
example lengths, with the padding fraction of each.

Pretraining examples are BERT's NSP instances (``bert_jax.data.instances``, ``nsp`` mode with
``--short-seq-prob``) of the ``--corpus`` text; fine-tuning examples are the train splits of
``--glue-tasks`` under ``--glue``. Both are tokenized here (numpy and the bert-jax tokenizer,
no tensorflow): with ``--tokenizer`` (a vocab.txt or a tokenizer folder), else a WordPiece
vocabulary of ``--vocab-size`` learned from the corpus. Unpacked rows hold one example each,
right-padded to the sequence length; packed rows hold up to ``--max-examples-per-row``
examples (``bert_jax.data.packing``, best-fit decreasing). The steps are the engine's
(``training.steps.make_train_step``, ``finetuning.trainer.make_train_step``), timed on
``--batches`` distinct batches cycled, and a record per (step, sequence length, packed) goes
to OUT/packing.jsonl: ``effective_tokens_per_s`` = real tokens of the timed batches per
second, ``padding_fraction`` over the whole example set.

  python -m bench packing --corpus CORPUS.txt --glue GLUE_DIR --out bench_out
"""

from __future__ import annotations

import argparse
import os
import random
import time

import numpy as np

from bench.common import (
    add_out_argument,
    environment,
    masked_positions,
    results_file,
    write_result,
)
from bench.pretrain import time_steps


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench packing",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", required=True,
                    help="plain-text corpus file (or folder) for the pretraining examples")
    ap.add_argument("--glue", required=True, help="GLUE root folder (<TASK>/train.tsv)")
    ap.add_argument("--glue-tasks", default="sst2,mrpc",
                    help="comma-separated GLUE tasks whose train splits are fine-tuned "
                         "(default: sst2,mrpc)")
    ap.add_argument("--tokenizer", default="",
                    help="vocab.txt or tokenizer folder; default: learn a WordPiece "
                         "vocabulary from the corpus")
    ap.add_argument("--vocab-size", type=int, default=8192,
                    help="size of the learned vocabulary (without --tokenizer)")
    ap.add_argument("--corpus-mb", type=float, default=8.0,
                    help="read at most this many MB of the corpus (default 8)")
    ap.add_argument("--model", default="base", help="model preset (default base)")
    ap.add_argument("--layers", type=int, default=0,
                    help="override the preset's layer count (0: keep)")
    ap.add_argument("--hidden", type=int, default=0,
                    help="override the preset's hidden size (0: keep; 4x for the MLP, "
                         "64 per head)")
    ap.add_argument("--seq-lens", default="128,512", help="sequence lengths (default 128,512)")
    ap.add_argument("--batch-size", type=int, default=32, help="rows per step (default 32)")
    ap.add_argument("--max-examples-per-row", type=int, default=0,
                    help="examples a packed row may hold (default 0: sequence length / 8, "
                         "16 at 128 and 64 at 512)")
    ap.add_argument("--short-seq-prob", type=float, default=0.1,
                    help="BERT's chance of a shorter NSP target length (default 0.1)")
    ap.add_argument("--max-examples", type=int, default=20000,
                    help="examples kept per example set (default 20000)")
    ap.add_argument("--devices", type=int, default=0,
                    help="data-parallel devices (default 0: all)")
    ap.add_argument("--batches", type=int, default=8, help="distinct batches timed (default 8)")
    ap.add_argument("--steps", type=int, default=20, help="steps per timed run (default 20)")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs (median, default 3)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps (default 2)")
    ap.add_argument("--dtype", default="bfloat16", help="compute dtype (default bfloat16)")
    ap.add_argument("--dropout", type=float, default=0.1,
                    help="hidden and attention dropout (default 0.1)")
    ap.add_argument("--dropout-impl", default="auto",
                    help="model.kernels.dropout_attention_impl (auto: flash on GPU, explicit "
                         "on CPU)")
    add_out_argument(ap)
    return ap.parse_args(argv)


# ---- examples --------------------------------------------------------------------------------
def load_tokenizer(args):
    from bert_jax.data.text import list_input_files
    from bert_jax.tokenization.factory import load_tokenizer as load
    from bert_jax.tokenization.wordpiece_trainer import train_wordpiece

    if args.tokenizer:
        return load(args.tokenizer)
    files, size = [], 0
    for path in list_input_files([args.corpus]):  # the files the examples come from
        if size >= args.corpus_mb * 1e6:
            break
        files.append(path)
        size += os.path.getsize(path)
    return train_wordpiece(files, args.vocab_size)[0]


def corpus_documents(args, tokenizer) -> list[list[list[int]]]:
    """Tokenized documents (lists of sentences of ids) of the first ``--corpus-mb`` MB."""
    from bert_jax.data.text import detect_format, list_input_files, split_documents

    budget = int(args.corpus_mb * 1e6)
    documents = []
    for path in list_input_files([args.corpus]):
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read(budget)
        budget -= len(text)
        for doc in split_documents(text, detect_format(text)):
            ids = [s for s in tokenizer.encode_batch(doc) if s]
            if ids:
                documents.append(ids)
        if budget <= 0:
            break
    return documents


def pretraining_examples(documents, tokenizer, seq_len: int, args):
    """NSP instances (ids, segments, label) at ``seq_len``, BERT's recipe."""
    import collections

    from bert_jax.data.instances import create_examples

    examples = create_examples(documents, "nsp", seq_len, args.short_seq_prob, 1,
                               random.Random(12345), tokenizer.cls_id, tokenizer.sep_id,
                               collections.Counter())
    return examples[:args.max_examples]


def pretraining_features(examples, seq_len: int, pad_id: int) -> dict[str, np.ndarray]:
    from bert_jax.tasks.base import pad_rows

    ids = pad_rows([e[0] for e in examples], seq_len, pad_id)
    return {"input_ids": ids,
            "input_mask": pad_rows([[1] * len(e[0]) for e in examples], seq_len, 0),
            "segment_ids": pad_rows([e[1] for e in examples], seq_len, 0),
            "next_sentence_labels": np.array([e[2] for e in examples], np.int32)}


def add_masks(batch: dict[str, np.ndarray], predictions: int, special_ids, rng
              ) -> dict[str, np.ndarray]:
    """15% of each row's real non-special tokens (at most ``predictions``) as MLM targets."""
    ids, mask = batch["input_ids"], batch["input_mask"]
    candidates = (mask > 0) & ~np.isin(ids, list(special_ids))
    rows = len(ids)
    positions = np.zeros((rows, predictions), np.int32)
    weights = np.zeros((rows, predictions), np.float32)
    for r in range(rows):
        where = np.flatnonzero(candidates[r])
        n = min(predictions, max(1, round(0.15 * mask[r].sum())), len(where))
        positions[r, :n] = np.sort(rng.choice(where, n, replace=False))
        weights[r, :n] = 1.0
    return {**batch, "masked_lm_positions": positions,
            "masked_lm_ids": np.take_along_axis(ids, positions, 1).astype(np.int32),
            "masked_lm_weights": weights}


def glue_features(args, tokenizer, seq_len: int) -> list[tuple[str, str, int, dict]]:
    """(task, kind, labels, features of its train split) per ``--glue-tasks``."""
    from bert_jax.tasks.registry import get_task

    out = []
    for name in [t for t in args.glue_tasks.split(",") if t]:
        task = get_task(name)
        examples = task.read("train", data_dir=args.glue)[:args.max_examples]
        feats = task.featurize(examples, tokenizer, seq_len)
        out.append((name, task.kind, task.num_labels, feats))
    return out


# ---- batches ---------------------------------------------------------------------------------
def packed_or_not(feats: dict[str, np.ndarray], seq_len: int, k: int, packed: bool,
                  per_example: tuple[str, ...]) -> dict[str, np.ndarray]:
    """The example set as rows: one example a row, or packed (``data/packing.py``)."""
    from bert_jax.data import packing

    if not packed:
        return dict(feats)
    lengths = feats["input_mask"].sum(axis=1)
    rows = packing.pack_lengths(lengths, seq_len, k, seed=0)
    return packing.pack_features(feats, rows, k, per_example)


def take_batches(rows: dict[str, np.ndarray], batch_size: int, count: int, keys,
                 rng) -> list[dict[str, np.ndarray]]:
    """``count`` batches of distinct random rows (fewer if the set is small)."""
    n = len(rows["input_ids"])
    order = rng.permutation(n)
    count = max(1, min(count, n // batch_size))
    if n < batch_size:
        order = np.resize(order, batch_size)
    return [{k: rows[k][order[i * batch_size:(i + 1) * batch_size]] for k in keys}
            for i in range(count)]


# ---- steps -----------------------------------------------------------------------------------
def model_config(args, vocab_size: int):
    from bert_jax.config import KernelOptions, get_preset

    sizes = {}
    if args.layers:
        sizes["num_hidden_layers"] = args.layers
    if args.hidden:
        sizes.update(hidden_size=args.hidden, intermediate_size=4 * args.hidden,
                     num_attention_heads=max(1, args.hidden // 64))
    return get_preset(args.model, vocab_size=vocab_size, dtype=args.dtype, **sizes,
                      param_dtype="float32", hidden_dropout_prob=args.dropout,
                      attention_probs_dropout_prob=args.dropout,
                      kernels=KernelOptions(dropout_attention_impl=args.dropout_impl))


def _optimizer():
    import ml_collections

    from bert_jax.runs.optimizers import make_optimizer

    return make_optimizer(ml_collections.ConfigDict({
        "name": "adamw", "learning_rate": 1e-4, "warmup_steps": 100, "decay": "linear",
        "decay_steps": 10_000, "end_learning_rate": 0.0, "power": 1.0, "b1": 0.9,
        "b2": 0.999, "eps": 1e-6, "weight_decay": 0.01, "clip_norm": 1.0}))


def time_step(make_step, model, seq_len: int, batches, args, mesh, rules):
    """(compile + first step s, median s per step, last metrics) of ``make_step(model, tx,
    schedule)`` over ``batches``."""
    import jax
    import jax.numpy as jnp

    from bert_jax import parallel
    from bert_jax.runs.state import TrainState

    tx, schedule = _optimizer()

    def init_fn(rng):
        ids = jnp.zeros((1, seq_len), jnp.int32)
        params = model.init({"params": rng}, ids, jnp.ones_like(ids), ids)["params"]
        return TrainState.create(params, tx.init(params))

    _, shardings = parallel.abstract_and_shardings(init_fn, mesh, rules, jax.random.PRNGKey(0))
    state = parallel.sharded_init(init_fn, shardings, jax.random.PRNGKey(0))
    replicated = parallel.replicated(mesh)
    step = jax.jit(parallel.traced_in_mesh(make_step(model, tx, schedule), mesh, rules),
                   out_shardings=(shardings, replicated), donate_argnums=0)
    placed = [parallel.global_batch(b, mesh, rules) for b in batches]
    rng = jax.device_put(jax.random.PRNGKey(1), replicated)
    _, metrics, first, median, _ = time_steps(step, state, placed, rng, args.steps,
                                              args.repeats, args.warmup)
    return first, median / args.steps, jax.device_get(metrics)


def record_run(args, base: dict, make_step, model, seq_len, rows, keys, lengths, rng, mesh,
               rules, finite_key) -> dict:
    from bert_jax.data.packing import padding_fraction

    batches = take_batches(rows, args.batch_size, args.batches, keys, rng)
    real_tokens = float(np.mean([b["input_mask"].sum() for b in batches]))
    record = {**base, "rows": len(rows["input_ids"]), "examples": len(lengths),
              "padding_fraction": padding_fraction(lengths, len(rows["input_ids"]), seq_len),
              "batch_padding_fraction": 1 - real_tokens / (args.batch_size * seq_len)}
    try:
        first, step_s, metrics = time_step(make_step, model, seq_len, batches, args, mesh,
                                           rules)
    except Exception as e:  # noqa: BLE001 - recorded, the sweep goes on
        record["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        write_result(args.out, record)
        return record
    record.update(compile_and_first_step_s=first, step_time_s=step_s,
                  rows_per_s=args.batch_size / step_s,
                  effective_tokens_per_s=real_tokens / step_s,
                  loss=float(finite_key(metrics)))
    write_result(args.out, record)
    return record


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    args.out = results_file(args.out, "packing")
    from bert_jax import parallel
    from bert_jax.finetuning import trainer
    from bert_jax.modeling.heads import BertForPreTraining, BertForSequenceClassification
    from bert_jax.training import steps

    t0 = time.perf_counter()
    tokenizer = load_tokenizer(args)
    documents = corpus_documents(args, tokenizer)
    print(f"tokenizer ({tokenizer.vocab_size} ids) and {len(documents)} documents in "
          f"{time.perf_counter() - t0:.0f} s", flush=True)
    import jax

    devices = jax.devices()[:args.devices] if args.devices else jax.devices()
    mesh = parallel.create_mesh({"data": -1, "fsdp": 1, "tensor": 1}, devices=devices)
    rules = parallel.DEFAULT_RULES
    env = environment()
    records = []
    for seq_len in [int(s) for s in args.seq_lens.split(",")]:
        k = args.max_examples_per_row or max(1, seq_len // 8)
        cfg = model_config(args, tokenizer.vocab_size)
        base = {**env, "suite": "packing", "model": args.model, "seq_len": seq_len,
                "batch_size": args.batch_size, "max_examples_per_row": k,
                "dtype": args.dtype, "dropout": args.dropout, "dropout_impl": args.dropout_impl}
        feats = pretraining_features(pretraining_examples(documents, tokenizer, seq_len, args),
                                     seq_len, tokenizer.pad_id)
        lengths = feats["input_mask"].sum(axis=1)
        predictions = masked_positions(seq_len)
        for packed in (False, True):
            rows = packed_or_not(feats, seq_len, k, packed, ("next_sentence_labels",))
            if packed:
                rows["next_sentence_weights"] = rows["example_slots"]
            rng = np.random.default_rng(0)
            rows = add_masks(rows, predictions, tokenizer.special_ids, rng)
            keys = [key for key in ("input_ids", "input_mask", "segment_ids",
                                    "masked_lm_positions", "masked_lm_ids",
                                    "masked_lm_weights", "next_sentence_labels",
                                    "next_sentence_weights", "example_ids", "position_ids",
                                    "cls_positions") if key in rows]
            records.append(record_run(
                args, {**base, "step": "pretrain", "data": "corpus", "packed": packed},
                lambda model, tx, schedule: steps.make_train_step(model, tx, schedule),
                BertForPreTraining(cfg), seq_len, rows, keys, lengths, rng, mesh, rules,
                lambda m: m["loss"]))
        for name, kind, num_labels, feats in glue_features(args, tokenizer, seq_len):
            label_key = "labels" if kind == "regression" else "label_ids"
            lengths = feats["input_mask"].sum(axis=1)
            model = BertForSequenceClassification(cfg, num_labels)
            for packed in (False, True):
                rows = packed_or_not(feats, seq_len, k, packed, (label_key,))
                rows[trainer.WEIGHT_KEY] = rows.pop(
                    "example_slots", np.ones(len(rows["input_ids"]), np.float32))
                keys = [key for key in ("input_ids", "input_mask", "segment_ids", label_key,
                                        trainer.WEIGHT_KEY, "example_ids", "position_ids",
                                        "cls_positions") if key in rows]
                records.append(record_run(
                    args, {**base, "step": "finetune", "data": name, "packed": packed},
                    lambda model, tx, schedule, kind=kind: trainer.make_train_step(
                        model, tx, kind),
                    model, seq_len, rows, keys, lengths, np.random.default_rng(0), mesh,
                    rules, lambda m: m["loss_sum"] / max(float(m["count"]), 1.0)))
    return records


if __name__ == "__main__":
    main()
