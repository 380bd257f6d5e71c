"""Task-specific distillation (bert_jax.finetuning.distill): the loss by hand, and a student
fine-tuned on a teacher workdir's logits."""

from __future__ import annotations

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.errors import BertJaxError
from bert_jax.finetuning.config import load_config
from bert_jax.finetuning.finetune import finetune
from bert_jax.finetuning.trainer import distill_loss

FAST = ["--config.max_seq_length=32", "--config.log_every=0", "--config.eval_batch_size=32"]
# No dropout: a cheaper compile of each step; the teacher's logits and the distillation loss
# do not depend on it.
NO_DROPOUT = ["--config.model.hidden_dropout_prob=0.0",
              "--config.model.attention_probs_dropout_prob=0.0"]


def test_distill_loss_by_hand():
    logits = jnp.array([[2.0, 0.0]])
    teacher = jnp.array([[0.0, 2.0]])
    t, alpha = 2.0, 0.25
    q = np.exp([1.0, 0.0]) / np.exp([1.0, 0.0]).sum()
    p = np.exp([0.0, 1.0]) / np.exp([0.0, 1.0]).sum()
    hard = -np.log(np.exp(2.0) / (np.exp(2.0) + 1.0))
    soft = np.sum(p * np.log(p / q)) * t * t
    np.testing.assert_allclose(distill_loss("classification", logits, jnp.array([0]), teacher,
                                            t, alpha), [(1 - alpha) * hard + alpha * soft],
                               rtol=1e-6)
    np.testing.assert_allclose(distill_loss("regression", jnp.array([[1.0]]), jnp.array([3.0]),
                                            jnp.array([[2.0]]), t, 0.5), [0.5 * 4 + 0.5 * 1])


def test_student_learns_from_teacher_workdir(data, tmp_path):
    teacher = str(tmp_path / "teacher")
    taught = finetune(load_config("experiments/glue.py:sst2", [
        *FAST, *NO_DROPOUT, f"--config.init_checkpoint={data['ckpt']}",
        f"--config.data_dir={data['sst2']}", "--config.optimizer.learning_rate=3e-3",
        "--config.epochs=4"]), teacher)
    student = str(tmp_path / "student")
    result = finetune(load_config("experiments/glue.py:sst2", [
        *FAST, *NO_DROPOUT, f"--config.init_checkpoint={data['ckpt']}",
        f"--config.data_dir={data['sst2']}", "--config.optimizer.learning_rate=3e-3",
        "--config.epochs=3",
        f"--config.distill_from={teacher}", "--config.distill_alpha=0.9",
        "--config.distill_temperature=2"]), student)
    # chance is 0.5; the student learns the task from mostly soft labels
    assert result["best"]["value"] >= min(0.7, taught["best"]["value"] - 0.1)
    saved = json.load(open(os.path.join(student, "config.json")))
    assert saved["finetune"]["distill_from"] == teacher


def test_teacher_must_be_the_same_task(data, tmp_path):
    with pytest.raises(BertJaxError, match="not a fine-tuned sst2 model"):
        finetune(load_config("experiments/glue.py:sst2", [
            *FAST, f"--config.init_checkpoint={data['ckpt']}",
            f"--config.data_dir={data['sst2']}", f"--config.distill_from={data['ckpt']}"]),
            str(tmp_path / "s"))
