"""Fine-tuning mechanics: the task model, per-kind losses, the jitted pure train and predict
steps over a data-parallel mesh, batching with padding, and the epoch loop.

Nothing here reads task files or checkpoints (``inputs.py`` and ``model_init.py`` do);
``Finetuner`` takes numpy feature dicts and parameter trees; :func:`build_finetuner` makes one
from a run config (``config.py``). Every batch has one of a few fixed shapes: its length is
one of the run's length buckets (``bucketing.py``), and the last batch of an epoch and of an
evaluation is padded with copies of a row whose ``example_weight`` is 0, so they carry no loss
and their predictions are dropped — no example is skipped. Packed training rows
(``packing.py``) carry several examples each: their ``example_weight`` is
[batch, max_examples_per_row] (the filled slots of real rows) and the losses are per example.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from jax.sharding import Mesh

from bert_jax import parallel
from bert_jax.config import BertConfig
from bert_jax.errors import BertJaxError
from bert_jax.finetuning import bucketing
from bert_jax.finetuning import packing as task_packing
from bert_jax.modeling.heads import (
    BertForMultipleChoice,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    packing_inputs,
)
from bert_jax.runs.optimizers import make_optimizer
from bert_jax.runs.state import TrainState
from bert_jax.tasks.base import IGNORE_INDEX, INPUT_KEYS, Task

Batch = dict[str, jax.Array]
# [batch] float32: 1 for real rows, 0 for padding rows; packed rows: [batch, examples per row]
WEIGHT_KEY = "example_weight"
TEACHER_KEY = "teacher_logits"  # [batch, labels] float32: task distillation's soft labels
HEAD_NAMES = ("classifier", "qa_outputs", "feature_mix", "bilstm")


def build_model(task: Task, config: BertConfig, freeze_encoder: bool = False,
                features: Mapping[str, Any] | None = None) -> nn.Module:
    """The Flax model for the task's kind: {"bert": encoder, head name: head}.

    ``features``: the run's ``feature_layers``, ``feature_head``, ``lstm_hidden_size`` and
    ``lstm_layers``; other than the last layer and a linear head they select the feature-based
    models of ``modeling/feature_heads.py`` (token and sequence classification)."""
    features = dict(features or {})
    layers = features.get("feature_layers", "last")
    head = features.get("feature_head", "linear")
    if layers != "last" or head != "linear":
        from bert_jax.modeling.feature_heads import BertFeatureClassifier, BertFeatureTagger

        if task.kind == "token_classification":
            return BertFeatureTagger(config, task.num_labels, freeze_encoder, layers, head,
                                     features.get("lstm_hidden_size", 768),
                                     features.get("lstm_layers", 2))
        if head != "linear" or task.kind not in ("classification", "regression"):
            raise BertJaxError(f"task {task.name} ({task.kind}): feature_layers={layers!r} / "
                               f"feature_head={head!r} apply to token classification "
                               "(any head) and sequence classification (linear head) only")
        return BertFeatureClassifier(config, task.num_labels, freeze_encoder, layers)
    if task.kind in ("classification", "regression"):
        return BertForSequenceClassification(config, task.num_labels, freeze_encoder)
    if task.kind == "token_classification":
        return BertForTokenClassification(config, task.num_labels, freeze_encoder)
    if task.kind == "span":
        return BertForQuestionAnswering(config, freeze_encoder)
    if task.kind == "multiple_choice":
        return BertForMultipleChoice(config, freeze_encoder)
    raise BertJaxError(f"task {task.name}: unknown kind {task.kind!r}")


def output_keys(kind: str) -> tuple[str, ...]:
    return ("start_logits", "end_logits") if kind == "span" else ("logits",)


# ---- losses ---------------------------------------------------------------------------------
def _weighted_mean(values, weights):
    total = jnp.sum(weights)
    return jnp.sum(values * weights) / jnp.maximum(total, 1.0), total


def task_loss(kind: str, outputs: Mapping[str, jax.Array], batch: Batch
              ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Mean loss over real rows (tokens for NER) and {"loss_sum", "count"} for averaging.

    classification / multiple choice: cross-entropy over classes / choices; regression: MSE
    of the single output; token classification: cross-entropy over tokens whose label is not
    ``IGNORE_INDEX``; span: (CE of the start + CE of the end position) / 2. Packed rows
    (classification, regression): logits, labels and weights per example slot, [batch, k].
    """
    weights = batch[WEIGHT_KEY].astype(jnp.float32)  # [batch] ([batch, k] packed)
    if kind in ("classification", "multiple_choice"):
        logits = outputs["logits"].astype(jnp.float32)  # [batch, (k,) classes | choices]
        per_row = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label_ids"])
        loss, count = _weighted_mean(per_row, weights)
    elif kind == "regression":
        preds = outputs["logits"].astype(jnp.float32).reshape(weights.shape)
        loss, count = _weighted_mean(jnp.square(preds - batch["labels"]), weights)
    elif kind == "token_classification":
        logits = outputs["logits"].astype(jnp.float32)  # [batch, seq, labels]
        labels = batch["label_ids"]  # [batch, seq]
        valid = (labels != IGNORE_INDEX).astype(jnp.float32) * weights[:, None]
        per_token = optax.softmax_cross_entropy_with_integer_labels(
            logits, jnp.where(labels == IGNORE_INDEX, 0, labels))
        loss, count = _weighted_mean(per_token, valid)
    elif kind == "span":
        start = optax.softmax_cross_entropy_with_integer_labels(
            outputs["start_logits"].astype(jnp.float32), batch["start_positions"])
        end = optax.softmax_cross_entropy_with_integer_labels(
            outputs["end_logits"].astype(jnp.float32), batch["end_positions"])
        loss, count = _weighted_mean((start + end) / 2, weights)
    else:
        raise BertJaxError(f"unknown task kind {kind!r}")
    return loss, {"loss_sum": loss * jnp.maximum(count, 1.0), "count": count}


