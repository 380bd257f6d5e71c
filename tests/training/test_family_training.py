"""Each family objective trains a tiny model on the CPU with falling loss (ELECTRA, DistilBERT
from a saved teacher; SpanBERT on packed rows in test_family_packing.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import parallel
from bert_jax.checkpoint import store
from bert_jax.config import get_preset
from bert_jax.modeling.heads import BertForPreTraining
from bert_jax.modeling.params import flatten_params, unbox
from bert_jax.training import config as config_lib
from bert_jax.training.config import load_config
from bert_jax.training.inputs import SyntheticBatches
from bert_jax.training.setup import build_training

from .helpers import EXPERIMENT, SMALL, small_config

pytestmark = pytest.mark.slow

NO_DROPOUT = ("--config.model.hidden_dropout_prob=0.0",
              "--config.model.attention_probs_dropout_prob=0.0")


def config_without_depth(*overrides):
    small = [s for s in SMALL if "num_hidden_layers" not in s]
    return load_config(f"{EXPERIMENT}:tiny", [*small, *NO_DROPOUT, *overrides])


def _losses_fall(*overrides, steps=6):
    config = config_without_depth("--config.model.num_hidden_layers=1",
                              "--config.optimizer.warmup_steps=0",
                              "--config.optimizer.learning_rate=3e-3", *overrides)
    mesh = parallel.create_mesh({"data": -1}, devices=jax.devices()[:1])
    training = build_training(config, config_lib.model_config(config), mesh)
    state = training.init_state(jax.random.PRNGKey(0))
    batch = training.global_batch(next(SyntheticBatches(16, 32, 5, 200, seed=3)))
    losses = []
    for _ in range(steps):
        state, metrics = training.train_step(state, batch, jax.random.PRNGKey(1))
        losses.append(float(metrics["loss"]))
    assert np.isfinite(losses).all()
    assert losses[-1] < 0.95 * losses[0], losses
    return metrics


def test_electra_trains():
    metrics = _losses_fall("--config.objective=electra", "--config.electra.rtd_weight=50")
    assert 0 < float(metrics["rtd_replaced_fraction"]) < 1


@pytest.mark.parametrize("objective", ["nsp", "mlm", "sop"])
def test_bert_objectives_unchanged_keys(objective):
    config = small_config(f"--config.objective={objective}")
    assert config_lib.pair_head(config) == (objective != "mlm")


def test_distillation_end_to_end(tmp_path):
    """A 2-layer teacher saved as a model dir, a 1-layer student distilled from it: the
    student starts from the teacher's layer 0, the teacher stays frozen, the loss falls."""
    teacher_dir = str(tmp_path / "teacher")
    teacher_cfg = get_preset("tiny", vocab_size=200, hidden_size=32, num_attention_heads=4,
                             intermediate_size=64, num_hidden_layers=2,
                             max_position_embeddings=32)
    ids = jnp.zeros((1, 8), jnp.int32)
    # Random weights drawn in numpy (LayerNorm scales near 1): a Flax init costs a compile.
    shapes = unbox(jax.eval_shape(BertForPreTraining(teacher_cfg).init, jax.random.PRNGKey(7),
                                  ids, ids, ids, ids[:, :2])["params"])
    rng = np.random.default_rng(7)
    teacher = jax.tree_util.tree_map_with_path(lambda path, x: np.asarray(
        (1.0 if jax.tree_util.keystr(path).endswith("['scale']") else 0.0)
        + rng.normal(0, 0.02, x.shape), np.float32), shapes)
    store.save_model(teacher_dir, jax.device_get(teacher), teacher_cfg)
    config = config_without_depth("--config.objective=distill",
                                  f"--config.distill.teacher={teacher_dir}",
                                  "--config.optimizer.warmup_steps=0",
                                  "--config.optimizer.learning_rate=3e-3")
    model_cfg = config_lib.model_config(config)
    assert model_cfg.num_hidden_layers == 1 and model_cfg.hidden_size == 32
    mesh = parallel.create_mesh({"data": -1}, devices=jax.devices()[:1])
    training = build_training(config, model_cfg, mesh)
    state = training.init_state(jax.random.PRNGKey(0))
    state = state.replace(params=training.init_params(state.params,
                                                      training.state_shardings.params))
    params = flatten_params(jax.device_get(state.params))
    np.testing.assert_array_equal(params["bert/encoder/layer_0/attention/qkv/kernel"],
                                  params["teacher/bert/encoder/layer_0/attention/qkv/kernel"])
    frozen = {k: v for k, v in params.items() if k.startswith("teacher/")}
    batch = training.global_batch(next(SyntheticBatches(16, 32, 5, 200, seed=3)))
    losses = []
    for _ in range(6):
        state, metrics = training.train_step(state, batch, jax.random.PRNGKey(1))
        losses.append(float(metrics["loss"]))
    assert losses[-1] < 0.95 * losses[0], losses
    assert {"kd_loss", "cos_loss"} <= set(metrics)
    after = flatten_params(jax.device_get(state.params))
    for k, v in frozen.items():
        np.testing.assert_array_equal(after[k], v, err_msg=k)


@pytest.mark.parametrize("variant, low, high", [
    ("spanbert_base", 110e6, 118e6), ("ernie_base", 105e6, 115e6),
    ("electra_small", 13e6, 16e6), ("electra_base", 115e6, 130e6)])
def test_family_variants_build_sharded(variant, low, high):
    """The paper-size variants build their train state on an 8-way FSDP mesh (abstractly):
    every new parameter names logical axes, so the big ones are split over the mesh. Layers
    scanned: the same parameters, one layer traced instead of twelve."""
    c = load_config(f"{EXPERIMENT}:{variant}", ["--config.model.scan_layers=true"])
    model_cfg = config_lib.model_config(c)
    mesh = parallel.create_mesh({"data": 1, "fsdp": -1, "tensor": 1})
    training = build_training(c, model_cfg, mesh)
    params = flatten_params(training.abstract_state.params)
    count = sum(x.size for x in params.values())
    assert low < count < high, count
    shardings = flatten_params(training.state_shardings.params)
    new = [k for k in params if k.startswith(("sbo/", "generator", "rtd_"))]
    assert bool(new) == (variant != "ernie_base")
    for name in new:
        if params[name].size >= 64 * 64:
            assert any(axis is not None for axis in shardings[name].spec), name
