"""What a checkpoint fine-tuned here exports as: its task's kind and label names, read from
the run config it stored (``bert-jax export``)."""

from __future__ import annotations

from typing import Any

from bert_jax.checkpoint.convert import converted_task
from bert_jax.errors import BertJaxError
from bert_jax.finetuning.config import config_from_dict
from bert_jax.tasks.registry import get_task


def checkpoint_task(extra: dict[str, Any], source: str
                    ) -> tuple[str | None, tuple[str, ...]]:
    """(task kind, label names) of a bert-jax checkpoint from its config.json: a fine-tuning
    workdir's task, or the Hugging Face class a converted checkpoint came from; (None, ())
    where it records neither. A head on combined hidden states (feature_layers other than
    ``last``, or a BiLSTM) is refused: no Hugging Face class computes it."""
    if "task" in extra and isinstance(extra.get("finetune"), dict):
        run = config_from_dict(extra["finetune"], source=source)
        layers, head = run.get("feature_layers", "last"), run.get("feature_head", "linear")
        if (layers, head) != ("last", "linear"):
            raise BertJaxError(f"{source}: fine-tuned with feature_layers={layers!r}, "
                               f"feature_head={head!r}; no Hugging Face class computes that "
                               "head (only feature_layers=last with a linear head exports)")
        task = get_task(extra["task"], run)
        return task.kind, tuple(task.labels)
    return converted_task(extra, source)
