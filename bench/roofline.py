"""How fast can a pretraining step be? A floor for each workload from its FLOPs and bytes.

The step time cannot be shorter than its matmul FLOPs at the measured bf16 matmul peak plus the
bytes its memory-bound passes must move at the HBM bandwidth (no overlap of the two: XLA
runs one kernel at a time on one stream). This prints that floor for two decompositions of
the step, the rate and MFU it allows, and, given the peer's measured rate, the MFU that a
target ratio (``--ratio``, default 1.5x) requires:

* ``kernels``: the passes bert-jax's step runs today (``python -m bench profile`` lists them):
  the q/k/v bias add, two fused LayerNorms each way per layer, the residual-gradient sums,
  the GELU forward and backward, the MLM softmax, the optimizer;
* ``epilogues``: the same with every pass a GEMM epilogue could absorb removed (the q/k/v
  bias, the residual-gradient sums as a GEMM addend, the GELU's round trips of the
  pre-activation and its gradient): the floor of a step built on custom fused GEMMs.

Both floors are optimistic: every GEMM at the square-matmul peak, every pass at the full
bandwidth, attention (with its backward recomputation) at the matmul peak. ``--attention-ms``
replaces the last with a measured time (attention forward + backward per layer, e.g. from
``python -m bench kernels --kernel attention``): the floor with the fastest attention kernel
there is instead of one that does not exist.

    python -m bench roofline --peak 733 --bandwidth 3.35 \\
        [--peer base:128:256=3862 --peer large:512:32=316 ...] \\
        [--attention-ms large:128:256=0.581 ...] [--json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os

from bench.common import (
    MODELS,
    add_out_argument,
    masked_positions,
    results_file,
    train_flops_per_sequence,
)
from bert_jax.config import BertConfig, get_preset  # plain dataclasses, no jax

BF16, F32 = 2, 4


@dataclasses.dataclass
class Pass:
    name: str
    bytes: float  # as bert-jax's kernels run it
    epilogue_bytes: float  # what is left when GEMM epilogues (or addends) absorb what they can


def param_count(cfg: BertConfig) -> int:
    """Parameters of BertForPreTraining for ``cfg`` (tied decoder; the padded vocabulary rows
    of the embedding table and the decoder bias included)."""
    hidden, ffn, vocab = cfg.hidden_size, cfg.intermediate_size, cfg.padded_vocab_size
    norm = 2 * hidden  # LayerNorm scale and bias
    per_layer = 4 * hidden * hidden + 4 * hidden + 2 * hidden * ffn + ffn + hidden + 2 * norm
    tables = (vocab + cfg.max_position_embeddings + cfg.type_vocab_size) * hidden
    mlm = hidden * hidden + hidden + norm + vocab  # transform, its LayerNorm, decoder bias
    pooler_nsp = hidden * hidden + hidden + 2 * hidden + 2
    return cfg.num_hidden_layers * per_layer + tables + norm + mlm + pooler_nsp


def passes(model: str, seq_len: int, batch: int) -> list[Pass]:
    """The memory-bound passes of one pretraining step and the bytes each moves at least."""
    layers, hidden, _, ffn = MODELS[model]
    tokens = batch * seq_len
    preds = batch * masked_positions(seq_len)
    act = tokens * hidden * BF16  # one [tokens, hidden] bf16 array
    wide = tokens * ffn * BF16  # one [tokens, ffn] bf16 array
    cfg = get_preset(model)
    n = param_count(cfg)
    mlm = preds * cfg.padded_vocab_size * (4 * F32 + 2 * BF16)
    optimizer = n * (6 * F32 + 2 * F32)
    return [
        # read the projection output, write it back with the bias (an epilogue: nothing)
        Pass("q/k/v bias add (forward)", layers * 2 * 3 * act, 0.0),
        # per layer two LayerNorms: forward reads residual and y, writes the output;
        # backward reads the output gradient, residual and y, writes two input gradients
        Pass("fused LayerNorm forward", layers * 2 * 3 * act, layers * 2 * 3 * act),
        Pass("fused LayerNorm backward", layers * 2 * 5 * act, layers * 2 * 5 * act),
        # the residual gradient plus the matmul's input gradient: read two, write one (a GEMM
        # addend: nothing)
        Pass("residual-gradient sums", (2 * layers - 1) * 3 * act, 0.0),
        # forward reads h (bias added on the way), writes gelu(h); in an epilogue the GEMM
        # writes h (saved for the backward pass) and gelu(h) instead
        Pass("GELU forward", layers * 2 * wide, layers * 1 * wide),
        # backward reads the gradient and h, writes the pre-activation gradient; in the
        # epilogue of the gradient's GEMM only the read of h is left
        Pass("GELU backward", layers * 3 * wide, layers * 1 * wide),
        # f32 logits written, read for the max and the sum; backward reads them, writes bf16
        # gradients, the bias gradient reads those again
        Pass("MLM softmax and its gradient", mlm, mlm),
        # AdamW: f32 parameter, two moments read and written, the f32 gradient read twice
        # (global norm, update)
        Pass("optimizer (AdamW, gradient norm)", optimizer, optimizer),
    ]


def attention_flops_per_sequence(model: str, seq_len: int) -> float:
    """Attention's matmul FLOPs in one step (all layers): the counted 12 s^2 H per layer plus
    the flash backward's recomputation."""
    layers, hidden, _, _ = MODELS[model]
    return 12 * layers * seq_len ** 2 * hidden + extra_flops_per_sequence(model, seq_len)


