"""``bert-jax finetune | evaluate | predict``: argument parsing and output for the CLI.

Parsing imports nothing heavy (``--help`` runs without JAX); each ``run`` imports the work."""

from __future__ import annotations

import argparse
import json

from bert_jax.runs.arguments import (
    add_run_arguments,
    finetune_summary,
    print_line,
    print_result,
)
from bert_jax.tasks.data_root import DATA_ENV

# The experiment files and their variants (in experiments/ of a clone; --config takes the
# path). tests/test_cli_help.py checks this list against the files.
EXPERIMENTS_HELP = """\
Experiments (--config FILE:VARIANT; append _quick to a variant for a CPU smoke run):
  experiments/glue.py     cola sst2 mrpc stsb qqp mnli qnli rte wnli
  experiments/squad.py    v1 v2 (SQuAD v1.1, v2.0)
  experiments/ner.py      conll2003
  experiments/swag.py     swag
  experiments/custom.py   classification pair_classification regression tagging: your own
                          CSV / TSV / JSON-lines files, e.g. --config.train_file=news.csv
                          --config.text_column=title --config.label_column=topic
Data: GLUE, SQuAD and CoNLL-2003 can come from tensorflow-datasets (--config.tfds=true,
plus --config.tfds_download=true to fetch them where there is internet)."""


class Finetune:
    accepts_overrides = True

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        add_run_arguments(
            parser, config_example="experiments/glue.py:mrpc",
            workdir_help="output: best model (config.json, params/, tokenizer/), metrics.json",
            overwrite_help="start afresh: move everything the workdir holds (any kind of "
                           "run) aside to WORKDIR.replaced-N, named in the output; nothing "
                           "is deleted",
            override_examples="--config.init_checkpoint=PATH --config.data_dir=glue_data/MRPC "
                              "--config.optimizer.learning_rate=3e-5",
            epilog_note=f"The data root defaults to ${DATA_ENV} (GLUE tasks under "
                        f"${DATA_ENV}/glue/<TASK>/).")
        parser.epilog += "\n\n" + EXPERIMENTS_HELP

    @staticmethod
    def run(args) -> int:
        from bert_jax import compilation_cache, xla_flags
        from bert_jax.finetuning.config import load_config
        from bert_jax.finetuning.finetune import finetune

        config = load_config(args.config, args.overrides)
        if not config.get("triton_gemm", False):
            xla_flags.add(xla_flags.TRITON_GEMM_OFF)
        if config.compilation_cache:
            compilation_cache.enable()
        result = finetune(config, args.workdir, overwrite=args.overwrite)
        if args.json:
            print_result({"workdir": args.workdir, "best": result["best"]})
        else:
            print_line(finetune_summary(args.workdir, result))
        return 0


def _workdir_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workdir", required=True, help="a `bert-jax finetune` workdir")
    parser.epilog = ("The run's stored config is used; override data locations with e.g. "
                     "--config.data_dir=DIR or --config.test_file=FILE")


class Evaluate:
    accepts_overrides = True

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        _workdir_arguments(parser)
        parser.add_argument("--split", default="dev",
                            help="dev (the run's dev split(s)), or any labelled split name")
        parser.add_argument("--output", help="also write the metrics JSON to this file")

    @staticmethod
    def run(args) -> int:
        import jax

        from bert_jax import compilation_cache
        from bert_jax.fileio import check_output_path
        from bert_jax.finetuning.evaluate import evaluate
        from bert_jax.tasks.base import write_json

        if args.output:
            check_output_path(args.output, directory=False)
        compilation_cache.enable()
        result = evaluate(args.workdir, args.split, args.overrides)
        if jax.process_index() == 0:
            if args.output:
                write_json(args.output, result)
            print(json.dumps(result, indent=2, sort_keys=True))
        return 0


class Predict:
    accepts_overrides = True

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        _workdir_arguments(parser)
        parser.add_argument("--split", default="test", help="split to predict (default test)")
        parser.add_argument("--output", required=True, help="directory for the prediction files")
        parser.add_argument("--ax-file", help="MNLI: the AX diagnostic TSV (default: looked "
                                              "for beside the MNLI data)")

    @staticmethod
    def run(args) -> int:
        from bert_jax import compilation_cache
        from bert_jax.fileio import check_output_path
        from bert_jax.finetuning.evaluate import predict

        check_output_path(args.output, directory=True)
        compilation_cache.enable()
        paths = predict(args.workdir, args.split, args.output, args.overrides, args.ax_file)
        print_result({"written": paths}, indent=2)
        return 0
