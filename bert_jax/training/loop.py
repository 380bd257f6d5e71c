"""The pretraining loop: everything around the pure step that talks to the outside world.

``train_and_evaluate(config, workdir)`` builds the mesh and the directly sharded state,
resumes from the newest checkpoint (or starts from ``init_checkpoint``), runs the jitted
step with device prefetch, and handles logging (fetched from the device only every
``log_every`` steps), evaluation, checkpoints, profiling, SIGTERM and non-finite streaks.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from bert_jax import fileio, parallel, shutdown, startup, storage
from bert_jax.checkpoint import store
from bert_jax.checkpoint.manager import CheckpointManager, NonFiniteState
from bert_jax.config import BertConfig
from bert_jax.errors import BertJaxError
from bert_jax.modeling.params import flatten_params, to_layout
from bert_jax.runs.metrics import MetricsWriter, flops_per_sequence, peak_tflops
from bert_jax.runs.progress import exclude_pause
from bert_jax.runs.state import TrainState
from bert_jax.runs.workdir import check_pretraining_workdir, locked_workdir
from bert_jax.training import config as config_lib
from bert_jax.training.inputs import (
    DataWaitInterrupted,
    Prefetcher,
    check_eval_data,
    check_vocab,
    describe_source,
    make_batches,
    resolve_source,
)
from bert_jax.training.setup import (
    build_training,
    device_memory_limit,
    fit_microbatches,
)
from bert_jax.training.signals import Preemption
from bert_jax.training.steps import summarize


class TrainingDiverged(BertJaxError):
    """Too many consecutive non-finite steps; the last good state was checkpointed."""


def _log(message: str) -> None:
    if jax.process_index() == 0:
        print(message, flush=True)


# ---- setup helpers --------------------------------------------------------------------------
def _data_vocab_size(config) -> int | None:
    """The vocabulary size recorded with TFRecord data (None for other sources)."""
    if config.data.source != "tfrecord" or not config.data.directory:
        return None
    from bert_jax.data.metadata import load_metadata
    from bert_jax.data.pipeline import check_training_data

    meta = load_metadata(config.data.directory)
    check_training_data(meta, config.objective, config.data.pairing,
                        config.data.max_seq_length)
    return meta.vocab_size


def _check_sizes(config, model_cfg: BertConfig, mesh) -> int:
    """Validates batch/mesh/sequence arithmetic; returns the per-process batch size."""
    batch, k = config.global_batch_size, config.microbatches
    rules = parallel.rules_from_config(config.parallel.logical_axis_rules)
    divisor = parallel.batch_divisor(mesh, rules)
    parallel.check_batch_split_over_processes(mesh, rules)
    if k < 1 or batch % k:
        raise BertJaxError(f"global_batch_size={batch} is not divisible by microbatches={k}")
    if (batch // k) % divisor:
        raise BertJaxError(f"each microbatch ({batch // k} sequences) must split evenly over "
                           f"the {divisor} batch shards of the mesh {dict(mesh.shape)}")
    if batch % jax.process_count():
        raise BertJaxError(f"global_batch_size={batch} is not divisible by the "
                           f"{jax.process_count()} processes")
    if config.data.max_seq_length > model_cfg.max_sequence_length:
        raise BertJaxError(f"data.max_seq_length={config.data.max_seq_length} exceeds the "
                           f"model's {model_cfg.max_sequence_length} positions "
                           f"(max_position_embeddings={model_cfg.max_position_embeddings}, "
                           f"position_offset={model_cfg.position_offset})")
    return batch // jax.process_count()


def _load_tokenizer(config):
    """The data's tokenizer (required for TFRecord data, optional otherwise)."""
    if not config.data.tokenizer:
        if config.data.source == "tfrecord":
            raise BertJaxError("data.source='tfrecord' needs --config.data.tokenizer (the "
                               "tokenizer the data was created with)")
        return None
    from bert_jax.tokenization import load_tokenizer

    return load_tokenizer(config.data.tokenizer)


