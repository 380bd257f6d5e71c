"""WordPiece vocabulary training: the vocab.txt it writes is read identically by bert-jax's
WordPieceTokenizer and transformers' BertTokenizer; specials first, ## continuations,
casing options, parallel counting, the CLI."""

from __future__ import annotations

import pytest

from bert_jax.cli import main
from bert_jax.errors import BertJaxError
from bert_jax.tokenization import SPECIAL_TOKENS, load_tokenizer
from bert_jax.tokenization.wordpiece_trainer import train_wordpiece

CORPUS = [
    "The quick brown fox jumps over the lazy dog. The dogs were running and jumping.",
    "Unaffable, unbelievable, UNDENIABLE: unhappy runners ran; the runner's shoes!",
    "Café naïve résumé Ångström façade ÉCOLE über straße, Ελληνικά κείμενα, русский текст.",
    "中文字符测试 日本語のテキスト 한국어 텍스트 — “quotes” ‘single’ … «guillemets».",
    "Numbers 12345 3.14159 1,000,000; emoji 😀👍🏽 ❤️ and $5.00 ^_^ @user #tag 50%.",
    "don't can't it's o'clock U.S.A. e-mail [MASK] tokens stay whole [SEP] here.",
]
TEXTS = CORPUS + [
    "", "   ", "Hello, World! How are you?", "unseen xylophone zebra quokka",
    "THE QUICK BROWN FOX", "résumé RÉSUMÉ resume", "control\x00chars\x07 \u200bzwsp",
    "a" * 120, "Paris is the [MASK] of France.", "jumping runners' unaffable-ness",
]


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    (root / "a.txt").write_text("\n".join(CORPUS * 4) + "\n", encoding="utf-8")
    (root / "b.txt").write_text("\n".join(reversed(CORPUS)) + "\n\n", encoding="utf-8")
    return root


@pytest.mark.parametrize(("lower", "strip"), [(True, None), (False, None), (True, False)])
def test_vocab_reads_identically_in_bert_tokenizer(corpus_dir, tmp_path, lower, strip):
    import transformers

    tok, report = train_wordpiece([str(corpus_dir)], vocab_size=300, do_lower_case=lower,
                                  strip_accents=strip, min_frequency=1, num_workers=2)
    assert report.lines == 5 * len(CORPUS) and report.blank_lines == 1
    assert [tok.id_to_token(i) for i in range(5)] == list(SPECIAL_TOKENS)
    tokens = [tok.id_to_token(i) for i in range(tok.vocab_size)]
    assert len(tokens) == len(set(tokens)) == 300
    assert any(t.startswith("##") and len(t) > 3 for t in tokens)  # learned continuations
    tok.save(str(tmp_path / "tok"))
    ref = transformers.BertTokenizer(str(tmp_path / "tok" / "vocab.txt"), do_lower_case=lower,
                                     strip_accents=strip)
    loaded = load_tokenizer(str(tmp_path / "tok"))
    for text in TEXTS:
        ids = loaded.encode_ids(text)
        assert ids == ref(text, add_special_tokens=False)["input_ids"], text
        assert ids == tok.encode_ids(text)
    assert loaded.encode("a b", "c").input_ids == ref("a b", "c")["input_ids"]
    if lower:
        assert "the" in tokens and "The" not in tokens
    else:
        assert "The" in tokens


def test_merges_follow_frequency(tmp_path):
    (tmp_path / "c.txt").write_text("hug " * 10 + "pug " * 5 + "pun " * 12 + "bun " * 4
                                    + "hugs " * 5 + "\n", encoding="utf-8")
    tok, _ = train_wordpiece([str(tmp_path)], vocab_size=30, num_workers=1)
    learned = [tok.id_to_token(i) for i in range(5, tok.vocab_size)]
    # alphabet (b g h n p s u and their ## forms) then the merges, most frequent first
    # (##u ##g: 20, then ##u ##n: 16, h ##ug: 15, ...; ties to the smaller pair), until no
    # pair occurs twice: 26 of the 30 tokens asked for.
    assert learned[:7] == ["b", "g", "h", "n", "p", "s", "u"]
    assert learned[14:] == ["##ug", "##un", "hug", "pun", "hugs", "pug", "bun"]
    assert tok.tokenize("hugs puns bug") == ["hugs", "pun", "##s", "b", "##ug"]


def test_parallel_and_serial_counting_agree(corpus_dir):
    one, _ = train_wordpiece([str(corpus_dir)], vocab_size=250, num_workers=1)
    two, _ = train_wordpiece([str(corpus_dir)], vocab_size=250, num_workers=2)
    assert one.fingerprint() == two.fingerprint()


def test_limit_alphabet_and_errors(corpus_dir, tmp_path):
    tok, _ = train_wordpiece([str(corpus_dir)], vocab_size=200, limit_alphabet=30)
    singles = [t for t in (tok.id_to_token(i) for i in range(5, tok.vocab_size))
               if len(t) == 1]
    assert len(singles) == 30
    with pytest.raises(BertJaxError, match="leaves no room"):
        train_wordpiece([str(corpus_dir)], vocab_size=5)
    (tmp_path / "empty.txt").write_text("\n\n", encoding="utf-8")
    with pytest.raises(BertJaxError, match="no usable text lines"):
        train_wordpiece([str(tmp_path / "empty.txt")], vocab_size=100)


def test_cli_trains_wordpiece_and_byte_bpe(corpus_dir, tmp_path, capsys):
    for kind in ("wordpiece", "byte-bpe"):
        out = tmp_path / kind
        assert main(["train-tokenizer", "--input", str(corpus_dir), "--output", str(out),
                     "--vocab-size", "300", "--model-type", kind, "--num-workers", "2",
                     "--min-frequency", "1"]) == 0
        printed = capsys.readouterr().out
        assert "MB/s" in printed and f"{kind} vocabulary of 300 tokens" in printed
        assert load_tokenizer(str(out)).kind == ("wordpiece" if kind == "wordpiece" else "bpe")
    assert main(["train-tokenizer", "--input", str(tmp_path / "missing"), "--output",
                 str(tmp_path / "x"), "--vocab-size", "300", "--model-type", "wordpiece"]) == 2
    assert "error:" in capsys.readouterr().err
