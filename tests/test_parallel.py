"""Meshes from config, logical-axis rules, and the same training on every layout."""

import functools
import re

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from training.helpers import EXPERIMENT, SMALL, small_config

from bert_jax import parallel
from bert_jax.errors import BertJaxError
from bert_jax.training import config as config_lib
from bert_jax.training.inputs import SyntheticBatches
from bert_jax.training.setup import build_training

MESHES = {
    "one_device": ({"data": 1}, 1),
    "data_parallel": ({"data": -1}, 8),
    "fsdp": ({"data": 1, "fsdp": -1}, 8),
    "data_x_tensor": ({"data": -1, "tensor": 2}, 8),
}


def test_axis_sizes_fill_and_errors():
    assert parallel.resolve_axis_sizes({"data": -1, "tensor": 2}, 8, "m") == (4, 1, 2)
    assert parallel.resolve_axis_sizes({"fsdp": -1}, 8, "m") == (1, 8, 1)
    with pytest.raises(BertJaxError, match="at most one -1"):
        parallel.resolve_axis_sizes({"data": -1, "fsdp": -1}, 8, "m")
    with pytest.raises(BertJaxError, match="uses 6 devices but 8"):
        parallel.resolve_axis_sizes({"data": 3, "tensor": 2}, 8, "m")
    with pytest.raises(BertJaxError, match="unknown mesh axes"):
        parallel.resolve_axis_sizes({"model": 2}, 8, "m")
    with pytest.raises(BertJaxError, match="unknown mesh axes"):
        parallel.rules_from_config([("embed", "model")])


def test_hybrid_mesh_over_granules():
    mesh = parallel.create_mesh({"data": 2, "fsdp": -1}, {"data": 1})
    assert dict(mesh.shape) == {"data": 2, "fsdp": 4, "tensor": 1}


def _losses(mesh_sizes, devices, steps=3, *overrides):
    # One layer: what differs between meshes is alike in every layer.
    config = small_config("--config.optimizer.warmup_steps=0", "--config.model.num_hidden_layers=1",
                          "--config.optimizer.learning_rate=1e-2", *overrides)
    mesh = parallel.create_mesh(mesh_sizes, devices=jax.devices()[:devices])
    training = build_training(config, config_lib.model_config(config), mesh)
    state = training.init_state(jax.random.PRNGKey(0))
    batch = training.global_batch(next(SyntheticBatches(16, 32, 5, 200, seed=7)))
    losses = []
    for _ in range(steps):  # the same batch: the loss must fall
        state, metrics = training.train_step(state, batch, jax.random.PRNGKey(1))
        losses.append(float(metrics["loss"]))
    return losses, state


@pytest.mark.slow
def test_same_losses_on_every_mesh_and_params_sharded_by_rules():
    # The partitioner's reduction draws the same dropout masks on every mesh (the explicit one
    # draws per device: test_explicit_reduction_reduces_the_tied_embeddings_once).
    results = {name: _losses(*spec, 3, "--config.parallel.grad_reduce=partitioner")
               for name, spec in MESHES.items()}
    reference = results["one_device"][0]
    assert reference[-1] < reference[0]
    for name, (losses, _) in results.items():
        np.testing.assert_allclose(losses, reference, rtol=2e-5, err_msg=name)

    def spec_and_shard(state, *path):
        node = state.params
        for p in path:
            node = node[p]
        return node.sharding.spec, node.addressable_shards[0].data.shape

    emb = ("bert", "embeddings", "word_embeddings", "embedding")  # [256, 32] (vocab, embed)
    mlp_in = ("bert", "encoder", "layer_0", "mlp_in", "kernel")  # [32, 64] (embed, mlp)
    qkv = ("bert", "encoder", "layer_0", "attention", "qkv", "kernel")  # [32, 3, 4, 8]
    dp, fsdp, dxt = (results[k][1] for k in ("data_parallel", "fsdp", "data_x_tensor"))
    assert spec_and_shard(dp, *mlp_in)[1] == (32, 64)  # replicated
    assert spec_and_shard(fsdp, *emb) == (P("tensor", "fsdp"), (256, 4))
    assert spec_and_shard(fsdp, *mlp_in) == (P("fsdp", "tensor"), (4, 64))
    assert spec_and_shard(dxt, *mlp_in) == (P("fsdp", "tensor"), (32, 32))
    assert spec_and_shard(dxt, *qkv) == (P("fsdp", None, "tensor", None), (32, 3, 2, 8))
    assert spec_and_shard(dxt, *emb) == (P("tensor", "fsdp"), (128, 32))
    # Optimizer moments follow their parameters (FSDP shards optimizer state too).
    mu = fsdp.opt_state[1].mu["bert"]["encoder"]["layer_0"]["mlp_in"]["kernel"]
    assert mu.addressable_shards[0].data.shape == (4, 64)


