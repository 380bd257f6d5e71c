"""A run's examples and features: each split from local files or tensorflow-datasets, the dev
split held out from train when there is no dev file, and featurization with the run's
sequence length and task options."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from bert_jax.errors import BertJaxError
from bert_jax.tasks import read_tfds
from bert_jax.tasks.base import ExampleList, Task, resolve_file
from bert_jax.tasks.data_root import missing_data_message
from bert_jax.tasks.splits import split_examples, squad_articles


def _split_filenames(task: Task) -> dict[str, Sequence[str]]:
    """File names a task looks for per split (GLUE: its spec; others: their table)."""
    spec = getattr(task, "spec", None)
    return spec.split_files if spec is not None else getattr(task, "_files", {})


def read_split(task: Task, config, split: str) -> ExampleList:
    """One split from tensorflow-datasets or from local files."""
    if config.tfds:
        return read_tfds(task.tfds_name or task.name, split, data_dir=config.tfds_data_dir,
                         download=config.get("tfds_download", False))
    files = {"train": config.train_file, "dev": config.dev_file}.get(split)
    if split.startswith("test") and config.test_file:
        files = config.test_file
    if not files and not config.data_dir:
        family = (task.tfds_name or "").split("/")[0].split(":")[0] or None
        raise BertJaxError(missing_data_message(task.name, family))
    examples = task.read(split, data_dir=config.data_dir, files=files or None,
                         on_error=config.on_error)
    if not len(examples):
        skipped = getattr(examples, "skipped", None)
        raise BertJaxError(
            f"{_split_path(task, config, split, files)}: no {split} examples"
            + (f" ({len(skipped)} malformed rows skipped; first: {skipped[0]})" if skipped
               else " (empty, or only a header)"))
    return examples


def _split_path(task: Task, config, split: str, files) -> str:
    """The file a split is read from, for messages (the task and split if unknown)."""
    subdirs = (task.spec.folder,) if hasattr(task, "spec") else ()
    try:
        return str(resolve_file(split, _split_filenames(task), config.data_dir, files or None,
                                subdirs))
    except (BertJaxError, TypeError, ValueError):
        return f"{task.name} {split} split"


def has_dev_files(task: Task, config) -> bool:
    """Whether the run's dev split(s) come from files (else dev is held out from train)."""
    if config.tfds or config.dev_file:
        return True
    names = _split_filenames(task)
    if not config.data_dir or not task.eval_splits:
        return False
    subdirs = (task.spec.folder,) if hasattr(task, "spec") else ()
    try:
        for split in task.eval_splits:
            resolve_file(split, names, config.data_dir, None, subdirs)
    except BertJaxError:
        return False
    return True


def _holdout_groups(task: Task, config, train: ExampleList) -> list | None:
    """SQuAD: the article of each question (no article in both splits); others: by row."""
    if task.kind != "span":
        return None
    if config.tfds:
        return [ex.context for ex in train]  # tfds has no article index: keep paragraphs whole
    path = config.train_file or resolve_file("train", _split_filenames(task), config.data_dir,
                                             None)
    articles = squad_articles(path)
    return [articles[ex.qas_id] for ex in train]


def train_and_dev(task: Task, config) -> tuple[ExampleList, dict[str, ExampleList], str]:
    """(train, {eval split: examples}, where dev came from)."""
    train = read_split(task, config, "train")
    if has_dev_files(task, config):
        devs = {split: read_split(task, config, split) for split in task.eval_splits}
        source = "dev files"
    else:
        if config.holdout_fraction <= 0:
            raise BertJaxError(f"{task.name}: no dev file found (data_dir={config.data_dir}, "
                               "dev_file unset) and holdout_fraction=0; set "
                               "--config.holdout_fraction=0.1 to hold out dev from train")
        train, dev = split_examples(train, config.holdout_fraction, config.holdout_seed,
                                    _holdout_groups(task, config, train))
        devs = {"dev": dev}
        source = (f"held out {config.holdout_fraction:g} of train "
                  f"(seed {config.holdout_seed})")
    if config.max_train_examples and config.max_train_examples < len(train):
        keep = np.sort(np.random.default_rng(config.holdout_seed).permutation(len(train))[
            :config.max_train_examples])
        train = ExampleList([train[i] for i in keep], train.skipped)
    return train, devs, source


def eval_split_examples(task: Task, config, split: str) -> ExampleList:
    """``dev``: the run's dev split (held out again exactly when it was); else a file split."""
    if split == "dev" and not has_dev_files(task, config):
        return train_and_dev(task, config)[1]["dev"]
    return read_split(task, config, split)


def featurize(task: Task, examples, tokenizer, config) -> dict[str, np.ndarray]:
    return task.featurize(examples, tokenizer, config.max_seq_length, **config.featurize)
