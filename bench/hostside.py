"""The host side of a pod: what each TPU VM host must load and deliver for pretraining from
document shards (pairs made in the pipeline), measured on a corpus of at least 1 GB.

    python -m bench hostside replicate --documents DOCS --out BIG --copies 45
        # DOCS: `bert-jax create-pretraining-data --format documents` output; BIG gets
        # COPIES copies of its records (each copy in its own shuffled order, its work units
        # renumbered, so every document is distinct to the loader), one shard per copy
    python -m bench hostside measure --data BIG --points 12,23,45 --out OUT
        # per point (that many copies, a fresh process each): load time, table bytes, peak
        # resident memory, epoch-plan time and bytes at seq 128 and 512; at the largest point
        # the pipeline's batches/s and CPU time per sequence on one core
    python -m bench hostside report OUT/hostside.jsonl --sweep bench/tables/tpu_sweep_lamb.jsonl \
        --docs docs
        # linear fits over the points, extrapolated to BERT's corpus, against each sweep
        # row's per-host rate and the TPU VM host's memory (into docs/tpu.md)

docs/tpu.md ("The host side") has the results.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

# BERT's pretraining corpus (Devlin et al. 2019): BooksCorpus 800 M + English Wikipedia
# 2,500 M words.
BERT_WORDS = 3.3e9
# TPU VM host of a multi-host slice (Google Cloud machine types): vCPUs and memory in GB.
HOSTS = {"v4": ("ct4p-hightpu-4t", 240, 407), "v5p": ("ct5p-hightpu-4t", 208, 448),
         "v5e": ("ct5lp-hightpu-4t", 112, 192), "v6e": ("ct6e-standard-4t", 180, 720)}


def _log(msg: str) -> None:
    print(f"[hostside {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def replicate(documents: str, out: str, copies: int, seed: int = 0) -> dict:
    """``copies`` copies of the document shards in ``documents`` under ``out``, one shard a
    copy: the records (the source's documents, chunked as it was) are encoded once, each copy
    gets its own record order and work unit (its index), so the loader sees distinct
    documents."""
    from bert_jax.data.documents import chunk_document, load_document_table
    from bert_jax.data.example_proto import ExampleEncoder
    from bert_jax.data.metadata import load_metadata
    from bert_jax.data.records import frame

    meta = load_metadata(documents)
    raw = json.load(open(os.path.join(documents, "metadata.json"), encoding="utf-8"))
    table = load_document_table(meta.train_files, meta.vocab_size)
    starts, first = table.sentence_starts, table.document_sentences
    encoder = ExampleEncoder(meta.vocab_size)
    bodies, keys = [], []
    for d in range(table.num_documents):
        sentences = [table.tokens[starts[k]:starts[k + 1]] for k in range(first[d], first[d + 1])]
        for c, chunk in enumerate(chunk_document(sentences, raw["max_record_tokens"])):
            bodies.append(encoder.entry("token_ids", np.concatenate(chunk).tolist())
                          + encoder.entry("sentence_lengths", [len(s) for s in chunk]))
            keys.append((d, c))
    os.makedirs(out, exist_ok=True)
    shards, size = [], 0
    rng = np.random.default_rng(seed)
    for copy in range(copies):
        name = f"train-{copy:05d}-of-{copies:05d}.tfrecord"
        with open(os.path.join(out, name), "wb") as f:
            for i in rng.permutation(len(bodies)):
                body = bodies[i] + encoder.entry("document", (copy, *keys[i]))
                f.write(frame(encoder.example(body)))
        nbytes = os.path.getsize(os.path.join(out, name))
        shards.append({"file": name, "examples": len(bodies), "bytes": nbytes})
        size += nbytes
    raw["splits"] = {"train": {"documents": table.num_documents * copies,
                               "examples": len(bodies) * copies, "shards": shards},
                     "eval": {"documents": 0, "examples": 0, "shards": []}}
    for key in ("bytes", "documents", "sentences", "tokens", "train_documents"):
        raw["input"][key] *= copies
    raw["replicated"] = {"source": os.path.abspath(documents), "copies": copies, "seed": seed,
                         "source_words": _words(raw)}
    with open(os.path.join(out, "metadata.json"), "w", encoding="utf-8") as f:
        json.dump(raw, f, indent=1)
    _log(f"{out}: {copies} copies, {len(bodies) * copies:,} records, {size / 1e9:.2f} GB, "
         f"{raw['input']['bytes'] / 1e9:.2f} GB of source text")
    return raw


def _words(meta: dict) -> int | None:
    """Whitespace-separated words of the source corpus, where its paths are readable."""
    words = 0
    for path in meta["input"].get("paths", []):
        for root, _, names in os.walk(path):
            for n in names:
                with open(os.path.join(root, n), "rb") as f:
                    words += len(f.read().split())
    return words or None


def subset(data: str, copies: int, out: str) -> str:
    """A data directory of the first ``copies`` shards of ``data`` (symlinks)."""
    meta = json.load(open(os.path.join(data, "metadata.json"), encoding="utf-8"))
    total = meta["replicated"]["copies"]
    shards = meta["splits"]["train"]["shards"][:copies]
    os.makedirs(out, exist_ok=True)
    for s in shards:
        link = os.path.join(out, s["file"])
        if not os.path.lexists(link):
            os.symlink(os.path.abspath(os.path.join(data, s["file"])), link)
    meta["splits"]["train"].update(shards=shards, examples=sum(s["examples"] for s in shards),
                                   documents=meta["splits"]["train"]["documents"] * copies
                                   // total)
    for key in ("bytes", "documents", "sentences", "tokens", "train_documents"):
        meta["input"][key] = meta["input"][key] * copies // total
    meta["replicated"]["copies"] = copies
    with open(os.path.join(out, "metadata.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=1)
    return out


def _rss() -> tuple[int, int]:
    """(current, peak) resident bytes of this process."""
    status = open("/proc/self/status", encoding="ascii").read().split("\n")
    field = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in status
             if line.startswith(("VmRSS", "VmHWM"))}
    return field["VmRSS"], field["VmHWM"]


def point(data: str, rate: bool, steps: int = 60, batch: int = 256) -> dict:
    """One process's measurement of ``data`` (a fresh process: the peak is this point's;
    memory is counted from before the load, so tensorflow's runtime, loaded with it, is part
    of every point: the fits' constant)."""
    from bert_jax.data.documents import load_document_table
    from bert_jax.data.metadata import load_metadata
    from bert_jax.data.pairing import make_plan

    meta = load_metadata(data)
    files, _ = meta.files("train")
    raw = json.load(open(os.path.join(data, "metadata.json"), encoding="utf-8"))
    base, _ = _rss()
    start = time.perf_counter()
    table = load_document_table(files, meta.vocab_size)
    load_s = time.perf_counter() - start
    after, peak = _rss()
    table_bytes = sum(a.nbytes for a in (table.tokens, table.sentence_starts,
                                         table.document_sentences))
    words = raw["replicated"].get("source_words")
    out = {"copies": raw["replicated"]["copies"], "text_bytes": raw["input"]["bytes"],
           "words": words * raw["replicated"]["copies"] if words else None,
           "tokens": int(table.tokens.size), "sentences": table.num_sentences,
           "documents": table.num_documents, "shard_bytes": sum(os.path.getsize(f) for f in files),
           "load_seconds": round(load_s, 2), "table_bytes": table_bytes,
           "rss_after_load": after - base, "peak_rss_load": peak - base, "plans": {}}
    for seq in (128, 512):
        start = time.perf_counter()
        plan = make_plan(table, "nsp", seq, 0.1, np.random.default_rng([1, 0, 0]))
        order = np.random.default_rng([1, 0, 1]).permutation(plan.num_examples)
        seconds = time.perf_counter() - start
        nbytes = order.nbytes + sum(getattr(plan, k).nbytes for k in (
            "piece_lo", "piece_hi", "piece_segment", "example_pieces", "labels", "target",
            "document"))
        out["plans"][str(seq)] = {"seconds": round(seconds, 2), "bytes": nbytes,
                             "examples": plan.num_examples}
        del plan, order
    out["peak_rss"] = _rss()[1] - base
    del table
    if rate:
        out["pipeline"] = []
        for seq in (128, 512):
            out["pipeline"].append(pipeline_rate(data, seq, batch, steps, base))
    return out


def pipeline_rate(data: str, seq: int, batch: int, steps: int, base: int = 0) -> dict:
    """Masked NSP batches from document shards, as one host of 16 reads them: sequences/s and
    CPU time per sequence after the first epoch's plan is built, and the resident bytes above
    ``base`` while it runs (its table, the layout's TF copy of the tokens, the plans)."""
    from bert_jax.data.mask_settings import MaskSettings
    from bert_jax.data.pipeline import PretrainingIterator

    start = time.perf_counter()
    it = PretrainingIterator.from_data_dir(
        data, per_host_batch_size=batch, max_predictions_per_seq=20 if seq == 128 else 80,
        mask=MaskSettings(), seq_len=seq, pairing="nsp", process_index=3, process_count=16)
    next(it)
    first = time.perf_counter() - start
    for _ in range(10):
        next(it)
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        next(it)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    return {"seq_len": seq, "batch": batch, "cores": len(os.sched_getaffinity(0)),
            "first_batch_seconds": round(first, 1),
            "sequences_per_s": round(steps * batch / wall),
            "cpu_us_per_sequence": round(cpu / (steps * batch) * 1e6, 2),
            "rss": _rss()[0] - base}


def measure(args) -> int:
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "hostside.jsonl")
    points = [int(p) for p in args.points.split(",")]
    for i, copies in enumerate(points):
        data = subset(args.data, copies, os.path.join(args.work, f"copies{copies}"))
        cmd = [sys.executable, "-m", "bench", "hostside", "point", "--data", data,
               *(["--rate"] if i == len(points) - 1 else [])]
        if args.one_core:
            cmd = ["taskset", "-c", "0", *cmd]
        _log(f"{copies} copies: {' '.join(cmd)}")
        result = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if result.returncode:
            sys.stderr.write(result.stderr[-3000:])
            return result.returncode
        rec = json.loads(result.stdout.strip().splitlines()[-1])
        rec["time"] = time.strftime("%Y-%m-%dT%H:%M:%S")
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(rec) + "\n")
        _log(json.dumps(rec))
    return 0