def test_batch_split_over_data_and_fsdp():
    mesh = parallel.create_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    rules = parallel.rules_from_config(parallel.DEFAULT_RULES)
    assert parallel.batch_divisor(mesh, rules) == 4
    batch = parallel.global_batch({"x": np.arange(16).reshape(8, 2)}, mesh, rules)
    assert batch["x"].shape == (8, 2)
    assert batch["x"].addressable_shards[0].data.shape == (2, 2)
    np.testing.assert_array_equal(np.asarray(batch["x"]), np.arange(16).reshape(8, 2))


def _fsdp_config(*overrides):
    """SMALL with hidden 64 (not the sequence length 32, so activation shapes [16, 32, ...]
    stay unambiguous), one layer (gathers and casts are alike in every layer) and bf16
    compute."""
    return config_lib.load_config(f"{EXPERIMENT}:tiny", [
        *(o for o in SMALL if "hidden_size" not in o and "num_hidden_layers" not in o),
        "--config.model.hidden_size=64", "--config.model.num_hidden_layers=1",
        "--config.model.dtype=bfloat16", *overrides])


# The tests of _fsdp_step's programs run on one xdist worker, where its cache shares them.
FSDP_STEP = pytest.mark.xdist_group("fsdp_step")


@functools.cache
def _fsdp_step(gather: str):
    """The FSDP train step of ``_fsdp_config`` with ``parallel.param_gather=gather``: the
    lowered step, its compiled program, and the loss after two compiled steps from the same
    initial state on the same batch (one lowering and one compile, shared by the gather
    tests)."""
    config = _fsdp_config(f"--config.parallel.param_gather={gather}")
    training = build_training(config, config_lib.model_config(config),
                              parallel.create_mesh({"data": 1, "fsdp": -1}))
    batch = training.global_batch(next(SyntheticBatches(16, 32, 5, 200, seed=7)))
    lowered = training.train_step.lower(training.abstract_state, batch, jax.random.PRNGKey(1))
    step = lowered.compile()
    state = training.init_state(jax.random.PRNGKey(0))
    for _ in range(2):
        state, metrics = step(state, batch, jax.random.PRNGKey(1))
    return lowered, step, float(metrics["loss"])


@FSDP_STEP
def test_fsdp_gathers_parameters_not_activations():
    """Under FSDP the batch stays split: every all-gather in the compiled step is a parameter
    (or a per-example vector), never a [batch, seq, ...] activation. Without the model's
    activation constraints reaching the partitioner (``parallel.constrain``), XLA followed the
    fsdp-sharded kernels, gathered the whole batch's activations and all-reduced matmul
    outputs."""
    hlo = _fsdp_step("param_dtype")[1].as_text()
    gathered = [tuple(int(d) for d in dims.split(",") if d)
                for dims in re.findall(r"= [a-z0-9]+\[([0-9,]*)\][^ ]* all-gather(?:-start)?\(",
                                       hlo)]
    assert gathered, "no all-gather: is the mesh FSDP?"
    activations = [shape for shape in gathered if shape[:2] == (16, 32) and shape[2:] != (1,)]
    assert not activations, f"activations gathered over the batch: {activations}"
    assert (64, 64) in gathered  # the MLP kernels ([64, 64]) are gathered


