"""Pure pretraining step functions: losses, the train step (with gradient accumulation and
non-finite skipping) and the eval step. No I/O here; the loop jits these with shardings.

Batch (global arrays): input_ids / input_mask / segment_ids [batch, seq] int32,
masked_lm_positions / masked_lm_ids [batch, P] int32, masked_lm_weights [batch, P] float32,
next_sentence_labels [batch] int32. Packed rows (``bert_jax/data/packing.py``) add
example_ids / position_ids [batch, seq], cls_positions [batch, k] and next_sentence_weights
[batch, k] (1 for a filled example slot); next_sentence_labels is then [batch, k] and the
NSP/SOP loss is per example, weighted by next_sentence_weights.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from bert_jax.config import BertConfig
from bert_jax.modeling import fp8, heads
from bert_jax.modeling.fp8 import FP8_COLLECTION
from bert_jax.runs.state import TrainState, split_fp8_state, with_fp8_state

Batch = dict[str, jax.Array]
NSP_WEIGHTS_KEY = "next_sentence_weights"  # packed rows: [batch, k], 1 per filled slot

# Sums over a (micro)batch; the step divides them by batch-wide denominators so that k
# microbatches give exactly the full-batch loss and gradient.
SUM_KEYS = ("mlm_loss_sum", "mlm_correct", "mlm_weight", "nsp_loss_sum", "nsp_correct",
            "nsp_count")
# Extra loss terms of the family objectives (``objectives.py``): name -> the sums key of its
# denominator. An objective's sums carry ``<name>_loss_sum`` and ``<name>_weighted_sum``.
EXTRA_TERMS = {"sbo": "mlm_weight", "rtd": "token_count", "kd": "mlm_weight",
               "cos": "token_count"}
# Accuracy-like sums of the extra terms: sums key -> (metric name, denominator key).
EXTRA_RATES = {"sbo_correct": ("sbo_accuracy", "mlm_weight"),
               "rtd_correct": ("rtd_accuracy", "token_count"),
               "rtd_replaced": ("rtd_replaced_fraction", "token_count")}


def loss_sums(outputs: dict[str, Any], batch: Batch, pair_head: bool, config: BertConfig
              ) -> dict[str, jax.Array]:
    """Weighted MLM cross-entropy / accuracy sums and NSP (or SOP) sums, all float32; ``config``
    (the model's) picks the MLM loss's kernels."""
    weights = batch["masked_lm_weights"].astype(jnp.float32)  # [batch, P]
    # [batch, P] each: the fused decoder + loss kernels on GPUs
    # (config.kernels.fused_mlm_loss), else XLA's passes over the float32 logits
    nll, correct = heads.mlm_cross_entropy(outputs, batch["masked_lm_ids"], config)
    sums = {"mlm_loss_sum": jnp.sum(nll * weights), "mlm_correct": jnp.sum(correct * weights),
            "mlm_weight": jnp.sum(weights)}
    zero = jnp.zeros((), jnp.float32)
    if pair_head and NSP_WEIGHTS_KEY in batch:  # packed rows: per example slot [batch, k]
        nsp_logits = outputs["nsp_logits"].astype(jnp.float32)  # [batch, k, 2]
        labels = batch["next_sentence_labels"]
        slots = batch[NSP_WEIGHTS_KEY].astype(jnp.float32)
        sums["nsp_loss_sum"] = jnp.sum(
            optax.softmax_cross_entropy_with_integer_labels(nsp_logits, labels) * slots)
        sums["nsp_correct"] = jnp.sum(
            (jnp.argmax(nsp_logits, -1) == labels).astype(jnp.float32) * slots)
        sums["nsp_count"] = jnp.sum(slots)
    elif pair_head:
        nsp_logits = outputs["nsp_logits"].astype(jnp.float32)  # [batch, 2]
        labels = batch["next_sentence_labels"]
        sums["nsp_loss_sum"] = jnp.sum(
            optax.softmax_cross_entropy_with_integer_labels(nsp_logits, labels))
        sums["nsp_correct"] = jnp.sum((jnp.argmax(nsp_logits, -1) == labels).astype(jnp.float32))
        sums["nsp_count"] = jnp.asarray(labels.shape[0], jnp.float32)
    else:
        sums.update(nsp_loss_sum=zero, nsp_correct=zero, nsp_count=zero)
    return sums


def summarize(sums: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """Sums -> mean losses and accuracies (total loss = MLM + NSP/SOP, plus the weighted
    extra terms of the family objectives where present)."""
    mlm_weight = jnp.maximum(sums["mlm_weight"], 1.0)
    nsp_count = jnp.maximum(sums["nsp_count"], 1.0)
    mlm_loss = sums["mlm_loss_sum"] / mlm_weight
    nsp_loss = sums["nsp_loss_sum"] / nsp_count
    metrics = {"loss": mlm_loss + nsp_loss, "mlm_loss": mlm_loss,
               "mlm_accuracy": sums["mlm_correct"] / mlm_weight, "nsp_loss": nsp_loss,
               "nsp_accuracy": sums["nsp_correct"] / nsp_count}
    for name, den_key in EXTRA_TERMS.items():
        if f"{name}_loss_sum" in sums:
            den = jnp.maximum(sums[den_key], 1.0)
            metrics[f"{name}_loss"] = sums[f"{name}_loss_sum"] / den
            metrics["loss"] = metrics["loss"] + sums[f"{name}_weighted_sum"] / den
    for key, (metric, den_key) in EXTRA_RATES.items():
        if key in sums:
            metrics[metric] = sums[key] / jnp.maximum(sums[den_key], 1.0)
    return metrics


def _apply(model: nn.Module, params, batch: Batch, *, rng=None, fp8_scales=None
           ) -> dict[str, Any]:
    variables = {"params": params}
    if fp8_scales is not None:
        variables[FP8_COLLECTION] = fp8_scales
    return model.apply(variables, batch["input_ids"], batch["input_mask"],
                       batch["segment_ids"], batch["masked_lm_positions"],
                       deterministic=rng is None,
                       rngs={"dropout": rng} if rng is not None else None,
                       **heads.packing_inputs(batch))


def nsp_denominator(batch: Batch) -> jax.Array:
    """The NSP/SOP loss's denominator: rows, or the filled example slots of packed rows."""
    if NSP_WEIGHTS_KEY in batch:
        return jnp.maximum(jnp.sum(batch[NSP_WEIGHTS_KEY].astype(jnp.float32)), 1.0)
    return jnp.float32(batch["input_ids"].shape[0])


def _split_microbatches(batch: Batch, k: int, sharding: Callable[[int], Any] | None) -> Batch:
    """[batch, ...] -> [k, batch/k, ...], microbatch i = rows i, i+k, ... so each device's
    rows stay on that device (no cross-device shuffle); ``sharding(ndim)`` pins that."""
    def split(x):
        y = x.reshape(x.shape[0] // k, k, *x.shape[1:]).swapaxes(0, 1)
        return y if sharding is None else jax.lax.with_sharding_constraint(y, sharding(x.ndim))

    return jax.tree.map(split, batch)


def default_sums_fn(model: nn.Module, pair_head: bool) -> Callable[..., dict[str, jax.Array]]:
    """MLM + NSP/SOP sums: ``sums_fn(params, batch, rng, deterministic, fp8_scales=None)``
    (``fp8_scales``: the model's FP8 collection of scales, ``BertConfig.fp8``)."""
    def sums_fn(params, batch: Batch, rng, deterministic: bool, fp8_scales=None):
        outputs = _apply(model, params, batch, rng=None if deterministic else rng,
                         fp8_scales=fp8_scales)
        return loss_sums(outputs, batch, pair_head, model.config)

    return sums_fn


def _loss(sums: dict[str, jax.Array], dens: dict[str, jax.Array]) -> jax.Array:
    """The total loss of (micro)batch sums over batch-wide denominators."""
    loss = sums["mlm_loss_sum"] / dens["mlm_weight"] + sums["nsp_loss_sum"] / dens["nsp_count"]
    for name, den_key in EXTRA_TERMS.items():
        if f"{name}_weighted_sum" in sums:
            loss = loss + sums[f"{name}_weighted_sum"] / dens[den_key]
    return loss


def make_train_step(model: nn.Module, tx: optax.GradientTransformation,
                    schedule: optax.Schedule, *, microbatches: int = 1, pair_head: bool = True,
                    microbatch_sharding: Callable[[int], Any] | None = None,
                    skip: str = "where", check_update: bool = False,
                    param_cast: Callable[[Any], Any] | None = None,
                    sums_fn: Callable[..., dict[str, jax.Array]] | None = None,
                    reduce_grads: Callable[[Callable], Callable] | None = None,
                    unroll_microbatches: bool = False
                    ) -> Callable[[TrainState, Batch, jax.Array], tuple[TrainState, dict]]:
    """Builds ``train_step(state, batch, rng) -> (state, metrics)``.

    The dropout key is ``fold_in(rng, state.step)`` (and the microbatch index). Gradients of
    ``microbatches`` slices are summed in a ``lax.scan`` with batch-wide denominators, which
    equals one full-batch step; ``microbatch_sharding(ndim)`` pins the [k, batch/k, ...]
    split (batch on the second axis). A non-finite loss or gradient norm leaves params and
    optimizer state untouched and bumps the skip counters: ``skip="where"`` applies the
    update under that predicate in place (the select rides in the update's own pass);
    ``skip="cond"`` runs the update under a ``lax.cond``. With finite gradients (their norm
    bounds every element) and a finite state, AdamW's and LAMB's updates are finite, so the
    predicate needs no pass of its own. ``check_update`` also requires the new parameters and
    optimizer state to be finite, which catches a damaged state (a flipped bit in Adam's
    moments) before it reaches a parameter: ``where`` then computes the update once more only
    to reduce its finiteness (nothing stored), ``cond`` stores it and selects.
    ``param_cast`` (``parallel.param_gather_cast``) maps the parameters before the forward
    pass, inside the differentiated function. ``sums_fn`` (``objectives.py``) replaces the
    MLM + NSP/SOP sums with a family objective's. ``reduce_grads``
    (``parallel.grad_reduction``) wraps ``gradients(params, batch, rng, dens) -> (grads,
    sums)`` to reduce them over the batch shards itself; None (and FP8, whose scaling state is
    not a sum) leaves it to XLA's partitioner. ``unroll_microbatches`` unrolls the
    accumulation loop (the same arithmetic; XLA's cost analysis then counts every microbatch,
    which ``bert-jax compile``'s cost probes need).

    Under ``BertConfig.fp8`` the optimizer-state slot also holds the FP8 scaling state
    (``state.with_fp8_state``, ``modeling/fp8.py``): the step differentiates with respect to
    its scales too, whose "gradients" are their tensors' absolute maxima; every microbatch
    uses the step's scales, the step records the largest maximum of its microbatches
    (``fp8.next_state``), and a skipped update keeps the old state.
    """
    if skip not in ("where", "cond"):
        raise ValueError(f"skip={skip!r}: expected 'where' or 'cond'")
    gradients = _gradients_fn(sums_fn or default_sums_fn(model, pair_head), param_cast,
                              microbatches, unroll_microbatches)
    # Inside an explicit reduction each device splits only its own rows into microbatches.
    reduced_gradients = None if reduce_grads is None else reduce_grads(
        lambda params, batch, rng, dens: gradients(params, None, batch, rng, dens, None)[:2])

    def train_step(state: TrainState, batch: Batch, rng: jax.Array):
        step_rng = jax.random.fold_in(rng, state.step)
        dens = _denominators(batch)
        tx_state, fp8_state = split_fp8_state(state.opt_state)
        if reduce_grads is not None and fp8_state is None:
            grads, sums = reduced_gradients(state.params, batch, step_rng, dens)
        else:
            grads, sums, amaxes = gradients(
                state.params, None if fp8_state is None else fp8_state["scale"], batch,
                step_rng, dens, microbatch_sharding)
        metrics = summarize(sums)
        grad_norm = optax.global_norm(grads)
        finite = jnp.isfinite(metrics["loss"]) & jnp.isfinite(grad_norm)
        new_params, new_opt_state, finite = _guarded_update(
            tx, grads, (state.params, tx_state), finite, skip=skip, check_update=check_update)
        if fp8_state is not None:
            new_fp8_state = _select(finite, fp8.next_state(fp8_state, amaxes), fp8_state)
            new_opt_state = with_fp8_state(new_opt_state, new_fp8_state)
        skipped = (~finite).astype(jnp.int32)
        new_state = state.replace(
            step=state.step + 1, params=new_params, opt_state=new_opt_state,
            skipped_total=state.skipped_total + skipped,
            skipped_in_row=(state.skipped_in_row + 1) * skipped)
        metrics.update(grad_norm=grad_norm, skipped=skipped,
                       learning_rate=schedule(state.step - state.skipped_total),
                       mlm_weight=sums["mlm_weight"])
        return new_state, metrics

    return train_step


def _denominators(batch: Batch) -> dict[str, jax.Array]:
    """The batch-wide denominators every (micro)batch's sums are divided by."""
    return {"mlm_weight": jnp.maximum(
                jnp.sum(batch["masked_lm_weights"].astype(jnp.float32)), 1.0),
            "nsp_count": nsp_denominator(batch),
            "token_count": jnp.maximum(jnp.sum(batch["input_mask"].astype(jnp.float32)), 1.0)}


def _gradients_fn(sums_fn: Callable[..., dict[str, jax.Array]],
                  param_cast: Callable[[Any], Any] | None, microbatches: int,
                  unroll_microbatches: bool):
    """``gradients(params, scales, batch, step_rng, dens, split_sharding) -> (gradients,
    sums, FP8 maxima or None)`` of the whole batch: one pass, or ``microbatches`` summed in a
    ``lax.scan`` (maxima: their largest; ``split_sharding``: :func:`_split_microbatches`');
    ``scales``: the model's FP8 collection (None without FP8)."""
    def loss_fn(params, mb: Batch, rng, dens, fp8_scales=None):
        if param_cast is not None:
            params = param_cast(params)
        extra = {} if fp8_scales is None else {"fp8_scales": fp8_scales}
        sums = sums_fn(params, mb, rng, False, **extra)
        return _loss(sums, dens), sums

    param_grad_fn = jax.grad(loss_fn, has_aux=True)
    fp8_grad_fn = jax.grad(loss_fn, argnums=(0, 4), has_aux=True)

    def grad_fn(params, scales, mb: Batch, rng, dens):
        """(parameter gradients, sums, the FP8 tensors' maxima or None)."""
        if scales is None:
            return (*param_grad_fn(params, mb, rng, dens), None)
        (grads, amaxes), sums = fp8_grad_fn(params, mb, rng, dens, scales)
        return grads, sums, amaxes

    def gradients(params, scales, batch: Batch, step_rng, dens, split_sharding):
        if microbatches == 1:
            return grad_fn(params, scales, batch, step_rng, dens)

        def body(carry, xs):
            grad_acc, sum_acc, amax_acc = carry
            index, mb = xs
            g, s, amaxes = grad_fn(params, scales, mb, jax.random.fold_in(step_rng, index),
                                   dens)
            with jax.named_scope("accumulate_grads"):  # (a name for bert_jax/tpu/hlo.py)
                grad_acc = jax.tree.map(jnp.add, grad_acc, g)
            return (grad_acc, jax.tree.map(jnp.add, sum_acc, s),
                    None if amaxes is None else jax.tree.map(jnp.maximum, amax_acc, amaxes)
                    ), None

        split = _split_microbatches(batch, microbatches, split_sharding)
        sum_shapes = jax.eval_shape(
            lambda: grad_fn(params, scales, jax.tree.map(lambda x: x[0], split), step_rng,
                            dens)[1])
        init = (jax.tree.map(jnp.zeros_like, params),
                jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), sum_shapes),
                None if scales is None else jax.tree.map(jnp.zeros_like, scales))
        (grads, sums, amaxes), _ = jax.lax.scan(
            body, init, (jnp.arange(microbatches), split), unroll=unroll_microbatches)
        return grads, sums, amaxes

    return gradients


