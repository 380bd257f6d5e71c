"""Benchmark: the masking pipeline and the raw TFRecord reader on the same pretraining data,
from local disk and from a bucket, in one run.

    STORAGE_EMULATOR_HOST=http://127.0.0.1:PORT \\
        python -m bench bucket --data-dir DATA --remote gs://BUCKET/data --out OUT

``--data-dir`` is a local ``create-pretraining-data`` directory (pairs); it is copied to
``--remote`` first (any existing copy there is replaced). Prints one JSON object and appends it
to OUT/bucket.jsonl: sequences/s of the pipeline, and records/s and MB/s of the storage
layer's TFRecord reader alone (``bert_jax.data.records.iter_records``, framing and CRC32C
included), for each side, and the pipeline's ratio.
"""

from __future__ import annotations

import argparse
import time

from bench.common import add_out_argument, results_file, write_result


def read_rate(files: list[str]) -> dict:
    from bert_jax import storage
    from bert_jax.data import records

    start = time.perf_counter()
    count = sum(1 for f in files for _ in records.iter_records(f))
    seconds = time.perf_counter() - start
    size = sum(storage.getsize(f) for f in files)
    return {"records_per_s": round(count / seconds), "mb_per_s": round(size / 1e6 / seconds, 1),
            "records": count}


def main(argv: list[str] | None = None) -> int:
    from bench.data import bench_pipeline
    from bert_jax import fileio
    from bert_jax.data.metadata import load_metadata

    parser = argparse.ArgumentParser(prog="python -m bench bucket", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", required=True, help="local pretraining data (pairs)")
    parser.add_argument("--remote", required=True, help="gs:// prefix to copy it to")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=2)
    add_out_argument(parser)
    args = parser.parse_args(argv)
    fileio.publish_directory(args.data_dir, args.remote, marker="metadata.json")
    result = {"batch": args.batch, "steps": args.steps}
    for side, directory in (("local", args.data_dir), ("bucket", args.remote)):
        files = load_metadata(directory).train_files
        reads = [read_rate(files) for _ in range(args.repeats)]
        pipes = [bench_pipeline(directory, args.batch, 20, args.steps, 5)
                 for _ in range(args.repeats)]
        result[side] = {"reader": max(reads, key=lambda r: r["records_per_s"]),
                        "pipeline_sequences_per_s": max(p["sequences_per_s"] for p in pipes)}
    result["pipeline_bucket_over_local"] = round(
        result["bucket"]["pipeline_sequences_per_s"] / result["local"]["pipeline_sequences_per_s"],
        3)
    write_result(results_file(args.out, "bucket"), result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
