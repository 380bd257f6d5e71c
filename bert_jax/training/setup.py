"""Builds the sharded pieces of a pretraining run for a given mesh: model, optimizer,
abstract state with shardings, and the jitted train / eval steps. Shared by the loop,
tests and benchmarks."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import optax
from jax.sharding import Mesh, NamedSharding

from bert_jax import parallel, xla_flags
from bert_jax.config import BertConfig
from bert_jax.errors import BertJaxError
from bert_jax.modeling import fp8
from bert_jax.modeling.heads import BertForPreTraining
from bert_jax.runs.optimizers import make_optimizer
from bert_jax.runs.state import TrainState, with_fp8_state
from bert_jax.training import config as config_lib
from bert_jax.training.inputs import examples_per_row
from bert_jax.training.steps import make_eval_step, make_train_step

BATCH_FIELDS = (("input_ids", 2), ("input_mask", 2), ("segment_ids", 2),
                ("masked_lm_positions", 2), ("masked_lm_ids", 2), ("masked_lm_weights", 2),
                ("next_sentence_labels", 1))
# Packed rows (pair shards made with ``create-pretraining-data --pack``, or document shards
# with ``data.max_examples_per_row``): next_sentence_labels becomes [batch, k].
PACKED_BATCH_FIELDS = (("example_ids", 2), ("position_ids", 2), ("cls_positions", 2),
                       ("next_sentence_labels", 2), ("next_sentence_weights", 2))


@dataclasses.dataclass
class Training:
    """Everything the loop needs that depends on (config, model config, mesh)."""

    model: nn.Module
    tx: optax.GradientTransformation
    schedule: optax.Schedule
    mesh: Mesh
    rules: tuple
    init_fn: Callable[[jax.Array], TrainState]  # rng -> boxed TrainState
    abstract_state: TrainState  # ShapeDtypeStructs with target shardings
    state_shardings: TrainState
    batch_shardings: dict[str, NamedSharding]
    train_step: Callable  # jitted (state, batch, rng) -> (state, metrics), state donated
    eval_step: Callable  # jitted (params, batch) -> sums
    param_cast: Callable | None = None  # parallel.param_gather_cast, inside the train step
    # Fills a fresh state's params from elsewhere (distill: the teacher and the student's
    # start): (params, param shardings) -> params; None for the other objectives.
    init_params: Callable | None = None
    reduce_grads: Callable | None = None  # parallel.grad_reduction, inside the train step

    def init_state(self, rng: jax.Array) -> TrainState:
        """Fresh state, created directly in its shards."""
        return parallel.sharded_init(self.init_fn, self.state_shardings, rng)

    def global_batch(self, local: dict[str, Any]) -> dict[str, jax.Array]:
        """This process's numpy rows -> global sharded arrays (fields the model needs)."""
        local = {k: local[k] for k in self.batch_shardings}
        return parallel.global_batch(local, self.mesh, self.rules)


def build_training(config: ml_collections.ConfigDict, model_cfg: BertConfig,
                   mesh: Mesh, unroll_microbatches: bool = False) -> Training:
    """``config.microbatches`` must be resolved (>= 1: ``fit_microbatches`` for auto);
    ``unroll_microbatches`` unrolls the accumulation loop (cost probes, ``tpu/compile.py``)."""
    if config.microbatches < 1:
        raise BertJaxError("microbatches=0 (auto) must be resolved before the step is built "
                           "(setup.fit_microbatches)")
    rules = parallel.rules_from_config(config.parallel.logical_axis_rules)
    tx, schedule = make_optimizer(ml_collections.ConfigDict(
        dict(config.optimizer.to_dict(), decay_steps=config_lib.decay_steps(config))))
    seq, preds = config.data.max_seq_length, config.data.max_predictions_per_seq
    pair_head = config_lib.pair_head(config)
    if config.objective in ("sbo", "electra", "distill"):
        if model_cfg.fp8:
            raise BertJaxError(f"model.fp8 is not available with objective="
                               f"{config.objective!r}, which builds its own models (set "
                               "model.fp8=false)")
        from bert_jax.training import family as family_lib

        family = family_lib.build(config, model_cfg, tx, seq, preds)
        model, tx, sums_fn, init_fn = family.model, family.tx, family.sums_fn, family.init_fn
        init_params = family.init_params
    else:
        model = BertForPreTraining(model_cfg, pair_head=pair_head)
        sums_fn = init_params = None

        def init_fn(rng):
            ids = jnp.zeros((1, seq), jnp.int32)
            positions = jnp.zeros((1, preds), jnp.int32)
            variables = model.init({"params": rng}, ids, ids, ids, positions)
            params = variables["params"]
            # BertConfig.fp8: the scaling state rides in the optimizer-state slot
            collection = variables.get(fp8.FP8_COLLECTION)
            return TrainState.create(params, with_fp8_state(tx.init(params), None if (
                collection is None) else fp8.initial_state(collection,
                                                           model_cfg.fp8_amax_history)))

    abstract_state, state_shardings = parallel.abstract_and_shardings(
        init_fn, mesh, rules, jax.random.PRNGKey(0))
    replicated = parallel.replicated(mesh)
    fields = dict(BATCH_FIELDS)
    if examples_per_row(config):
        fields.update(PACKED_BATCH_FIELDS)
    batch_shardings = {name: parallel.batch_sharding(mesh, rules, ndim)
                       for name, ndim in fields.items()}
    param_cast = parallel.param_gather_cast(state_shardings.params, model_cfg.dtype,
                                            config.parallel.get("param_gather", "param_dtype"))
    grad_reduce = config.parallel.get("grad_reduce", "auto")
    if model_cfg.fp8 and grad_reduce == "explicit":
        raise BertJaxError("parallel.grad_reduce='explicit' is not available with model.fp8 "
                           "(its scaling state is not a sum); use auto or partitioner")
    reduce_grads = None if model_cfg.fp8 else parallel.grad_reduction(
        mesh, rules, state_shardings.params, grad_reduce, param_cast, model_cfg.dtype)
    step_fn = make_train_step(
        model, tx, schedule, microbatches=config.microbatches, pair_head=pair_head,
        microbatch_sharding=lambda ndim: parallel.logical_sharding(
            mesh, rules, None, "batch", *([None] * (ndim - 1))), param_cast=param_cast,
        sums_fn=sums_fn, reduce_grads=reduce_grads,
        check_update=bool(config.get("check_update", False)),
        unroll_microbatches=unroll_microbatches)
    step_fn, eval_fn = (parallel.traced_in_mesh(f, mesh, rules) for f in (
        step_fn, make_eval_step(model, pair_head=pair_head, sums_fn=sums_fn)))
    options = xla_flags.tpu_compiler_options(
        mesh.devices.flat[0].platform, config.parallel.get("tpu_collective_matmul", "auto"),
        dict(mesh.shape))
    train_step = jax.jit(step_fn, in_shardings=(state_shardings, batch_shardings, replicated),
                         out_shardings=(state_shardings, replicated), donate_argnums=0,
                         compiler_options=options)
    eval_step = jax.jit(eval_fn,
                        in_shardings=(state_shardings.params, batch_shardings),
                        out_shardings=replicated, compiler_options=options)
    return Training(model, tx, schedule, mesh, rules, init_fn, abstract_state,
                    state_shardings, batch_shardings, train_step, eval_step, param_cast,
                    init_params, reduce_grads)


