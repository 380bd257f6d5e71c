"""Fine-tuning with packed training rows (packing=True): the per-example losses of a packed
batch equal the unpacked ones, the CLI trains, evaluates and predicts one row per example in
order, and tasks that cannot be packed get one error line naming the key."""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.cli import main
from bert_jax.data import packing
from bert_jax.finetuning import trainer
from bert_jax.modeling.heads import BertForSequenceClassification
from tests.finetuning import helpers as H

pytestmark = pytest.mark.slow

FAST = ["--config.max_seq_length=32", "--config.log_every=0", "--config.eval_batch_size=32"]


@pytest.mark.parametrize("kind,labels", [("classification", 3), ("regression", 1)])
def test_packed_batch_loss_and_grads_equal_unpacked(kind, labels):
    config = H.tiny_config().replace(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = BertForSequenceClassification(config, labels)
    rng = np.random.default_rng(0)
    lengths = np.array([5, 9, 3, 12, 4, 6])
    mask = (np.arange(16)[None] < lengths[:, None]).astype(np.int32)
    feats = {"input_ids": rng.integers(5, 40, mask.shape).astype(np.int32) * mask,
             "input_mask": mask, "segment_ids": np.zeros_like(mask)}
    key = "label_ids" if kind == "classification" else "labels"
    feats[key] = (rng.integers(0, labels, 6).astype(np.int32) if kind == "classification"
                  else rng.normal(size=6).astype(np.float32))
    rows = packing.pack_lengths(lengths, 16, 3)
    packed = packing.pack_features(feats, rows, 3, (key,))
    unpacked = {**feats, trainer.WEIGHT_KEY: np.ones(6, np.float32)}
    packed[trainer.WEIGHT_KEY] = packed.pop("example_slots")
    # Compiled (one program per layout): op by op, the model's many small ops cost more.
    params = jax.jit(model.init)(jax.random.PRNGKey(0), *(jnp.asarray(feats[k]) for k in (
        "input_ids", "input_mask", "segment_ids")))["params"]

    def loss(params, batch):
        return trainer.task_loss(kind, trainer._apply(model, params, batch), batch)

    loss_and_grads = jax.jit(jax.value_and_grad(loss, has_aux=True))
    (loss_u, sums_u), grads_u = loss_and_grads(params, unpacked)
    (loss_p, sums_p), grads_p = loss_and_grads(
        params, {k: v for k, v in packed.items() if k != "example_index"})
    assert len(rows) < 6 and float(sums_p["count"]) == float(sums_u["count"]) == 6
    np.testing.assert_allclose(float(loss_p), float(loss_u), rtol=1e-5)
    for gp, gu in zip(jax.tree.leaves(grads_p), jax.tree.leaves(grads_u), strict=True):
        np.testing.assert_allclose(np.asarray(gp), np.asarray(gu), atol=2e-5, rtol=1e-4)


def test_cli_packed_training_evaluates_and_predicts_in_order(data, tmp_path, capsys):
    workdir = str(tmp_path / "run")
    rc = main(["finetune", "--config", "experiments/glue.py:sst2", "--workdir", workdir,
               f"--config.init_checkpoint={data['ckpt']}", f"--config.data_dir={data['sst2']}",
               "--config.optimizer.learning_rate=3e-3", "--config.epochs=4",
               "--config.global_batch_size=8", "--config.packing=true",
               "--config.max_examples_per_row=4", "--config.progress_bar=false", *FAST])
    assert rc == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("packing: 400 train examples in "))
    packed_rows = int(line.split(" in ")[1].split()[0])
    assert 100 <= packed_rows < 200  # at most 4 examples a row, at least 2 fit
    metrics = json.load(open(os.path.join(workdir, "metrics.json")))
    assert metrics["train_sequences"] == packed_rows
    assert metrics["dev_examples"] == {"dev": 80}
    assert metrics["best"]["value"] >= 0.85  # chance is 0.5
    out = str(tmp_path / "pred")
    assert main(["predict", "--workdir", workdir, "--output", out]) == 0
    rows = open(os.path.join(out, "SST-2.tsv")).read().splitlines()
    assert rows[0] == "index\tprediction" and len(rows) == 21
    assert [r.split("\t")[0] for r in rows[1:]] == [str(i) for i in range(20)]
    _, labels = H.sentences(20, 3)
    predicted = [r.split("\t")[1] for r in rows[1:]]
    assert np.mean([p == y for p, y in zip(predicted, labels, strict=True)]) >= 0.8


def test_unsupported_task_names_the_key(data, tmp_path, capsys):
    rc = main(["finetune", "--config", "experiments/ner.py:conll2003", "--workdir",
               str(tmp_path / "run"), f"--config.init_checkpoint={data['ckpt']}",
               f"--config.data_dir={data['conll']}", "--config.packing=true", *FAST])
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: packing=True: task conll2003")
