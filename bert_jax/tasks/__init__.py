"""Fine-tuning tasks (GLUE, SQuAD v1.1/v2.0, CoNLL-2003 NER, SWAG): readers, features,
post-processing, official metrics and output files behind one ``Task`` interface."""

from bert_jax.tasks.base import IGNORE_INDEX, KINDS, ExampleList, Features, Task, write_json
from bert_jax.tasks.registry import TASK_NAMES, get_task


def read_tfds(name: str, split: str, data_dir: str | None = None, download: bool = False):
    """Examples of a task from tensorflow-datasets (imports TensorFlow only when called)."""
    from bert_jax.tasks.tfds import read_tfds as _read

    return _read(name, split, data_dir=data_dir, download=download)


__all__ = ["IGNORE_INDEX", "KINDS", "TASK_NAMES", "ExampleList", "Features", "Task",
           "get_task", "read_tfds", "write_json"]
