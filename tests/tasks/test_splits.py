"""Holding out dev from train: deterministic, disjoint, whole SQuAD articles."""

import numpy as np
import pytest

from bert_jax.errors import BertJaxError
from bert_jax.tasks import get_task
from bert_jax.tasks.splits import holdout_rows, split_examples, squad_articles
from tests.finetuning import helpers as H


def test_holdout_rows_deterministic_disjoint_complete():
    train, dev = holdout_rows(1000, 0.1, seed=3)
    again = holdout_rows(1000, 0.1, seed=3)
    assert np.array_equal(train, again[0]) and np.array_equal(dev, again[1])
    assert len(dev) == 100 and not set(train) & set(dev)
    assert sorted(set(train) | set(dev)) == list(range(1000))
    other = holdout_rows(1000, 0.1, seed=4)[1]
    assert not np.array_equal(dev, other)


def test_holdout_rejects_bad_fractions():
    for fraction in (0.0, 1.0, -0.1):
        with pytest.raises(BertJaxError, match="holdout_fraction"):
            holdout_rows(10, fraction, 0)


def test_squad_holdout_keeps_articles_whole(tmp_path):
    path = H.write_squad(str(tmp_path), n_articles=12)
    examples = get_task("squad_v1").read("train", files=path)
    articles = squad_articles(path)
    groups = [articles[ex.qas_id] for ex in examples]
    train, dev = split_examples(examples, 0.25, seed=0, groups=groups)
    train_articles = {articles[ex.qas_id] for ex in train}
    dev_articles = {articles[ex.qas_id] for ex in dev}
    assert len(dev_articles) == 3 and not train_articles & dev_articles
    assert len(train) + len(dev) == len(examples) == 48
    again = split_examples(examples, 0.25, seed=0, groups=groups)[1]
    assert [ex.qas_id for ex in again] == [ex.qas_id for ex in dev]
