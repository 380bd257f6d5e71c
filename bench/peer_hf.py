"""The peer: Hugging Face transformers (PyTorch) training steps on the same device.

bf16 autocast, SDPA attention, torch.compile, fused AdamW; BertForPreTraining with its
standard (dense) MLM head and MLM labels on the masked positions only, and
BertForSequenceClassification for fine-tuning. Throughput is reported with FLOPs counted by
``bench.common`` exactly as for bert-jax.

Records go to OUT/peers.jsonl.

  python -m bench peers transformers --model base --seq-len 128 --batch-size 256
"""

from __future__ import annotations

import argparse

from bench.common import (
    MODELS,
    VOCAB,
    add_out_argument,
    masked_positions,
    median_time,
    results_file,
    train_flops_per_sequence,
    write_result,
)


def matmul_peak_tflops(torch, n: int = 8192, iters: int = 20) -> float:
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()

    def run():
        for _ in range(iters):
            a @ b
        torch.cuda.synchronize()

    t, _ = median_time(run, 5)
    return 2 * n ** 3 * iters / t / 1e12


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench peers transformers",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="base", choices=sorted(MODELS))
    ap.add_argument("--task", default="pretrain", choices=["pretrain", "classify"])
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-compile", action="store_true")
    add_out_argument(ap)
    args = ap.parse_args(argv)
    args.out = results_file(args.out, "peers")

    import torch
    import transformers

    torch.backends.cuda.matmul.allow_tf32 = True
    layers, hidden, heads, inter = MODELS[args.model]
    cfg = transformers.BertConfig(vocab_size=VOCAB, hidden_size=hidden,
                                  num_hidden_layers=layers, num_attention_heads=heads,
                                  intermediate_size=inter, max_position_embeddings=512)
    cfg._attn_implementation = "sdpa"
    dev = "cuda"
    if args.task == "pretrain":
        model = transformers.BertForPreTraining(cfg)
    else:
        cfg.num_labels = 2
        model = transformers.BertForSequenceClassification(cfg)
    model.to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=True)
    g = torch.Generator(device="cpu").manual_seed(0)
    b, s = args.batch_size, args.seq_len
    p = masked_positions(s)
    ids = torch.randint(5, VOCAB, (b, s), generator=g).to(dev)
    mask = torch.ones(b, s, dtype=torch.long, device=dev)
    seg = torch.cat([torch.zeros(b, s // 2), torch.ones(b, s - s // 2)], 1).long().to(dev)
    if args.task == "pretrain":
        labels = torch.full((b, s), -100, dtype=torch.long)
        pos = torch.stack([torch.randperm(s - 2, generator=g)[:p] + 1 for _ in range(b)])
        labels.scatter_(1, pos, torch.randint(5, VOCAB, (b, p), generator=g))
        extra = dict(labels=labels.to(dev),
                     next_sentence_label=torch.randint(0, 2, (b,), generator=g).to(dev))
    else:
        extra = dict(labels=torch.randint(0, 2, (b,), generator=g).to(dev))

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, attention_mask=mask, token_type_ids=seg, **extra).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    if not args.no_compile:
        step = torch.compile(step)
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()

    def run():
        for _ in range(args.steps):
            step()
        torch.cuda.synchronize()

    t, times = median_time(run, args.repeats)
    peak = matmul_peak_tflops(torch)
    seq_per_s = b * args.steps / t
    flops = train_flops_per_sequence(layers, hidden, s) if args.task == "pretrain" else \
        train_flops_per_sequence(layers, hidden, s, predictions=0)
    write_result(args.out, {
        "framework": "transformers", "version": transformers.__version__,
        "torch": torch.__version__, "device": torch.cuda.get_device_name(),
        "task": args.task, "model": args.model, "seq_len": s, "batch_size": b,
        "compiled": not args.no_compile, "step_time_s": t / args.steps,
        "seq_per_s": seq_per_s, "tokens_per_s": seq_per_s * s,
        "tflops": seq_per_s * flops / 1e12, "matmul_peak_tflops": peak,
        "mfu": seq_per_s * flops / 1e12 / peak,
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2 ** 30,
        "repeat_times_s": times})


if __name__ == "__main__":
    main()
