"""The ``bert-jax`` command: parses the subcommand and dispatches; no logic lives here.

Each subcommand is an object in one of this package's modules (one module per command group)
with ``add_arguments(parser)`` and ``run(args) -> int | None``; ``run`` calls the package that
does the work. Modules are imported lazily so ``bert-jax --help`` stays fast and commands that
need no tensorflow never import it.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from bert_jax.errors import BertJaxError

DESCRIPTION = """\
BERT in JAX/Flax: train a tokenizer, build pretraining data, pretrain (MLM + NSP/SOP) on
CPUs, GPUs or TPU pod slices, fine-tune on GLUE / SQuAD / CoNLL-2003 / SWAG, run inference,
and convert checkpoints from and to Hugging Face and Google TF.

A first run: `make demo` in a clone of the repository does the whole road on the bundled
corpus (about 6 minutes on 2 CPU cores). Step by step, from the clone's root (the demo corpus
is bert_jax/demo_data/; the experiment configs are in experiments/):
  bert-jax train-tokenizer --input bert_jax/demo_data --output tok/ --vocab-size 2000
  bert-jax create-pretraining-data --input bert_jax/demo_data --tokenizer tok/ \\
      --output-dir data/ --max-seq-length 32 --holdout-fraction 0.05
  bert-jax pretrain --config experiments/pretrain.py:demo --workdir run/ \\
      --config.data.directory=data/ --config.data.tokenizer=tok/
  bert-jax fill-mask run/ --text "It was a [MASK] day."
Then docs/first-hour.md: a real checkpoint fine-tuned on your own CSV.
"""

EPILOG = "Run `bert-jax COMMAND --help` for a command's options and their defaults."

# TensorFlow (imported by the data commands) prints a CPU-feature banner through absl's C++
# logging on import; neither it nor oneDNN's float rewrites matter to integer data pipelines.
QUIET_ENVIRONMENT = {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "0"}


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Shows each option's default (unless its help already names it, or it is unset) and
    keeps descriptions' line breaks."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default is None or action.default is False or "default" in text:
            return text
        return super()._get_help_string(action)

# name -> (module, help)
COMMANDS: dict[str, tuple[str, str]] = {
    "convert": ("bert_jax.cli.checkpoint:Convert",
                "import a Hugging Face or Google TF BERT checkpoint into a bert-jax checkpoint"),
    "export": ("bert_jax.cli.checkpoint:Export",
               "export a bert-jax checkpoint to a Hugging Face directory"),
    "train-tokenizer": ("bert_jax.cli.tokenization:train_tokenizer",
                        "train a SentencePiece (unigram or BPE) tokenizer on raw text"),
    "create-pretraining-data": ("bert_jax.cli.data:CreatePretrainingData",
                                "raw text -> sharded TFRecord pretraining examples"),
    "materialize-batches": ("bert_jax.cli.data:MaterializeBatches",
                            "run the masking pipeline for N steps and save the batches as numpy"),
    "pretrain": ("bert_jax.cli.pretrain:Pretrain", "pretrain BERT (MLM + NSP/SOP)"),
    "compile": ("bert_jax.cli.tpu:Compile",
                "compile the train step for a TPU slice here: memory per chip, fit, speed"),
    "finetune": ("bert_jax.cli.finetune:Finetune",
                 "fine-tune on GLUE, SQuAD, CoNLL-2003 NER or SWAG"),
    "evaluate": ("bert_jax.cli.finetune:Evaluate", "evaluate a fine-tuned workdir"),
    "predict": ("bert_jax.cli.finetune:Predict",
                "write predictions / submission files from a fine-tuned workdir"),
    "fill-mask": ("bert_jax.cli.inference:FillMask", "top-k fillers for each [MASK]"),
    "embed": ("bert_jax.cli.inference:Embed",
              "per-token or pooled vectors from any layer to .npy"),
    "analyze-attention": ("bert_jax.cli.analysis:AnalyzeAttention",
                          "per-layer, per-head attention statistics and figures"),
    "probe": ("bert_jax.cli.analysis:Probe",
              "linear / MLP probes per layer of a frozen checkpoint (which layer knows what)"),
    "plot-metrics": ("bert_jax.cli.pretrain:PlotMetrics",
                     "draw a run's loss and accuracy curves (metrics.jsonl) to a PNG"),
}


def _load(target: str):
    module_name, attr = target.split(":")
    return getattr(importlib.import_module(module_name), attr)


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bert-jax", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    wanted = next((a for a in argv if not a.startswith("-")), None)
    for name, (target, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text,
                           formatter_class=HelpFormatter)
        if name == wanted:  # only import the chosen command's module
            _load(target).add_arguments(p)
    return parser


def _version() -> str:
    from bert_jax import __version__

    return __version__


def main(argv: list[str] | None = None) -> int:
    """The ``bert-jax`` entry point; returns the exit status (from a command line it ends
    the process itself, see :mod:`bert_jax.shutdown`)."""
    rc = _run(argv)
    if argv is None:
        from bert_jax import shutdown

        shutdown.exit_now(rc)
    return rc


def _run(argv: list[str] | None) -> int:
    from_command_line = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    if from_command_line:
        from bert_jax import allocator

        allocator.configure()  # before any thread allocates: see bert_jax/allocator.py
    for key, value in QUIET_ENVIRONMENT.items():
        os.environ.setdefault(key, value)
    from bert_jax.tpu.topologies import quiet_libtpu_without_tpus

    quiet_libtpu_without_tpus()
    try:
        parser = build_parser(argv)
        args, unknown = parser.parse_known_args(argv)
        if args.command is None:
            parser.print_help()
            return 2
        if from_command_line:
            from bert_jax import startup

            startup.install()  # before the command's imports: see bert_jax/startup.py
        command = _load(COMMANDS[args.command][0])
        if unknown and not getattr(command, "accepts_overrides", False):
            parser.error(f"unrecognized arguments: {' '.join(unknown)}")
        args.overrides = unknown
        args.from_command_line = from_command_line  # the process ends when the command does
        rc = command.run(args)
        return int(rc or 0)
    except BertJaxError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        if not e.filename:  # not about a path the user gave: a real failure, keep the trace
            raise
        print(f"error: {e.filename}: {e.strerror or e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130

