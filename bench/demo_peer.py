"""The demo's pretraining repeated by Hugging Face transformers on the same batches.

transformers (PyTorch, CPU) gets the same batches, model size and optimizer, and is scored on
the same held-out batches as bert-jax's model.

It answers whether a weak demo result is bert-jax's or the recipe's: a same-size
``BertForPreTraining`` trained on the batches the run's data pipeline yields (same seed, same
masks), AdamW with the run's learning rate, warmup, linear decay, weight decay, epsilon and
clipping (no weight decay on biases and LayerNorm), then held-out masked-LM accuracy and loss
at every masked position and at the ``[MASK]`` positions alone, for the transformers model and
for the run's last checkpoint.

Records go to OUT/quality.jsonl.

  bash scripts/demo.sh          # writes demo_workdir/pretrain
  python -m bench quality demo demo_workdir/pretrain
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from bench.common import add_out_argument, results_file, write_result


def _experiment(workdir: str):
    import ml_collections

    with open(os.path.join(workdir, "config.json"), encoding="utf-8") as f:
        return ml_collections.ConfigDict(json.load(f)["experiment"])


def _hf_model(torch, config, dropout: float, attention_dropout: float):
    from transformers import BertConfig as HFConfig
    from transformers import BertForPreTraining

    return BertForPreTraining(HFConfig(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        intermediate_size=config.intermediate_size, hidden_act=config.hidden_act,
        max_position_embeddings=config.max_position_embeddings,
        type_vocab_size=config.type_vocab_size, initializer_range=config.initializer_range,
        layer_norm_eps=config.layer_norm_eps, hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=attention_dropout))


def _tensors(torch, batch) -> dict:
    """A numpy batch as torch tensors (int64 ids, float weights)."""
    return {k: torch.as_tensor(np.array(v)) if k == "masked_lm_weights"
            else torch.as_tensor(np.array(v)).long() for k, v in batch.items()}


def train_peer(experiment, config, tokenizer, steps: int, seed: int = 0):
    """A transformers BertForPreTraining trained like the run; returns (model, seconds)."""
    import torch

    from bert_jax.training.inputs import make_batches

    torch.manual_seed(seed)
    model = _hf_model(torch, config, experiment.model.hidden_dropout_prob or 0.0,
                      experiment.model.attention_probs_dropout_prob or 0.0)
    opt_cfg = experiment.optimizer
    decay = [p for n, p in model.named_parameters() if "bias" not in n and "LayerNorm" not in n]
    rest = [p for n, p in model.named_parameters() if "bias" in n or "LayerNorm" in n]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": opt_cfg.weight_decay},
         {"params": rest, "weight_decay": 0.0}],
        lr=opt_cfg.learning_rate, betas=(opt_cfg.b1, opt_cfg.b2), eps=opt_cfg.eps)
    warmup, total = opt_cfg.warmup_steps, experiment.num_train_steps
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: s / warmup if s < warmup
                                                 else max(0.0, (total - s) / (total - warmup)))
    pair = experiment.objective in ("nsp", "sop")
    source = make_batches(experiment, "train", batch_size=experiment.global_batch_size,
                          vocab_size=config.vocab_size, process_index=0, process_count=1,
                          tokenizer=tokenizer)
    started = time.perf_counter()
    model.train()
    for _, batch in zip(range(steps), source, strict=False):
        t = _tensors(torch, batch)
        labels = torch.full_like(t["input_ids"], -100)
        keep = t["masked_lm_weights"] > 0
        rows = torch.arange(labels.shape[0])[:, None].expand_as(t["masked_lm_positions"])
        labels[rows[keep], t["masked_lm_positions"][keep]] = t["masked_lm_ids"][keep]
        out = model(input_ids=t["input_ids"], attention_mask=t["input_mask"],
                    token_type_ids=t["segment_ids"], labels=labels,
                    next_sentence_label=t["next_sentence_labels"] if pair else None)
        loss = out.loss if pair else torch.nn.functional.cross_entropy(
            out.prediction_logits.reshape(-1, config.vocab_size), labels.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        if opt_cfg.clip_norm:
            torch.nn.utils.clip_grad_norm_(model.parameters(), opt_cfg.clip_norm)
        optimizer.step()
        schedule.step()
    model.eval()
    return model, time.perf_counter() - started


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m bench quality demo",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("workdir", help="a pretraining workdir (scripts/demo.sh: "
                                    "DEMO_DIR/pretrain)")
    ap.add_argument("--steps", type=int, default=None,
                    help="training steps of the transformers model (default: the run's)")
    add_out_argument(ap)
    args = ap.parse_args(argv)

    from bert_jax.cli import QUIET_ENVIRONMENT
    from bert_jax.tpu.topologies import quiet_libtpu_without_tpus

    for key, value in QUIET_ENVIRONMENT.items():  # as the bert-jax command does
        os.environ.setdefault(key, value)
    quiet_libtpu_without_tpus()
    import jax
    import torch

    from bert_jax.tokenization import load_tokenizer
    from bert_jax.training.heldout import checkpoint_logits, eval_batches, masked_lm_scores

    experiment = _experiment(args.workdir)
    tokenizer = load_tokenizer(os.path.join(args.workdir, "tokenizer"))
    logits_fn, config = checkpoint_logits(args.workdir)
    steps = args.steps or experiment.num_train_steps
    evals = eval_batches(experiment, config.vocab_size, tokenizer)
    bert_jax = masked_lm_scores(logits_fn, evals, tokenizer.mask_id, config.vocab_size)

    peer, seconds = train_peer(experiment, config, tokenizer, steps)

    def peer_logits(batch):
        t = _tensors(torch, batch)
        with torch.no_grad():
            logits = peer(input_ids=t["input_ids"], attention_mask=t["input_mask"],
                          token_type_ids=t["segment_ids"]).prediction_logits.numpy()
        return np.take_along_axis(logits, batch["masked_lm_positions"][..., None], axis=1)

    transformers = masked_lm_scores(peer_logits, evals, tokenizer.mask_id,
                                    config.vocab_size)
    import transformers as hf

    record = {
        "suite": "quality", "mode": "demo", "workdir": os.path.abspath(args.workdir),
        "steps": steps, "bert_jax_steps": experiment.num_train_steps,
        "batch": experiment.global_batch_size, "seq_len": experiment.data.max_seq_length,
        "objective": experiment.objective, "bert_jax": bert_jax,
        "transformers": transformers, "transformers_train_s": round(seconds, 1),
        "versions": {"torch": torch.__version__, "transformers": hf.__version__,
                     "jax": jax.__version__}}
    write_result(results_file(args.out, "quality"), record)
    return record
