"""Damaged checkpoints: every saved step carries a checksum manifest; a restore skips a
step that fails it (or fails to restore, or holds NaN) and falls back to the newest good
step; model directories are replaced only once the new one is complete."""

import json
import os

import jax
import numpy as np
import pytest

from bert_jax.checkpoint import integrity, store
from bert_jax.checkpoint import manager as manager_module
from bert_jax.checkpoint.manager import DAMAGED_DIR, CheckpointManager, NonFiniteState
from bert_jax.config import get_preset
from bert_jax.errors import BertJaxError
from bert_jax.runs.state import TrainState

RNG_SPEC = jax.ShapeDtypeStruct((2,), np.uint32)


def _state(value: float, step: int | None = None) -> TrainState:
    params = {"dense": {"kernel": np.full((4, 2), value, np.float32)}}
    return TrainState.create(params, {"mu": params}).replace(
        step=np.int32(value if step is None else step))


def _abstract():
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype),
                        _state(0.0))


def _saved_run(workdir, steps=(1, 2, 3)):
    manager = CheckpointManager(str(workdir), every_steps=1, keep=5, async_save=True)
    for step in steps:
        manager.save(step, _state(float(step)), jax.random.PRNGKey(0), {"step": step})
    manager.close()
    return workdir / "checkpoints"


def _largest_file(directory):
    files = [os.path.join(d, f) for d, _, fs in os.walk(directory) for f in fs
             if f != integrity.MANIFEST]
    return max(files, key=os.path.getsize)


def _truncate(path):
    with open(path, "r+b") as f:
        f.truncate(max(0, os.path.getsize(path) // 2))


def _flip_byte(path):
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))


def _damage_params_truncated(step_dir):
    _truncate(_largest_file(step_dir / "params"))


def _damage_json_truncated(step_dir):
    _truncate(step_dir / "data_state" / "metadata")  # the JSON item


def _damage_empty_step(step_dir):
    for root, dirs, files in os.walk(step_dir, topdown=False):
        for f in files:
            os.remove(os.path.join(root, f))
        for d in dirs:
            os.rmdir(os.path.join(root, d))


def _damage_missing_opt_state(step_dir):
    _damage_empty_step(step_dir / "opt_state")
    os.rmdir(step_dir / "opt_state")


def _damage_flipped_opt_state(step_dir):
    _flip_byte(_largest_file(step_dir / "opt_state"))


def _damage_unverified_truncation(step_dir):
    """A step killed between its save and its manifest: no checksums, truncated file."""
    os.remove(step_dir / integrity.MANIFEST)
    _truncate(_largest_file(step_dir / "params"))


@pytest.mark.parametrize("damage", [
    _damage_params_truncated, _damage_json_truncated, _damage_empty_step,
    _damage_missing_opt_state, _damage_flipped_opt_state, _damage_unverified_truncation])
def test_restore_falls_back_to_newest_good_step(tmp_path, damage):
    checkpoints = _saved_run(tmp_path)
    assert all((checkpoints / str(s) / integrity.MANIFEST).exists() for s in (1, 2, 3))
    damage(checkpoints / "3")
    messages = []
    manager = CheckpointManager(str(tmp_path), every_steps=1, keep=5)
    step, state, _, data_state = manager.restore_latest(_abstract(), RNG_SPEC,
                                                        messages.append)
    assert step == 2 and data_state == {"step": 2}
    np.testing.assert_array_equal(state.params["dense"]["kernel"], np.full((4, 2), 2.0))
    assert "checkpoint step 3 is damaged" in messages[0]
    assert "resuming from step 2" in messages[-1]
    # The damaged step is kept for inspection, out of the run's way: step 3 saves afresh.
    assert (tmp_path / DAMAGED_DIR / "3").is_dir() and manager.all_steps() == [1, 2]
    assert manager.save(3, _state(3.0), jax.random.PRNGKey(0), {"step": 3})
    manager.close()
    assert integrity.verify(str(checkpoints / "3"))


def test_non_finite_state_is_not_saved(tmp_path):
    manager = CheckpointManager(str(tmp_path), every_steps=1, keep=5)
    manager.save(1, _state(1.0), jax.random.PRNGKey(0), {"step": 1})
    nan = _state(1.0, step=2)
    nan = nan.replace(opt_state={"mu": {"dense": {"kernel": np.full((4, 2), np.nan,
                                                                    np.float32)}}})
    with pytest.raises(NonFiniteState, match=r"step 2: \['opt_state'\]\['mu'\]\['dense'\]"
                                             r"\['kernel'\] holds NaN/Inf.*checkpoints/1 is "
                                             "the newest saved step"):
        manager.save(2, nan, jax.random.PRNGKey(0), {"step": 2})
    manager.close()
    assert manager.all_steps() == [1]