def _write_workdir_files(config, workdir: str, model_cfg: BertConfig, tokenizer) -> None:
    """WORKDIR/config.json and WORKDIR/tokenizer/, so fine-tuning and export read the run."""
    if jax.process_index() != 0:
        return
    store.write_config(workdir, model_cfg, extra={"experiment": config.to_dict()})
    if tokenizer is not None:
        with fileio.replace_directory(storage.join(workdir, store.TOKENIZER_DIR),
                                      marker=store.TOKENIZER_MARKER) as tmp:
            tokenizer.save(tmp)


def _load_init_params(path: str, model_cfg: BertConfig, params, shardings):
    """Copies matching parameters from another run/model (phase 1 -> phase 2) into the
    freshly initialized sharded ``params``; returns (params, paths not taken)."""
    loaded = flatten_params(to_layout(store.load_newest(path)[2], model_cfg))
    flat = flatten_params(params)
    flat_shardings = flatten_params(shardings)
    for name, value in loaded.items():
        if name not in flat:
            continue
        if tuple(value.shape) != tuple(flat[name].shape):
            raise BertJaxError(f"{path}: parameter {name} has shape {value.shape}, the model "
                               f"needs {flat[name].shape}")
        value = np.asarray(value, dtype=flat[name].dtype)
        flat[name] = jax.make_array_from_callback(value.shape, flat_shardings[name],
                                                  lambda idx, v=value: v[idx])
    from bert_jax.modeling.params import unflatten_params

    return unflatten_params(flat), sorted(set(loaded) - set(flat))


def _data_state_for_this_process(saved: dict[str, Any], config, local_batch: int
                                 ) -> dict[str, Any]:
    """The restored iterator state, made this process's own.

    Orbax writes JSON items from process 0 only, so every process restores process 0's state.
    All processes stand at the same step and a source's position is a function of (its
    identity, step), so each takes the step with its own process index. Resumed on another
    process count (same global batch), the stream continues at the same step with the new
    host split (the per-host batch changes with it)."""
    state = dict(saved)
    if "process_index" in state:
        state["process_index"] = jax.process_index()
    saved_count = state.get("process_count", jax.process_count())
    if saved_count != jax.process_count():
        state["process_count"] = jax.process_count()
        if "per_host_batch_size" in state and (
                state["per_host_batch_size"] * saved_count == config.global_batch_size):
            state["per_host_batch_size"] = local_batch
        _log(f"resuming a run of {saved_count} processes on {jax.process_count()}: the data "
             f"continues at step {state.get('step')} with a new split over processes")
    return state


# ---- the loop -------------------------------------------------------------------------------
def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, *,
                       overwrite: bool = False, exit_follows: bool = False) -> dict[str, Any]:
    """Trains (or resumes) the configured experiment in ``workdir``; returns the final
    metrics (last logged train metrics, ``eval_*`` metrics, ``step``, and ``stopped``:
    completed | preempted). The workdir is locked for the run and checked (kind of run,
    model shape against its checkpoints) before anything is written into it.

    ``exit_follows``: the process ends right after (the CLI), so the training data pipeline
    is left to the exit instead of destroyed here: a tf.data iterator that ran for minutes
    waits, when destroyed, for its autotuning thread, which sleeps up to a minute between
    rounds, holding the interpreter all the while."""
    parallel.maybe_initialize_distributed()
    startup.backends_ready()
    workdir = storage.abspath(workdir)
    config.data.source = resolve_source(config.data)
    _log(describe_source(config.data))
    data_vocab = _data_vocab_size(config)  # the data's shards checked before anything else
    tokenizer = _load_tokenizer(config)
    model_cfg = config_lib.model_config(
        config, data_vocab or (tokenizer.vocab_size if tokenizer else None))
    check_vocab(config, model_cfg.vocab_size, tokenizer)
    check_eval_data(config)
    check_pretraining_workdir(workdir, model_cfg, config.to_dict(), overwrite=overwrite)
    mesh = parallel.create_mesh(config.parallel.mesh, config.parallel.dcn_mesh)
    if config.microbatches == 0:  # auto: the largest micro-batch that fits, by compiling
        config.microbatches = fit_microbatches(config, model_cfg, mesh,
                                               device_memory_limit(mesh), _log)
        _log(f"gradient accumulation: {config.microbatches} microbatches")
    local_batch = _check_sizes(config, model_cfg, mesh)
    with locked_workdir(workdir, overwrite=overwrite, log=_log) as lock:
        return _train(config, workdir, model_cfg, mesh, local_batch, tokenizer, lock,
                      exit_follows)