def abstract_batch(batch_shardings, batch: int, seq: int, predictions: int,
                   examples_per_row: int = 0) -> dict:
    """ShapeDtypeStructs of one global pretraining batch with its shardings; packed rows
    (``examples_per_row`` > 0: ``create-pretraining-data --pack``, or document shards with
    ``data.max_examples_per_row``) add the per-token example ids and positions and the
    per-slot [CLS] positions, NSP labels and weights."""
    k = examples_per_row
    shapes = {"input_ids": (batch, seq), "input_mask": (batch, seq),
              "segment_ids": (batch, seq), "masked_lm_positions": (batch, predictions),
              "masked_lm_ids": (batch, predictions), "masked_lm_weights": (batch, predictions),
              "next_sentence_labels": (batch, k) if k else (batch,),
              "example_ids": (batch, seq), "position_ids": (batch, seq),
              "cls_positions": (batch, k), "next_sentence_weights": (batch, k)}
    weights = ("masked_lm_weights", "next_sentence_weights")
    return {name: jax.ShapeDtypeStruct(
        shapes[name], jnp.float32 if name in weights else jnp.int32,
        sharding=sharding) for name, sharding in batch_shardings.items()}


def fit_microbatches(config: ml_collections.ConfigDict, model_cfg: BertConfig, mesh: Mesh,
                     limit_bytes: int | None, report: Callable[[str], None] | None = None
                     ) -> int:
    """``microbatches=0`` (auto) -> the fewest microbatches whose step fits ``limit_bytes``
    per device, found by compiling the step on ``mesh``'s devices at each probed micro-batch
    (``training/accumulation.py``); without a known limit (CPU devices): 1."""
    from bert_jax.training.accumulation import Probe, largest_fitting, micro_batch_options
    from bert_jax.training.inputs import examples_per_row

    if limit_bytes is None:
        return 1
    rules = parallel.rules_from_config(config.parallel.logical_axis_rules)
    shards = parallel.batch_divisor(mesh, rules)
    per_shard = config.global_batch_size // shards
    seq, preds = config.data.max_seq_length, config.data.max_predictions_per_seq

    def probe(micro: int) -> Probe:
        k = per_shard // micro
        trial = config.copy_and_resolve_references()
        with trial.unlocked():
            trial.microbatches = k
        training = build_training(trial, model_cfg, mesh)
        batch = abstract_batch(training.batch_shardings, config.global_batch_size, seq, preds,
                               examples_per_row(config))
        rng = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=parallel.replicated(mesh))
        try:
            memory = training.train_step.lower(training.abstract_state, batch,
                                               rng).compile().memory_analysis()
        except Exception as e:  # the compiler refusing the program for memory
            if "RESOURCE_EXHAUSTED" not in str(e) and "memory" not in str(e).lower():
                raise
            return Probe(micro, k, None, limit_bytes, False)
        total = int(memory.argument_size_in_bytes + memory.output_size_in_bytes
                    - memory.alias_size_in_bytes + memory.temp_size_in_bytes
                    + memory.generated_code_size_in_bytes)
        return Probe(micro, k, total, limit_bytes, total <= limit_bytes)

    chosen, _ = largest_fitting(micro_batch_options(config.global_batch_size, shards), probe,
                                None if report is None else lambda p: report(p.describe()))
    return chosen.microbatches


def device_memory_limit(mesh: Mesh) -> int | None:
    """Bytes one device of ``mesh`` can hold (its runtime's limit), None where unknown."""
    try:
        stats = mesh.devices.flat[0].memory_stats()
    except Exception:  # CPU devices and abstract (compile-only) devices report none
        return None
    return int(stats["bytes_limit"]) if stats and "bytes_limit" in stats else None