def extra_flops_per_sequence(model: str, seq_len: int) -> float:
    """Matmul FLOPs the step runs beyond the counted ones: the flash backward recomputes
    Q K^T once (one kernel, length <= 128) or, split in two kernels, Q K^T twice and dO V^T
    once more (longer sequences)."""
    layers, hidden, _, _ = MODELS[model]
    recomputed = 1 if seq_len <= 128 else 3
    return layers * recomputed * 2 * seq_len ** 2 * hidden


def floor(model: str, seq_len: int, batch: int, peak_tflops: float, bandwidth_tbs: float,
          epilogues: bool = False, attention_ms: float | None = None) -> dict:
    """The floor of one step: times in ms, the rate in sequences/s, MFU (counted FLOPs over
    the peak, the benchmark's definition). ``attention_ms``: attention's measured forward +
    backward per layer, in place of its FLOPs at the peak."""
    layers, hidden, _, _ = MODELS[model]
    counted = batch * train_flops_per_sequence(layers, hidden, seq_len)
    flops = counted + batch * extra_flops_per_sequence(model, seq_len)
    matmul_ms = flops / (peak_tflops * 1e12) * 1e3
    if attention_ms is not None:  # the measured time instead of attention's FLOPs at the peak
        attention_at_peak_ms = (batch * attention_flops_per_sequence(model, seq_len)
                                / (peak_tflops * 1e12) * 1e3)
        matmul_ms += layers * attention_ms - attention_at_peak_ms
    per_pass = {p.name: (p.epilogue_bytes if epilogues else p.bytes) / (bandwidth_tbs * 1e12)
                * 1e3 for p in passes(model, seq_len, batch)}
    memory_ms = sum(per_pass.values())
    step_ms = matmul_ms + memory_ms
    return {"model": model, "seq_len": seq_len, "batch_size": batch,
            "floor": "epilogues" if epilogues else "kernels", "attention_ms": attention_ms,
            "matmul_ms": matmul_ms, "memory_ms": memory_ms, "step_ms": step_ms,
            "seq_per_s": batch / step_ms * 1e3,
            "mfu": counted / (peak_tflops * 1e12) / (step_ms / 1e3),
            "passes_ms": per_pass}


def required_mfu(model: str, seq_len: int, rate: float, peak_tflops: float) -> float:
    """The MFU a step running ``rate`` sequences/s has (the benchmark's FLOP count)."""
    layers, hidden, _, _ = MODELS[model]
    return rate * train_flops_per_sequence(layers, hidden, seq_len) / (peak_tflops * 1e12)


