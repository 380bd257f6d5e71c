"""The pretraining step under ``model.fp8``: it trains, the scaling state (scales and the
stacked amax history) is replaced by the step, never touched by the optimizer, records the
largest maxima of its microbatches, is kept on a skipped update, replicated over the mesh and
checkpointed with the optimizer state."""

import jax
import numpy as np
import pytest

from bert_jax import parallel
from bert_jax.checkpoint.manager import CheckpointManager
from bert_jax.errors import BertJaxError
from bert_jax.runs.state import split_fp8_state
from bert_jax.training import config as config_lib
from bert_jax.training.inputs import SyntheticBatches
from bert_jax.training.setup import build_training

from .helpers import small_config

# The module fixtures' compiled steps serve every test here: one xdist worker runs them all.
pytestmark = pytest.mark.xdist_group("fp8_training")

FP8 = ("--config.model.hidden_dropout_prob=0.0", "--config.model.attention_probs_dropout_prob=0.0",
       "--config.model.dtype=bfloat16", "--config.model.fp8=true",
       "--config.model.fp8_amax_history=4", "--config.optimizer.warmup_steps=0",
       "--config.optimizer.learning_rate=3e-3", "--config.model.num_hidden_layers=1")


def _setup(*overrides):
    config = small_config(*FP8, *overrides)
    mesh = parallel.create_mesh({"data": -1}, devices=jax.devices()[:2])
    training = build_training(config, config_lib.model_config(config), mesh)
    batch = training.global_batch(next(SyntheticBatches(16, 32, 5, 200, seed=3)))
    return training, training.init_state(jax.random.PRNGKey(0)), batch


@pytest.fixture(scope="module")
def plain_steps():
    """(training, batch) without microbatches, compiled once for the file (the step donates
    its state: each test makes its own)."""
    training, _, batch = _setup()
    return training, batch


@pytest.fixture(scope="module")
def scanned_microbatch_steps():
    """(training, batch) with scanned layers and two microbatches."""
    training, _, batch = _setup("--config.microbatches=2", "--config.model.scan_layers=true")
    return training, batch


def _histories(state) -> dict[str, np.ndarray]:
    fp8_state = jax.device_get(split_fp8_state(state.opt_state)[1])
    return {jax.tree_util.keystr(path): np.asarray(leaf)
            for path, leaf in jax.tree_util.tree_leaves_with_path(fp8_state)}


def test_fp8_step_trains_and_keeps_the_scaling_state_apart(plain_steps):
    training, batch = plain_steps
    state = training.init_state(jax.random.PRNGKey(0))
    rng = jax.random.PRNGKey(1)
    tx_state, fp8_state = split_fp8_state(state.opt_state)
    assert fp8_state is not None
    # the optimizer sees the parameters only: no moments for the scaling state
    assert (jax.tree.structure(tx_state)
            == jax.tree.structure(jax.eval_shape(training.tx.init, state.params)))
    assert "amax" not in str(jax.tree_util.tree_structure(state.params))
    # replicated over the (data-parallel) mesh: every device holds the same maxima
    for leaf in jax.tree.leaves(split_fp8_state(training.state_shardings.opt_state)[1]):
        assert leaf.is_fully_replicated

    histories, losses = [_histories(state)], []
    for _ in range(5):
        state, metrics = training.train_step(state, batch, rng)
        losses.append(float(metrics["loss"]))
        histories.append(_histories(state))
    assert losses[-1] < losses[0] - 0.05, losses
    scales = {k: v for k, v in histories[0].items() if k.startswith("['scale']")}
    assert len(scales) == 1 * 4 * 3  # layers x projections x tensors
    assert histories[0]["['amax_history']"].shape == (len(scales), 4)
    assert not histories[0]["['amax_history']"].any()
    assert all(v == 1.0 for v in scales.values())
    hist = [h["['amax_history']"] for h in histories]
    assert (hist[1][:, 0] > 0).all() and not hist[1][:, 1:].any()
    # newest in front: step t's entries are step t-1's, moved back by one
    np.testing.assert_array_equal(hist[5][:, 1:], hist[4][:, :-1])
    assert (hist[5] > 0).all()
    # each scale: max(history) / float8 max, in the order of the scale tree's leaves
    for row, key in enumerate(scales):
        limit = 57344.0 if "output_grad" in key else 448.0
        np.testing.assert_allclose(histories[5][key], hist[5][row].max() / limit, rtol=1e-6)

    # a skipped update (non-finite loss) keeps the scaling state as it was
    bad = jax.device_get(batch)
    bad["masked_lm_weights"] = bad["masked_lm_weights"].copy()
    bad["masked_lm_weights"][0, 0] = np.nan
    state, metrics = training.train_step(state, training.global_batch(
        {k: np.asarray(v) for k, v in bad.items()}), rng)
    assert int(metrics["skipped"]) == 1
    for key, value in _histories(state).items():
        np.testing.assert_array_equal(value, histories[5][key], err_msg=key)


