"""Pretraining data made with the real tools: a small text corpus -> WordPiece vocab ->
``bert-jax create-pretraining-data`` (3 train shards, 1 held-out shard) and
``bert-jax materialize-batches``."""

from __future__ import annotations

import os

import numpy as np
import pytest

from bert_jax.cli import main

WORDS = ("the a cat dog bird sat ran flew on over under mat log tree and then it was very happy "
         "sad big small play jump walk talk").split()
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, ".", "##s", "##ed", "##ing"]
SEQ_LEN = 32


def write_corpus(directory: str, n_files: int = 3, docs_per_file: int = 12) -> None:
    rng = np.random.default_rng(0)
    os.makedirs(directory, exist_ok=True)
    for f in range(n_files):
        docs = []
        for _ in range(docs_per_file):
            sentences = [" ".join(rng.choice(WORDS, int(rng.integers(3, 10)))).capitalize() + "."
                         for _ in range(int(rng.integers(2, 9)))]
            docs.append("\n".join(sentences))
        with open(os.path.join(directory, f"part{f}.txt"), "w", encoding="utf-8") as fh:
            fh.write("\n\n".join(docs) + "\n")


@pytest.fixture(scope="session")
def pretraining_data(tmp_path_factory) -> tuple[str, str]:
    """(data directory, vocab file)."""
    pytest.importorskip("tensorflow")
    root = tmp_path_factory.mktemp("pretraining_data")
    write_corpus(str(root / "corpus"))
    vocab = root / "vocab.txt"
    vocab.write_text("\n".join(VOCAB) + "\n")
    rc = main(["create-pretraining-data", "--input", str(root / "corpus"), "--tokenizer",
               str(vocab), "--output-dir", str(root / "data"), "--max-seq-length",
               str(SEQ_LEN), "--num-shards", "3", "--num-workers", "1", "--holdout-fraction",
               "0.2", "--no-progress"])
    assert rc == 0
    return str(root / "data"), str(vocab)


@pytest.fixture(scope="session")
def materialized(pretraining_data, tmp_path_factory) -> str:
    """6 global batches of 24 (divisible by 1, 2, 3, 4 hosts and 8 devices)."""
    out = tmp_path_factory.mktemp("materialized")
    rc = main(["materialize-batches", "--data-dir", pretraining_data[0], "--output", str(out),
               "--steps", "6", "--batch-size", "24", "--max-predictions", "5", "--seed", "3",
               "--no-progress"])
    assert rc == 0
    return str(out)