def _guarded_update(tx: optax.GradientTransformation, grads, operands, finite: jax.Array, *,
                    skip: str, check_update: bool):
    """(new params, new optimizer state, finite): the optimizer update of ``operands``
    (params, optimizer state), or ``operands`` unchanged where ``finite`` (the loss and
    gradient norm) does not hold, or, with ``check_update``, the update itself is not
    finite (see :func:`make_train_step`)."""
    def update(operands):
        params, opt_state = operands
        with jax.named_scope("optimizer_update"):  # (a name for bert_jax/tpu/hlo.py)
            updates, new_opt_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), new_opt_state

    if skip == "cond":
        def guarded(o):
            new = update(o)
            if not check_update:
                return (*new, jnp.bool_(True))
            ok = _all_finite(new)
            return (*_select(ok, new, o), ok)

        new_params, new_opt_state, ok = jax.lax.cond(
            finite, guarded, lambda o: (*o, jnp.bool_(False)), operands)
        return new_params, new_opt_state, finite & ok
    if check_update:
        # The update is not stored before it is known to be finite: this pass recomputes it
        # only to reduce its finiteness (the barrier keeps XLA from sharing it with the pass
        # that applies it). Storing it and then selecting every leaf reads the new state twice
        # more and writes it once more.
        finite = finite & _all_finite(update(jax.lax.optimization_barrier(operands)))
    new_params, new_opt_state = _select(finite, update(operands), operands)
    return new_params, new_opt_state, finite


def _all_finite(tree) -> jax.Array:
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)
              if jnp.issubdtype(x.dtype, jnp.inexact)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.bool_(True)


def _select(pred, new, old):
    """``new`` where the scalar ``pred`` holds, else ``old``, leaf by leaf."""
    return jax.tree.map(lambda n, o: jnp.where(pred, n, o), new, old)


def make_eval_step(model: nn.Module, *, pair_head: bool = True,
                   sums_fn: Callable[..., dict[str, jax.Array]] | None = None
                   ) -> Callable[[Any, Batch], dict[str, jax.Array]]:
    """``eval_step(params, batch) -> sums`` (add over batches, then ``summarize``); an
    objective that samples (ELECTRA) draws from a fixed key."""
    sums_fn = sums_fn or default_sums_fn(model, pair_head)

    def eval_step(params, batch: Batch):
        return sums_fn(params, batch, jax.random.PRNGKey(0), True)

    return eval_step
