"""Byte-level BPE: a vocabulary trained here encodes exactly as transformers' RobertaTokenizer
reads the same vocab.json + merges.txt; persistence, RoBERTa's pair layout, errors."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from bert_jax.errors import BertJaxError
from bert_jax.tokenization import load_tokenizer
from bert_jax.tokenization.bpe import (
    BPE_SPECIAL_TOKENS,
    ByteLevelBPETokenizer,
    byte_alphabet,
    train_bpe,
)

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "It's a truth universally acknowledged, that a single man in possession of a good fortune",
    "must be in want of a wife. We'll see; they're sure I'd say so, and you've heard it.",
    "Numbers: 12345, 3.14159, 1,000,000 and 2026-11-27T12:00:00Z.",
    "Unicode: café naïve résumé Ångström, Ελληνικά, русский текст, 中文字符, 日本語のテキスト.",
    "Emoji 😀👍🏽 ❤️ and symbols © ® ™ → ← ∑ ∞.",
    "   indented line\twith tabs  and   runs of spaces   ",
]
TEXTS = [
    "", " ", "\n", "  \n\n  ", "Hello, world!", "  leading and trailing spaces  ",
    "line one\nline two\r\nline three\n\n\nend", "tab\tseparated\tvalues\t",
    "Émoji 😀👍🏽 x😀y ❤️ 🎉🎉", "naïve café — “quotes” ‘single’ … «guillemets» ¿qué? ¡sí!",
    "中文字符测试 日本語のテキスト 한국어 텍스트", "ΟΔΟΣ Σίσυφος İstanbul straße ﬁne",
    "it's we'll they're I'M you've she'd", "numbers 12345 3.14 1,000 ٣٤٥ ½",
    "unseen words: zyxwvut qqqq Xylophone", "control\x00chars\x07 \u200bzwsp \ufffd",
    "The capital of France is <mask>.", "x <mask> y", "x<mask>y", "x  \n<mask>",
    "<s>a</s> <pad> <unk> b", "supercalifragilisticexpialidocious" * 3,
]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 450-token vocabulary trained by bert-jax, saved, and the same files loaded by
    transformers' RobertaTokenizer (with RoBERTa's tokenizer_config: <mask> lstrip)."""
    import transformers

    from bert_jax.checkpoint.families import _write_bpe_tokenizer
    from bert_jax.config import BertConfig

    root = tmp_path_factory.mktemp("bpe")
    (root / "corpus.txt").write_text("\n".join(CORPUS * 3) + "\n", encoding="utf-8")
    tok, report = train_bpe([str(root / "corpus.txt")], vocab_size=450, min_frequency=2,
                            num_workers=2)
    assert report.lines == 3 * len(CORPUS)
    _write_bpe_tokenizer(tok, str(root / "hf"), BertConfig(vocab_size=tok.vocab_size))
    ref = transformers.RobertaTokenizer.from_pretrained(root / "hf")
    return tok, ref, root


def _random_texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    pools = [range(32, 127), range(0xA0, 0x250), range(0x370, 0x400), range(0x4E00, 0x4E80),
             range(0x1F600, 0x1F650), [9, 10, 13, 32, 32, 32, 0xA0, 0x3000]]
    words = " ".join(CORPUS).split()
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, 12)):
            if rng.random() < 0.5:
                parts.append(rng.choice(words))
            else:
                pool = rng.choice(pools)
                parts.append("".join(chr(rng.choice(pool)) for _ in range(rng.randint(1, 5))))
            parts.append(rng.choice([" ", "  ", "\n", "", "\t", " <mask> "]))
        out.append("".join(parts))
    return out


def test_trained_vocabulary_shape(trained):
    tok, _, _ = trained
    assert tok.vocab_size == 450
    assert [tok.id_to_token(i) for i in range(5)] == list(BPE_SPECIAL_TOKENS)
    assert [tok.id_to_token(i) for i in range(5, 261)] == list(byte_alphabet())
    assert (tok.pad_id, tok.cls_id, tok.sep_id, tok.unk_id) == (1, 0, 2, 3)
    assert tok.token_to_id("\u0120the") > 260  # a merge learned from the corpus


@pytest.mark.parametrize("source", ["fixed", "random"])
def test_encodes_like_roberta_tokenizer(trained, source):
    tok, ref, _ = trained
    texts = TEXTS if source == "fixed" else _random_texts(300)
    for text in texts:
        assert tok.encode_ids(text) == ref(text, add_special_tokens=False)["input_ids"], text
    for a, b in zip(texts[::2], texts[1::2], strict=False):
        assert tok.encode(a, b).input_ids == ref(a, b)["input_ids"], (a, b)
        assert tok.encode(a).input_ids == ref(a)["input_ids"], a