def _train(config, workdir: str, model_cfg: BertConfig, mesh, local_batch: int, tokenizer,
           lock: fileio.WorkdirLock, exit_follows: bool = False) -> dict[str, Any]:
    training = build_training(config, model_cfg, mesh)
    checkpoints = CheckpointManager(workdir, every_steps=config.checkpoint.every_steps,
                                    keep=config.checkpoint.keep,
                                    async_save=config.checkpoint.async_save)
    state, dropout_rng, data_state = _starting_state(config, model_cfg, mesh, local_batch,
                                                     training, checkpoints)
    # Written only now: a config, checkpoint or init_checkpoint rejected above leaves the
    # workdir as it was.
    _write_workdir_files(config, workdir, model_cfg, tokenizer)
    source = make_batches(config, "train", batch_size=local_batch,
                          vocab_size=model_cfg.vocab_size, process_index=jax.process_index(),
                          process_count=jax.process_count(), state=data_state,
                          tokenizer=tokenizer)
    loop = _Loop(config, workdir, model_cfg, training, checkpoints, lock, source,
                 _evaluator(config, model_cfg, local_batch, tokenizer, training),
                 state, dropout_rng, exit_follows)
    del source  # the loop holds the last reference: it destroys the pipeline when it ends
    return loop.run()


def _starting_state(config, model_cfg: BertConfig, mesh, local_batch: int, training,
                    checkpoints: CheckpointManager):
    """(train state, dropout rng, data iterator state or None): restored from the newest
    checkpoint, else freshly initialised (from ``init_checkpoint`` where one is named)."""
    init_rng, dropout_rng = jax.random.split(jax.random.PRNGKey(config.seed))
    replicated = parallel.replicated(mesh)
    abstract_rng = jax.ShapeDtypeStruct(dropout_rng.shape, dropout_rng.dtype,
                                        sharding=replicated)
    restored = checkpoints.restore_latest(training.abstract_state, abstract_rng, _log)
    if restored is not None:
        latest, state, dropout_rng, data_state = restored
        _log(f"resumed from {checkpoints.directory}/{latest} onto mesh {dict(mesh.shape)}")
        return state, dropout_rng, _data_state_for_this_process(data_state, config,
                                                                local_batch)
    state = training.init_state(init_rng)
    param_shardings = training.state_shardings.params
    if config.init_checkpoint:
        params, unused = _load_init_params(config.init_checkpoint, model_cfg, state.params,
                                           param_shardings)
        state = state.replace(params=params)
        _log(f"initialized from {config.init_checkpoint}"
             + (f" (not used: {unused})" if unused else ""))
    if training.init_params is not None:
        state = state.replace(params=training.init_params(state.params, param_shardings))
    return state, jax.device_put(dropout_rng, replicated), None


def _evaluator(config, model_cfg: BertConfig, local_batch: int, tokenizer, training):
    """``evaluate(params) -> metrics``: the held-out loss and accuracies over
    ``eval_steps`` batches ({} when the held-out data yields none)."""
    pair_head = config_lib.pair_head(config)

    def evaluate(params) -> dict[str, float]:
        source = make_batches(config, "eval", batch_size=local_batch,
                              vocab_size=model_cfg.vocab_size,
                              process_index=jax.process_index(),
                              process_count=jax.process_count(), tokenizer=tokenizer)
        batches = Prefetcher(source, training.global_batch,
                             timeout_s=config.data.wait_timeout_s, what="evaluation")
        totals = None
        try:
            for _, (batch, _) in zip(range(config.eval_steps), batches, strict=False):
                sums = training.eval_step(params, batch)
                totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
        finally:
            batches.close()
        if totals is None:
            return {}
        return _reported({k: float(v) for k, v in summarize(jax.device_get(totals)).items()},
                         pair_head)

    return evaluate


