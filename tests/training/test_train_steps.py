"""The pure steps: accumulation equals the full batch, non-finite updates are skipped,
weight decay skips LayerNorm and biases."""

import jax
import numpy as np
import pytest

from bert_jax import parallel
from bert_jax.runs.optimizers import decay_mask
from bert_jax.training import config as config_lib
from bert_jax.training.inputs import SyntheticBatches
from bert_jax.training.setup import build_training

from .helpers import small_config

# full_steps (a module fixture) serves three tests: one xdist worker runs the file.
pytestmark = pytest.mark.xdist_group("train_steps")

# One layer: accumulation, skipping and the optimizers act on every layer alike.
NO_DROPOUT = ("--config.model.hidden_dropout_prob=0.0",
              "--config.model.attention_probs_dropout_prob=0.0",
              "--config.model.num_hidden_layers=1")


def _setup(*overrides, devices=2):
    config = small_config(*NO_DROPOUT, *overrides)
    mesh = parallel.create_mesh({"data": -1}, devices=jax.devices()[:devices])
    training = build_training(config, config_lib.model_config(config), mesh)
    batches = SyntheticBatches(16, 32, 5, 200, seed=3)
    return training, training.init_state(jax.random.PRNGKey(0)), batches


@pytest.fixture(scope="module")
def full_steps():
    """The step on the whole batch (no warmup: the first update moves the parameters), over
    two data-parallel devices, compiled once for the file (the step donates its state: each
    test makes its own)."""
    training, _, _ = _setup("--config.optimizer.warmup_steps=0")
    return training


def test_gradient_accumulation_equals_full_batch(full_steps):
    rng = jax.random.PRNGKey(1)
    full = full_steps
    state_full = full.init_state(jax.random.PRNGKey(0))
    accum, state_accum, batches = _setup("--config.microbatches=4",
                                         "--config.optimizer.warmup_steps=0")
    batch = full.global_batch(next(batches))
    state_full, m_full = full.train_step(state_full, batch, rng)
    state_accum, m_accum = accum.train_step(state_accum, batch, rng)
    for key in ("loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "grad_norm"):
        np.testing.assert_allclose(m_full[key], m_accum[key], rtol=2e-5, err_msg=key)
    for a, b in zip(jax.tree.leaves(state_full.params), jax.tree.leaves(state_accum.params),
                    strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_non_finite_step_is_skipped_and_counted(full_steps):
    training = full_steps
    state = training.init_state(jax.random.PRNGKey(0))
    batches = SyntheticBatches(16, 32, 5, 200, seed=3)
    rng = jax.random.PRNGKey(1)
    before = jax.device_get(state.params)
    bad = next(batches)
    bad["masked_lm_weights"] = bad["masked_lm_weights"].copy()
    bad["masked_lm_weights"][0, 0] = np.nan
    state, metrics = training.train_step(state, training.global_batch(bad), rng)
    assert int(metrics["skipped"]) == 1
    assert (int(state.step), int(state.skipped_total), int(state.skipped_in_row)) == (1, 1, 1)
    for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(state.params), strict=True):
        np.testing.assert_array_equal(a, b)
    state, metrics = training.train_step(state, training.global_batch(next(batches)), rng)
    assert int(metrics["skipped"]) == 0 and np.isfinite(float(metrics["loss"]))
    assert (int(state.step), int(state.skipped_total), int(state.skipped_in_row)) == (2, 1, 0)
    changed = [not np.array_equal(a, b) for a, b in
               zip(jax.tree.leaves(before), jax.tree.leaves(state.params), strict=True)]
    assert all(changed)
    # A damaged optimizer state (a NaN in Adam's moments, as a flipped exponent bit gives):
    # the loss and gradient are finite. The default step applies the update, so the NaN
    # reaches that parameter (and a checkpoint save refuses the state); with check_update
    # the new state is checked first and the step is skipped.
    good = jax.device_get(state.params)
    damaged = state.replace(opt_state=jax.tree.map(
        lambda x: x.at[(0,) * x.ndim].set(np.nan) if x.ndim == 2 else x, state.opt_state))
    checked, _, _ = _setup("--config.optimizer.warmup_steps=0", "--config.check_update=true")
    kept, metrics = checked.train_step(damaged, training.global_batch(next(batches)), rng)
    assert int(metrics["skipped"]) == 1 and np.isfinite(float(metrics["loss"]))
    for a, b in zip(jax.tree.leaves(good), jax.tree.leaves(kept.params), strict=True):
        np.testing.assert_array_equal(a, b)
    damaged = kept
    state, metrics = training.train_step(damaged, training.global_batch(next(batches)), rng)
    assert int(metrics["skipped"]) == 0 and np.isfinite(float(metrics["loss"]))
    finite = [bool(np.isfinite(x).all()) for x in jax.tree.leaves(state.params)]
    assert not all(finite) and any(finite)


def test_decay_mask_excludes_layer_norm_and_biases():
    params = {"bert": {"embeddings": {"LayerNorm": {"scale": 1, "bias": 1},
                                      "word_embeddings": {"embedding": 1}},
                       "encoder": {"layer_0": {"mlp_in": {"kernel": 1, "bias": 1},
                                               "output_norm": {"scale": 1, "bias": 1}}}},
              "mlm": {"bias": 1, "transform": {"kernel": 1}}}
    mask = decay_mask(params)
    assert mask["bert"]["embeddings"]["word_embeddings"]["embedding"]
    assert mask["bert"]["encoder"]["layer_0"]["mlp_in"]["kernel"]
    assert mask["mlm"]["transform"]["kernel"]
    assert not mask["bert"]["embeddings"]["LayerNorm"]["scale"]
    assert not mask["bert"]["encoder"]["layer_0"]["mlp_in"]["bias"]
    assert not mask["bert"]["encoder"]["layer_0"]["output_norm"]["scale"]
    assert not mask["mlm"]["bias"]


@pytest.mark.parametrize("name", ["adamw", "lamb"])
def test_optimizers_train(full_steps, name):
    """Each optimizer memorizes one batch: AdamW is the file's step (the default optimizer,
    learning rate 1e-3, no warmup), LAMB a step of its own (5e-2 after 2 warmup steps)."""
    if name == "adamw":
        assert small_config().optimizer.name == "adamw"
        training = full_steps
        state = training.init_state(jax.random.PRNGKey(0))
        batches = SyntheticBatches(16, 32, 5, 200, seed=3)
    else:
        training, state, batches = _setup(f"--config.optimizer.name={name}",
                                          "--config.optimizer.warmup_steps=2",
                                          "--config.optimizer.learning_rate=5e-2",
                                          "--config.num_train_steps=40", devices=1)
    batch = training.global_batch(next(batches))
    losses = []
    for _ in range(15):  # memorize one batch
        state, metrics = training.train_step(state, batch, jax.random.PRNGKey(0))
        losses.append(float(metrics["loss"]))
    assert losses[-1] < losses[0] - 0.5, losses
