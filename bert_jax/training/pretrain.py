"""``bert-jax pretrain --config experiments/pretrain.py:<variant> --workdir DIR
[--config.key=value ...]``: parse, load the locked config, run ``train_and_evaluate``."""

from __future__ import annotations

import argparse
import json


class command:  # noqa: N801 - the CLI registry names this attribute
    accepts_overrides = True

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--config", required=True,
                            help="experiment file and variant, e.g. experiments/pretrain.py:tiny")
        parser.add_argument("--workdir", required=True,
                            help="run directory: checkpoints, metrics, config, tokenizer; "
                                 "rerunning the same command resumes from it")
        parser.add_argument("--overwrite", action="store_true",
                            help="run in a workdir that holds another kind of run (a model or "
                                 "a fine-tuning run); its checkpoints are never deleted")
        parser.epilog = ("Override any config field with --config.<key>=<value>, e.g. "
                         "--config.data.directory=DATA --config.num_train_steps=1000")

    @staticmethod
    def run(args) -> int:
        from bert_jax.training.config import load_config
        from bert_jax.training.loop import train_and_evaluate

        config = load_config(args.config, args.overrides)
        result = train_and_evaluate(config, args.workdir, overwrite=args.overwrite)
        import jax

        if jax.process_index() == 0:
            print(json.dumps({"workdir": args.workdir, **result}, sort_keys=True))
        return 0
