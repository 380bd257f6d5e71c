"""``bert-jax fill-mask`` and ``bert-jax embed``: their arguments and output. JAX is
imported only when a command runs (``bert_jax.inference``), so ``--help`` stays instant."""

from __future__ import annotations

import json
import os
import sys

import numpy as np

from bert_jax import storage
from bert_jax.errors import BertJaxError
from bert_jax.fileio import atomic_write, check_output_path
from bert_jax.inference import embed, fill_mask, format_fill_mask
from bert_jax.textio import ERROR_MODES, read_text

CHECKPOINT_HELP = ("a bert-jax model directory, pretraining or fine-tuning workdir, step "
                   "directory (WORKDIR/checkpoints/N), or Hugging Face BERT directory")


def _read_texts(args) -> list[str]:
    texts = list(args.text or [])
    if args.input:
        if not storage.exists(args.input):
            raise BertJaxError(f"{args.input}: input file not found")
        text = read_text(args.input, encoding=args.encoding, errors=args.encoding_errors,
                         hint="pass --encoding, or --encoding-errors replace to replace "
                              "undecodable bytes (counted)")
        texts += [line.rstrip("\r") for line in text.split("\n") if line.strip()]
    if not texts:
        raise BertJaxError("no input text: pass --text or --input FILE (one text per line)")
    return texts


def _add_encoding_arguments(p) -> None:
    p.add_argument("--encoding", default="utf-8", help="text encoding of --input")
    p.add_argument("--encoding-errors", choices=ERROR_MODES, default="strict",
                   help="strict: an undecodable byte is an error naming its offset; replace: "
                        "replace it with U+FFFD (the count is reported)")


class FillMask:
    @staticmethod
    def add_arguments(p):
        p.add_argument("checkpoint", help=CHECKPOINT_HELP + "; it needs a masked-LM head")
        p.add_argument("--text", action="append",
                       help="text with the tokenizer's mask token ([MASK] for WordPiece and "
                            "SentencePiece, <mask> for byte-level BPE; repeatable)")
        p.add_argument("--input", help="file with one text per line")
        _add_encoding_arguments(p)
        p.add_argument("--top-k", type=int, default=5,
                       help="candidates printed per mask, most probable first")
        p.add_argument("--json", action="store_true",
                       help="one JSON line per text ({text, masks: [[{token, id, text, "
                            "probability}, ...] per mask]}) instead of the readable lines")

    @staticmethod
    def run(args):
        texts = _read_texts(args)
        for text, masks in zip(texts, fill_mask(args.checkpoint, texts, args.top_k),
                               strict=True):
            print(json.dumps({"text": text, "masks": masks}, ensure_ascii=False) if args.json
                  else format_fill_mask(text, masks))
        return 0


class Embed:
    @staticmethod
    def add_arguments(p):
        p.add_argument("checkpoint", help=CHECKPOINT_HELP)
        p.add_argument("--text", action="append", help="a text (repeatable)")
        p.add_argument("--input", help="file with one text per line")
        _add_encoding_arguments(p)
        p.add_argument("--output", required=True,
                       help="output .npy path (per-token output also writes .lengths.npy)")
        p.add_argument("--layer", default="-1",
                       help="hidden-state index (0 = embeddings, -1 = last), last4 (concat of "
                            "the last four), sum4 (their sum), all (every state stacked) or "
                            "mix:w0,w1,... (weighted sum, embeddings first)")
        p.add_argument("--pooling", default="none", choices=["none", "cls", "mean", "pooled"],
                       help="none: a vector per token; cls: the [CLS] vector; mean: the mean "
                            "over tokens (sentence embeddings); pooled: the pooler's output")
        p.add_argument("--max-length", type=int, default=128,
                       help="tokens per text, [CLS] and [SEP] included (longer texts are cut)")
        p.add_argument("--batch-size", type=int, default=64, help="texts per forward pass")

    @staticmethod
    def run(args):
        for name in ("max_length", "batch_size"):
            if getattr(args, name) < 1:
                raise BertJaxError(f"--{name.replace('_', '-')} {getattr(args, name)}: "
                                   "expected an integer >= 1")
        lengths_path = os.path.splitext(args.output)[0] + ".lengths.npy"
        check_output_path(args.output, directory=False)
        check_output_path(lengths_path, directory=False)
        texts = _read_texts(args)
        vectors, lengths = embed(args.checkpoint, texts, args.layer, args.pooling,
                                 args.max_length, args.batch_size)
        atomic_write(args.output, lambda f: np.save(f, vectors))
        if args.pooling == "none":
            atomic_write(lengths_path, lambda f: np.save(f, lengths))
        print(f"wrote {args.output}: shape {vectors.shape}", file=sys.stderr)
        return 0