def parse_spec(spec: str, option: str = "--peer",
               unit: str = "SEQ_PER_S") -> tuple[str, int, int, float]:
    """``MODEL:SEQ:BATCH=VALUE`` -> (model, seq, batch, value)."""
    try:
        shape, value = spec.split("=")
        model, seq, batch = shape.split(":")
        if model not in MODELS:
            raise ValueError(model)
        return model, int(seq), int(batch), float(value)
    except ValueError:
        raise SystemExit(f"{option} {spec!r}: expected MODEL:SEQ:BATCH={unit} with MODEL one "
                         f"of {sorted(MODELS)}") from None


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(prog="python -m bench roofline",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--peak", type=float, default=733.0,
                    help="bf16 matmul peak in TFLOP/s (the benchmark's measured value)")
    ap.add_argument("--bandwidth", type=float, default=3.35, help="HBM bandwidth in TB/s")
    ap.add_argument("--peer", action="append", default=[],
                    help="MODEL:SEQ:BATCH=SEQ_PER_S, the peer's measured rate (repeatable)")
    ap.add_argument("--attention-ms", action="append", default=[],
                    help="MODEL:SEQ:BATCH=MS, attention forward + backward per layer as "
                         "measured, in place of its FLOPs at the peak (repeatable)")
    ap.add_argument("--ratio", type=float, default=1.5, help="the target ratio over the peer")
    ap.add_argument("--workloads", default="base:128:256,large:128:256,large:512:32")
    ap.add_argument("--json", action="store_true",
                    help="print JSON lines instead of a table")
    add_out_argument(ap)
    args = ap.parse_args(argv)
    args.out = results_file(args.out, "roofline")
    peers = {(m, s, b): r for m, s, b, r in map(parse_spec, args.peer)}
    attention = {(m, s, b): ms for m, s, b, ms in
                 (parse_spec(a, "--attention-ms", "MS") for a in args.attention_ms)}
    rows = []
    for spec in args.workloads.split(","):
        model, seq, batch = spec.split(":")
        seq, batch = int(seq), int(batch)
        for epilogues in (False, True):
            row = floor(model, seq, batch, args.peak, args.bandwidth, epilogues,
                        attention.get((model, seq, batch)))
            peer = peers.get((model, seq, batch))
            if peer is not None:
                row["peer_seq_per_s"] = peer
                row["target_seq_per_s"] = args.ratio * peer
                row["target_mfu"] = required_mfu(model, seq, args.ratio * peer, args.peak)
                row["max_ratio"] = row["seq_per_s"] / peer
            rows.append(row)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "a", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps({"task": "roofline", "peak_tflops": args.peak,
                                "bandwidth_tb_per_s": args.bandwidth, **row}) + "\n")
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return rows
    print(f"peak {args.peak:g} TFLOP/s, bandwidth {args.bandwidth:g} TB/s\n")
    print("| workload | floor | attention | matmuls ms | passes ms | step ms | max seq/s "
          f"| max MFU | peer seq/s | {args.ratio:g}x needs | {args.ratio:g}x MFU | max ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        peer = (f"{r['peer_seq_per_s']:,.0f} | {r['target_seq_per_s']:,.0f} | "
                f"{r['target_mfu']:.1%} | {r['max_ratio']:.2f}x" if "peer_seq_per_s" in r
                else "— | — | — | —")
        attn = "at the peak" if r["attention_ms"] is None else f"{r['attention_ms']:g} ms/layer"
        print(f"| {r['model']}/{r['seq_len']} b{r['batch_size']} | {r['floor']} | {attn} | "
              f"{r['matmul_ms']:.1f} | {r['memory_ms']:.1f} | {r['step_ms']:.1f} | "
              f"{r['seq_per_s']:,.0f} | {r['mfu']:.1%} | {peer} |")
    return rows


if __name__ == "__main__":
    main()