def test_non_finite_step_is_skipped(tmp_path, monkeypatch):
    """A step that holds NaN (written without the save's check, as older versions did) is
    skipped on restore."""
    manager = CheckpointManager(str(tmp_path), every_steps=1, keep=5)
    manager.save(1, _state(1.0), jax.random.PRNGKey(0), {"step": 1})
    with monkeypatch.context() as patch:
        patch.setattr(manager_module, "first_non_finite", lambda tree: None)
        manager.save(2, _state(float("nan"), step=2), jax.random.PRNGKey(0), {"step": 2})
    manager.close()
    messages = []
    manager = CheckpointManager(str(tmp_path), every_steps=1, keep=5)
    step, *_ = manager.restore_latest(_abstract(), RNG_SPEC, messages.append)
    manager.close()
    assert step == 1 and "NaN/Inf" in messages[0]


def test_all_steps_damaged_moves_nothing(tmp_path):
    checkpoints = _saved_run(tmp_path, steps=(1,))
    _damage_params_truncated(checkpoints / "1")
    manager = CheckpointManager(str(tmp_path), every_steps=1, keep=5)
    with pytest.raises(BertJaxError, match="no usable checkpoint.*params"):
        manager.restore_latest(_abstract(), RNG_SPEC, lambda m: None)
    manager.close()
    assert (checkpoints / "1").is_dir() and not (tmp_path / DAMAGED_DIR).exists()


def test_tools_skip_damaged_step_or_name_the_file(tmp_path, capsys):
    checkpoints = _saved_run(tmp_path, steps=(1, 2))
    store.write_config(str(tmp_path), get_preset("tiny"))
    _flip_byte(_largest_file(checkpoints / "2" / "params"))
    params, *_ = store.load_model(str(tmp_path))
    np.testing.assert_array_equal(params["dense"]["kernel"], np.full((4, 2), 1.0))
    assert "skipping damaged checkpoint" in capsys.readouterr().err
    _flip_byte(_largest_file(checkpoints / "1" / "params"))
    with pytest.raises(integrity.DamagedCheckpoint, match="checksum mismatch"):
        store.load_model(str(tmp_path))


def test_model_directory_replaced_only_when_complete(tmp_path, monkeypatch):
    model = tmp_path / "model"
    store.save_model(str(model), {"w": np.ones(3, np.float32)}, get_preset("tiny"))
    assert integrity.verify(str(model / "params"))

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(integrity, "write_manifest", fail)
    with pytest.raises(OSError):
        store.save_model(str(model), {"w": np.zeros(3, np.float32)}, get_preset("tiny"))
    monkeypatch.undo()
    params, *_ = store.load_model(str(model))
    np.testing.assert_array_equal(params["w"], np.ones(3))
    store.save_model(str(model), {"w": np.zeros(3, np.float32)}, get_preset("tiny"))
    np.testing.assert_array_equal(store.load_model(str(model))[0]["w"], np.zeros(3))
    assert sorted(os.listdir(model)) == ["config.json", "params"]
    # Damage in a model directory: one error naming the file.
    _truncate(_largest_file(model / "params"))
    with pytest.raises(integrity.DamagedCheckpoint, match=r"params.*bytes"):
        store.load_model(str(model))
    with open(model / "config.json", "w") as f:
        f.write('{"format": "bert_jax", "con')
    with pytest.raises(BertJaxError, match="not valid JSON"):
        store.read_config(str(model))
    json.loads((model / "params" / integrity.MANIFEST).read_text())


def _random_state(step: int) -> TrainState:
    """Incompressible values: a flipped bit lands in the stored array data."""
    kernel = np.random.default_rng(step).standard_normal((64, 64)).astype(np.float32)
    params = {"dense": {"kernel": kernel}}
    return TrainState.create(params, {"mu": params}).replace(step=np.int32(step))


def _random_run(workdir, steps=(1, 2)):
    manager = CheckpointManager(str(workdir), every_steps=1, keep=5)
    for step in steps:
        manager.save(step, _random_state(step), jax.random.PRNGKey(0), {"step": step})
    manager.close()
    store.write_config(str(workdir), get_preset("tiny"))
    return workdir / "checkpoints"


def _flip_bit(path):
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x01]))


