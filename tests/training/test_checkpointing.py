"""Checkpoints in the loop: resume onto another mesh continues exactly, an interrupted save
leaves the previous step usable, a non-finite streak stops with a saved last good state (a
non-finite state is never saved), and the workdir is readable by store.load_model."""

import json
import os
import shutil

import jax
import numpy as np
import pytest

from bert_jax import parallel
from bert_jax.checkpoint import store
from bert_jax.checkpoint.manager import CheckpointManager
from bert_jax.runs.metrics import read_metrics, truncate_metrics
from bert_jax.runs.state import TrainState
from bert_jax.training import config as config_lib
from bert_jax.training.loop import TrainingDiverged, _load_init_params, train_and_evaluate
from bert_jax.training.setup import build_training

from .helpers import small_config

# One layer: checkpoints hold and restore every layer alike.
RUN = ("--config.log_every=1", "--config.checkpoint.every_steps=3", "--config.eval_steps=0",
       "--config.optimizer.warmup_steps=2", "--config.model.num_hidden_layers=1")


def train_losses(workdir) -> dict[int, float]:
    """step -> train loss, the last record of each step (a resumed run rewrites later steps)."""
    return {r["step"]: r["loss"] for r in read_metrics(workdir)}


# The two tests that read the uninterrupted run share it on one xdist worker.
SHARED_RUN = pytest.mark.xdist_group("checkpointing_full_run")


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    """An uninterrupted 6-step run (checkpoints at 3 and 6) with a configured peak and a
    profiler trace over steps 2-3."""
    full = tmp_path_factory.mktemp("full")
    train_and_evaluate(small_config(*RUN, "--config.num_train_steps=6", "--config.peak_tflops=1.0",
                                    "--config.profile_steps=(2, 3)"), str(full))
    return full


@pytest.mark.slow
@SHARED_RUN
def test_resume_onto_another_mesh_matches_uninterrupted(full_run, tmp_path):
    full = full_run
    # Observability: TensorBoard events, MFU with a configured peak, a profiler trace.
    assert any(f.startswith("events") for f in os.listdir(full / "tensorboard"))
    with open(full / "metrics.jsonl") as f:
        last = [json.loads(line) for line in f][-1]
    assert {"mfu", "seq_per_sec", "tokens_per_sec", "grad_norm", "learning_rate",
            "skipped_steps"} <= set(last)
    assert any(files for _, _, files in os.walk(full / "profile"))
    # The run as if it had stopped at step 3 (the later checkpoint and metric records
    # dropped), resumed on FSDP x TP.
    part = tmp_path / "part"
    shutil.copytree(full, part)
    shutil.rmtree(part / "checkpoints" / "6")
    truncate_metrics(str(part / "metrics.jsonl"), after_step=3)
    assert sorted(train_losses(part)) == [1, 2, 3]
    resumed = train_and_evaluate(small_config(
        *RUN, "--config.num_train_steps=6", "--config.parallel.mesh.data=1",
        "--config.parallel.mesh.fsdp=-1", "--config.parallel.mesh.tensor=2"), str(part))
    assert resumed["step"] == 6
    want, got = train_losses(full), train_losses(part)
    assert sorted(got) == list(range(1, 7))
    np.testing.assert_allclose([got[s] for s in range(1, 7)], [want[s] for s in range(1, 7)],
                               rtol=1e-5)
    # The workdir is a model checkpoint for fine-tuning and export.
    params, config, _, extra = store.load_model(str(part))
    assert config.hidden_size == 32 and extra["experiment"]["num_train_steps"] == 6
    assert params["bert"]["embeddings"]["word_embeddings"]["embedding"].shape == (256, 32)


