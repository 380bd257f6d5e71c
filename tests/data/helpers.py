"""Small fixtures for data tests: a WordPiece vocab written to disk, synthetic shards."""

from __future__ import annotations

import os

import numpy as np

from bert_jax.data.example_proto import ExampleEncoder
from bert_jax.data.metadata import FORMAT_VERSION, write_metadata

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = ("the a cat dog bird sat ran flew on over under mat log tree and then it was very "
         "happy sad big small play jump walk talk . , ! ?").split()
# "playing" -> play ##ing, "jumped" -> jump ##ed: multi-piece words for whole-word masking.
SUFFIXES = ["##ing", "##ed", "##s"]
PAD, UNK, CLS, SEP, MASK = range(5)


def write_vocab(directory: str) -> str:
    path = os.path.join(directory, "vocab.txt")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(SPECIALS + WORDS + SUFFIXES) + "\n")
    return path


def wordpiece(directory: str):
    from bert_jax.tokenization.wordpiece import WordPieceTokenizer

    return WordPieceTokenizer.from_vocab_file(write_vocab(directory))


def random_sentence(rng: np.random.Generator, n_words: int) -> str:
    words = [w for w in WORDS if w not in ".,!?"]
    out = []
    for _ in range(n_words):
        w = words[rng.integers(len(words))]
        if w in ("play", "jump", "walk", "talk") and rng.random() < 0.7:
            w += ("ing", "ed", "s")[rng.integers(3)]
        out.append(w)
    return " ".join(out).capitalize() + "."


def write_corpus(directory, n_files=3, docs_per_file=20, seed=0):
    rng = np.random.default_rng(seed)
    os.makedirs(directory, exist_ok=True)
    for f in range(n_files):
        docs = ["\n".join(random_sentence(rng, int(rng.integers(3, 12)))
                          for _ in range(int(rng.integers(2, 12))))
                for _ in range(docs_per_file)]
        with open(os.path.join(directory, f"part{f}.txt"), "w") as fh:
            fh.write("\n\n".join(docs) + "\n")


def write_shards(directory: str, num_examples: int, num_shards: int, seq_len: int = 32,
                 vocab_size: int = 1000) -> list[np.ndarray]:
    """Synthetic shards: example i starts [CLS] 100+i//100 100+i%100 (identifiable), then
    random tokens, [SEP]; lengths vary. Returns the unpadded id arrays in index order."""
    import tensorflow as tf

    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(0)
    encoder = ExampleEncoder(vocab_size)
    names = [f"train-{s:05d}-of-{num_shards:05d}.tfrecord" for s in range(num_shards)]
    writers = [tf.io.TFRecordWriter(os.path.join(directory, n)) for n in names]
    counts = [0] * num_shards
    examples = []
    for i in range(num_examples):
        length = int(rng.integers(8, seq_len + 1))
        body = rng.integers(300, vocab_size, size=length - 4).tolist()
        ids = [CLS, 100 + i // 100, 100 + i % 100, *body, SEP]
        examples.append(np.array(ids))
        pad = seq_len - len(ids)
        writers[i % num_shards].write(encoder.encode({
            "input_ids": ids + [PAD] * pad, "segment_ids": [0] * seq_len,
            "next_sentence_label": [i % 2]}))
        counts[i % num_shards] += 1
    for w in writers:
        w.close()
    write_metadata(directory, {
        "format_version": FORMAT_VERSION, "mode": "nsp", "max_seq_length": seq_len,
        "tokenizer": {"kind": "test", "fingerprint": "test:0", "vocab_size": vocab_size,
                      "special_ids": {"pad": PAD, "unk": UNK, "cls": CLS, "sep": SEP,
                                      "mask": MASK}},
        "splits": {"train": {"examples": num_examples,
                             "shards": [{"file": n, "examples": c}
                                        for n, c in zip(names, counts, strict=True)]},
                   "eval": {"examples": 0, "shards": []}}})
    return examples


def example_index(batch: dict, row: int) -> int:
    """Recovers the synthetic example index from a masked batch row (undoing the masking)."""
    ids = batch["input_ids"][row].copy()
    for p, t, w in zip(batch["masked_lm_positions"][row], batch["masked_lm_ids"][row],
                       batch["masked_lm_weights"][row], strict=True):
        if w:
            ids[p] = t
    return int((ids[1] - 100) * 100 + ids[2] - 100)


def unmasked(batch: dict) -> np.ndarray:
    ids = batch["input_ids"].copy()
    for r in range(ids.shape[0]):
        for p, t, w in zip(batch["masked_lm_positions"][r], batch["masked_lm_ids"][r],
                           batch["masked_lm_weights"][r], strict=True):
            if w:
                ids[r, p] = t
    return ids
