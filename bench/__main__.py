"""``python -m bench <suite> [mode] [options]``: dispatches to the suite's module ``main``."""

from __future__ import annotations

import importlib
import sys

# suite -> (what it measures, module) or (what it measures, {mode: (what, module)})
SUITES: dict[str, tuple[str, str | dict[str, tuple[str, str]]]] = {
    "step": ("training-step throughput, MFU and memory of bert-jax's engine", {
        "pretrain": ("pretraining step (MLM + NSP)", "bench.pretrain"),
        "finetune": ("sequence-classification fine-tuning step", "bench.finetune"),
        "loop": ("the real pretraining loop against the step", "bench.loop"),
    }),
    "peers": ("the same steps in other frameworks on the same device", {
        "transformers": ("Hugging Face transformers (PyTorch) pretrain / classify step",
                         "bench.peer_hf"),
        "flax": ("a plain, untuned Flax pretraining step", "bench.plain_flax"),
    }),
    "kernels": ("one Pallas kernel (attention, norm, gelu, xent) against XLA", "bench.kernels"),
    "scaling": ("multi-device scaling and collectives", {
        "run": ("data-parallel efficiency and FSDP memory on 1, 2, 4, ... devices",
                "bench.scaling"),
        "collectives": ("the collectives of the compiled step (and their overlap)",
                        "bench.collectives"),
    }),
    "profile": ("a profiler trace of one step, per kernel and category", "bench.profile_step"),
    "roofline": ("the FLOP + byte floor of a step and the MFU a target needs", "bench.roofline"),
    "quality": ("training quality against transformers, end-to-end reports", {
        "finetune": ("GLUE / CoNLL / SQuAD fine-tuning, bert-jax and transformers",
                     "bench.quality_finetune"),
        "peer": ("the transformers side of one fine-tuning run", "bench.peer_finetune_hf"),
        "squad": ("SQuAD from the CLI against transformers over seeds, held-out articles",
                  "bench.quality_squad"),
        "e2e": ("tables and plots of the end-to-end run (docs/results.md)",
                "bench.e2e_report"),
        "demo": ("the demo's pretraining repeated by transformers on the same batches",
                 "bench.demo_peer"),
    }),
    "packing": ("effective tokens/s of the pretraining and fine-tuning steps, packed rows "
                "against one example a row", "bench.packing"),
    "data": ("pretraining-data creation and masking pipeline rates", "bench.data"),
    "hostside": ("a pod host's document table, epoch plans and pipeline rate on a >= 1 GB "
                 "corpus", "bench.hostside"),
    "bucket": ("the masking pipeline and TFRecord reader from a bucket against local disk",
               "bench.bucket"),
    "tokenizer": ("WordPiece tokenizer throughput", "bench.tokenizer"),
    "summary": ("markdown tables from the JSON lines of the other suites", "bench.summarize"),
    "fp8": ("FP8 matmuls (model.fp8) against bf16 and transformers; MLM accuracy at equal "
            "steps", "bench.fp8"),
    "variants": ("BERT, RoBERTa, SpanBERT, ERNIE, ELECTRA, ALBERT, DistilBERT at equal tokens: "
                 "pretrain, fine-tune on GLUE, compare", "bench.variants"),
}


def usage(suite: str | None = None) -> str:
    if suite is None:
        lines = ["usage: python -m bench <suite> [mode] [--out DIR] [options]", "",
                 "suites:"]
        for name, (what, modes) in SUITES.items():
            lines.append(f"  {name:<10} {what}")
            if isinstance(modes, dict):
                lines.append(f"  {'':<10}   modes: {', '.join(modes)}")
        lines += ["", "python -m bench <suite> [mode] --help: the suite's options"]
        return "\n".join(lines)
    what, modes = SUITES[suite]
    lines = [f"usage: python -m bench {suite} <mode> [options]", "", what, "", "modes:"]
    lines += [f"  {m:<13} {text}" for m, (text, _) in modes.items()]
    lines += ["", f"python -m bench {suite} <mode> --help: the mode's options"]
    return "\n".join(lines)


def resolve(argv: list[str]) -> tuple[str, list[str]]:
    """(module name, the module's argv) for ``argv`` = [suite, [mode], options...]; exits
    with a usage message (status 2) on an unknown suite or mode, 0 on --help."""
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        raise SystemExit(0 if argv else 2)
    suite, rest = argv[0], argv[1:]
    if suite not in SUITES:
        print(f"error: unknown suite {suite!r}; choose one of {', '.join(SUITES)}",
              file=sys.stderr)
        raise SystemExit(2)
    modes = SUITES[suite][1]
    if isinstance(modes, str):
        return modes, rest
    if not rest or rest[0] in ("-h", "--help"):
        print(usage(suite))
        raise SystemExit(0 if rest else 2)
    if rest[0] not in modes:
        print(f"error: unknown mode {rest[0]!r} of suite {suite!r}; choose one of "
              f"{', '.join(modes)}", file=sys.stderr)
        raise SystemExit(2)
    return modes[rest[0]][1], rest[1:]


def main(argv: list[str] | None = None) -> int:
    module, rest = resolve(list(sys.argv[1:] if argv is None else argv))
    result = importlib.import_module(module).main(rest)
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