@pytest.mark.slow
def test_microbatches_record_their_largest_maxima(plain_steps, scanned_microbatch_steps):
    full, batch = plain_steps
    state_full = full.init_state(jax.random.PRNGKey(0))
    accum, _ = scanned_microbatch_steps
    state_accum = accum.init_state(jax.random.PRNGKey(0))
    rng = jax.random.PRNGKey(1)
    state_full, m_full = full.train_step(state_full, batch, rng)
    state_accum, m_accum = accum.train_step(state_accum, batch, rng)
    # the same scales (all 1 in a first step), the same loss
    np.testing.assert_allclose(m_accum["loss"], m_full["loss"], rtol=1e-2)
    # one entry per step, the largest of the microbatches' maxima (not their sum): for the
    # forward tensors the whole batch's (no dropout), up to rounding in a differently
    # compiled (scanned) model that float8 at scale 1 amplifies after the first matmul
    def forward_maxima(state):
        scales = _histories(state)
        rows, row = [], 0
        for key, value in scales.items():
            if key.startswith("['scale']"):
                if "output_grad" not in key:
                    rows.extend(range(row, row + value.size))
                row += value.size
        history = scales["['amax_history']"]
        assert history.shape == (12, 4) and (history[:, 0] > 0).all()
        assert not history[:, 1:].any()
        return np.sort(history[rows, 0])

    np.testing.assert_allclose(forward_maxima(state_accum), forward_maxima(state_full),
                               rtol=0.1)


def test_scaling_state_survives_a_checkpoint(tmp_path, scanned_microbatch_steps):
    training, batch = scanned_microbatch_steps
    state = training.init_state(jax.random.PRNGKey(0))
    rng = jax.random.PRNGKey(1)
    state, _ = training.train_step(state, batch, rng)
    state, _ = training.train_step(state, batch, rng)
    saved = _histories(state)
    manager = CheckpointManager(str(tmp_path), every_steps=1, keep=1, async_save=False)
    manager.save(2, state, rng, {"step": 2})
    manager.close()
    manager = CheckpointManager(str(tmp_path), every_steps=1, keep=1)
    restored, _, _ = manager.restore(2, training.abstract_state,
                                     jax.ShapeDtypeStruct(rng.shape, rng.dtype))
    manager.close()
    for key, value in _histories(restored).items():
        np.testing.assert_array_equal(value, saved[key], err_msg=key)
    # the restored run continues exactly as the uninterrupted one
    after, m_after = training.train_step(state, batch, rng)
    resumed, m_resumed = training.train_step(restored, batch, rng)
    assert float(m_after["loss"]) == float(m_resumed["loss"])
    for key, value in _histories(resumed).items():
        np.testing.assert_array_equal(value, _histories(after)[key], err_msg=key)


def test_family_objectives_reject_fp8():
    config = small_config(*FP8, "--config.objective=electra")
    mesh = parallel.create_mesh({"data": -1}, devices=jax.devices()[:1])
    with pytest.raises(BertJaxError, match="model.fp8 is not available with objective="):
        build_training(config, config_lib.model_config(config), mesh)