def fit(xs, ys) -> tuple[float, float, float]:
    """Least-squares line y = a x + b and the largest relative residual over the points."""
    a, b = np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)
    resid = max((abs(a * x + b - y) / abs(y) for x, y in zip(xs, ys, strict=True) if y),
                default=0.0)
    return float(a), float(b), float(resid)


def extrapolate(points: list[dict], tokens: float) -> dict[str, tuple[float, float]]:
    """Each measured quantity at ``tokens`` from the line through the points, with the fit's
    largest relative residual."""
    xs = [p["tokens"] for p in points]
    quantities = {
        "load_seconds": lambda p: p["load_seconds"], "table_bytes": lambda p: p["table_bytes"],
        "rss_after_load": lambda p: p["rss_after_load"], "peak_rss": lambda p: p["peak_rss"],
        "plan128_seconds": lambda p: p["plans"]["128"]["seconds"],
        "plan128_bytes": lambda p: p["plans"]["128"]["bytes"],
        "plan128_examples": lambda p: p["plans"]["128"]["examples"],
        "plan512_seconds": lambda p: p["plans"]["512"]["seconds"],
        "plan512_bytes": lambda p: p["plans"]["512"]["bytes"],
        "plan512_examples": lambda p: p["plans"]["512"]["examples"],
        "shard_bytes": lambda p: p["shard_bytes"]}
    out = {}
    for name, get in quantities.items():
        a, b, resid = fit(xs, [get(p) for p in points])
        out[name] = (a * tokens + b, resid)
    return out


