"""A converted ALBERT directory's SentencePiece tokenizer normalises text as transformers'
AlbertTokenizer (lower-casing, accent stripping, whitespace collapsing, `` and '' as ",
literal special tokens kept whole), with the options its tokenizer_config.json sets."""

from __future__ import annotations

import json

import pytest

from bert_jax.checkpoint.families import read_family_tokenizer
from bert_jax.config import BertConfig
from bert_jax.tokenization import load_tokenizer

spm = pytest.importorskip("sentencepiece")
transformers = pytest.importorskip("transformers")

CORPUS = [
    "the cat sat on the mat", "a dog runs in the park", "cafe creme and naive resume",
    "Über café Crème, NAÏVE résumé", "he said ``hello'' to me", "she said \"goodbye\" then",
    "numbers 12 and 345 and 6789", "the Straße is long", "déjà vu in São Paulo",
    "ångström ﬁne ① ｆｕｌｌｗｉｄｔｈ", "The Old Man WALKS", "mixed CaSe WoRdS here",
]
TEXTS = [
    "The Cat SAT on the MAT.", "  many   spaces\there\n\nand  tabs  ", "Café crème, naïve résumé",
    "He said ``Hello'' and ''bye``", "ÜBER Straße ÅNGSTRÖM", "ﬁne ① ｆｕｌｌｗｉｄｔｈ text",
    "déjà vu — São Paulo!", "the [MASK] sat on the mat", "[CLS] inside [SEP] text [MASK].",
    "Ünïcödé ̈ combining e\u0301 and a\u0300", "", "   ", "日本語 and ελληνικά ΣΊΣΥΦΟΣ",
]


@pytest.fixture(scope="module")
def spiece(tmp_path_factory):
    root = tmp_path_factory.mktemp("albert_spm")
    (root / "corpus.txt").write_text("\n".join(CORPUS * 10) + "\n", encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(root / "corpus.txt"), model_prefix=str(root / "spiece"), vocab_size=100,
        pad_id=0, pad_piece="<pad>", unk_id=1, unk_piece="<unk>", bos_id=-1, eos_id=-1,
        user_defined_symbols=["[CLS]", "[SEP]", "[MASK]"], character_coverage=1.0,
        minloglevel=2)
    return (root / "spiece.model").read_bytes()


@pytest.mark.parametrize("options", [
    {}, {"do_lower_case": False}, {"keep_accents": True},
    {"do_lower_case": False, "keep_accents": True},
])
def test_matches_albert_tokenizer(spiece, options, tmp_path):
    (tmp_path / "spiece.model").write_bytes(spiece)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "AlbertTokenizer", **options}))
    ours = read_family_tokenizer(str(tmp_path), BertConfig(vocab_size=100))
    theirs = transformers.AlbertTokenizer.from_pretrained(str(tmp_path))
    assert ours.do_lower_case == options.get("do_lower_case", True)
    assert ours.keep_accents == options.get("keep_accents", False)
    for text in TEXTS:
        assert ours.encode(text).input_ids == theirs(text)["input_ids"], text
    words = [t for t in TEXTS if t.strip()]  # (transformers reads an empty pair as none)
    for a, b in zip(words, words[3:], strict=False):
        enc = ours.encode(a, b)
        ref = theirs(a, b, return_token_type_ids=True)
        assert (enc.input_ids, enc.segment_ids) == (ref["input_ids"], ref["token_type_ids"])

    # The options travel with a saved tokenizer and into an export.
    ours.save(str(tmp_path / "saved"))
    again = load_tokenizer(str(tmp_path / "saved"))
    assert again.options() == ours.options()
    assert again.encode(TEXTS[4]).input_ids == ours.encode(TEXTS[4]).input_ids
