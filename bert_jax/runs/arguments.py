"""What the run commands share (``bert-jax pretrain`` and ``bert-jax finetune``, and the
``evaluate`` / ``predict`` commands that read a finished run): the experiment file, the workdir,
``--overwrite`` and the ``--config.key=value`` overrides their epilog explains, and printing the
result once per job.

Importing this module imports nothing heavy, so every command's ``--help`` stays fast and free
of JAX; ``print_result`` imports JAX only when called.
"""

from __future__ import annotations

import argparse
import json
from typing import Any


def add_run_arguments(parser: argparse.ArgumentParser, *, config_example: str,
                      workdir_help: str, overwrite_help: str, override_examples: str,
                      epilog_note: str = "") -> None:
    """``--config FILE:VARIANT``, ``--workdir``, ``--overwrite`` and an epilog on overrides.

    ``override_examples``: a few ``--config.<key>=<value>`` examples for the epilog;
    ``epilog_note``: sentences the epilog adds after them."""
    parser.add_argument("--config", required=True,
                        help=f"experiment file and variant, e.g. {config_example}")
    parser.add_argument("--workdir", required=True, help=workdir_help)
    parser.add_argument("--overwrite", action="store_true", help=overwrite_help)
    parser.add_argument("--json", action="store_true",
                        help="end with the result as one JSON line (for scripts) instead of "
                             "a sentence")
    parser.epilog = ("Override any config field with --config.<key>=<value>, e.g. "
                     f"{override_examples}" + (f". {epilog_note}" if epilog_note else ""))


def print_result(result: Any, **dumps_options: Any) -> None:
    """Prints ``result`` as JSON on the first process only (one line per job, not per host)."""
    import jax

    if jax.process_index() == 0:
        print(json.dumps(result, **dumps_options))


def print_line(line: str) -> None:
    """Prints ``line`` on the first process only."""
    import jax

    if jax.process_index() == 0:
        print(line)


def pretrain_summary(workdir: str, result: dict[str, Any]) -> str:
    """The end of ``bert-jax pretrain`` in one sentence: where it stopped, the last losses,
    where the run is."""
    if result.get("stopped") == "preempted":
        return (f"stopped at step {result['step']} (signal); rerun the same command to "
                f"resume from {workdir}")
    parts = [f"done: step {result['step']}"]
    if "loss" in result:
        parts.append(f"train loss {result['loss']:.3f}")
    if "eval_loss" in result:
        held = f"held-out loss {result['eval_loss']:.3f}"
        if "eval_mlm_accuracy" in result:
            held += f", masked-LM accuracy {result['eval_mlm_accuracy']:.3f}"
        parts.append(held)
    return "; ".join(parts) + f". Run in {workdir} (checkpoints/, metrics.jsonl)"


def finetune_summary(workdir: str, result: dict[str, Any]) -> str:
    """The end of ``bert-jax finetune`` in one sentence: the best epoch and where it is."""
    best = result["best"]
    split, _, metric = best["metric"].partition("/")
    return (f"best: epoch {best['epoch']}, {split} {metric} {best['value']:.4f}. Model in "
            f"{workdir} (metrics.json has every epoch)")
