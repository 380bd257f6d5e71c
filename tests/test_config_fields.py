"""BertConfig's kernel fields: validated, round-tripped through the config JSON (tuples come
back from JSON lists), and settable from the pretraining command line."""

from __future__ import annotations

import json

import pytest

from bert_jax.config import BertConfig
from bert_jax.errors import BertJaxError
from bert_jax.runs.config import apply_overrides
from bert_jax.training import config as train_config

KERNEL_FIELDS = dict(fused_gelu="force", fused_mlm_loss="off", split_norm_grads=False,
                     direct_weight_grads=False, flash_bias_grads=False,
                     norm_blocks=(2, 1, False), norm_sum_blocks=4, gelu_blocks=(4, 512, 2),
                     gelu_sum_blocks=8)


def test_defaults():
    cfg = BertConfig()
    assert (cfg.fused_gelu, cfg.fused_mlm_loss) == ("auto", "auto")
    assert cfg.split_norm_grads and cfg.direct_weight_grads and cfg.flash_bias_grads
    assert (cfg.norm_blocks, cfg.norm_sum_blocks, cfg.gelu_blocks, cfg.gelu_sum_blocks) == (
        None, None, None, None)


def test_json_round_trip(tmp_path):
    cfg = BertConfig(**KERNEL_FIELDS)
    path = tmp_path / "config.json"
    cfg.save_json(path)
    stored = json.loads(path.read_text())["config"]
    assert stored["norm_blocks"] == [2, 1, False]  # JSON has no tuples
    back = BertConfig.from_json_file(path)
    assert back == cfg and isinstance(back.norm_blocks, tuple)
    assert hash(back) == hash(cfg)
    assert BertConfig.from_dict(stored).gelu_blocks == (4, 512, 2)


@pytest.mark.parametrize("field,value,message", [
    ("fused_gelu", True, "not one of"),
    ("fused_mlm_loss", "kernel", "not one of"),
    ("split_norm_grads", "yes", "true or false"),
    ("norm_blocks", (2, 1), "3 values"),
    ("norm_blocks", (2, 1, 1), "recompute true or false"),
    ("norm_blocks", (0, 1, True), "positive integers"),
    ("gelu_blocks", (4, 512, True), "positive integers"),
    ("gelu_blocks", 4, "3 values"),
    ("norm_sum_blocks", 0, "positive integer"),
    ("gelu_sum_blocks", 2.0, "positive integer"),
])
def test_bad_values_are_refused(field, value, message):
    with pytest.raises(BertJaxError, match=f"BertConfig.{field}: .*{message}"):
        BertConfig(**{field: value})


def test_command_line_overrides():
    config = train_config.base_config()
    apply_overrides(config, [
        "--config.model.preset=tiny", "--config.model.fused_gelu=off",
        "--config.model.norm_blocks=(2, 1, True)", "--config.model.gelu_sum_blocks=4",
        "--config.model.split_norm_grads=false"])
    model = train_config.model_config(config)
    assert model.fused_gelu == "off" and model.norm_blocks == (2, 1, True)
    assert model.gelu_sum_blocks == 4 and model.split_norm_grads is False
    assert model.gelu_blocks is None


def test_runtime_fields_name_every_kernel_field():
    import dataclasses

    from bert_jax.config import RUNTIME_FIELDS

    names = {f.name for f in dataclasses.fields(BertConfig)}
    assert set(RUNTIME_FIELDS) <= names
    assert set(KERNEL_FIELDS) <= set(RUNTIME_FIELDS)
    # Shapes come from these: never runtime.
    assert not {"vocab_size", "hidden_size", "vocab_pad_multiple", "share_layers"} & set(
        RUNTIME_FIELDS)
