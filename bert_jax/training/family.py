"""The model, optimizer, init and loss sums of the family objectives (``objective`` = sbo |
electra | distill), for ``setup.build_training``; and the DistilBERT student's start from a
teacher checkpoint.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from bert_jax.checkpoint import store
from bert_jax.config import BertConfig
from bert_jax.errors import BertJaxError
from bert_jax.modeling import family
from bert_jax.modeling.params import flatten_params, to_layout, unflatten_params
from bert_jax.runs.state import TrainState
from bert_jax.training import objectives

# The teacher's architecture; everything else (dtype, kernels, layouts) follows the student.
_ARCHITECTURE = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                 "intermediate_size", "hidden_act", "max_position_embeddings",
                 "type_vocab_size", "layer_norm_eps", "embedding_size", "share_layers",
                 "vocab_pad_multiple")


@dataclasses.dataclass
class FamilyParts:
    model: object
    tx: optax.GradientTransformation
    sums_fn: Callable
    init_fn: Callable  # rng -> boxed TrainState
    init_params: Callable | None = None  # (params, shardings) -> params


def teacher_config(config: ml_collections.ConfigDict, runtime: BertConfig) -> BertConfig:
    """The distillation teacher's config: its checkpoint's architecture, ``runtime``'s other
    fields."""
    if not config.distill.teacher:
        raise BertJaxError("objective='distill' needs --config.distill.teacher (a pretraining "
                           "workdir or model directory)")
    config_dir, _ = store.resolve(config.distill.teacher)
    saved, _ = store.read_config(config_dir)
    return runtime.replace(**{k: getattr(saved, k) for k in _ARCHITECTURE})


def student_config(config: ml_collections.ConfigDict, model_cfg: BertConfig,
                   explicit: dict) -> BertConfig:
    """DistilBERT's student: the teacher's architecture with half its layers (DistilBERT
    removes every other layer), unless ``model.*`` fields say otherwise."""
    teacher = teacher_config(config, model_cfg)
    student = teacher.replace(num_hidden_layers=max(1, teacher.num_hidden_layers // 2))
    return student.replace(**{k: v for k, v in explicit.items() if k in _ARCHITECTURE})


def _dummy(seq: int, preds: int):
    ids = jnp.zeros((1, seq), jnp.int32)
    positions = jnp.zeros((1, preds), jnp.int32)
    return ids, positions, jnp.ones((1, preds), jnp.float32)


def build(config: ml_collections.ConfigDict, model_cfg: BertConfig,
          tx: optax.GradientTransformation, seq: int, preds: int) -> FamilyParts:
    ids, positions, weights = _dummy(seq, preds)
    if config.objective == "sbo":
        model = family.SpanBertForPreTraining(model_cfg, config.sbo_max_relative_position)

        def init_fn(rng):
            params = model.init({"params": rng}, ids, ids, ids, positions, weights)["params"]
            return TrainState.create(params, tx.init(params))

        return FamilyParts(model, tx, objectives.span_boundary_sums(model), init_fn)

    if config.objective == "electra":
        gen_cfg = family.generator_config(model_cfg, config.electra.generator_fraction)
        model = family.ElectraForPreTraining(model_cfg, gen_cfg)

        def init_fn(rng):
            params = model.init({"params": rng}, ids, ids, ids, positions, positions, weights,
                                jax.random.PRNGKey(0))["params"]
            params = family.untie_generator_embeddings(params)
            return TrainState.create(params, tx.init(params))

        return FamilyParts(model, tx, objectives.electra_sums(model, config.electra.rtd_weight),
                           init_fn)

    if config.objective == "distill":
        teacher_cfg = teacher_config(config, model_cfg)
        if teacher_cfg.hidden_size != model_cfg.hidden_size:
            raise BertJaxError(f"distill: the student's hidden_size {model_cfg.hidden_size} "
                               f"must equal the teacher's {teacher_cfg.hidden_size} (the "
                               "cosine loss compares hidden states)")
        model = family.DistillationPair(model_cfg, teacher_cfg)
        frozen_tx = freeze_teacher(tx)

        def init_fn(rng):
            params = model.init({"params": rng}, ids, ids, ids, positions)["params"]
            return TrainState.create(params, frozen_tx.init(params))

        def init_params(params, shardings):
            return init_from_teacher(config.distill.teacher, teacher_cfg, model_cfg, params,
                                     shardings)

        return FamilyParts(model, frozen_tx, objectives.distill_sums(
            model, config.distill.temperature, config.distill.alpha_kd,
            config.distill.alpha_cos), init_fn, init_params)
    raise BertJaxError(f"objective={config.objective!r} is not a family objective")


def freeze_teacher(tx: optax.GradientTransformation) -> optax.GradientTransformation:
    """``tx`` with every update of ``params["teacher"]`` zero (weight decay included). The
    teacher's gradients are zero already (``stop_gradient``), so its optimizer moments stay
    zero; they keep the state one tree that the mesh machinery shards like the parameters."""
    def update(grads, state, params=None):
        updates, state = tx.update(grads, state, params)
        return {**updates, "teacher": jax.tree.map(jnp.zeros_like, updates["teacher"])}, state

    return optax.GradientTransformation(tx.init, update)


def every_other_layer(teacher: dict, student_layers: int) -> dict:
    """A student encoder from teacher layers 0, 2, 4, ... (unrolled ``layer_i`` or scanned
    ``layers`` with a leading layer axis)."""
    if "layers" in teacher:
        stacked = jax.tree.map(lambda x: np.asarray(x)[0::2][:student_layers], teacher["layers"])
        return {"layers": stacked}
    if "layer" in teacher:
        raise BertJaxError("distill: a teacher with shared layers has no layers to pick from")
    return {f"layer_{i}": teacher[f"layer_{2 * i}"] for i in range(student_layers)}


def init_from_teacher(path: str, teacher_cfg: BertConfig, student_cfg: BertConfig, params,
                      shardings):
    """``params`` with ``teacher`` = the teacher checkpoint's encoder and MLM head, and the
    student's embeddings, MLM head and layers from the teacher (every other layer)."""
    loaded = to_layout(store.load_newest(path)[2], teacher_cfg)
    if 2 * (student_cfg.num_hidden_layers - 1) >= teacher_cfg.num_hidden_layers:
        raise BertJaxError(f"distill: a {student_cfg.num_hidden_layers}-layer student cannot "
                           f"take every other layer of a {teacher_cfg.num_hidden_layers}-layer "
                           "teacher")
    student_bert = dict(loaded["bert"], encoder=every_other_layer(
        loaded["bert"]["encoder"], student_cfg.num_hidden_layers))
    source = {"teacher": {"bert": loaded["bert"], "mlm": loaded["mlm"]},
              "bert": student_bert, "mlm": loaded["mlm"]}
    flat_source = flatten_params(source)
    flat = flatten_params(params)
    flat_shardings = flatten_params(shardings)
    missing = sorted(set(flat) - set(flat_source))
    if missing:
        raise BertJaxError(f"{path}: the teacher checkpoint lacks {missing[:3]}")
    for name in flat:
        value = np.asarray(flat_source[name], dtype=flat[name].dtype)
        if value.shape != tuple(flat[name].shape):
            raise BertJaxError(f"{path}: {name} has shape {value.shape}, the model needs "
                               f"{tuple(flat[name].shape)}")
        flat[name] = jax.make_array_from_callback(value.shape, flat_shardings[name],
                                                  lambda idx, v=value: v[idx])
    return unflatten_params(flat)