@pytest.mark.slow
@FSDP_STEP
def test_param_gather_in_compute_dtype():
    """parallel.param_gather=compute_dtype: matmul kernels are cast to bf16 under their own
    (fsdp) sharding before use, so the gathers move bf16; embeddings stay float32; the loss is
    the one of the default path (the same bf16 values reach the matmuls)."""
    (default, _, default_loss), (cast, _, cast_loss) = (
        _fsdp_step("param_dtype"), _fsdp_step("compute_dtype"))
    default, cast = default.as_text(), cast.as_text()
    constrained = re.compile(r"sdy\.sharding_constraint[^\n]*tensor<([0-9x]+)xbf16>")
    assert "64x64" in constrained.findall(cast) and "64x64" not in constrained.findall(default)
    assert "200x64" not in constrained.findall(cast)  # the word embeddings (vocab 200 x 64)
    with pytest.raises(BertJaxError, match="param_gather"):
        parallel.param_gather_cast({}, "bfloat16", "int8")
    assert abs(default_loss - cast_loss) < 1e-3


def test_entered_mesh_only_inside_traced_in_mesh():
    """``traced_in_mesh`` makes its mesh visible to the model code it traces (constraints,
    the flash kernel's shard_map), and only there; a one-device mesh counts as none."""
    mesh = parallel.create_mesh({"data": -1})
    rules = parallel.rules_from_config(parallel.DEFAULT_RULES)
    seen = []
    parallel.traced_in_mesh(lambda: seen.append(parallel.entered_mesh()), mesh, rules)()
    one = parallel.create_mesh({"data": 1}, devices=jax.devices()[:1])
    parallel.traced_in_mesh(lambda: seen.append(parallel.entered_mesh()), one, rules)()
    assert seen == [mesh, None] and parallel.entered_mesh() is None
    with pytest.raises(ZeroDivisionError):  # the mesh is left even when the trace fails
        parallel.traced_in_mesh(lambda: 1 / 0, mesh, rules)()
    assert parallel.entered_mesh() is None


# One layer: what these tests check (reductions, gathers, losses) is alike in every layer.
NO_DROPOUT = ("--config.model.hidden_dropout_prob=0.0",
              "--config.model.attention_probs_dropout_prob=0.0",
              "--config.model.num_hidden_layers=1")
WORD_TABLE = [256, 32]  # vocab 200 padded to 256, hidden 32


def _compiled(training):
    batch = training.global_batch(next(SyntheticBatches(16, 32, 5, 200, seed=7)))
    return training.train_step.lower(training.abstract_state, batch,
                                     jax.random.PRNGKey(1)).compile()


def _reductions(compiled, shape) -> list[tuple[str, int]]:
    """(collective, count) of every all-reduce / reduce-scatter of ``shape`` in a compiled
    train step (bench's census of the optimized HLO)."""
    from bench.collectives import census

    return [(r["collective"], r["count"]) for r in census(compiled.as_text())
            if r["shape"] == shape and r["collective"] != "all-gather"]