def distill_loss(kind: str, logits, labels, teacher, temperature: float, alpha: float):
    """Per-row loss: the hard-label loss and the soft-target loss mixed by ``alpha``."""
    logits = logits.astype(jnp.float32)
    teacher = jax.lax.stop_gradient(teacher.astype(jnp.float32))
    if kind == "regression":
        preds = logits.reshape(labels.shape)
        return ((1 - alpha) * jnp.square(preds - labels)
                + alpha * jnp.square(preds - teacher.reshape(labels.shape)))
    hard = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    t = temperature
    log_p = jax.nn.log_softmax(teacher / t, axis=-1)
    log_q = jax.nn.log_softmax(logits / t, axis=-1)
    soft = jnp.sum(jnp.exp(log_p) * (log_p - log_q), axis=-1) * t * t
    return (1 - alpha) * hard + alpha * soft


# ---- steps ----------------------------------------------------------------------------------
def _apply(model: nn.Module, params, batch: Batch, rng=None):
    return model.apply({"params": params}, batch["input_ids"], batch["input_mask"],
                       batch["segment_ids"], deterministic=rng is None,
                       rngs={"dropout": rng} if rng is not None else None,
                       **packing_inputs(batch))


def make_train_step(model: nn.Module, tx: optax.GradientTransformation, kind: str,
                    distill: tuple[float, float] | None = None
                    ) -> Callable[[TrainState, Batch, jax.Array], tuple[TrainState, dict]]:
    """``train_step(state, batch, rng) -> (state, {"loss_sum", "count", "grad_norm"})``;
    dropout key ``fold_in(rng, step)`` so a run depends only on its seed. ``distill`` =
    (temperature, alpha): the loss of ``finetuning/distill.py`` against ``teacher_logits``."""

    def loss_fn(params, batch, rng):
        outputs = _apply(model, params, batch, rng)
        if distill is None:
            return task_loss(kind, outputs, batch)
        labels = batch["labels" if kind == "regression" else "label_ids"]
        per_row = distill_loss(kind, outputs["logits"], labels, batch[TEACHER_KEY], *distill)
        loss, count = _weighted_mean(per_row, batch[WEIGHT_KEY].astype(jnp.float32))
        return loss, {"loss_sum": loss * jnp.maximum(count, 1.0), "count": count}

    def train_step(state: TrainState, batch: Batch, rng: jax.Array):
        step_rng = jax.random.fold_in(rng, state.step)
        grads, sums = jax.grad(loss_fn, has_aux=True)(state.params, batch, step_rng)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        sums["grad_norm"] = optax.global_norm(grads)
        return state.replace(step=state.step + 1, params=params, opt_state=opt_state), sums

    return train_step


