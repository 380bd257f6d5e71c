"""The fine-tuning config: pretraining's key names, keys of the earlier schema refused with
their new name, the data root from --config.data_dir or $BERT_JAX_DATA, stored old-schema
run configs mapped on read."""

from __future__ import annotations

import os

import pytest

from bert_jax.cli import main
from bert_jax.errors import BertJaxError
from bert_jax.finetuning.config import (
    RENAMED_KEYS,
    base_config,
    config_from_dict,
    load_config,
)
from bert_jax.finetuning.inputs import train_and_dev
from bert_jax.tasks import get_task
from bert_jax.tasks.data_root import DATA_ENV
from bert_jax.training import config as pretrain_config

# The earlier flat schema as a run stored it (config.json "finetune"), abridged to the keys
# that changed plus a few that did not.
OLD_RUN = {
    "task": "sst2", "data_dir": "/data/SST-2", "epochs": 2, "seed": 3, "max_seq_length": 32,
    "featurize": {}, "postprocess": {}, "init_checkpoint": "", "freeze_encoder": False,
    "batch_size": 16, "eval_batch_size": 24, "learning_rate": 3e-3, "warmup_proportion": 0.2,
    "weight_decay": 0.05, "adam_b1": 0.8, "adam_b2": 0.98, "adam_eps": 1e-8, "clip_norm": 0.5,
    "mesh": {"data": 2, "fsdp": 4, "tensor": 1},
    "logical_axis_rules": [["batch", ["data", "fsdp"]], ["embed", None]],
    "model": {"preset": "tiny", "hidden_dropout_prob": 0.2},
}


def test_names_match_pretraining():
    fine, pre = base_config(), pretrain_config.base_config()
    assert set(pre.optimizer.keys()) <= set(fine.optimizer.keys())
    assert set(fine.optimizer.keys()) - set(pre.optimizer.keys()) == {"warmup_proportion"}
    assert {"mesh", "logical_axis_rules"} <= set(pre.parallel.keys())
    assert set(fine.parallel.keys()) == {"mesh", "logical_axis_rules"}
    assert "global_batch_size" in fine and "global_batch_size" in pre
    assert not set(RENAMED_KEYS) & set(fine.keys())


@pytest.mark.parametrize("old, new", [
    ("learning_rate", "optimizer.learning_rate"), ("adam_b1", "optimizer.b1"),
    ("adam_b2", "optimizer.b2"), ("adam_eps", "optimizer.eps"),
    ("weight_decay", "optimizer.weight_decay"), ("clip_norm", "optimizer.clip_norm"),
    ("warmup_proportion", "optimizer.warmup_proportion"), ("mesh.data", "parallel.mesh.data"),
    ("logical_axis_rules", "parallel.logical_axis_rules"), ("batch_size", "global_batch_size"),
])
def test_old_override_names_new_key(old, new):
    with pytest.raises(BertJaxError) as e:
        load_config("experiments/glue.py:sst2", [f"--config.{old}=1"])
    assert str(e.value) == f"--config.{old}: config key {old!r} was renamed to {new!r}"


def test_old_key_error_on_the_command_line(tmp_path, capsys):
    rc = main(["finetune", "--config", "experiments/glue.py:sst2", "--workdir",
               str(tmp_path / "run"), "--config.learning_rate=1e-3"])
    assert rc == 2
    assert capsys.readouterr().err.strip() == (
        "error: --config.learning_rate: config key 'learning_rate' was renamed to "
        "'optimizer.learning_rate'")
    assert main(["finetune", "--config", "experiments/glue.py:sst2", "--workdir",
                 str(tmp_path / "run"), "--config.learning_rat=1e-3"]) == 2
    assert "did you mean --config.optimizer.learning_rate" in capsys.readouterr().err


@pytest.mark.parametrize("line, old", [("c.learning_rate = 1e-4", "learning_rate"),
                                       ("c.batch_size = 8", "batch_size"),
                                       ("c.mesh.data = 2", "mesh")])
def test_old_key_in_experiment_file(tmp_path, line, old):
    path = tmp_path / "exp.py"
    path.write_text("from bert_jax.finetuning.config import base_config\n\n\n"
                    f"def get_config():\n    c = base_config()\n    {line}\n    return c\n")
    with pytest.raises(BertJaxError, match=f"^{path}: config key '{old}' was renamed to "
                                           f"'{RENAMED_KEYS[old]}'$"):
        load_config(str(path))


def test_data_root_from_environment(data, tmp_path, monkeypatch):
    root = tmp_path / "root"
    (root / "glue").mkdir(parents=True)
    os.symlink(data["sst2"], root / "glue" / "SST-2")
    monkeypatch.setenv(DATA_ENV, str(root))
    c = load_config("experiments/glue.py:sst2")
    assert c.data_dir == str(root / "glue")
    train, devs, source = train_and_dev(get_task("sst2"), c)
    assert (len(train), len(devs["dev"]), source) == (400, 80, "dev files")
    assert load_config("experiments/ner.py:conll2003").data_dir == str(root / "conll2003")
    assert load_config("experiments/squad.py:v1").data_dir == str(root / "squad")
    assert load_config("experiments/swag.py:swag").data_dir == str(root / "swag")
    flag = load_config("experiments/glue.py:sst2", ["--config.data_dir=/elsewhere"])
    assert flag.data_dir == "/elsewhere"


def test_no_data_location_names_flag_and_variable(data, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(DATA_ENV, raising=False)
    c = load_config("experiments/glue.py:sst2")
    assert c.data_dir is None
    with pytest.raises(BertJaxError, match=f"--config.data_dir=DIR .* {DATA_ENV}=ROOT"):
        train_and_dev(get_task("sst2"), c)
    rc = main(["finetune", "--config", "experiments/glue.py:sst2", "--workdir",
               str(tmp_path / "run"), f"--config.init_checkpoint={data['ckpt']}"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: sst2: no data location")
    assert "--config.data_dir=DIR" in err and f"{DATA_ENV}=ROOT" in err
    assert len(err.strip().splitlines()) == 1


def test_old_schema_run_config_maps_to_new_names():
    c = config_from_dict(OLD_RUN)
    assert c.global_batch_size == 16 and c.eval_batch_size == 24
    assert c.optimizer.learning_rate == 3e-3 and c.optimizer.warmup_proportion == 0.2
    assert c.optimizer.warmup_steps == -1  # the proportion decides, as before
    assert (c.optimizer.b1, c.optimizer.b2, c.optimizer.eps) == (0.8, 0.98, 1e-8)
    assert (c.optimizer.weight_decay, c.optimizer.clip_norm) == (0.05, 0.5)
    assert c.parallel.mesh.to_dict() == {"data": 2, "fsdp": 4, "tensor": 1}
    assert c.parallel.logical_axis_rules == (("batch", ("data", "fsdp")), ("embed", None))
    assert (c.task, c.epochs, c.seed, c.model.hidden_dropout_prob) == ("sst2", 2, 3, 0.2)
    # A new-schema run config reads back unchanged.
    assert config_from_dict(c.to_dict()).to_dict() == c.to_dict()
    with pytest.raises(BertJaxError, match="^run/config.json: unknown fine-tuning config key "
                                           "'optimizer.nope'"):
        config_from_dict({**OLD_RUN, "optimizer": {"nope": 1}}, source="run/config.json")
