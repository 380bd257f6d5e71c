"""Launching several ``jax.distributed`` processes on localhost with bounded waits.

Every child gets ``BERT_JAX_COORDINATOR_ADDRESS`` / ``BERT_JAX_NUM_PROCESSES`` /
``BERT_JAX_PROCESS_ID`` (the path ``bert_jax.parallel.maybe_initialize_distributed`` reads),
CPU only, ``devices_per_process`` simulated devices and gloo collectives. Children are always
killed (by pid) when the launching block ends, whatever happened.

Time limits are generous (a loaded 2-core machine runs several of these processes, each
compiling its steps, at once) and scale with ``BERT_JAX_TEST_TIME_SCALE`` (default 1) for
slower machines: see :func:`time_limit`.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence

from training.helpers import without_keys
from xla_env import cpu_flags

from bert_jax.runs.metrics import read_metrics

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker.py")
EXPERIMENT = os.path.join(REPO, "experiments", "pretrain.py")

# A model that compiles and steps in well under a second on simulated CPUs.
SMALL = [
    "--config.model.hidden_size=32", "--config.model.num_attention_heads=4",
    "--config.model.intermediate_size=64", "--config.model.num_hidden_layers=2",
    "--config.model.max_position_embeddings=32", "--config.data.max_seq_length=32",
    "--config.data.max_predictions_per_seq=5",
    "--config.progress_bar=false", "--config.log_every=1", "--config.eval_steps=0",
    "--config.optimizer.warmup_steps=2", "--config.optimizer.decay_steps=100",
]


# Seconds a multi-process run (start, compile, a few steps, checkpoint) may take before
# time_limit's scaling: about 10x what it takes on an idle 2-core machine.
RUN_S = 900


def time_limit(seconds: float) -> float:
    """``seconds`` times ``BERT_JAX_TEST_TIME_SCALE`` (default 1)."""
    raw = os.environ.get("BERT_JAX_TEST_TIME_SCALE", "1")
    try:
        scale = float(raw)
    except ValueError:
        raise ValueError(f"BERT_JAX_TEST_TIME_SCALE={raw!r} is not a number") from None
    return seconds * max(scale, 1e-3)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_env(port: int, num_processes: int, process_id: int, devices_per_process: int,
                **extra: str) -> dict[str, str]:
    return dict(os.environ, BERT_JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
                BERT_JAX_NUM_PROCESSES=str(num_processes), BERT_JAX_PROCESS_ID=str(process_id),
                XLA_FLAGS=cpu_flags(devices_per_process),
                JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1", **extra)


@contextlib.contextmanager
def launched(commands: Sequence[Sequence[str]], devices_per_process: int = 2,
             cwd: str | None = None, **extra_env: str) -> Iterator[list[subprocess.Popen]]:
    """Starts ``commands[i]`` as process ``i`` of ``len(commands)``; kills leftovers on exit.
    Output goes to ``LOGDIR/<i>.log`` when ``extra_env`` has ``LOGDIR``, else to pipes."""
    port = free_port()
    procs: list[subprocess.Popen] = []
    logdir = extra_env.pop("LOGDIR", None)
    try:
        for pid, cmd in enumerate(commands):
            env = process_env(port, len(commands), pid, devices_per_process, **extra_env)
            out = (open(os.path.join(logdir, f"{pid}.log"), "w") if logdir  # noqa: SIM115
                   else subprocess.PIPE)
            procs.append(subprocess.Popen(list(cmd), env=env, cwd=cwd or REPO, stdout=out,
                                          stderr=subprocess.STDOUT, text=True))
            if logdir:
                out.close()
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=10)


def run_all(commands: Sequence[Sequence[str]], timeout: float, devices_per_process: int = 2,
            **extra_env: str) -> list[str]:
    """Runs the processes to completion (all must exit 0 within ``time_limit(timeout)``
    seconds); returns their outputs."""
    timeout = time_limit(timeout)
    with launched(commands, devices_per_process, **extra_env) as procs:
        deadline = time.monotonic() + timeout
        outputs = []
        for p in procs:
            try:
                outputs.append(p.communicate(timeout=max(1.0, deadline - time.monotonic()))[0])
            except subprocess.TimeoutExpired:
                raise AssertionError(f"process {procs.index(p)} of {len(procs)} did not finish "
                                     f"within {timeout}s") from None
        if any(p.returncode for p in procs):
            raise AssertionError("\n".join(
                f"--- process {i} exited {p.returncode}:\n{out[-3000:]}"
                for i, (p, out) in enumerate(zip(procs, outputs, strict=True))))
        return outputs


def pretrain_args(workdir: str, *overrides: str) -> list[str]:
    """``bert-jax pretrain``'s arguments for SMALL with ``overrides`` (an override of a SMALL
    key replaces it)."""
    return ["--config", f"{EXPERIMENT}:tiny", "--workdir", str(workdir),
            *without_keys(SMALL, overrides), *overrides]


def pretrain_command(workdir: str, *overrides: str) -> list[str]:
    """The CLI's pretrain on SMALL with ``overrides`` (an override of a SMALL key replaces it)."""
    return [sys.executable, "-m", "bert_jax", "pretrain", *pretrain_args(workdir, *overrides)]


def worker_command(mode: str, *args: str) -> list[str]:
    return [sys.executable, WORKER, mode, *args]


def split_runs(output: str) -> list[str]:
    """The output of ``worker.py pretrain``, one string per run."""
    from .worker import RUN_MARK

    return [part.split("\n", 1)[1] if "\n" in part else ""
            for part in output.split(RUN_MARK)[1:]]


def train_losses(workdir) -> dict[int, float]:
    """step -> train loss, the last record of each step (a resumed run rewrites later steps)."""
    return {r["step"]: r["loss"] for r in read_metrics(workdir)}