def test_decode_restores_text(trained):
    tok, ref, _ = trained
    for text in TEXTS[:16]:
        ids = tok.encode_ids(text)
        assert tok.decode(ids) == text
        assert tok.decode(ids) == ref.decode(ids)


def test_pair_layout_and_truncation(trained):
    tok, _, _ = trained
    enc = tok.encode("a b c d e f", "g h i j", max_length=10)
    s, e = tok.cls_id, tok.sep_id
    ids = enc.input_ids
    assert len(ids) == 10 and ids[0] == s and ids[-1] == e and enc.segment_ids == [0] * 10
    assert ids.count(e) == 3 and ids[ids.index(e) + 1] == e  # <s> A </s></s> B </s>
    assert enc.word_ids[0] is None and enc.word_ids[-1] is None


def test_save_load_and_factory(trained, tmp_path):
    tok, _, root = trained
    tok.save(str(tmp_path / "tok"))
    for loaded in (load_tokenizer(str(tmp_path / "tok")), load_tokenizer(str(root / "hf"))):
        assert isinstance(loaded, ByteLevelBPETokenizer)
        assert loaded.fingerprint() == tok.fingerprint()
        assert loaded.encode_ids(TEXTS[9]) == tok.encode_ids(TEXTS[9])
    mask = tok.word_start_mask()
    assert mask[tok.token_to_id("\u0120the")] and not mask[tok.token_to_id("e")]


def test_parallel_encode_batch(trained):
    tok, _, _ = trained
    texts = _random_texts(2100, seed=1)
    assert tok.encode_batch(texts, num_workers=2) == [tok.encode_ids(t) for t in texts]


def test_bad_files_are_one_error(trained, tmp_path):
    tok, _, _ = trained
    tok.save_vocab_files(str(tmp_path))
    lines = (tmp_path / "merges.txt").read_text(encoding="utf-8").splitlines()
    (tmp_path / "merges.txt").write_text("\n".join(lines[:3] + ["a b c"]) + "\n",
                                         encoding="utf-8")
    with pytest.raises(BertJaxError, match=r"merges.txt:4: expected two symbols"):
        ByteLevelBPETokenizer.from_files(str(tmp_path / "vocab.json"),
                                         str(tmp_path / "merges.txt"))
    (tmp_path / "merges.txt").write_text("\n".join(lines[:3]) + "\n", encoding="utf-8")
    vocab = json.loads((tmp_path / "vocab.json").read_text(encoding="utf-8"))
    del vocab["<mask>"]
    (tmp_path / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    with pytest.raises(BertJaxError, match="<mask> missing"):
        ByteLevelBPETokenizer.from_files(str(tmp_path / "vocab.json"),
                                         str(tmp_path / "merges.txt"))
    with pytest.raises(BertJaxError, match="leaves no room for merges"):
        train_bpe([str(tmp_path)], vocab_size=200)


def test_training_is_deterministic(tmp_path):
    (tmp_path / "a.txt").write_text("\n".join(CORPUS) + "\n", encoding="utf-8")
    one, _ = train_bpe([str(tmp_path)], vocab_size=320)
    two, _ = train_bpe([str(tmp_path)], vocab_size=320, num_workers=2)
    assert one.fingerprint() == two.fingerprint()
    assert np.array_equal(one.word_start_mask(), two.word_start_mask())


def test_create_pretraining_data_with_byte_level_bpe(trained, tmp_path):
    """FULL-SENTENCES data (RoBERTa's recipe) framed with <s> ... </s>, padded with <pad>,
    the special ids in the metadata the masking reads."""
    from bert_jax.data.create_pretraining import CreationConfig, create_pretraining_data

    tok, _, _ = trained
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "doc.txt").write_text("\n\n".join("\n".join(CORPUS[i:] + CORPUS[:i])
                                                for i in range(4)) + "\n", encoding="utf-8")
    meta = create_pretraining_data([str(corpus)], tok, str(tmp_path / "out"),
                                   CreationConfig(max_seq_length=32, mode="full_sentences"),
                                   progress=False)
    assert meta["tokenizer"]["kind"] == "bpe"
    assert meta["tokenizer"]["special_ids"] == {"pad": 1, "unk": 3, "cls": 0, "sep": 2,
                                                "mask": 4}
    assert meta["splits"]["train"]["examples"] > 0
