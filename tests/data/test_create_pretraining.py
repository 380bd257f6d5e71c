"""`bert-jax create-pretraining-data`: shards, metadata, determinism, malformed input."""

import json

import numpy as np
import pytest

from bert_jax.cli import main
from bert_jax.data.create_pretraining import CreationConfig, create_pretraining_data
from bert_jax.data.metadata import load_metadata
from data.helpers import CLS, PAD, SEP, wordpiece, write_corpus, write_vocab

tf = pytest.importorskip("tensorflow")


def read_records(path, seq_len):
    features = {"input_ids": tf.io.FixedLenFeature([seq_len], tf.int64),
                "segment_ids": tf.io.FixedLenFeature([seq_len], tf.int64),
                "next_sentence_label": tf.io.FixedLenFeature([1], tf.int64)}
    return [{k: v.numpy() for k, v in tf.io.parse_single_example(r, features).items()}
            for r in tf.data.TFRecordDataset(path)]


def test_cli_writes_shards_and_metadata(tmp_path):
    write_corpus(tmp_path / "corpus")
    vocab = write_vocab(str(tmp_path))
    out = tmp_path / "out"
    rc = main(["create-pretraining-data", "--input", str(tmp_path / "corpus"), "--tokenizer",
               vocab, "--output-dir", str(out), "--max-seq-length", "48", "--num-shards", "2",
               "--num-workers", "1", "--holdout-fraction", "0.2", "--no-progress"])
    assert rc == 0
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["mode"] == "nsp" and meta["max_seq_length"] == 48
    assert meta["tokenizer"]["special_ids"] == {"pad": 0, "unk": 1, "cls": 2, "sep": 3,
                                                "mask": 4}
    assert meta["input"]["files"] == 3 and meta["input"]["files_lines"] == 3
    train = meta["splits"]["train"]["shards"]
    assert [s["file"] for s in train] == ["train-00000-of-00002.tfrecord",
                                          "train-00001-of-00002.tfrecord"]
    assert meta["splits"]["eval"]["shards"][0]["file"] == "eval-00000-of-00001.tfrecord"
    assert meta["splits"]["eval"]["examples"] > 0
    labels = []
    for shard in train:
        records = read_records(str(out / shard["file"]), 48)
        assert len(records) == shard["examples"]
        for r in records:
            ids, segs = r["input_ids"], r["segment_ids"]
            n = int((ids != PAD).sum())
            assert ids[0] == CLS and ids[n - 1] == SEP and (ids[n:] == PAD).all()
            assert (ids[:n] == SEP).sum() == 2 and segs[n - 1] == 1 and (segs[n:] == 0).all()
            labels.append(int(r["next_sentence_label"][0]))
    assert 0.25 < np.mean(labels) < 0.75
    config = load_metadata(str(out))
    config.check_tokenizer(wordpiece(str(tmp_path)))


def test_deterministic_and_independent_of_workers(tmp_path):
    write_corpus(tmp_path / "corpus", n_files=4)
    tokenizer = wordpiece(str(tmp_path))
    outputs = []
    for name, workers in (("a", 1), ("b", 1), ("c", 2)):
        create_pretraining_data([str(tmp_path / "corpus")], tokenizer, str(tmp_path / name),
                                CreationConfig(max_seq_length=32, mode="sop", seed=3),
                                num_shards=2, num_workers=workers, unit_bytes=1500,
                                progress=False)
        outputs.append([(tmp_path / name / f"train-0000{i}-of-00002.tfrecord").read_bytes()
                        for i in range(2)])
    assert outputs[0] == outputs[1] == outputs[2]
    create_pretraining_data([str(tmp_path / "corpus")], tokenizer, str(tmp_path / "d"),
                            CreationConfig(max_seq_length=32, mode="sop", seed=4),
                            num_shards=2, progress=False)
    assert (tmp_path / "d" / "train-00000-of-00002.tfrecord").read_bytes() != outputs[0][0]


def test_full_sentences_mode(tmp_path):
    write_corpus(tmp_path / "corpus", n_files=1)
    meta = create_pretraining_data([str(tmp_path / "corpus")], wordpiece(str(tmp_path)),
                                   str(tmp_path / "out"),
                                   CreationConfig(max_seq_length=64, mode="full_sentences"),
                                   progress=False)
    records = read_records(str(tmp_path / "out" / "train-00000-of-00001.tfrecord"), 64)
    assert len(records) == meta["splits"]["train"]["examples"]
    assert all((r["segment_ids"] == 0).all() and r["next_sentence_label"][0] == 0
               for r in records)
    # documents are short, so most packed examples cross a boundary: more than the final [SEP]
    assert np.mean([(r["input_ids"] == SEP).sum() > 1 for r in records]) > 0.5


def test_malformed_input_counted(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "bad.txt").write_bytes(b"The cat sat on the mat.\nThe dog \xff\xfe ran.\n\n")
    (corpus / "good.txt").write_bytes(b"The cat sat on the mat.\nThe dog ran.\n\n"
                                      b"Cat\n\n" + b"It was big.\nThen it ran.\n")
    (corpus / "empty.txt").write_bytes(b"\n\n")
    meta = create_pretraining_data([str(corpus)], wordpiece(str(tmp_path)), str(tmp_path / "o"),
                                   CreationConfig(max_seq_length=32, mode="sop",
                                                  input_format="lines"), progress=False)
    s = meta["input"]
    assert s["files_not_text_skipped"] == 1 and s["files"] == 2  # bad.txt: not utf-8
    assert s["documents_too_short"] == 1  # "Cat" is one token: no SOP pair possible
    assert s["empty_files"] == 1 and s["documents"] == 3


def test_empty_corpus_and_missing_path_are_errors(tmp_path, capsys):
    vocab = write_vocab(str(tmp_path))
    (tmp_path / "blank").mkdir()
    (tmp_path / "blank" / "x.txt").write_text("\n\n \n")
    rc = main(["create-pretraining-data", "--input", str(tmp_path / "blank"), "--tokenizer",
               vocab, "--output-dir", str(tmp_path / "o"), "--num-workers", "1",
               "--no-progress"])
    assert rc == 2 and "empty corpus" in capsys.readouterr().err
    assert not list((tmp_path / "o").glob("*.tfrecord"))
    rc = main(["create-pretraining-data", "--input", str(tmp_path / "nope"), "--tokenizer",
               vocab, "--output-dir", str(tmp_path / "o2"), "--no-progress"])
    assert rc == 2 and "no such file" in capsys.readouterr().err
