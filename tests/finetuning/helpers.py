"""Fixtures written in the real formats: a WordPiece vocab, a tiny pretraining-style
checkpoint, and small GLUE / CoNLL / SQuAD / SWAG files with learnable toy labels."""

from __future__ import annotations

import csv
import json
import os

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.checkpoint import store
from bert_jax.config import get_preset
from bert_jax.modeling.heads import BertForPreTraining
from bert_jax.modeling.params import unbox
from bert_jax.tokenization.wordpiece import WordPieceTokenizer

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = ["the", "a", "cat", "dog", "man", "woman", "park", "city", "walks", "runs", "sits",
         "eats", "sees", "likes", "big", "small", "red", "blue", "old", "new", "good", "bad",
         "house", "tree", "car", "river", "john", "mary", "paris", "london", "acme", "corp",
         "in", "on", "at", "to", "and", "of", ".", ",", "?", "##s", "##ed"]
VOCAB = SPECIALS + WORDS
FILLER = [w for w in WORDS if w not in ("good", "bad", "john", "mary", "paris", "london",
                                        "acme", "corp", ".", ",", "?", "##s", "##ed")]


def write_vocab(directory: str, extra: tuple[str, ...] = ()) -> str:
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "vocab.txt")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(VOCAB + list(extra)) + "\n")
    return path


def tiny_config(vocab_size: int = len(VOCAB), num_hidden_layers: int = 2):
    return get_preset("tiny", vocab_size=vocab_size, hidden_size=32, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=64, vocab_pad_multiple=8,
                      num_hidden_layers=num_hidden_layers)


def write_checkpoint(directory: str, seed: int = 0, num_hidden_layers: int = 2) -> str:
    """A random BertForPreTraining (MLM + NSP heads) saved as a bert-jax model dir."""
    config = tiny_config(num_hidden_layers=num_hidden_layers)
    tokenizer = WordPieceTokenizer.from_vocab_file(write_vocab(directory + "_vocab"))
    ids = jnp.zeros((1, 8), jnp.int32)
    # Compiled: op by op, the init's many small ops cost several times one compile.
    params = unbox(jax.jit(BertForPreTraining(config).init)(jax.random.PRNGKey(seed), ids, ids,
                                                            ids, ids[:, :2])["params"])
    store.save_model(directory, jax.device_get(params), config, tokenizer)
    return directory


def sentences(n: int, seed: int, marker: str = "good") -> tuple[list[str], list[str]]:
    """Random filler sentences; half contain ``marker`` (label "1"), half not ("0")."""
    rng = np.random.default_rng(seed)
    texts, labels = [], []
    for i in range(n):
        words = list(rng.choice(FILLER, size=rng.integers(4, 9)))
        label = i % 2
        if label:
            words.insert(int(rng.integers(0, len(words) + 1)), marker)
        texts.append(" ".join(words) + " .")
        labels.append(str(label))
    return texts, labels


def write_sst2(directory: str, n_train: int, n_dev: int | None = None, n_test: int = 0):
    """SST-2 layout: header ``sentence\\tlabel``; test ``index\\tsentence``."""
    os.makedirs(directory, exist_ok=True)
    for split, n, seed in (("train", n_train, 1), ("dev", n_dev, 2), ("test", n_test, 3)):
        if not n:
            continue
        texts, labels = sentences(n, seed)
        with open(os.path.join(directory, f"{split}.tsv"), "w", encoding="utf-8") as f:
            if split == "test":
                f.write("index\tsentence\n")
                f.writelines(f"{i}\t{t}\n" for i, t in enumerate(texts))
            else:
                f.write("sentence\tlabel\n")
                f.writelines(f"{t}\t{y}\n" for t, y in zip(texts, labels, strict=True))
    return directory


def write_stsb(directory: str, n: int = 48):
    """STS-B layout, train only (dev is held out); score = 5 * word overlap of the pair."""
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(4)
    header = ("index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\t"
              "sentence2\tscore\n")
    with open(os.path.join(directory, "train.tsv"), "w", encoding="utf-8") as f:
        f.write(header)
        for i in range(n):
            a = list(rng.choice(FILLER, size=6))
            keep = int(rng.integers(0, 7))
            b = a[:keep] + list(rng.choice(FILLER, size=6 - keep))
            f.write(f"{i}\tmain\tx\t2012\t{i}\tnone\tnone\t{' '.join(a)}\t{' '.join(b)}\t"
                    f"{5 * keep / 6:.3f}\n")
    return directory


NAMES = {"PER": ["john", "mary"], "LOC": ["paris", "london"], "ORG": ["acme"]}


def write_conll(directory: str, n: int = 40):
    """CoNLL-2003 column files (token POS chunk NER), IOB2 tags, -DOCSTART- lines."""
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(5)
    for split in ("train", "valid", "test"):
        lines = ["-DOCSTART- -X- -X- O", ""]
        for _ in range(n):
            for w in rng.choice(FILLER, size=int(rng.integers(3, 7))):
                lines.append(f"{w} NN I-NP O")
            kind = str(rng.choice(list(NAMES)))
            if kind == "ORG":
                lines += ["acme NNP I-NP B-ORG", "corp NNP I-NP I-ORG"]
            else:
                lines.append(f"{rng.choice(NAMES[kind])} NNP I-NP B-{kind}")
            lines += ["walks VB I-VP O", ". . O O", ""]
        with open(os.path.join(directory, f"{split}.txt"), "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    return directory


def squad_json(n_articles: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    data = []
    for a in range(n_articles):
        paragraphs = []
        for p in range(2):
            name = str(rng.choice(["john", "mary"]))
            place = str(rng.choice(["paris", "london"]))
            context = f"the old {name} walks to {place} in the red car ."
            qas = [{"id": f"q{a}-{p}-0", "question": "who walks ?",
                    "answers": [{"text": name, "answer_start": context.index(name)}]},
                   {"id": f"q{a}-{p}-1", "question": "to what city ?",
                    "answers": [{"text": place, "answer_start": context.index(place)}]}]
            paragraphs.append({"context": context, "qas": qas})
        data.append({"title": f"article {a}", "paragraphs": paragraphs})
    return {"version": "1.1", "data": data}


def write_squad(directory: str, n_articles: int = 12):
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "train-v1.1.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(squad_json(n_articles, 6), f)
    return path


def write_swag(directory: str, n: int = 32):
    """SWAG CSV with the real header; the right ending repeats the subject."""
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(7)
    header = ["", "video-id", "fold-ind", "startphrase", "sent1", "sent2", "gold-source",
              "ending0", "ending1", "ending2", "ending3", "label"]
    for split in ("train", "val", "test"):
        with open(os.path.join(directory, f"{split}.csv"), "w", encoding="utf-8",
                  newline="") as f:
            writer = csv.writer(f)
            writer.writerow(header if split != "test" else header[:-1])
            for i in range(n):
                subject = str(rng.choice(["cat", "dog", "man"]))
                endings = [f"{w} runs" for w in rng.choice(["car", "tree", "river"], size=4)]
                label = int(rng.integers(0, 4))
                endings[label] = f"{subject} runs"
                row = [i, "v", i, "x", f"the {subject} sits", "then the", "gold", *endings]
                writer.writerow(row + [label] if split != "test" else row)
    return directory