# Steps dispatched ahead of the last finished one. jax dispatches asynchronously; unbounded,
# the host queued dozens of steps on a CPU backend, the progress bar ran ahead of the work,
# and each log step then waited for the queue in silence. Two steps in flight keep an
# accelerator fed while the host prepares the next.
STEPS_AHEAD = 2


class _Loop:
    """The steps of one run and what happens between them: logging, checkpoints, evaluation,
    profiling, preemption and non-finite streaks. ``run()`` returns the run's result."""

    def __init__(self, config, workdir: str, model_cfg: BertConfig, training,
                 checkpoints: CheckpointManager, lock: fileio.WorkdirLock, source, evaluate,
                 state: TrainState, dropout_rng, exit_follows: bool = False):
        self.config, self.workdir, self.training = config, workdir, training
        self.exit_follows = exit_follows
        self.checkpoints, self.source, self.evaluate = checkpoints, source, evaluate
        self.state, self.dropout_rng = state, dropout_rng
        self.pair_head = config_lib.pair_head(config)
        self.seq = config.data.max_seq_length
        self.step = int(jax.device_get(state.step))
        self.total_steps = config.num_train_steps
        self.writer = MetricsWriter(workdir, enabled=jax.process_index() == 0,
                                    after_step=self.step)
        self.flops = flops_per_sequence(self.seq, model_cfg.num_hidden_layers,
                                        model_cfg.hidden_size, model_cfg.vocab_size,
                                        config.data.max_predictions_per_seq)
        self.peak = peak_tflops(config.peak_tflops)
        self.progress = _progress_bar(config, self.step, self.total_steps)
        self.result: dict[str, Any] = {"step": self.step, "stopped": "completed"}
        self.pending: list[dict[str, jax.Array]] = []
        self.data_state = source.state()
        self.last_time, self.last_step = None, self.step
        self.profile = tuple(config.profile_steps)
        self.preemption = Preemption(on_idle_exit=lock.release)
        # One process stops inside a data wait; several agree on a step first (at log steps).
        self.prefetch = Prefetcher(source, training.global_batch,
                                   timeout_s=config.data.wait_timeout_s,
                                   interrupted=(lambda: self.preemption.requested)
                                   if jax.process_count() == 1 else None)

    def say(self, message: str) -> None:
        """A line for the user that leaves the progress bar whole."""
        if self.progress is not None and jax.process_index() == 0:
            self.progress.write(message)
        else:
            _log(message)

    def run(self) -> dict[str, Any]:
        try:
            with self.preemption:
                self.preemption.idle = True  # until the first step: nothing to save, exit
                while self.step < self.total_steps:
                    if not self._train_one_step():
                        return self.result  # preempted while waiting for data, and saved
                    at_end = self.step == self.total_steps
                    if self.step % self.config.log_every == 0 or at_end:
                        self._log_metrics()
                        stop = self.preemption.agreed()
                    else:
                        stop = jax.process_count() == 1 and self.preemption.requested
                    if stop:
                        self._save_and_stop()
                        return self.result
                    self._after_step(at_end)
                self.result["step"] = self.step
                return self.result
        except jax.errors.JaxRuntimeError as error:
            if jax.process_count() > 1:
                _exit_on_lost_peer(error, self.step, self.checkpoints.directory)
            raise
        finally:
            self._close()

    def _train_one_step(self) -> bool:
        """One step on the next batch; False (after saving) when a signal came while the
        batch was awaited."""
        step = self.step
        if self.profile and step == self.profile[0]:
            jax.profiler.start_trace(storage.join(self.workdir, "profile"))
        try:
            batch, next_data_state = next(self.prefetch)
        except StopIteration:
            raise BertJaxError(f"the training data ran out at step {step}; use more "
                               "data or fewer num_train_steps") from None
        except DataWaitInterrupted:
            self._save_and_stop(" (while waiting for data)")
            return False
        self.state, metrics = self.training.train_step(self.state, batch, self.dropout_rng)
        self.pending.append(metrics)
        if len(self.pending) > STEPS_AHEAD:  # the bar counts steps done, not queued
            jax.block_until_ready(self.pending[-STEPS_AHEAD - 1])
        self.step = step = step + 1
        self.data_state = next_data_state
        if self.profile and step == self.profile[-1]:
            jax.block_until_ready(self.state)
            jax.profiler.stop_trace()
        if self.last_time is None:  # the first step includes compilation: time from here
            jax.block_until_ready(metrics)
            self.preemption.idle = False
            self.last_time, self.last_step = time.perf_counter(), step
        if self.progress is not None:
            self.progress.update(1)
        return True

    def _log_metrics(self) -> None:
        """Fetches the metrics of the steps since the last log, adds the throughput, writes
        them; stops the run after ``max_skipped_in_row`` non-finite steps in a row."""
        step, batch = self.step, self.config.global_batch_size
        logged = _reported(_fetch(self.pending, self.state), self.pair_head)
        self.pending = []
        now = time.perf_counter()
        if step > self.last_step:
            rate = (step - self.last_step) / (now - self.last_time)
            logged.update(steps_per_sec=rate, seq_per_sec=rate * batch,
                          tokens_per_sec=rate * batch * self.seq)
            if self.peak:
                logged["mfu"] = (logged["seq_per_sec"] * self.flops
                                 / (self.peak * 1e12 * jax.device_count()))
        self.last_time, self.last_step = now, step
        self.writer.write(step, logged)
        self.result.update(logged)
        if self.progress is not None:
            self.progress.set_postfix(loss=f"{logged['loss']:.3f}",
                                      mlm_acc=f"{logged['mlm_accuracy']:.3f}")
        if logged["skipped_in_row"] >= self.config.max_skipped_in_row:
            self._stop_diverged(logged["skipped_in_row"])

    def _stop_diverged(self, skipped_in_row: int) -> None:
        step, checkpoints = self.step, self.checkpoints
        streak = (f"{skipped_in_row} consecutive steps had a non-finite loss, gradient or "
                  f"update (up to step {step}); stopped.")
        try:
            checkpoints.save(step, self.state, self.dropout_rng, self.data_state, force=True)
        except NonFiniteState as error:
            raise TrainingDiverged(f"{streak} {error}") from None
        checkpoints.wait()
        raise TrainingDiverged(
            f"{streak} Skipped steps change nothing, so {checkpoints.directory}/{step} holds "
            f"the parameters of step {step - skipped_in_row}, the last good one. Lower the "
            "learning rate or check the data.")

    def _save_and_stop(self, where: str = "") -> None:
        """Saves this step and marks the run preempted (SIGTERM, SIGINT)."""
        self.checkpoints.save(self.step, self.state, self.dropout_rng, self.data_state,
                              force=True)
        self.checkpoints.wait()
        _log(f"{self.preemption.signal_name or 'SIGTERM'}: saved step {self.step} to "
             f"{self.checkpoints.directory}{where}; exiting")
        self.result.update(step=self.step, stopped="preempted")

    def _after_step(self, at_end: bool) -> None:
        """The checkpoint of this step (when due), then its evaluation (when due)."""
        step, checkpoints = self.step, self.checkpoints
        if at_end and self.progress is not None:  # the bar ends at 100%; what follows
            self.progress.close()                 # is said line by line
            self.progress = None
        if at_end:
            _log(f"step {step}: saving the final checkpoint to {checkpoints.directory}/{step}")
        # Save first: an evaluation that fails never costs the training.
        pause_start = time.perf_counter()
        if checkpoints.save(step, self.state, self.dropout_rng, self.data_state, force=at_end):
            self.writer.flush()  # the records up to a checkpoint are as durable as it
        if at_end:
            checkpoints.wait()
        if self.config.eval_steps > 0 and (step % self.config.eval_every == 0 or at_end):
            self._evaluate(at_end)
        if self.progress is not None and time.perf_counter() - pause_start > 0.5:
            exclude_pause(self.progress)

    def _evaluate(self, at_end: bool) -> None:
        step = self.step
        eval_start = time.perf_counter()
        if at_end:
            _log(f"step {step}: evaluating on {self.config.eval_steps} held-out batches")
        evaluated = _evaluate_or_warn(lambda: self.evaluate(self.state.params), step, self.say)
        if self.last_time is not None:  # keep evaluation out of the throughput window
            self.last_time += time.perf_counter() - eval_start
        if evaluated:
            self.writer.write(step, evaluated, prefix="eval")
            self.result.update({f"eval_{k}": v for k, v in evaluated.items()})
            self.say(f"step {step}: eval " + ", ".join(f"{k}={v:.4f}"
                                                      for k, v in evaluated.items()))

    def _close(self) -> None:
        self.prefetch.close()
        if self.progress is not None:
            self.progress.close()
        self.checkpoints.close()
        self.writer.close()
        self.prefetch.release_source()
        if self.exit_follows:
            shutdown.keep_until_exit(self.source)
        elif self.step == self.total_steps and self.config.data.source == "tfrecord":
            _log("stopping the data pipeline (tf.data's autotuning thread can take up to a "
                 "minute to notice; the run is saved)")
        self.source = None  # the last reference: the pipeline is destroyed here


