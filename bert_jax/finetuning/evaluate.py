"""Scoring and predicting with a fine-tuned workdir (``bert-jax evaluate | predict``).

The workdir's stored run config rebuilds the same splits (a held-out dev split is drawn again
exactly as in training) and the same Finetuner; ``--config.key=value`` overrides change data
locations or batch sizes.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import jax

from bert_jax import storage
from bert_jax.checkpoint import store
from bert_jax.errors import BertJaxError
from bert_jax.finetuning.config import apply_overrides, config_from_dict
from bert_jax.finetuning.inputs import eval_split_examples, featurize, has_dev_files
from bert_jax.finetuning.trainer import Finetuner, build_finetuner, model_outputs
from bert_jax.modeling.params import to_layout
from bert_jax.tasks.base import Task
from bert_jax.tasks.registry import get_task


def score(finetuner: Finetuner, params, task: Task, examples, features, config
          ) -> tuple[dict[str, float], Any]:
    """(metrics, predictions) of ``params`` on labelled examples."""
    outputs = finetuner.predict(params, features)
    predictions = task.postprocess(features, model_outputs(task.kind, outputs), examples,
                                   **config.postprocess)
    return task.metrics(predictions, examples), predictions


def load_finetuned(workdir: str, overrides: Sequence[str] = ()):
    """(task, run config, tokenizer, finetuner, sharded params) of a workdir."""
    params, model_cfg, tokenizer, extra = store.load_model(workdir)
    if "task" not in extra or "finetune" not in extra:
        raise BertJaxError(f"{workdir}: not a fine-tuned workdir (config.json has no task; "
                           "run `bert-jax finetune` first)")
    config = config_from_dict(extra["finetune"],
                              source=os.path.join(workdir, store.CONFIG_FILE))
    apply_overrides(config, overrides)
    if tokenizer is None:
        raise BertJaxError(f"{workdir}: no tokenizer/ directory")
    task = get_task(extra["task"], config)
    finetuner = build_finetuner(task, config, model_cfg, None)
    params = finetuner.place_params(to_layout(params, model_cfg))
    return task, config, tokenizer, finetuner, params


def evaluate(workdir: str, split: str = "dev", overrides: Sequence[str] = ()
             ) -> dict[str, Any]:
    task, config, tokenizer, finetuner, params = load_finetuned(workdir, overrides)
    splits = task.eval_splits if split == "dev" and task.eval_splits and \
        has_dev_files(task, config) else (split,)
    out = {}
    for s in splits:
        examples = eval_split_examples(task, config, s)
        out[s] = score(finetuner, params, task, examples, featurize(task, examples, tokenizer,
                                                                    config), config)[0]
    return {"task": task.name, "workdir": workdir, **out}


def _predict_splits(task: Task, split: str) -> tuple[str, ...]:
    if split == "test" and "test" not in task.splits:
        return tuple(s for s in task.splits if s.startswith("test"))  # MNLI: matched, mism.
    return (split,)


def predict(workdir: str, split: str, output_dir: str, overrides: Sequence[str] = (),
            ax_file: str | None = None) -> list[str]:
    """Writes the task's prediction files for ``split`` (MNLI test: both test sets, and AX
    when its file is found or given); returns the paths."""
    task, config, tokenizer, finetuner, params = load_finetuned(workdir, overrides)
    jobs = [(task, s, eval_split_examples(task, config, s))
            for s in _predict_splits(task, split)]
    if task.name == "mnli" and split == "test":
        ax = get_task("ax")
        roots = [d for d in (config.data_dir, config.data_dir and storage.dirname(
            storage.abspath(config.data_dir))) if d]
        for root in ([None] if ax_file else roots):
            try:
                jobs.append((ax, "test", ax.read("test", data_dir=root, files=ax_file)))
                break
            except BertJaxError as e:
                if ax_file:
                    raise
                if jax.process_index() == 0:
                    print(f"AX diagnostic not predicted: {e}", flush=True)
    paths = []
    for job_task, s, examples in jobs:
        feats = featurize(job_task, examples, tokenizer, config)
        outputs = finetuner.predict(params, feats)
        preds = job_task.postprocess(feats, model_outputs(job_task.kind, outputs), examples,
                                     **config.postprocess)
        if jax.process_index() == 0:
            paths += job_task.write_predictions(preds, examples, output_dir, s)
    return paths
