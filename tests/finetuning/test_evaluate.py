"""evaluate / predict on a stored run: a run written with the earlier flat config schema
still loads (its keys mapped to the new names); overrides use the new names."""

from __future__ import annotations

import json
import os

import jax

from bert_jax.checkpoint import store
from bert_jax.cli import main
from bert_jax.finetuning.config import config_from_dict
from bert_jax.finetuning.evaluate import load_finetuned
from bert_jax.finetuning.trainer import build_finetuner
from bert_jax.tasks import get_task
from bert_jax.tokenization import load_tokenizer
from tests.finetuning import helpers as H


def old_schema_run(data) -> dict:
    """The "finetune" entry of a run stored before the optimizer/parallel sections."""
    return {
        "task": "sst2", "data_dir": data["sst2"], "train_file": None, "dev_file": None,
        "test_file": None, "tfds": False, "tfds_data_dir": None, "on_error": "raise",
        "holdout_fraction": 0.1, "holdout_seed": 1234, "max_train_examples": 0,
        "max_seq_length": 32, "featurize": {}, "postprocess": {}, "init_checkpoint": "",
        "tokenizer": None, "model": {"preset": "base", "hidden_dropout_prob": 0.1,
                                     "attention_probs_dropout_prob": 0.1},
        "freeze_encoder": False, "batch_size": 16, "eval_batch_size": 16, "epochs": 1,
        "learning_rate": 2e-5, "warmup_proportion": 0.1, "weight_decay": 0.01,
        "adam_b1": 0.9, "adam_b2": 0.999, "adam_eps": 1e-6, "clip_norm": 1.0, "seed": 0,
        "mesh": {"data": -1, "fsdp": 1, "tensor": 1},
        "logical_axis_rules": [["batch", ["data", "fsdp"]], ["embed", None]],
        "log_every": 100,
    }


def test_old_schema_run_evaluates_and_predicts(data, tmp_path, capsys):
    workdir = str(tmp_path / "old_run")
    stored = old_schema_run(data)
    model_cfg = H.tiny_config()
    finetuner = build_finetuner(get_task("sst2"), config_from_dict(stored), model_cfg, None)
    params = jax.device_get(finetuner.init_params(jax.random.PRNGKey(0)))
    store.save_model(workdir, params, model_cfg, load_tokenizer(data["vocab_dir"]),
                     extra={"task": "sst2", "num_labels": 2, "finetune": stored})

    _, config, _, finetuner, _ = load_finetuned(workdir)
    assert config.global_batch_size == 16 and config.optimizer.learning_rate == 2e-5
    assert dict(finetuner.mesh.shape) == {"data": 8, "fsdp": 1, "tensor": 1}

    assert main(["evaluate", "--workdir", workdir]) == 0
    evaluated = json.loads(capsys.readouterr().out)
    assert evaluated["task"] == "sst2" and 0.0 <= evaluated["dev"]["accuracy"] <= 1.0
    assert main(["evaluate", "--workdir", workdir, "--config.batch_size=32"]) == 2
    assert ("config key 'batch_size' was renamed to 'global_batch_size'"
            in capsys.readouterr().err)

    out = str(tmp_path / "pred")
    assert main(["predict", "--workdir", workdir, "--output", out]) == 0
    rows = open(os.path.join(out, "SST-2.tsv")).read().splitlines()
    assert rows[0] == "index\tprediction" and len(rows) == 21


def test_not_a_finetuned_workdir(data, capsys):
    assert main(["evaluate", "--workdir", data["ckpt"]]) == 2
    assert "not a fine-tuned workdir" in capsys.readouterr().err
