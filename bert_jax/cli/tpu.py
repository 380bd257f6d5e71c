"""``bert-jax compile --config experiments/pretrain.py:<variant> --topology v5p-128
[--num-slices N] [--json OUT] [--save-hlo FILE] [--config.key=value ...]``: compile the
pretraining step for a TPU slice on any machine and report memory per chip, fit, and
roofline predictions.
``--task glue:mrpc`` (``FAMILY:VARIANT`` of ``experiments/FAMILY.py``, or a fine-tuning
``FILE.py:VARIANT``) compiles the fine-tuning step instead.

Exit status: 0 when the step fits the chips' HBM, 1 when it compiles but does not fit (or
the compiler rejects it for memory), 2 for bad input.
"""

from __future__ import annotations

import argparse
import sys


class Compile:
    accepts_overrides = True

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--config",
                            help="pretraining experiment file and variant, as for pretrain, "
                                 "e.g. experiments/pretrain.py:bert_large_phase1")
        parser.add_argument("--task",
                            help="compile the fine-tuning step instead: glue:mrpc, squad:v1, "
                                 "ner:conll2003 ... (experiments/FAMILY.py:VARIANT) or a "
                                 "fine-tuning FILE.py:VARIANT")
        parser.add_argument("--topology", required=True,
                            help="TPU slice: v4-32, v5e-256, v5p-128, v6e-64 ... (v4/v5p "
                                 "count TensorCores, v5e/v6e chips, as gcloud does)")
        parser.add_argument("--num-slices", type=int, default=1,
                            help="identical slices over DCN (multislice); the config's "
                                 "parallel.dcn_mesh splits them (default: data parallel)")
        parser.add_argument("--layer-costs", choices=("auto", "extrapolate", "hlo", "scanned"),
                            default="auto",
                            help="where FLOPs and HBM bytes come from when the step loops "
                                 "(scanned layers, gradient accumulation): extrapolate: extra "
                                 "compiles with 1 and 2 unrolled layers (and microbatches); "
                                 "hlo: the compiled program itself, loops weighted by their "
                                 "trip counts (no extra compiles); scanned: XLA's count, which "
                                 "counts a loop body once (fit only). auto (default): hlo with "
                                 "gradient accumulation, else extrapolate")
        parser.add_argument("--max-batch", action="store_true",
                            help="find the largest micro-batch per chip that fits by "
                                 "compiling (bisection; each probe's memory is shown), then "
                                 "report the step at it and the gradient accumulation the "
                                 "global batch needs (what --config.microbatches=0 does)")
        parser.add_argument("--json", metavar="OUT",
                            help="also write the report as JSON to this file")
        parser.add_argument("--save-hlo", metavar="FILE",
                            help="also write the reported step's compiled program (optimized "
                                 "HLO text) to this file; `python -m bert_jax.tpu.hlo FILE "
                                 "--devices N` reads its bytes and collectives again")
        parser.epilog = ("Override any config field with --config.<key>=<value>, as for "
                         "pretrain. The numbers are compiler estimates (docs/tpu.md).")

    @staticmethod
    def run(args) -> int:
        from bert_jax.errors import BertJaxError
        from bert_jax.tpu.topologies import parse_slice, prepare_environment

        if (args.config is None) == (args.task is None):
            raise BertJaxError("give --config (pretraining) or --task (fine-tuning), not both")
        if args.max_batch and args.task:
            raise BertJaxError("--max-batch searches the pretraining step's micro-batch; "
                               "it takes --config, not --task")
        tpu = parse_slice(args.topology, args.num_slices)
        from bert_jax.fileio import check_output_path

        for path in (args.json, args.save_hlo):
            if path:
                check_output_path(path, directory=False)
        prepare_environment()
        from bert_jax.tpu.compile import (
            LEVERS,
            CompileFailed,
            compile_finetuning,
            compile_pretraining,
            format_report,
            not_fit_message,
        )

        spec = args.config or task_spec(args.task)
        print(f"compiling {spec} for {tpu.describe()} ...", flush=True)
        try:
            if args.task:
                from bert_jax.finetuning.config import load_config as load_task_config

                estimate = compile_finetuning(load_task_config(spec, args.overrides), tpu,
                                              layer_costs=args.layer_costs)
            else:
                from bert_jax.training.config import load_config

                estimate = compile_pretraining(
                    load_config(spec, args.overrides), tpu, layer_costs=args.layer_costs,
                    max_batch=args.max_batch, report=lambda line: print(line, flush=True))
        except CompileFailed as e:
            if not e.out_of_memory:
                raise
            _write_json(args.json, {"config": spec, "overrides": list(args.overrides),
                                    "slice": tpu.name, "num_slices": tpu.num_slices,
                                    "fits": False, "error": str(e),
                                    "total_bytes": e.used_bytes,
                                    "compiler_hbm_limit_bytes": e.limit_bytes})
            print(f"does not fit: {e}", file=sys.stderr)
            print("levers:\n  " + "\n  ".join(LEVERS), file=sys.stderr)
            return 1
        print(format_report(estimate))
        if args.save_hlo:
            from bert_jax.fileio import atomic_write

            atomic_write(args.save_hlo, estimate.hlo_text)
        _write_json(args.json, {"config": spec, "overrides": list(args.overrides),
                                **estimate.to_dict()})
        if not estimate.fits:
            print(f"does not fit: {not_fit_message(estimate)}", file=sys.stderr)
            return 1
        return 0


def task_spec(task: str) -> str:
    """``glue:mrpc`` -> ``experiments/glue.py:mrpc``; a ``FILE.py:VARIANT`` stays as it is."""
    from bert_jax.errors import BertJaxError

    family, sep, variant = task.partition(":")
    if not sep or not variant:
        raise BertJaxError(f"--task {task!r}: expected FAMILY:VARIANT such as glue:mrpc, or "
                           "FILE.py:VARIANT")
    return task if family.endswith(".py") else f"experiments/{family}.py:{variant}"


def _write_json(path: str | None, record: dict) -> None:
    if not path:
        return
    from bert_jax import fileio

    fileio.atomic_write_json(path, record, indent=1)
