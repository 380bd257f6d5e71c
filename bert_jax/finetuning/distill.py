"""Task-specific distillation (DistilBERT, Sanh et al. 2019, section 4): a fine-tuned teacher's
logits on the training set become soft labels for a smaller student.

``--config.distill_from=WORKDIR`` (a ``bert-jax finetune`` workdir of the same task) runs the
teacher once over the student's training features and stores its logits as the feature
``teacher_logits``; the student's loss is then

  classification: (1 - alpha) * CE(labels) + alpha * T^2 * KL(softmax(t / T) || softmax(s / T))
  regression:     (1 - alpha) * MSE(labels) + alpha * MSE(teacher prediction)

with ``alpha = distill_alpha`` and ``T = distill_temperature`` (Hinton et al. 2015); the
loss itself is ``trainer.distill_loss``.
"""

from __future__ import annotations

from collections.abc import Mapping

import ml_collections
import numpy as np

from bert_jax.checkpoint import store
from bert_jax.errors import BertJaxError
from bert_jax.finetuning.trainer import TEACHER_KEY, build_finetuner, model_outputs
from bert_jax.tasks.base import Task

KINDS = ("classification", "regression")


def check(config: ml_collections.ConfigDict, task: Task) -> None:
    if not config.get("distill_from"):
        return
    if task.kind not in KINDS:
        raise BertJaxError(f"--config.distill_from: task {task.name} is {task.kind}; "
                           f"distillation supports {KINDS}")
    if config.distill_temperature <= 0:
        raise BertJaxError(f"--config.distill_temperature={config.distill_temperature}: "
                           "must be > 0")
    if not 0.0 <= config.distill_alpha <= 1.0:
        raise BertJaxError(f"--config.distill_alpha={config.distill_alpha}: must be in [0, 1]")


def add_teacher_logits(config: ml_collections.ConfigDict, task: Task,
                       features: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``features`` plus the teacher's logits [rows, labels] float32."""
    directory, params_dir = store.resolve(config.distill_from)
    teacher_cfg, extra = store.read_config(directory)
    if extra.get("task") != task.name:
        raise BertJaxError(f"--config.distill_from={config.distill_from}: a "
                           f"{extra.get('task') or 'pretraining'} model, not a fine-tuned "
                           f"{task.name} model")
    teacher_cfg = teacher_cfg.replace(dtype=config.model.get("dtype") or teacher_cfg.dtype)
    finetuner = build_finetuner(task, config, teacher_cfg, None)
    params = finetuner.place_params(store.load_params(params_dir))
    logits = np.asarray(model_outputs(task.kind, finetuner.predict(params, features)),
                        np.float32)
    return {**features, TEACHER_KEY: logits.reshape(len(logits), -1)}
