"""A step committed in a bucket without its manifest (the process was killed after Orbax
committed it) is checked against the digests committed with it, as on local disk."""

import jax
import numpy as np

from bert_jax import fileio, storage
from bert_jax.checkpoint import integrity, store
from bert_jax.checkpoint.manager import CheckpointManager
from bert_jax.config import get_preset
from bert_jax.runs.state import TrainState


def _state(step: int) -> TrainState:
    kernel = np.random.default_rng(step).standard_normal((64, 64)).astype(np.float32)
    params = {"dense": {"kernel": kernel}}
    return TrainState.create(params, {"mu": params}).replace(step=np.int32(step))


def test_unsealed_step_with_a_flipped_bit_is_skipped_in_a_bucket(bucket, capsys):
    run = f"{bucket}/run"
    manager = CheckpointManager(run, every_steps=1, keep=5)
    for step in (1, 2):
        manager.save(step, _state(step), jax.random.PRNGKey(0), {"step": step})
    manager.close()
    store.write_config(run, get_preset("tiny"))
    step_dir = f"{run}/checkpoints/2"
    storage.remove(storage.join(step_dir, integrity.MANIFEST))
    files = storage.files_with_info(f"{step_dir}/params")
    largest = max(files, key=lambda rel: files[rel]["size"])
    data = bytearray(storage.read_bytes(f"{step_dir}/params/{largest}"))
    data[len(data) // 2] ^= 0x01
    fileio.atomic_write(f"{step_dir}/params/{largest}", lambda f: f.write(bytes(data)))

    params, *_ = store.load_model(run)
    np.testing.assert_array_equal(params["dense"]["kernel"],
                                  _state(1).params["dense"]["kernel"])
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "content digest mismatch" in err[0], err

    messages = []
    manager = CheckpointManager(run, every_steps=1, keep=5)
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype),
                            _state(0))
    step, *_ = manager.restore_latest(abstract, jax.ShapeDtypeStruct((2,), np.uint32),
                                      messages.append)
    manager.close()
    assert step == 1 and "content digest mismatch" in messages[0]
    assert integrity.has_manifest(f"{run}/checkpoints/1")


def test_rejected_run_leaves_the_bucket_as_it_was(gcs, bucket, capsys):
    """A config error found when the optimizer is built: no object written or replaced (the
    lock object is gone again, config.json not rewritten)."""
    from bert_jax.cli import main
    from bert_jax.training import config as config_lib
    from tests.training.helpers import EXPERIMENT, SMALL

    run = f"{bucket}/run"
    config = config_lib.load_config(f"{EXPERIMENT}:tiny", SMALL)
    store.write_config(run, config_lib.model_config(config),
                       extra={"experiment": config.to_dict()})
    before = gcs.objects(bucket[len("gs://"):])
    rc = main(["pretrain", "--config", f"{EXPERIMENT}:tiny", *SMALL, "--workdir", run,
               "--config.optimizer.warmup_steps=30", "--config.optimizer.decay_steps=25",
               "--config.model.hidden_dropout_prob=0.2"])
    err = capsys.readouterr().err
    assert rc == 2 and "decay_steps=25 must exceed" in err, err
    assert gcs.objects(bucket[len("gs://"):]) == before
