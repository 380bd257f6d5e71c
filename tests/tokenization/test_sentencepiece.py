"""SentencePiece: training with BERT specials at ids 0-4, round trips, persistence, the CLI."""

from __future__ import annotations

import json
import pickle
import random

import numpy as np
import pytest

from bert_jax.cli import main
from bert_jax.cli.tokenization import train_tokenizer
from bert_jax.errors import BertJaxError
from bert_jax.tokenization import SPECIAL_TOKENS, load_tokenizer
from bert_jax.tokenization.sentencepiece import SentencePieceTokenizer, train_sentencepiece

pytest.importorskip("sentencepiece")

WORDS = ["the", "cat", "sat", "on", "mat", "dog", "ran", "fast", "über", "naïve", "hello",
         "world", "token", "tokenizer", "pretraining", "model", "jax", "data", "Paris", "France"]
ROUND_TRIP = ["the cat sat on the mat", "  hello   world  ", "naïve über tokenizer pretraining",
              "Paris France model jax data", "dog ran fast, the cat sat."]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A directory tree: text files (one with a blank line), a nested file in another
    encoding and a binary (a minority: skipped and counted)."""
    root = tmp_path_factory.mktemp("corpus")
    rng = random.Random(0)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 14)))
             + rng.choice(["", ".", ",", "!"]) for _ in range(3000)]
    (root / "a.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (root / "sub").mkdir()
    (root / "sub" / "b.txt").write_bytes(b"good line here\n\xff\xfe bad bytes\n\nanother good\n")
    (root / "sub" / "blob.bin").write_bytes(b"\x00\x01\x02binary\n")
    (root / "sub" / "c.txt").write_bytes(b"good line here\n\nanother good\n")
    (root / "sub" / "d.txt").write_bytes(b"one more\n")
    return root


@pytest.fixture(scope="module", params=["unigram", "bpe"])
def trained(request, corpus, tmp_path_factory):
    prefix = tmp_path_factory.mktemp(request.param) / "spm"
    report = train_sentencepiece([str(corpus)], str(prefix), vocab_size=48,
                                 model_type=request.param, num_threads=1)
    return SentencePieceTokenizer(f"{prefix}.model"), report


def test_specials_fixed_ids_and_report(trained):
    tok, report = trained
    assert [tok.id_to_token(i) for i in range(5)] == list(SPECIAL_TOKENS)
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
    assert tok.vocab_size == 48
    assert (report.files, report.binary_files, report.lines) == (3, 2, 3003)
    assert (report.undecodable_lines, report.blank_lines, report.too_long_lines) == (0, 1, 0)


def test_round_trip_and_words(trained):
    tok, _ = trained
    for text in ROUND_TRIP:
        ids = tok.encode_ids(text)
        assert tok.unk_id not in ids
        assert tok.decode(ids) == tok.normalize(text) == " ".join(text.split())
    words = tok.tokenize_words("the cat [MASK] pretraining")
    assert len(words) == 4 and words[2][-1] == "[MASK]"
    assert [p for w in words for p in w] == tok.tokenize("the cat [MASK] pretraining")
    enc = tok.encode("the cat [MASK]", "hello world")
    assert enc.input_ids[0] == 2 and enc.input_ids.count(3) == 2 and 4 in enc.input_ids
    assert enc.segment_ids[-1] == 1 and enc.word_ids[0] is None
    assert tok.decode(enc.input_ids) == "the cat hello world"
    assert tok.decode(enc.input_ids, skip_special_tokens=False) == \
        "[CLS] the cat [MASK][SEP] hello world[SEP]"
    mask = tok.word_start_mask()
    pieces = [tok.id_to_token(i) for i in range(tok.vocab_size)]
    assert mask.dtype == bool and mask[:5].all()
    assert list(mask[5:]) == [p.startswith("\u2581") for p in pieces[5:]]
    assert tok.encode_batch(ROUND_TRIP, num_workers=2) == [tok.encode_ids(t) for t in ROUND_TRIP]
    clone = pickle.loads(pickle.dumps(tok))
    assert clone.encode_ids(ROUND_TRIP[2]) == tok.encode_ids(ROUND_TRIP[2])


def test_save_load_dispatch(trained, tmp_path):
    tok, _ = trained
    tok.save(str(tmp_path / "tok"))
    meta = json.loads((tmp_path / "tok" / "tokenizer.json").read_text())
    assert meta["kind"] == "sentencepiece" and (tmp_path / "tok" / meta["model_file"]).exists()
    for loaded in (SentencePieceTokenizer.load(str(tmp_path / "tok")),
                   load_tokenizer(str(tmp_path / "tok")), load_tokenizer(tok.model_path)):
        assert isinstance(loaded, SentencePieceTokenizer)
        assert loaded.fingerprint() == tok.fingerprint()
        assert loaded.encode_ids(ROUND_TRIP[0]) == tok.encode_ids(ROUND_TRIP[0])


def test_model_without_bert_specials_rejected(corpus, tmp_path):
    import sentencepiece as spm

    spm.SentencePieceTrainer.train(input=str(corpus / "a.txt"), model_prefix=str(tmp_path / "raw"),
                                   vocab_size=40, minloglevel=2)
    with pytest.raises(BertJaxError, match=r"raw\.model: ids 0-4 are .*\[PAD\]=0"):
        SentencePieceTokenizer(str(tmp_path / "raw.model"))
    (tmp_path / "junk.model").write_bytes(b"not a model")
    with pytest.raises(BertJaxError, match="not a SentencePiece model"):
        SentencePieceTokenizer(str(tmp_path / "junk.model"))


def test_training_bad_inputs(corpus, tmp_path):
    with pytest.raises(BertJaxError, match="missing-dir: no such file or directory"):
        train_sentencepiece([str(corpus), str(tmp_path / "missing-dir")], str(tmp_path / "m"), 40)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "blank.txt").write_text("\n\n")
    with pytest.raises(BertJaxError, match="no usable text lines"):
        train_sentencepiece([str(empty)], str(tmp_path / "m"), 40)
    with pytest.raises(BertJaxError, match="Vocabulary size too high"):
        train_sentencepiece([str(corpus)], str(tmp_path / "m"), 5000)
    with pytest.raises(BertJaxError, match="model_type"):
        train_sentencepiece([str(corpus)], str(tmp_path / "m"), 40, model_type="word")


def test_cli_train_tokenizer(corpus, tmp_path, capsys):
    out = tmp_path / "tok"
    rc = main(["train-tokenizer", "--input", str(corpus / "a.txt"), str(corpus / "sub"),
               "--output", str(out), "--vocab-size", "45", "--model-type", "bpe",
               "--character-coverage", "1.0", "--input-sentence-size", "1000"])
    assert rc == 0
    stdout, err = capsys.readouterr()
    assert "2 not utf-8 text" in stdout
    assert [line.split(": not")[0] for line in err.splitlines() if "skipped" in line] == [
        f"warning: skipped {corpus / 'sub' / 'b.txt'}",
        f"warning: skipped {corpus / 'sub' / 'blob.bin'}"], err
    tok = load_tokenizer(str(out))
    assert isinstance(tok, SentencePieceTokenizer) and tok.vocab_size == 45
    assert tok.decode(tok.encode_ids("the cat sat")) == "the cat sat"
    assert np.array_equal(tok.special_ids, [0, 1, 2, 3, 4])
    bad = ["train-tokenizer", "--input", str(tmp_path / "nope"), "--output", str(tmp_path / "x"),
           "--vocab-size", "45"]
    assert main(bad) == 2
    assert "nope: no such file or directory" in capsys.readouterr().err
    import argparse

    parser = argparse.ArgumentParser()
    train_tokenizer.add_arguments(parser)
    with pytest.raises(BertJaxError, match="nope"):
        train_tokenizer.run(parser.parse_args(bad[1:]))
