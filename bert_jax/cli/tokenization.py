"""``bert-jax train-tokenizer``: raw text files -> a loadable tokenizer directory (SentencePiece
unigram/BPE, WordPiece ``vocab.txt``, or byte-level BPE ``vocab.json`` + ``merges.txt``)."""

from __future__ import annotations

import argparse
import os
import tempfile
import types

from bert_jax import storage
from bert_jax.errors import BertJaxError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", nargs="+", required=True, metavar="PATH",
                        help="text files or directories (walked recursively), one sentence or "
                             "paragraph per line")
    parser.add_argument("--output", required=True, metavar="DIR",
                        help="tokenizer directory to write (the vocabulary files + "
                             "tokenizer.json)")
    parser.add_argument("--vocab-size", type=int, required=True,
                        help="pieces in the vocabulary, the special tokens included "
                             "(30000 for a large corpus; 2000 for the 0.2 MB demo corpus)")
    parser.add_argument("--model-type", choices=("unigram", "bpe", "wordpiece", "byte-bpe"),
                        default="unigram",
                        help="unigram / bpe: SentencePiece; wordpiece: BERT's vocab.txt; "
                             "byte-bpe: RoBERTa/GPT-2 byte-level BPE")
    parser.add_argument("--lower-case", action=argparse.BooleanOptionalAction, default=True,
                        help="wordpiece: lower-case before counting and encoding (uncased)")
    parser.add_argument("--strip-accents", action=argparse.BooleanOptionalAction, default=None,
                        help="wordpiece: strip accents (default: when lower-casing)")
    parser.add_argument("--min-frequency", type=int, default=2,
                        help="wordpiece / byte-bpe: merge only pairs seen this often")
    parser.add_argument("--limit-alphabet", type=int, default=1000,
                        help="wordpiece: keep the most frequent characters only")
    parser.add_argument("--num-workers", type=int, default=None,
                        help="wordpiece / byte-bpe: processes counting words (default: all "
                             "CPU cores)")
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

    if storage.isfile(args.output):
        raise BertJaxError(f"{args.output}: --output must be a directory, found a file")
    if args.model_type in ("wordpiece", "byte-bpe"):
        return _run_merge_trainer(args)
    storage.check_reachable(args.output)
    # SentencePiece writes its model to a local file: for a gs:// output, into a temporary
    # folder, then saved to the bucket (the tokenizer.json marker last).
    with tempfile.TemporaryDirectory(prefix="bert-jax-spm-") as local:
        folder = local if storage.is_remote(args.output) else args.output
        prefix = os.path.join(folder, os.path.splitext(MODEL_FILE)[0])
        report = train_sentencepiece(
            args.input, prefix, args.vocab_size, model_type=args.model_type,
            character_coverage=args.character_coverage,
            input_sentence_size=args.input_sentence_size, num_threads=args.num_threads,
            byte_fallback=args.byte_fallback, seed=args.seed)
        print(f"read {report.summary()}")
        SentencePieceTokenizer(prefix + ".model").save(args.output)
    tokenizer = load_tokenizer(args.output)
    print(f"wrote {args.output}: {args.model_type} vocabulary of {tokenizer.vocab_size} pieces "
          f"({tokenizer.fingerprint()})")
    return 0


def _run_merge_trainer(args: argparse.Namespace) -> int:
    """WordPiece or byte-level BPE: trained here, parallel over ``--num-workers``."""
    import time

    from bert_jax.tokenization.factory import load_tokenizer

    workers = args.num_workers or os.cpu_count() or 1
    start = time.perf_counter()
    if args.model_type == "wordpiece":
        from bert_jax.tokenization.wordpiece_trainer import train_wordpiece

        tokenizer, report = train_wordpiece(
            args.input, args.vocab_size, do_lower_case=args.lower_case,
            strip_accents=args.strip_accents, min_frequency=args.min_frequency,
            limit_alphabet=args.limit_alphabet, num_workers=workers)
    else:
        from bert_jax.tokenization.bpe import train_bpe

        tokenizer, report = train_bpe(args.input, args.vocab_size,
                                      min_frequency=args.min_frequency, num_workers=workers)
    seconds = time.perf_counter() - start
    print(f"read {report.summary()}")
    print(f"trained in {seconds:.1f} s ({report.bytes / 1e6 / seconds:.2f} MB/s, "
          f"{workers} workers)")
    tokenizer.save(args.output)
    tokenizer = load_tokenizer(args.output)
    if tokenizer.vocab_size < args.vocab_size:
        print(f"note: no pair occurs --min-frequency={args.min_frequency} times any more: "
              f"the vocabulary stopped at {tokenizer.vocab_size} of {args.vocab_size}")
    print(f"wrote {args.output}: {args.model_type} vocabulary of {tokenizer.vocab_size} tokens "
          f"({tokenizer.fingerprint()})")
    return 0


train_tokenizer = types.SimpleNamespace(add_arguments=add_arguments, run=run)
