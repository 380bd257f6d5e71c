"""``bert-jax train-tokenizer``: raw text files -> a loadable SentencePiece tokenizer directory."""

from __future__ import annotations

import argparse
import os
import types

from bert_jax.errors import BertJaxError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", nargs="+", required=True, metavar="PATH",
                        help="text files or directories (walked recursively), one sentence or "
                             "paragraph per line")
    parser.add_argument("--output", required=True, metavar="DIR",
                        help="tokenizer directory to write (spm.model + tokenizer.json)")
    parser.add_argument("--vocab-size", type=int, required=True,
                        help="pieces in the vocabulary, the 5 BERT specials included "
                             "(30000 for a large corpus; 2000 for the 0.2 MB demo corpus)")
    parser.add_argument("--model-type", choices=("unigram", "bpe"), default="unigram",
                        help="SentencePiece algorithm")
    parser.add_argument("--character-coverage", type=float, default=0.9995,
                        help="share of characters the vocabulary covers (1.0 for small "
                             "alphabets, 0.9995 for CJK-rich text)")
    parser.add_argument("--input-sentence-size", type=int, default=2_000_000,
                        help="train on a shuffled sample of at most this many lines")
    parser.add_argument("--byte-fallback", action="store_true",
                        help="spell uncovered characters as UTF-8 byte pieces instead of [UNK]")
    parser.add_argument("--num-threads", type=int, default=None,
                        help="training threads (default: the CPU count)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed")


def run(args: argparse.Namespace) -> int:
    from bert_jax.tokenization.factory import load_tokenizer
    from bert_jax.tokenization.sentencepiece import (
        MODEL_FILE,
        SentencePieceTokenizer,
        train_sentencepiece,
    )

    if os.path.isfile(args.output):
        raise BertJaxError(f"{args.output}: --output must be a directory, found a file")
    prefix = os.path.join(args.output, os.path.splitext(MODEL_FILE)[0])
    report = train_sentencepiece(
        args.input, prefix, args.vocab_size, model_type=args.model_type,
        character_coverage=args.character_coverage, input_sentence_size=args.input_sentence_size,
        num_threads=args.num_threads, byte_fallback=args.byte_fallback, seed=args.seed)
    print(f"read {report.summary()}")
    SentencePieceTokenizer(prefix + ".model").save(args.output)
    tokenizer = load_tokenizer(args.output)
    print(f"wrote {args.output}: {args.model_type} vocabulary of {tokenizer.vocab_size} pieces "
          f"({tokenizer.fingerprint()})")
    return 0


train_tokenizer = types.SimpleNamespace(add_arguments=add_arguments, run=run)