def _evaluate_or_warn(evaluate, step: int, say=None) -> dict[str, float]:
    """Runs one evaluation; a failure (bad or missing held-out data) is reported and the run
    goes on, since the checkpoint of this step is already saved."""
    try:
        return evaluate()
    except jax.errors.JaxRuntimeError:
        raise  # a device or peer failure, not an evaluation problem
    except Exception as error:  # noqa: BLE001 - any data error; the step is saved already
        (say or _log)(f"warning: evaluation at step {step} failed and was skipped "
             f"({type(error).__name__}: {error}); training continues")
        return {}


EXIT_LOST_PEER = 3


def _exit_on_lost_peer(error: Exception, step: int, directory: str) -> None:
    """A failed computation in a multi-process run almost always means a peer process died
    (its collectives break). Says so and exits at once: a normal exit would wait in the
    distributed shutdown barrier (and pending checkpoint barriers) for the dead peer until the
    heartbeat timeout, then abort with a C++ stack trace."""
    detail = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    sys.stderr.write(
        f"error: process {jax.process_index()} of {jax.process_count()}: lost contact with "
        f"another process at step {step} (distributed failure: {detail}). A peer process "
        "probably died or was killed; stopping this one. Restart all processes with the same "
        f"command to resume from the last complete checkpoint in {directory}.\n")
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(EXIT_LOST_PEER)


# The sentence-pair head's metrics: zero without the head (objectives mlm, sbo, electra,
# distill), and then left out of the logs, metrics.jsonl and the result.
PAIR_METRICS = ("nsp_loss", "nsp_accuracy")


def _reported(metrics: dict[str, float], pair_head: bool) -> dict[str, float]:
    if pair_head:
        return metrics
    return {k: v for k, v in metrics.items() if k not in PAIR_METRICS}


def _fetch(pending: list[dict[str, jax.Array]], state: TrainState) -> dict[str, float]:
    """One device->host transfer for all steps since the last log; means over them."""
    host, counters = jax.device_get((pending, (state.skipped_total, state.skipped_in_row)))
    out = {k: float(np.mean([m[k] for m in host])) for k in host[-1] if k != "skipped"}
    out["learning_rate"] = float(host[-1]["learning_rate"])
    out["skipped_steps"] = int(counters[0])
    out["skipped_in_row"] = int(counters[1])
    return out


def _progress_bar(config, start: int, total: int):
    if not config.progress_bar or jax.process_index() != 0:
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=start, desc="pretrain", unit="step", dynamic_ncols=True)
