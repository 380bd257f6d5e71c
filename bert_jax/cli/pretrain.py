"""``bert-jax pretrain --config experiments/pretrain.py:<variant> --workdir DIR
[--config.key=value ...]``: parse, load the locked config, run ``train_and_evaluate``; and
``bert-jax plot-metrics WORKDIR``: a run's curves to a PNG."""

from __future__ import annotations

import argparse

from bert_jax.runs.arguments import (
    add_run_arguments,
    pretrain_summary,
    print_line,
    print_result,
)
from bert_jax.training import plot


class Pretrain:
    accepts_overrides = True

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        add_run_arguments(
            parser, config_example="experiments/pretrain.py:tiny",
            workdir_help="run directory: checkpoints, metrics, config, tokenizer; rerunning "
                         "the same command resumes from it",
            overwrite_help="start afresh: move everything the workdir holds (any kind of "
                           "run) aside to WORKDIR.replaced-N, named in the output; nothing "
                           "is deleted",
            override_examples="--config.data.directory=DATA --config.num_train_steps=1000")

    @staticmethod
    def run(args) -> int:
        from bert_jax import xla_flags
        from bert_jax.training.config import load_config
        from bert_jax.training.loop import train_and_evaluate

        config = load_config(args.config, args.overrides)
        if config.parallel.collective_overlap:
            xla_flags.add(xla_flags.COLLECTIVE_OVERLAP)
        result = train_and_evaluate(config, args.workdir, overwrite=args.overwrite,
                                    exit_follows=getattr(args, "from_command_line", False))
        if args.json:
            print_result({"workdir": args.workdir, **result}, sort_keys=True)
        else:
            print_line(pretrain_summary(args.workdir, result))
        return 0


class PlotMetrics:
    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("workdir", help="pretraining workdir (holds metrics.jsonl)")
        parser.add_argument("--output", default=None,
                            help=f"PNG to write (default: WORKDIR/{plot.PLOT_FILE})")
        parser.add_argument("--baseline-loss", type=float, default=None,
                            help="draw a reference line at this masked-LM loss")
        parser.add_argument("--baseline-accuracy", type=float, default=None,
                            help="draw a reference line at this masked-LM accuracy")

    @staticmethod
    def run(args) -> int:
        baselines = {k: v for k, v in (("mlm_loss", args.baseline_loss),
                                       ("mlm_accuracy", args.baseline_accuracy))
                     if v is not None}
        print(f"wrote {plot.plot_metrics(args.workdir, args.output, baselines=baselines)}")
        return 0