def report(records: str, sweep: str, docs: str | None = None, cached_epochs: int = 4) -> int:
    """Markdown: the measured points, BERT's corpus extrapolated, and each sweep row's
    per-host need against the TPU VM host, into ``docs``/tpu.md between its hostside markers
    where given. ``cached_epochs``: epoch plans a host holds (the pipeline's three cached
    epochs and the next one drawn ahead)."""
    from bert_jax.tpu.topologies import parse_slice

    rows = [json.loads(line) for line in open(records, encoding="utf-8") if line.strip()]
    points = sorted(rows, key=lambda r: r["tokens"])
    rate = next(r["pipeline"] for r in reversed(rows) if "pipeline" in r)
    words = points[-1].get("words")
    tokens_per_word = points[-1]["tokens"] / words if words else None
    out = ["| source text | tokens | shards | load | table | RSS after load | peak RSS "
           "| epoch plan, seq 128 | epoch plan, seq 512 |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in points:
        p1, p5 = r["plans"]["128"], r["plans"]["512"]
        out.append(f"| {r['text_bytes'] / 1e9:.2f} GB | {r['tokens'] / 1e6:.0f} M | "
                   f"{r['shard_bytes'] / 1e9:.2f} GB | {r['load_seconds']:.1f} s | "
                   f"{r['table_bytes'] / 1e9:.2f} GB | {r['rss_after_load'] / 1e9:.2f} GB | "
                   f"{r['peak_rss'] / 1e9:.2f} GB | {p1['seconds']:.1f} s, "
                   f"{p1['bytes'] / 1e9:.2f} GB | {p5['seconds']:.1f} s, "
                   f"{p5['bytes'] / 1e9:.2f} GB |")
    bert_tokens = BERT_WORDS * tokens_per_word if tokens_per_word else None
    if bert_tokens:
        big = extrapolate(points, bert_tokens)
        plans = big["plan128_bytes"][0] * cached_epochs
        need = big["rss_after_load"][0] + plans
        out += ["", f"BERT's corpus, {BERT_WORDS / 1e9:.1f} B words = "
                f"{bert_tokens / 1e9:.2f} B tokens at this corpus's {tokens_per_word:.3f} "
                "tokens a word, from the line through the points (largest residual in "
                "brackets):", "",
                "| per host | BERT's corpus |", "|---|---:|"]
        for label, key, unit, scale in (
                ("shards to read", "shard_bytes", "GB", 1e9),
                ("load (parse, sort; 2 cores)", "load_seconds", "s", 1),
                ("document table", "table_bytes", "GB", 1e9),
                ("resident after the load", "rss_after_load", "GB", 1e9),
                ("peak resident during the load", "peak_rss", "GB", 1e9),
                ("draw one epoch, seq 128", "plan128_seconds", "s", 1),
                ("one epoch's plan, seq 128", "plan128_bytes", "GB", 1e9),
                ("examples an epoch, seq 128", "plan128_examples", "M", 1e6),
                ("draw one epoch, seq 512", "plan512_seconds", "s", 1),
                ("examples an epoch, seq 512", "plan512_examples", "M", 1e6)):
            value, resid = big[key]
            out.append(f"| {label} | {value / scale:,.1f} {unit} ({100 * resid:.0f}%) |")
        out.append(f"| resident after the load, with {cached_epochs} epoch plans (seq 128) | "
                   f"{need / 1e9:,.1f} GB |")
        running = next((p for p in rate if p["seq_len"] == 128 and "rss" in p), None)
        if running:  # one point: scaled by tokens (its parts, table, copy and plans, are)
            per_token = running["rss"] / points[-1]["tokens"]
            out.append(f"| resident while the pipeline runs, seq 128 "
                       f"({running['rss'] / 1e9:.2f} GB at the largest point, scaled by tokens) "
                       f"| {per_token * bert_tokens / 1e9:,.1f} GB |")
    per_core = {p["seq_len"]: 1e6 / p["cpu_us_per_sequence"] for p in rate}
    out += ["", "| sweep row | slice | hosts | predicted seq/s | per host | host cores at "
            "the measured CPU time | TPU VM host (vCPUs, GB) | epoch (s) |",
            "|---|---|---:|---:|---:|---:|---|---:|"]
    for line in open(sweep, encoding="utf-8"):
        row = json.loads(line)
        if not row.get("compiled"):
            continue
        sl = parse_slice(row["slice"], row.get("num_slices", 1))
        per_host = row["sequences_per_second"] / sl.hosts
        cores = per_host / per_core[row["seq_len"]]
        machine, vcpus, gb = HOSTS[sl.chip.name]
        epoch = ""
        if bert_tokens:
            examples = big[f"plan{row['seq_len']}_examples"][0]
            epoch = f"{examples / row['sequences_per_second']:,.0f}"
        out.append(f"| {row['label']} | {row['slice']}"
                   f"{f' x {sl.num_slices}' if sl.num_slices > 1 else ''} | {sl.hosts} | "
                   f"{row['sequences_per_second']:,.0f} | {per_host:,.0f} | {cores:.2f} | "
                   f"{machine} ({vcpus}, {gb}) | {epoch} |")
    section = "\n".join(out) + "\n"
    print(section)
    if docs:
        path = os.path.join(docs, "tpu.md")
        doc = open(path, encoding="utf-8").read()
        begin, end = "<!-- hostside:begin -->\n", "<!-- hostside:end -->"
        if begin in doc and end in doc:
            doc = doc[:doc.index(begin) + len(begin)] + section + doc[doc.index(end):]
            with open(path, "w", encoding="utf-8") as f:
                f.write(doc)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench hostside", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("replicate")
    r.add_argument("--documents", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--copies", type=int, default=45)
    m = sub.add_parser("measure")
    m.add_argument("--data", required=True)
    m.add_argument("--points", default="12,23,45")
    m.add_argument("--work", default="hostside_work")
    m.add_argument("--out", required=True)
    m.add_argument("--one-core", action="store_true", help="taskset -c 0 for every point")
    q = sub.add_parser("point")
    q.add_argument("--data", required=True)
    q.add_argument("--rate", action="store_true")
    s = sub.add_parser("report")
    s.add_argument("records")
    s.add_argument("--sweep", default="bench/tables/tpu_sweep_lamb.jsonl")
    s.add_argument("--docs", help="the docs folder: the tables go into its tpu.md")
    args = p.parse_args(argv)
    if args.command == "replicate":
        replicate(args.documents, args.out, args.copies)
        return 0
    if args.command == "measure":
        return measure(args)
    if args.command == "point":
        print(json.dumps(point(args.data, args.rate)))
        return 0
    return report(args.records, args.sweep, args.docs)


if __name__ == "__main__":
    raise SystemExit(main())