def make_predict_step(model: nn.Module, kind: str) -> Callable[[Any, Batch], dict]:
    """``predict_step(params, batch) -> {output key: float32 array}`` (no dropout)."""

    def predict_step(params, batch: Batch):
        out = _apply(model, params, batch)
        return {k: out[k].astype(jnp.float32) for k in output_keys(kind)}

    return predict_step


def zero_encoder_updates(updates, params=None) -> Any:
    """Feature-based fine-tuning: the encoder's updates (weight decay included) become 0."""
    del params
    return {name: jax.tree.map(jnp.zeros_like, sub) if name == "bert" else sub
            for name, sub in updates.items()}


def make_tx(config: ml_collections.ConfigDict, total_steps: int
            ) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """The run's ``optimizer`` section over ``total_steps``: AdamW (no decay on LayerNorm or
    biases) or LAMB, warmup over ``warmup_steps`` (-1: ``warmup_proportion`` of the steps),
    then ``decay`` to ``end_learning_rate`` at ``decay_steps`` (-1: the last step); clipping
    first. A frozen encoder gets no update at all (not even weight decay)."""
    opt = config.optimizer
    warmup = int(opt.warmup_steps) if opt.warmup_steps >= 0 \
        else int(opt.warmup_proportion * total_steps)
    decay_steps = total_steps if opt.decay_steps < 0 else int(opt.decay_steps)
    section = ml_collections.ConfigDict(opt.to_dict())
    section.warmup_steps = warmup
    section.decay_steps = max(decay_steps, warmup + 1) if opt.decay_steps < 0 else decay_steps
    tx, schedule = make_optimizer(section)
    if config.freeze_encoder:
        tx = optax.chain(tx, optax.stateless(zero_encoder_updates))
    return tx, schedule


# ---- batching -------------------------------------------------------------------------------
def num_rows(features: Mapping[str, np.ndarray]) -> int:
    return int(features["input_ids"].shape[0])