@pytest.mark.slow
@SHARED_RUN
def test_init_checkpoint_loads_another_runs_params(full_run):
    source = full_run
    config = small_config(*RUN, f"--config.init_checkpoint={source}", "--config.seed=5")
    model_cfg = config_lib.model_config(config)
    training = build_training(config, model_cfg, parallel.create_mesh({"fsdp": -1}))
    state = training.init_state(jax.random.PRNGKey(5))
    params, unused = _load_init_params(str(source), model_cfg, state.params,
                                       training.state_shardings.params)
    assert unused == []
    want = store.load_model(str(source))[0]
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(params), strict=True):
        np.testing.assert_array_equal(a, np.asarray(b))
    assert params["bert"]["pooler"]["kernel"].sharding == \
        training.state_shardings.params["bert"]["pooler"]["kernel"]


def _tiny_state(value: float) -> TrainState:
    params = {"dense": {"kernel": np.full((4, 2), value, np.float32)}}
    return TrainState.create(params, {"mu": params}).replace(step=np.int32(value))


def test_interrupted_save_keeps_previous_checkpoint(tmp_path):
    manager = CheckpointManager(str(tmp_path), every_steps=1, keep=3, async_save=True)
    rng = jax.random.PRNGKey(0)
    manager.save(1, _tiny_state(1.0), rng, {"step": 1})
    manager.save(2, _tiny_state(2.0), rng, {"step": 2})
    manager.close()
    # A save of step 3 killed midway: Orbax's temporary directory, never renamed.
    partial = tmp_path / "checkpoints" / "3.orbax-checkpoint-tmp-1700000000000000"
    (partial / "params").mkdir(parents=True)
    (partial / "params" / "_METADATA").write_text("{trunc")
    assert os.path.basename(store.latest_step_dir(str(tmp_path))) == "2"
    manager = CheckpointManager(str(tmp_path), every_steps=1, keep=3)
    assert manager.latest_step() == 2
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype),
                            _tiny_state(0.0))
    state, _, data_state = manager.restore(2, abstract, jax.ShapeDtypeStruct((2,), np.uint32))
    manager.close()
    assert not partial.exists()  # stale temporary directories are removed (in the background)
    assert data_state == {"step": 2} and int(state.step) == 2
    np.testing.assert_array_equal(state.params["dense"]["kernel"], np.full((4, 2), 2.0))


def test_non_finite_streak_stops_with_checkpoint(tmp_path):
    config = small_config("--config.model.num_hidden_layers=1", "--config.log_every=1",
                          "--config.eval_steps=0",
                          "--config.optimizer.warmup_steps=0",
                          "--config.optimizer.learning_rate=1e30",
                          "--config.optimizer.clip_norm=0.0", "--config.max_skipped_in_row=3",
                          "--config.num_train_steps=50")
    with pytest.raises(TrainingDiverged, match="3 consecutive steps had a non-finite"):
        train_and_evaluate(config, str(tmp_path))
    steps = train_losses(tmp_path)
    assert max(steps) < 50
    saved = int(os.path.basename(store.latest_step_dir(str(tmp_path))))
    assert saved == max(steps)
    params, _, _, _ = store.load_model(str(tmp_path))
    leaves = jax.tree.leaves(params)
    assert all(np.isfinite(x).all() for x in leaves)


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")  # the learning rate
def test_non_finite_state_stops_without_saving(tmp_path):
    """An update that overflows (a learning rate beyond float32) reaches the parameters under
    the default skip predicate; the steps after it are skipped, and the stop refuses to save
    the non-finite state, naming a leaf."""
    config = small_config("--config.model.num_hidden_layers=1", "--config.log_every=1",
                          "--config.eval_steps=0",
                          "--config.optimizer.warmup_steps=0",
                          "--config.optimizer.learning_rate=1e39",
                          "--config.optimizer.clip_norm=0.0", "--config.max_skipped_in_row=2",
                          "--config.num_train_steps=50")
    with pytest.raises(TrainingDiverged, match=r"2 consecutive steps had a non-finite.*"
                                               r"\['params'\].* holds NaN/Inf.*not saved. "
                                               "No step was saved before"):
        train_and_evaluate(config, str(tmp_path))
    assert store.latest_step_dir(str(tmp_path)) is None