@pytest.mark.slow
def test_explicit_reduction_reduces_the_tied_embeddings_once():
    """Data parallel: XLA's partitioner all-reduces the word-embedding gradient twice (the
    lookup's and the MLM decoder's contributions, then adds them); the explicit reduction
    (default on a data-parallel mesh) sums the two per device and all-reduces once, with
    the same losses and parameters (no dropout: the two draw different masks)."""
    mesh = parallel.create_mesh({"data": -1})
    results = {}
    for choice, reduced in (("partitioner", 2), ("explicit", 1)):
        config = small_config(*NO_DROPOUT, f"--config.parallel.grad_reduce={choice}")
        training = build_training(config, config_lib.model_config(config), mesh)
        step = _compiled(training)
        assert _reductions(step, WORD_TABLE) == [("all-reduce", reduced)], choice
        state = training.init_state(jax.random.PRNGKey(0))
        batches = SyntheticBatches(16, 32, 5, 200, seed=7)
        losses = []
        for _ in range(3):
            state, metrics = step(state, training.global_batch(next(batches)),
                                  jax.random.PRNGKey(1))
            losses.append(float(metrics["loss"]))
        results[choice] = losses, jax.device_get(state.params)
    np.testing.assert_allclose(results["explicit"][0], results["partitioner"][0], rtol=2e-5)
    for a, b in zip(jax.tree.leaves(results["explicit"][1]),
                    jax.tree.leaves(results["partitioner"][1]), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    # auto: explicit on this mesh (replicated parameters, batch over 8 devices), not on one
    rules = parallel.rules_from_config(parallel.DEFAULT_RULES)
    params = training.state_shardings.params
    assert parallel.grad_reduction(mesh, rules, params, "auto") is not None
    one = parallel.create_mesh({"data": -1}, devices=jax.devices()[:1])
    one_params = jax.tree.map(lambda s: parallel.replicated(one), params)
    assert parallel.grad_reduction(one, rules, one_params, "auto") is None


def test_fsdp_reduces_the_tied_embeddings_once():
    """FSDP keeps the partitioner's reduction (parameters are sharded): the word-embedding
    gradient is reduced once (the lookup's scatter runs on the gathered token rows for its
    own hidden slice), as an all-reduce the GPU and TPU compilers turn into a reduce-scatter
    (the CPU keeps all-reduce + slice); the explicit reduction is refused."""
    config = small_config(*NO_DROPOUT)
    mesh = parallel.create_mesh({"data": 1, "fsdp": -1})
    training = build_training(config, config_lib.model_config(config), mesh)
    step = _compiled(training)
    reductions = _reductions(step, WORD_TABLE) + _reductions(step, [256, 4])
    assert sum(count for _, count in reductions) == 1, reductions
    rules = parallel.rules_from_config(parallel.DEFAULT_RULES)
    with pytest.raises(BertJaxError, match="grad_reduce='explicit' needs replicated"):
        parallel.grad_reduction(mesh, rules, training.state_shardings.params, "explicit")
    with pytest.raises(BertJaxError, match="grad_reduce='psum'"):
        parallel.grad_reduction(mesh, rules, training.state_shardings.params, "psum")


@pytest.mark.slow
def test_explicit_reduction_sums_kernels_in_the_compute_dtype():
    """bf16 compute: the explicit psum carries matmul kernels in bf16 (as the partitioner's
    all-reduces at their gradient matmuls do) and the rest in float32; the losses stay those
    of the partitioner's reduction."""
    mesh = parallel.create_mesh({"data": -1})
    losses = {}
    for choice in ("partitioner", "explicit"):
        config = small_config(*NO_DROPOUT, "--config.model.dtype=bfloat16",
                              f"--config.parallel.grad_reduce={choice}")
        training = build_training(config, config_lib.model_config(config), mesh)
        batch = training.global_batch(next(SyntheticBatches(16, 32, 5, 200, seed=7)))
        lowered = training.train_step.lower(training.abstract_state, batch,
                                            jax.random.PRNGKey(1))
        if choice == "explicit":
            summed = re.findall(r"all_reduce.*\n\s*\^bb0\(%\w+: tensor<(\w+)>",
                                lowered.as_text())
            assert "bf16" in summed and "f32" in summed, sorted(set(summed))
        step = lowered.compile()
        state = training.init_state(jax.random.PRNGKey(0))
        for _ in range(2):
            state, metrics = step(state, batch, jax.random.PRNGKey(1))
        losses[choice] = float(metrics["loss"])
    assert abs(losses["explicit"] - losses["partitioner"]) < 2e-3 * losses["partitioner"]
