"""The tensorflow-datasets path (skipped where tensorflow-datasets is not installed)."""

import numpy as np
import pytest

from bert_jax.errors import BertJaxError
from bert_jax.tasks import get_task, read_tfds

tfds = pytest.importorskip("tensorflow_datasets")


def test_glue_from_mock_tfds():
    with tfds.testing.mock_data(num_examples=3):
        cola = read_tfds("glue/cola", "train")
        mnli = read_tfds("glue/mnli", "dev_matched")  # our split name -> validation_matched
    assert len(cola) == 3 and all(e.label in ("0", "1") and e.text_b is None for e in cola)
    assert all(e.label in get_task("mnli").labels and e.text_b for e in mnli)
    with pytest.raises(BertJaxError, match="no task reads tensorflow-datasets 'glue/nope'"):
        read_tfds("glue/nope", "train")


def test_squad_and_conll_records():
    context = "Paris is the capital of France."
    records = [
        {"id": b"q1", "title": b"T", "context": context.encode(), "question": b"What?",
         "answers": {"text": np.array([b"Paris", b"Paris"]), "answer_start": np.array([0, 0])},
         "is_impossible": False},
        {"id": b"q2", "title": b"T", "context": context.encode(), "question": b"Who?",
         "answers": {"text": np.array([], dtype=object), "answer_start": np.array([])},
         "is_impossible": True},
    ]
    ex = get_task("squad_v2").from_tfds(records, "dev")
    assert [(e.qas_id, e.answers, e.is_impossible) for e in ex] == [
        ("q1", ("Paris", "Paris"), False), ("q2", (), True)]
    assert ex[0].start_position == 0
    ner = get_task("conll2003").from_tfds(
        [{"tokens": np.array([b"EU", b"rejects"]), "ner": np.array([3, 0])}], "train")
    assert ner[0].words == ("EU", "rejects") and ner[0].labels == ("B-ORG", "O")
    stsb = get_task("stsb").from_tfds(
        [{"sentence1": b"a", "sentence2": b"b", "label": np.float32(-1), "idx": 4}], "test", None)
    assert stsb[0].label is None and stsb[0].index == "4"
