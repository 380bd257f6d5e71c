"""The fine-tuning peer: Hugging Face transformers (PyTorch) on exactly the run bert-jax does.

Given a bert-jax fine-tuning run config (JSON, written by ``python -m bench quality
finetune``) and a Hugging Face checkpoint directory, it reads the same examples with
``bert_jax.tasks``, holds out the same dev split, featurizes with the same tokenizer (the
checkpoint's vocab.txt), and
trains ``AutoModelFor{SequenceClassification,TokenClassification,QuestionAnswering,
MultipleChoice}`` with the same hyperparameters: AdamW (no decay on biases and LayerNorm),
linear warmup then decay, gradient clipping, dropout, batch size, epochs and the same
per-epoch example order. bf16 autocast, SDPA attention, torch.compile. Metrics come from
``bert_jax.tasks`` on the same examples.

  python -m bench quality peer --config-json RUN.json --checkpoint HF_DIR --out peer.json
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # bert_jax is used for data only; GPU is torch's

import argparse
import json
import sys
import time

import numpy as np

from bert_jax.checkpoint.hf import read_hf_tokenizer
from bert_jax.finetuning.config import config_from_dict
from bert_jax.finetuning.inputs import featurize, train_and_dev
from bert_jax.finetuning.trainer import model_outputs
from bert_jax.tasks.registry import get_task

NO_DECAY = ("bias", "LayerNorm.weight")


def build_model(task, checkpoint: str, config):
    import torch
    import transformers as T

    # float32 master weights whatever the checkpoint's dtype (transformers 5 loads a bf16
    # checkpoint as bf16 parameters by default); bf16 comes from autocast, as for bert-jax.
    kwargs = {"hidden_dropout_prob": config.model.hidden_dropout_prob,
              "attention_probs_dropout_prob": config.model.attention_probs_dropout_prob,
              "attn_implementation": "sdpa", "dtype": torch.float32}
    if task.kind == "classification":
        return T.AutoModelForSequenceClassification.from_pretrained(
            checkpoint, num_labels=task.num_labels, **kwargs)
    if task.kind == "regression":
        return T.AutoModelForSequenceClassification.from_pretrained(
            checkpoint, num_labels=1, problem_type="regression", **kwargs)
    if task.kind == "token_classification":
        return T.AutoModelForTokenClassification.from_pretrained(
            checkpoint, num_labels=task.num_labels, **kwargs)
    if task.kind == "span":
        return T.AutoModelForQuestionAnswering.from_pretrained(checkpoint, **kwargs)
    return T.AutoModelForMultipleChoice.from_pretrained(checkpoint, **kwargs)


def torch_batch(torch, features, index, kind, device, with_labels: bool):
    batch = {"input_ids": features["input_ids"][index],
             "attention_mask": features["input_mask"][index],
             "token_type_ids": features["segment_ids"][index]}
    out = {k: torch.from_numpy(np.ascontiguousarray(v)).long().to(device, non_blocking=True)
           for k, v in batch.items()}
    if with_labels:
        if kind == "span":
            for key in ("start_positions", "end_positions"):
                out[key] = torch.from_numpy(features[key][index]).long().to(device)
        elif kind == "regression":
            out["labels"] = torch.from_numpy(features["labels"][index]).float().to(device)
        else:
            out["labels"] = torch.from_numpy(features["label_ids"][index]).long().to(device)
    return out


def load_head_init(torch, model, path: str) -> list[str]:
    """Experiment: overwrite the freshly initialised head with bert-jax's (an .npz of
    ``<module>/kernel`` and ``<module>/bias`` written by quality_finetune --share-head-init);
    returns the module names set."""
    arrays = np.load(path)
    names = sorted({key.split("/")[0] for key in arrays.files})
    with torch.no_grad():
        for name in names:
            layer = getattr(model, name)
            layer.weight.copy_(torch.from_numpy(arrays[f"{name}/kernel"].T.copy()))
            layer.bias.copy_(torch.from_numpy(arrays[f"{name}/bias"]))
    return names


def run(config, checkpoint: str, device_name: str | None, compile_model: bool,
        train_pad_embedding: bool = False, head_init: str | None = None,
        save_dir: str | None = None) -> dict:
    import torch
    import transformers as T

    device = torch.device(device_name or ("cuda" if torch.cuda.is_available() else "cpu"))
    cuda = device.type == "cuda"
    torch.manual_seed(config.seed)
    task = get_task(config.task)
    tokenizer = read_hf_tokenizer(checkpoint)
    train, devs, source = train_and_dev(task, config)
    dev_split, dev = next(iter(devs.items()))
    train_f = featurize(task, train, tokenizer, config)
    dev_f = featurize(task, dev, tokenizer, config)

    model = build_model(task, checkpoint, config)
    if head_init:
        print(f"head initialised from {head_init}: {load_head_init(torch, model, head_init)}")
    model = model.to(device)
    if train_pad_embedding:  # experiment: the [PAD] row gets gradients, as in bert-jax
        model.get_input_embeddings().padding_idx = None
    groups = [
        {"params": [p for n, p in model.named_parameters() if not n.endswith(NO_DECAY)],
         "weight_decay": config.optimizer.weight_decay},
        {"params": [p for n, p in model.named_parameters() if n.endswith(NO_DECAY)],
         "weight_decay": 0.0}]
    opt = config.optimizer
    optimizer = torch.optim.AdamW(groups, lr=opt.learning_rate, betas=(opt.b1, opt.b2),
                                  eps=opt.eps,
                                  fused=cuda)
    n = len(train_f["input_ids"])
    steps_per_epoch = -(-n // config.global_batch_size)
    total = steps_per_epoch * config.epochs
    scheduler = T.get_linear_schedule_with_warmup(
        optimizer, int(config.optimizer.warmup_proportion * total), total)
    # dynamic=False: the short last batch of an epoch (and evaluation) gets its own static
    # graph instead of switching every later step to a dynamic-shape graph.
    step_model = torch.compile(model, dynamic=False) if compile_model else model
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda)
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    train_seconds = steady_seconds = steady_sequences = 0.0
    losses, epoch_seconds = [], []
    for epoch in range(config.epochs):
        model.train()
        order = np.random.default_rng([config.seed, epoch]).permutation(n)
        t0 = time.perf_counter()
        first = 0.0
        loss_sum = torch.zeros((), device=device)
        for i in range(steps_per_epoch):
            index = order[i * config.global_batch_size:(i + 1) * config.global_batch_size]
            batch = torch_batch(torch, train_f, index, task.kind, device, True)
            with autocast:
                loss = step_model(**batch).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.optimizer.clip_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            loss_sum += loss.detach() * len(index)
            if i == 0:
                sync()
                first = time.perf_counter() - t0
        sync()
        seconds = time.perf_counter() - t0
        train_seconds += seconds
        epoch_seconds.append(seconds)
        steady_seconds += seconds - first
        steady_sequences += n * (1 - 1 / steps_per_epoch)
        losses.append(float(loss_sum) / n)
        print(f"[transformers] {task.name} epoch {epoch + 1}: loss {losses[-1]:.4f} "
              f"({seconds:.1f}s)", flush=True)

    model.eval()
    outputs: dict[str, list] = {}
    with torch.no_grad(), autocast:
        for start in range(0, len(dev_f["input_ids"]), config.eval_batch_size):
            index = np.arange(start, min(start + config.eval_batch_size,
                                         len(dev_f["input_ids"])))
            out = step_model(**torch_batch(torch, dev_f, index, task.kind, device, False))
            keys = ("start_logits", "end_logits") if task.kind == "span" else ("logits",)
            for k in keys:
                outputs.setdefault(k, []).append(out[k].float().cpu().numpy())
    outputs = {k: np.concatenate(v) for k, v in outputs.items()}
    predictions = task.postprocess(dev_f, model_outputs(task.kind, outputs), dev,
                                   **config.postprocess)
    metrics = task.metrics(predictions, dev)
    if save_dir:
        model.save_pretrained(save_dir)
    return {"framework": "transformers", "task": task.name, "dev_source": source,
            "train_examples": len(train), "dev_examples": len(dev), "train_sequences": n,
            "metrics": {dev_split: metrics}, "train_losses": losses,
            "train_seconds": train_seconds,
            "train_sequences_per_second": (steady_sequences / steady_seconds
                                           if steady_seconds > 0 else None),
            "epoch_seconds": epoch_seconds,
            "device": torch.cuda.get_device_name() if cuda else "cpu",
            "torch": torch.__version__, "transformers": T.__version__,
            "compiled": compile_model, "train_pad_embedding": train_pad_embedding}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench quality peer",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--config-json", required=True, help="bert-jax fine-tuning run config")
    ap.add_argument("--checkpoint", required=True, help="Hugging Face model directory")
    ap.add_argument("--out", required=True, help="result JSON file")
    ap.add_argument("--device", help="cuda or cpu (default: cuda when available)")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--train-pad-embedding", action="store_true",
                    help="experiment: no padding_idx, the [PAD] embedding row is trained (as "
                    "in bert-jax and Google's BERT)")
    ap.add_argument("--head-init", help="experiment: .npz of bert-jax's initial head")
    ap.add_argument("--save-dir", help="save the fine-tuned model here (save_pretrained)")
    args = ap.parse_args(argv)
    with open(args.config_json, encoding="utf-8") as f:
        config = config_from_dict(json.load(f))
    record = run(config, args.checkpoint, args.device, not args.no_compile,
                 args.train_pad_embedding, args.head_init, args.save_dir)
    record["head_init"] = "bert-jax" if args.head_init else "transformers"
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=2)
    print(json.dumps({k: record[k] for k in ("task", "metrics", "train_seconds",
                                            "train_sequences_per_second")}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
