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


def test_glue_downloaded_and_prepared_through_tfds(tmp_path, monkeypatch):
    """--config.tfds=true --config.tfds_download=true: tensorflow-datasets' own GLUE builder
    prepares SST-2 from the distribution's files (here written by the test, in place of the
    download) into tfds_data_dir, and the run reads it from there."""
    import ml_collections

    from bert_jax.finetuning.inputs import read_split

    # tensorflow-datasets imports it to prepare a dataset (the data extra installs it)
    pytest.importorskip("importlib_resources")
    extracted = tmp_path / "download" / "SST-2"
    extracted.mkdir(parents=True)
    rows = {"train": [("a fine film", 1), ("dull and long", 0), ("a joy", 1)],
            "dev": [("not good", 0), ("great fun", 1)]}
    for split, examples in rows.items():
        (extracted / f"{split}.tsv").write_text(
            "sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in examples))
    (extracted / "test.tsv").write_text("index\tsentence\n0\tsome film\n")
    fetched = []

    def download_and_extract(self, url):  # the only part that would need the internet
        fetched.append(url)
        return str(tmp_path / "download")

    monkeypatch.setattr(tfds.download.DownloadManager, "download_and_extract",
                        download_and_extract)
    config = ml_collections.ConfigDict({"tfds": True, "tfds_download": True,
                                        "tfds_data_dir": str(tmp_path / "prepared")})
    sst2 = get_task("sst2")
    train, dev = read_split(sst2, config, "train"), read_split(sst2, config, "dev")
    assert fetched == ["https://dl.fbaipublicfiles.com/glue/data/SST-2.zip"]
    assert sorted((e.text_a, e.label) for e in train) == sorted(
        (s, str(y)) for s, y in rows["train"])
    assert sorted((e.text_a, e.label) for e in dev) == sorted((s, str(y)) for s, y in rows["dev"])
    # Prepared once: a run without tfds_download reads it, and downloads nothing.
    config.tfds_download = False
    assert len(read_split(sst2, config, "train")) == 3 and len(fetched) == 1


def test_missing_glue_data_says_how_to_get_it(monkeypatch):
    import ml_collections

    from bert_jax.finetuning.inputs import read_split
    from bert_jax.tasks.data_root import DATA_ENV

    monkeypatch.delenv(DATA_ENV, raising=False)
    config = ml_collections.ConfigDict({"tfds": False, "train_file": None, "dev_file": None,
                                        "test_file": None, "data_dir": None,
                                        "on_error": "raise"})
    with pytest.raises(BertJaxError) as error:
        read_split(get_task("mrpc"), config, "train")
    message = str(error.value)
    assert message.startswith("mrpc: no data location")
    assert "--config.tfds=true --config.tfds_download=true" in message
    assert "pip install tensorflow-datasets importlib-resources" in message
    assert "gluebenchmark.com" in message
