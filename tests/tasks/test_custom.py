"""Tasks from your own CSV / TSV / JSON-lines files: reading, label inference, the errors
that name file and line, and fine-tune + evaluate + predict end to end on a CSV."""

from __future__ import annotations

import csv
import json
import os

import numpy as np
import pytest

from bert_jax.cli import main
from bert_jax.errors import BertJaxError
from bert_jax.finetuning.config import load_config
from bert_jax.tasks.registry import get_task
from tests.finetuning import helpers as H


def _config(*overrides, variant="classification"):
    return load_config(f"experiments/custom.py:{variant}", list(overrides))


def _write_csv(path, header, rows):
    with open(path, "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return str(path)


def test_csv_labels_inferred_sorted_and_stored(tmp_path):
    path = _write_csv(tmp_path / "news.csv", ["title", "topic"],
                      [["a, quoted title", "sport"], ["b", "politics"], ["c", "sport"]])
    c = _config("--config.text_column=title", "--config.label_column=topic")
    task = get_task(c.task, c)
    examples = task.read("train", files=path)
    assert [e.text_a for e in examples] == ["a, quoted title", "b", "c"]
    assert task.labels == ("politics", "sport")
    assert json.loads(c.labels) == ["politics", "sport"]  # written into the run config
    feats = task.featurize(examples, _tokenizer(tmp_path), 16)
    assert feats["label_ids"].tolist() == [1, 0, 1]


def test_pair_tsv_and_jsonl_tagging(tmp_path):
    tsv = tmp_path / "pairs.tsv"
    tsv.write_text("q\tanswer\tlabel\nthe cat\ta dog\t1\nthe man\tthe tree\t0\n")
    c = _config("--config.text_column=q", "--config.text_pair_column=answer")
    task = get_task(c.task, c)
    ex = task.read("train", files=str(tsv))
    assert (ex[0].text_a, ex[0].text_b, ex[0].label) == ("the cat", "a dog", "1")
    jl = tmp_path / "tags.jsonl"
    jl.write_text('{"tokens": ["john", "walks"], "tags": ["B-PER", "O"]}\n\n'
                  '{"tokens": "mary sits", "tags": "B-PER O"}\n')
    c = _config(variant="tagging")
    task = get_task(c.task, c)
    ex = task.read("train", files=str(jl))
    assert ex[1].words == ("mary", "sits") and task.labels == ("B-PER", "O")
    assert task.main_metric == "f1"


@pytest.mark.parametrize("content,overrides,message", [
    ("title,topic\nx,a\n", ["--config.text_column=headline"],
     r"news.csv:1: no column 'headline'"),
    ("text,topic\nx,a\n", ["--config.label_column=label"],
     r"news.csv:1: no label column 'label'"),
    ("text,label\nx,a\ny,\n", [], r"news.csv:3: empty label in column 'label'"),
    ("text,label\nx,a\ny,b,c\n", [], r"news.csv:3: expected 2 comma-separated columns"),
    ("text,label\nx,a\n", [], r"only one label"),
])
def test_reader_errors_name_file_and_line(tmp_path, content, overrides, message):
    (tmp_path / "news.csv").write_text(content)
    c = _config(*overrides)
    with pytest.raises(BertJaxError, match=message):
        get_task(c.task, c).read("train", files=str(tmp_path / "news.csv"))


def test_unknown_label_at_evaluation_and_bad_regression_value(tmp_path):
    _write_csv(tmp_path / "train.csv", ["text", "label"], [["x", "a"], ["y", "b"]])
    _write_csv(tmp_path / "dev.csv", ["text", "label"], [["x", "a"], ["z", "c"]])
    c = _config()
    task = get_task(c.task, c)
    task.read("train", data_dir=str(tmp_path))
    with pytest.raises(BertJaxError, match=r"dev.csv:3: label 'c' in column 'label' is not "
                                           r"one of the training labels \['a', 'b'\]"):
        task.read("dev", data_dir=str(tmp_path))
    c = _config(variant="regression")
    with pytest.raises(BertJaxError, match=r"train.csv:2: label 'a' .* is not a number"):
        get_task(c.task, c).read("train", data_dir=str(tmp_path))
    with pytest.raises(BertJaxError, match="set --config.text_column"):
        _ = get_task("custom_classification", _config("--config.text_column="))


def _tokenizer(tmp_path):
    from bert_jax.tokenization.wordpiece import WordPieceTokenizer
    return WordPieceTokenizer.from_vocab_file(H.write_vocab(str(tmp_path / "vocab")))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    # One layer: the custom-task reading, training and outputs are alike for any depth.
    return H.write_checkpoint(str(tmp_path_factory.mktemp("custom") / "ckpt"),
                              num_hidden_layers=1)


def test_finetune_evaluate_predict_on_custom_csv(checkpoint, tmp_path, capsys):
    texts, labels = H.sentences(400, 1)
    names = {"0": "neutral", "1": "positive"}
    train = _write_csv(tmp_path / "train.csv", ["id", "title", "topic"],
                       [[i, t, names[y]] for i, (t, y) in enumerate(zip(texts, labels,
                                                                            strict=True))])
    texts, labels = H.sentences(24, 3)
    test = _write_csv(tmp_path / "test.csv", ["id", "title"],
                      [[f"t{i}", t] for i, t in enumerate(texts)])
    workdir = str(tmp_path / "run")
    rc = main(["finetune", "--config", "experiments/custom.py:classification", "--workdir",
               workdir, f"--config.init_checkpoint={checkpoint}", f"--config.train_file={train}",
               f"--config.test_file={test}", "--config.text_column=title",
               "--config.label_column=topic", "--config.optimizer.learning_rate=3e-3",
               "--config.epochs=4", "--config.max_seq_length=32", "--config.log_every=0",
               "--config.eval_batch_size=32"])
    assert rc == 0
    metrics = json.load(open(os.path.join(workdir, "metrics.json")))
    assert metrics["best"]["metric"] == "dev/accuracy"
    assert metrics["best"]["value"] >= 0.85
    capsys.readouterr()
    assert main(["evaluate", "--workdir", workdir]) == 0
    assert json.loads(capsys.readouterr().out)["dev"]["accuracy"] == pytest.approx(
        metrics["best"]["value"])
    out = str(tmp_path / "pred")
    assert main(["predict", "--workdir", workdir, "--output", out]) == 0
    with open(os.path.join(out, "predictions.test.csv"), newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["id", "title", "prediction"]
    assert [r[0] for r in rows[1:]] == [f"t{i}" for i in range(24)]
    assert np.mean([r[2] == names[y] for r, y in zip(rows[1:], labels, strict=True)]) >= 0.8
