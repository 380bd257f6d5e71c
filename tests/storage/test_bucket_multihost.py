"""Two ``jax.distributed`` processes save one FSDP-sharded checkpoint to a bucket; one
process restores it."""

import jax
import numpy as np
import pytest
from multihost.helpers import RUN_S, pretrain_command, run_all

from bert_jax import storage
from bert_jax.checkpoint import store

pytestmark = [pytest.mark.multiprocess, pytest.mark.xdist_group("bucket_multihost")]


def test_two_processes_save_one_sharded_checkpoint_to_a_bucket(bucket):
    workdir = f"{bucket}/run"
    overrides = ("--config.model.num_hidden_layers=1", "--config.data.source=synthetic",
                 "--config.num_train_steps=2", "--config.checkpoint.every_steps=2",
                 "--config.eval_steps=0", "--config.parallel.mesh.data=1",
                 "--config.parallel.mesh.fsdp=-1")
    run_all([pretrain_command(workdir, *overrides)] * 2, timeout=RUN_S)
    step = f"{workdir}/checkpoints/2"
    objects = storage.files_with_info(step)
    # Each process wrote its own shards; process 0 the manifest over all of them.
    assert any("ocdbt.process_0/" in k for k in objects)
    assert any("ocdbt.process_1/" in k for k in objects)
    assert "sha256.json" in objects
    params = store.load_params(f"{step}/params")
    leaves = jax.tree_util.tree_leaves(params)
    assert leaves and all(np.isfinite(np.asarray(x)).all() for x in leaves)
    config, _ = store.read_config(workdir)
    assert params["bert"]["embeddings"]["word_embeddings"]["embedding"].shape[1] == \
        config.hidden_size
