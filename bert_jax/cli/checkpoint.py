"""``bert-jax convert`` (Hugging Face / Google TF -> bert-jax model directory) and
``bert-jax export`` (any bert-jax checkpoint -> Hugging Face directory)."""

from __future__ import annotations

import argparse

from bert_jax import storage
from bert_jax.checkpoint.convert import convert_checkpoint, export_checkpoint
from bert_jax.checkpoint.families import ARCHITECTURE_FAMILY


class Convert:
    @staticmethod
    def add_arguments(p: argparse.ArgumentParser) -> None:
        p.add_argument("source", help="Hugging Face model directory, or Google checkpoint "
                                      "directory / prefix (DIR/bert_model.ckpt)")
        p.add_argument("--from", dest="source_format", choices=["hf", "google", "auto"],
                       default="auto", help="source format (default: detect from the files)")
        p.add_argument("--output", required=True, help="bert-jax model directory to write")
        p.add_argument("--scan-layers", action="store_true",
                       help="store the layers stacked for nn.scan (default: unrolled)")

    @staticmethod
    def run(args: argparse.Namespace) -> int:
        report = convert_checkpoint(args.source, args.output, args.source_format,
                                    args.scan_layers)
        print(report)
        print(f"wrote bert-jax model directory {storage.abspath(args.output)}")
        return 0


class Export:
    @staticmethod
    def add_arguments(p: argparse.ArgumentParser) -> None:
        p.add_argument("checkpoint", help="bert-jax model directory, pretraining or "
                                          "fine-tuning workdir, step directory, or Hugging "
                                          "Face directory")
        p.add_argument("--output", required=True,
                       help="directory to write: config.json, model.safetensors and the "
                            "tokenizer (AutoTokenizer loads it)")
        p.add_argument("--format", choices=["hf"], default="hf", help="output format")
        p.add_argument("--architecture", choices=sorted(ARCHITECTURE_FAMILY),
                       help="Hugging Face class to export as (default: the fine-tuned "
                            "task's class, else the one the heads present fill)")

    @staticmethod
    def run(args: argparse.Namespace) -> int:
        from bert_jax.finetuning.export import checkpoint_task

        report = export_checkpoint(args.checkpoint, args.output, args.architecture,
                                   task_of=checkpoint_task)
        print(report)
        print(f"wrote Hugging Face directory {storage.abspath(args.output)}")
        return 0