@pytest.mark.parametrize("flipped", [False, True])
def test_step_killed_before_its_manifest_is_checked_by_its_digest(tmp_path, capsys, flipped):
    """SIGKILL after Orbax committed the newest step and before its manifest: the step's
    arrays are checked against the digests committed with it before anything trusts it."""
    checkpoints = _random_run(tmp_path)
    os.remove(checkpoints / "2" / integrity.MANIFEST)
    if flipped:
        _flip_bit(_largest_file(checkpoints / "2" / "params"))
    # The tools: a flipped bit falls back with one line; an intact step is used.
    params, *_ = store.load_model(str(tmp_path))
    expected = 1 if flipped else 2
    np.testing.assert_array_equal(params["dense"]["kernel"],
                                  _random_state(expected).params["dense"]["kernel"])
    err = capsys.readouterr().err
    assert (err.count("content digest mismatch") == 1) == flipped, err
    assert len(err.splitlines()) == int(flipped), err
    # The run: the same check; an intact step gets its manifest, a damaged one is set aside.
    messages = []
    manager = CheckpointManager(str(tmp_path), every_steps=1, keep=5)
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype),
                            _random_state(0))
    step, state, _, _ = manager.restore_latest(abstract, RNG_SPEC, messages.append)
    manager.close()
    assert step == expected
    np.testing.assert_array_equal(state.opt_state["mu"]["dense"]["kernel"],
                                  _random_state(expected).params["dense"]["kernel"])
    if flipped:
        assert "content digest mismatch" in messages[0]
        assert (tmp_path / DAMAGED_DIR / "2").is_dir()
    else:
        assert messages == [] and integrity.verify(str(checkpoints / "2"))


def test_tools_never_return_non_finite_parameters(tmp_path, monkeypatch, capsys):
    """A step holding NaN without manifest or digest (an older save): skipped, one line."""
    manager = CheckpointManager(str(tmp_path), every_steps=1, keep=5)
    manager.save(1, _state(1.0), jax.random.PRNGKey(0), {"step": 1})
    with monkeypatch.context() as patch:
        patch.setattr(manager_module, "first_non_finite", lambda tree: None)
        manager.save(2, _state(float("nan"), step=2), jax.random.PRNGKey(0), {"step": 2})
    manager.close()
    store.write_config(str(tmp_path), get_preset("tiny"))
    _damage_empty_step(tmp_path / "checkpoints" / "2" / "digest")
    os.remove(tmp_path / "checkpoints" / "2" / integrity.MANIFEST)
    params, *_ = store.load_model(str(tmp_path))
    np.testing.assert_array_equal(params["dense"]["kernel"], np.full((4, 2), 1.0))
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "checkpoints/2" in err[0] and "NaN/Inf" in err[0], err


@pytest.mark.parametrize("damage", ["empty", "many_flipped_bytes"])
def test_tools_report_a_damaged_step_once(tmp_path, capsys, damage):
    """An empty step folder is not skipped silently; a badly damaged one gives one line, not
    the warnings and unraisable-coroutine reports of an abandoned restore."""
    from bert_jax.checkpoint.detect import load_checkpoint

    checkpoints = _random_run(tmp_path)
    if damage == "empty":
        (checkpoints / "3").mkdir()
    else:
        os.remove(checkpoints / "2" / integrity.MANIFEST)
        for path in [os.path.join(d, f) for d, _, fs in os.walk(checkpoints / "2")
                     for f in fs]:
            size = os.path.getsize(path)
            with open(path, "r+b") as f:
                for offset in range(0, size, max(1, size // 100)):
                    f.seek(offset)
                    byte = f.read(1)
                    f.seek(offset)
                    f.write(bytes([byte[0] ^ 0xFF]))
    params, *_, report = load_checkpoint(str(tmp_path))
    np.testing.assert_array_equal(params["dense"]["kernel"],
                                  _random_state(2 if damage == "empty" else 1)
                                  .params["dense"]["kernel"])
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("warning: skipping damaged checkpoint"), err
    assert ("checkpoints/3" if damage == "empty" else "checkpoints/2") in err[0]
    assert report == [f"bert-jax checkpoint: {checkpoints / ('2' if damage == 'empty' else '1')}"
                      "/params"]


def test_checkpoints_and_models_follow_the_umask(tmp_path):
    """Training steps (Orbax, manifests, digests) and model directories get the modes the
    umask gives, like every other output (0o002: group-writable)."""
    import stat

    previous = os.umask(0o002)
    try:
        _saved_run(tmp_path / "run", steps=(1,))
        store.save_model(str(tmp_path / "model"), {"w": np.ones(3, np.float32)},
                         get_preset("tiny"))
    finally:
        os.umask(previous)
    modes = {os.path.relpath(os.path.join(root, name), tmp_path):
             stat.S_IMODE(os.stat(os.path.join(root, name)).st_mode)
             for root, dirs, files in os.walk(tmp_path) for name in dirs + files}
    wrong = {path: oct(mode) for path, mode in modes.items()
             if mode != (0o775 if os.path.isdir(tmp_path / path) else 0o664)}
    assert wrong == {} and len(modes) > 20