@dataclasses.dataclass
class Finetuner:
    """A task model on a mesh: sharded init/placement, jitted steps, epochs and prediction."""

    task: Task
    model: nn.Module
    mesh: Mesh
    rules: tuple
    batch_size: int
    eval_batch_size: int
    max_seq_length: int
    tx: optax.GradientTransformation | None = None
    schedule: optax.Schedule | None = None
    # Sequence lengths of the batches (``bucketing.py``); default: max_seq_length only.
    buckets: tuple[int, ...] = ()
    distill: tuple[float, float] | None = None  # (temperature, alpha) with teacher logits
    # (program, length) -> its compilation under way in a background thread (compile_ahead)
    _compiling: dict = dataclasses.field(default_factory=dict, repr=False)
    _compiled_ahead: set = dataclasses.field(default_factory=set, repr=False)

    def __post_init__(self):
        for name, size in (("global_batch_size", self.batch_size),
                           ("eval_batch_size", self.eval_batch_size)):
            divisor = parallel.batch_divisor(self.mesh, self.rules) * jax.process_count()
            if size % divisor:
                raise BertJaxError(f"{name}={size} must be divisible by the {divisor} batch "
                                   f"shards of the mesh {dict(self.mesh.shape)}")
        self.kind = self.task.kind
        self.buckets = tuple(self.buckets) or (self.max_seq_length,)
        if self.buckets[-1] != self.max_seq_length:
            raise BertJaxError(f"the longest length bucket {self.buckets[-1]} must be "
                               f"max_seq_length={self.max_seq_length}")
        self.label_keys = tuple(self.task.label_keys)
        self.abstract_params, self.param_shardings = parallel.abstract_and_shardings(
            self._init_params, self.mesh, self.rules, jax.random.PRNGKey(0))
        out_sharding = {k: parallel.batch_sharding(self.mesh, self.rules, 2)
                        for k in output_keys(self.kind)}
        # Inputs arrive committed to their shardings (params placed, batches global).
        # Traced inside the mesh: the model's activation constraints and the flash kernel's
        # per-shard split (shard_map) need it, as in pretraining (training/setup.py).
        in_mesh = functools.partial(parallel.traced_in_mesh, mesh=self.mesh, rules=self.rules)
        self.predict_step = jax.jit(in_mesh(make_predict_step(self.model, self.kind)),
                                    out_shardings=out_sharding)
        # Jitted once per Finetuner, so runs that share one (FinetunerCache) share the programs.
        self._init_jit = jax.jit(lambda rng: nn.unbox(self._init_params(rng)),
                                 out_shardings=self.param_shardings)
        if self.tx is not None:
            _, self.state_shardings = parallel.abstract_and_shardings(
                lambda rng: self._init_state(self._init_params(rng)), self.mesh, self.rules,
                jax.random.PRNGKey(0))
            self._create_state_jit = jax.jit(lambda p: nn.unbox(self._init_state(p)),
                                             out_shardings=self.state_shardings)
            self.train_step = jax.jit(
                in_mesh(make_train_step(self.model, self.tx, self.kind, self.distill)),
                out_shardings=(self.state_shardings, parallel.replicated(self.mesh)),
                donate_argnums=0)

    # ---- parameters ---------------------------------------------------------------------
    def _dummy_inputs(self):
        shape = (1, self.task.num_choices, self.max_seq_length) \
            if self.kind == "multiple_choice" else (1, self.max_seq_length)
        return jnp.zeros(shape, jnp.int32)

    def _init_params(self, rng):
        # The same parameters from the model on XLA's own ops: cheaper to compile.
        model = self.model.clone(config=self.model.config.with_xla_kernels())
        ids = self._dummy_inputs()
        return model.init({"params": rng}, ids, jnp.ones_like(ids), ids)["params"]

    def _init_state(self, params) -> TrainState:
        return TrainState.create(params, self.tx.init(params))

    def init_params(self, rng: jax.Array):
        """Fresh parameters, created directly in their shards."""
        return self._init_jit(rng)

    def fill_fresh(self, params, rng: jax.Array):
        """``params`` (host arrays, e.g. a pretrained encoder merged into
        :attr:`abstract_params`) with every leaf still a ShapeDtypeStruct replaced by its
        value from :meth:`init_params` ``(rng)``, bit for bit. The program computes those
        leaves only (XLA drops the rest), so it compiles in a fraction of the full
        initialisation's time (that one draws random numbers for every tensor)."""
        from bert_jax.modeling.params import flatten_params, unflatten_params

        flat = flatten_params(params)
        missing = {p for p, v in flat.items() if isinstance(v, jax.ShapeDtypeStruct)}
        if missing:
            fresh = jax.jit(lambda r: {p: v for p, v in flatten_params(
                nn.unbox(self._init_params(r))).items() if p in missing})(rng)
            flat.update(jax.device_get(fresh))
        return unflatten_params(flat)

    def place_params(self, params):
        """Host (numpy) parameters -> global arrays with the model's shardings."""
        def put(value, sharding):
            value = np.asarray(value)
            return jax.make_array_from_callback(value.shape, sharding, lambda i: value[i])

        return jax.tree.map(put, params, self.param_shardings)

    def create_state(self, params) -> TrainState:
        """Train state (optimizer moments zero, step 0) around sharded ``params``."""
        return self._create_state_jit(params)

    # ---- batches ------------------------------------------------------------------------
    def _global(self, batch: dict[str, np.ndarray]) -> Batch:
        """The global batch (every process holds it whole) -> this process's rows, sharded."""
        per_process = len(batch[WEIGHT_KEY]) // jax.process_count()
        lo = jax.process_index() * per_process
        local = {k: v[lo:lo + per_process] for k, v in batch.items()}
        return parallel.global_batch(local, self.mesh, self.rules)

    # ---- compiling ahead ----------------------------------------------------------------
    def compile_ahead(self, state: TrainState, rng: jax.Array,
                      train_features: Mapping[str, np.ndarray],
                      eval_features: Sequence[Mapping[str, np.ndarray]] = ()) -> None:
        """Starts compiling the train step at every length of ``train_features``'s batches
        and the predict step at every length of each of ``eval_features``'s, each in a
        background thread: XLA compiles with Python's lock released, so the programs compile
        at the same time, and while this thread goes on. The first call of each program
        waits for its compilation; the jitted step then finds it in its cache (same shapes,
        shardings and types). An error of a background compilation is raised again at that
        first call."""
        from concurrent.futures import ThreadPoolExecutor

        jobs = [(("train", length), self.train_step, (_specs(state), batch, _specs(rng)))
                for length, batch in self._one_batch_per_length(
                    train_features, self._train_keys(), self.batch_size)]
        predict = {}
        for features in eval_features:
            for length, batch in self._one_batch_per_length(features, INPUT_KEYS,
                                                            self.eval_batch_size):
                predict.setdefault(length, batch)
        jobs += [(("predict", length), self.predict_step, (_specs(state.params), batch))
                 for length, batch in predict.items()]
        jobs = [job for job in jobs if job[0] not in self._compiled_ahead]  # a later run
        if not jobs:
            return
        pool = ThreadPoolExecutor(max_workers=len(jobs), thread_name_prefix="compile")
        for key, step, args in jobs:
            self._compiled_ahead.add(key)
            self._compiling[key] = pool.submit(lambda s=step, a=args: s.lower(*a).compile())
        pool.shutdown(wait=False)

    def _one_batch_per_length(self, features, keys, batch_size):
        """(length, abstract global batch) for each length the batches of ``features``
        take."""
        n = num_rows(features)
        if n == 0:
            return []
        plan = self.plan(features, np.arange(n), batch_size)
        first = {p.seq_len: p for p in reversed(plan)}
        out = []
        for length, planned in sorted(first.items()):
            planned = bucketing.PlannedBatch(planned.rows[:1], length)
            batch, _ = next(self.batches(features, keys, [planned], batch_size))
            out.append((length, _specs(self._global(batch))))
        return out

    def _compiled(self, program: str, length: int) -> None:
        """Waits for ``program`` at ``length`` if it is compiling in the background."""
        future = self._compiling.pop((program, length), None)
        if future is not None:
            future.result()

    # ---- training -----------------------------------------------------------------------
    def _train_keys(self) -> tuple[str, ...]:
        keys = (*INPUT_KEYS, *self.label_keys)
        return (*keys, TEACHER_KEY) if self.distill is not None else keys

    def steps_per_epoch(self, features: Mapping[str, np.ndarray]) -> int:
        return math.ceil(num_rows(features) / self.batch_size)

    def plan(self, features: Mapping[str, np.ndarray], order: np.ndarray, batch_size: int
             ) -> list[bucketing.PlannedBatch]:
        """Batches of the rows in ``order`` grouped into the length buckets (packed rows:
        max_seq_length only, they are full)."""
        if len(self.buckets) == 1 or task_packing.is_packed(features):
            return [bucketing.PlannedBatch(order[s:s + batch_size], self.max_seq_length)
                    for s in range(0, len(order), batch_size)]
        return bucketing.plan_batches(bucketing.row_lengths(features["input_mask"]),
                                      self.buckets, order, batch_size)

    def batches(self, features: Mapping[str, np.ndarray], keys: tuple[str, ...],
                plan: list[bucketing.PlannedBatch], batch_size: int
                ) -> Iterator[tuple[dict, int]]:
        """(batch with ``example_weight``, real rows) for each planned batch."""
        packed = task_packing.is_packed(features)
        if packed:
            keys = (*keys, *task_packing.INPUT_KEYS, task_packing.SLOTS_KEY)
        for planned in plan:
            batch, real = bucketing.gather(features, keys, planned, batch_size,
                                           self.max_seq_length)
            weight = np.zeros(batch_size, np.float32)
            weight[:real] = 1.0
            if packed:  # [batch, k]: the filled slots of the real rows
                weight = batch.pop(task_packing.SLOTS_KEY) * weight[:, None]
            batch[WEIGHT_KEY] = weight
            yield batch, real

    def train_epoch(self, state: TrainState, features: Mapping[str, np.ndarray], epoch: int,
                    seed: int, rng: jax.Array, log: Callable[[str], None] | None = None,
                    log_every: int = 0, progress=None,
                    scalars: Callable[[int, dict[str, float]], None] | None = None
                    ) -> tuple[TrainState, dict[str, float]]:
        """One pass over ``features`` in an order drawn from (seed, epoch); with length
        buckets the batches are formed in that order and then shuffled (``bucketing.py``).
        ``progress`` (a tqdm bar) advances every step; ``scalars(step, {"loss", "grad_norm"})``
        receives the running epoch loss at every log point (step counts from the run's
        start)."""
        missing = [k for k in self.label_keys if k not in features]
        if missing:
            raise BertJaxError(f"{self.task.name}: training features lack labels {missing}")
        keys = self._train_keys()
        order = np.random.default_rng([seed, epoch]).permutation(num_rows(features))
        plan = self.plan(features, order, self.batch_size)
        if len(self.buckets) > 1:
            plan = bucketing.shuffled(plan, seed, epoch)
        loss_sum = count = 0.0
        pending = []
        first_step_s = None
        t0 = time.perf_counter()
        for i, (batch, _) in enumerate(self.batches(features, keys, plan, self.batch_size)):
            if self._compiling:
                self._compiled("train", batch["input_ids"].shape[-1])
            state, sums = self.train_step(state, self._global(batch), rng)
            pending.append(sums)
            if i == 0:
                jax.block_until_ready(sums)
                first_step_s = time.perf_counter() - t0
            if progress is not None:
                progress.update(1)
            if (log is not None or scalars is not None) and log_every \
                    and (i + 1) % log_every == 0:
                fetched = jax.device_get(pending)
                pending = []
                loss_sum += sum(float(s["loss_sum"]) for s in fetched)
                count += sum(float(s["count"]) for s in fetched)
                loss, grad_norm = loss_sum / max(count, 1.0), float(fetched[-1]["grad_norm"])
                if progress is not None:
                    progress.set_postfix(loss=f"{loss:.4f}")
                elif log is not None:
                    log(f"epoch {epoch + 1} step {i + 1}/{self.steps_per_epoch(features)} "
                        f"loss {loss:.4f} grad_norm {grad_norm:.3f}")
                if scalars is not None:
                    scalars(epoch * self.steps_per_epoch(features) + i + 1,
                            {"loss": loss, "grad_norm": grad_norm})
        fetched = jax.device_get(pending)
        loss_sum += sum(float(s["loss_sum"]) for s in fetched)
        count += sum(float(s["count"]) for s in fetched)
        jax.block_until_ready(state.step)
        seconds = time.perf_counter() - t0
        return state, {"loss": loss_sum / max(count, 1.0), "seconds": seconds,
                       "first_step_seconds": first_step_s or 0.0,
                       "sequences": float(num_rows(features))}

    # ---- prediction ---------------------------------------------------------------------
    def predict(self, params, features: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Model outputs for every feature row (float32 numpy), padding rows dropped."""
        from jax.experimental import multihost_utils

        n = num_rows(features)
        if n == 0:
            raise BertJaxError(f"{self.task.name}: nothing to predict (0 feature rows)")
        outputs: dict[str, list[np.ndarray]] = {k: [] for k in output_keys(self.kind)}
        plan = self.plan(features, np.arange(n), self.eval_batch_size)
        per_sequence = self.kind in ("span", "token_classification")  # [B, seq, ...] outputs
        for batch, real in self.batches(features, INPUT_KEYS, plan, self.eval_batch_size):
            if self._compiling:
                self._compiled("predict", batch["input_ids"].shape[-1])
            out = self.predict_step(params, self._global(batch))
            if jax.process_count() > 1:
                out = multihost_utils.process_allgather(out, tiled=True)
            for k, v in out.items():
                v = np.asarray(v)[:real]
                outputs[k].append(bucketing.pad_sequence_outputs(v, self.max_seq_length)
                                  if per_sequence else v)
        rows = np.concatenate([p.rows for p in plan])
        inverse = np.empty(n, np.int64)
        inverse[rows] = np.arange(n)  # outputs back in feature order
        return {k: np.concatenate(v)[inverse] for k, v in outputs.items()}


def _specs(tree):
    """ShapeDtypeStructs of ``tree``'s arrays as a jitted call sees them: shape, dtype, weak
    type, and the sharding of committed arrays (an uncommitted one may go anywhere)."""
    def spec(x):
        sharding = x.sharding if getattr(x, "committed", True) else None
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding,
                                    weak_type=x.aval.weak_type)

    return jax.tree.map(spec, tree)


def model_outputs(kind: str, outputs: dict[str, np.ndarray]):
    """Predict-step outputs -> what ``Task.postprocess`` takes for this kind."""
    return outputs if kind == "span" else outputs["logits"]


def run_buckets(config: ml_collections.ConfigDict, input_mask=None, passes: int = 1
                ) -> tuple[int, ...]:
    """The run's length buckets; with ``input_mask`` (the rows to be run, ``passes`` times)
    without those too small to pay for their compilation (``length_bucket_min_sequences``)."""
    buckets = bucketing.bucket_lengths(config.max_seq_length, config.length_bucket_min)
    if input_mask is not None:
        buckets = bucketing.keep_worthwhile(buckets, bucketing.row_lengths(input_mask), passes,
                                            config.get("length_bucket_min_sequences", 0))
    return tuple(buckets)


def run_model_config(config: ml_collections.ConfigDict, model_cfg: BertConfig, input_mask=None,
                     passes: int = 1) -> BertConfig:
    """``model_cfg`` for the run's programs. A run with fewer than ``kernel_min_sequences``
    sequences to compute (the rows of ``input_mask`` x ``passes``) puts the kernel choices
    it leaves to ``auto`` on XLA's own ops (:meth:`BertConfig.with_xla_kernels`): kernels
    pay for their tracing, lowering and loading only over a long run. One with fewer than
    ``unroll_min_sequences`` scans the encoder layers unless ``model.scan_layers`` is set
    (one layer's code to compile instead of one per layer). Same parameters either way, in
    the layer layout of the result (:func:`~bert_jax.modeling.params.to_layout`)."""
    if input_mask is None:
        return model_cfg
    sequences = len(input_mask) * passes
    minimum = config.get("kernel_min_sequences", 0)
    if minimum and sequences < minimum:
        model_cfg = model_cfg.with_xla_kernels(only_auto=True)
    minimum = config.get("unroll_min_sequences", 0)
    chosen = config.model.get("scan_layers") if "model" in config else None
    if minimum and sequences < minimum and chosen is None and not model_cfg.share_layers:
        model_cfg = model_cfg.replace(scan_layers=True)
    return model_cfg


def build_finetuner(task: Task, config: ml_collections.ConfigDict, model_cfg: BertConfig,
                    total_steps: int | None, input_mask=None, passes: int = 1) -> Finetuner:
    """The run's Finetuner: its mesh and rules, the task model, and (with ``total_steps``) the
    optimizer; without, prediction only. ``input_mask`` (the rows to be run, ``passes`` times)
    drops length buckets too small to pay for their compilation
    (``length_bucket_min_sequences``) and, in a short run, picks XLA's ops where the model
    leaves the kernels to ``auto`` and scans the layers (:func:`run_model_config`)."""
    model_cfg = run_model_config(config, model_cfg, input_mask, passes)
    if config.max_seq_length > model_cfg.max_sequence_length:
        raise BertJaxError(f"max_seq_length={config.max_seq_length} exceeds the model's "
                           f"{model_cfg.max_sequence_length} positions (max_position_embeddings="
                           f"{model_cfg.max_position_embeddings}, position_offset="
                           f"{model_cfg.position_offset})")
    mesh = parallel.create_mesh(config.parallel.mesh)
    rules = parallel.rules_from_config(config.parallel.logical_axis_rules)
    tx, schedule = make_tx(config, total_steps) if total_steps else (None, None)
    features = {k: config[k] for k in ("feature_layers", "feature_head", "lstm_hidden_size",
                                       "lstm_layers") if k in config}
    buckets = run_buckets(config, input_mask, passes)
    return Finetuner(task, build_model(task, model_cfg, config.freeze_encoder, features),
                     mesh, rules,
                     config.global_batch_size, config.eval_batch_size, config.max_seq_length,
                     tx, schedule, buckets,
                     (config.distill_temperature, config.distill_alpha)
                     if total_steps and config.get("distill_from") else None)


class FinetunerCache:
    """Finetuners kept across fine-tuning runs in one process (a sweep over seeds or over
    checkpoints of one shape): a run whose programs would be the same as an earlier run's
    reuses that run's Finetuner, so its steps are neither traced nor compiled again (the
    persistent compilation cache still costs a trace and a lookup per program and run).

    Programs are the same when the task, the model config and every run setting other than
    the per-run inputs below are equal, and so are the number of training steps (it shapes
    the learning-rate schedule) and the length buckets."""

    # Settings that choose inputs of a run, not its programs.
    PER_RUN_KEYS = ("seed", "data_dir", "train_file", "dev_file", "test_file", "tfds_data_dir",
                    "init_checkpoint", "tokenizer", "on_error", "holdout_seed",
                    "max_train_examples", "distill_from", "log_every", "progress_bar",
                    "compilation_cache", "compile_ahead", "postprocess", "reinitialize")

    def __init__(self):
        self._finetuners: dict[str, Finetuner] = {}
        self.hits = 0

    def __len__(self) -> int:
        return len(self._finetuners)

    def key(self, task: Task, config: ml_collections.ConfigDict, model_cfg: BertConfig,
            total_steps: int | None, buckets: tuple[int, ...]) -> str:
        import json

        settings = {k: v for k, v in config.to_dict().items() if k not in self.PER_RUN_KEYS}
        return json.dumps({"task": task.name, "num_labels": task.num_labels,
                           "model": repr(model_cfg), "steps": total_steps,
                           "buckets": list(buckets), "settings": settings,
                           "distill": bool(config.get("distill_from"))},
                          sort_keys=True, default=repr)

    def get(self, task: Task, config: ml_collections.ConfigDict, model_cfg: BertConfig,
            total_steps: int | None, input_mask=None, passes: int = 1) -> Finetuner:
        """:func:`build_finetuner`'s Finetuner, or an earlier one of the same programs."""
        key = self.key(task, config, run_model_config(config, model_cfg, input_mask, passes),
                       total_steps, run_buckets(config, input_mask, passes))
        if key in self._finetuners:
            self.hits += 1
        else:
            self._finetuners[key] = build_finetuner(task, config, model_cfg, total_steps,
                                                    input_mask, passes)
        return self._finetuners[key]
