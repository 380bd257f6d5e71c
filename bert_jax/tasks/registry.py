"""Task names -> Task objects."""

from __future__ import annotations

from bert_jax.errors import BertJaxError
from bert_jax.tasks.base import Task
from bert_jax.tasks.custom import CUSTOM_KINDS, CustomTask
from bert_jax.tasks.glue import GLUE_SPECS, GlueTask
from bert_jax.tasks.ner import NerTask
from bert_jax.tasks.squad import SquadTask
from bert_jax.tasks.swag import SwagTask

_FACTORIES = {
    **{name: (lambda spec=spec: GlueTask(spec)) for name, spec in GLUE_SPECS.items()},
    "squad_v1": lambda: SquadTask(version_2=False),
    "squad_v2": lambda: SquadTask(version_2=True),
    "conll2003": NerTask,
    "swag": SwagTask,
}
# Other spellings people use for the same tasks.
_ALIASES = {"sst-2": "sst2", "sts-b": "stsb", "mnli-m": "mnli", "mnli-mm": "mnli",
            "diagnostic": "ax", "squad": "squad_v1", "squad1": "squad_v1", "squad2": "squad_v2",
            "squad_v1.1": "squad_v1", "squad_v2.0": "squad_v2", "ner": "conll2003"}

TASK_NAMES = tuple(_FACTORIES)


# Tasks on the user's own files (tasks/custom.py): built from the run config.
CUSTOM_TASK_NAMES = tuple(CUSTOM_KINDS)


def get_task(name: str, config=None) -> Task:
    """Returns the task called ``name`` (case-insensitive; e.g. cola, mnli, squad_v2, swag);
    the custom tasks (custom_classification, custom_regression, custom_tagging) read their
    columns and labels from the run ``config``."""
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key in CUSTOM_KINDS:
        return CustomTask(key, config)
    if key not in _FACTORIES:
        raise BertJaxError(f"unknown task {name!r}; known tasks: "
                           f"{', '.join(TASK_NAMES + CUSTOM_TASK_NAMES)}")
    return _FACTORIES[key]()


def task_for_tfds(tfds_name: str) -> Task:
    """The task whose ``tfds_name`` is ``tfds_name`` (e.g. glue/cola, squad/v2.0)."""
    for name in TASK_NAMES:
        task = get_task(name)
        if task.tfds_name == tfds_name:
            return task
    known = sorted(get_task(n).tfds_name for n in TASK_NAMES if get_task(n).tfds_name)
    raise BertJaxError(f"no task reads tensorflow-datasets {tfds_name!r}; known: "
                       f"{', '.join(known)}")
