"""BertConfig's kernel options (``BertConfig.kernels``, a KernelOptions): validated,
round-tripped through the config JSON (tuples come back from JSON lists), settable from the
pretraining command line; configs saved with the earlier flat fields still load, and the old
names fail naming the new place."""

from __future__ import annotations

import dataclasses
import json

import pytest

from bert_jax.config import KERNEL_FIELDS, BertConfig, KernelOptions
from bert_jax.errors import BertJaxError
from bert_jax.runs.config import apply_overrides
from bert_jax.training import config as train_config

OPTIONS = dict(fused_gelu="force", fused_mlm_loss="off", split_norm_grads=False,
               direct_weight_grads=False, flash_bias_grads=False,
               norm_blocks=(2, 1, False), norm_sum_blocks=4, gelu_blocks=(4, 512, 2),
               gelu_sum_blocks=8)


def test_defaults():
    options = BertConfig().kernels
    assert (options.fused_gelu, options.fused_mlm_loss) == ("auto", "auto")
    assert options.split_norm_grads and options.direct_weight_grads and options.flash_bias_grads
    assert (options.norm_blocks, options.norm_sum_blocks, options.gelu_blocks,
            options.gelu_sum_blocks) == (None, None, None, None)


def test_json_round_trip(tmp_path):
    cfg = BertConfig(kernels=KernelOptions(**OPTIONS))
    path = tmp_path / "config.json"
    cfg.save_json(path)
    stored = json.loads(path.read_text())["config"]
    assert stored["kernels"]["norm_blocks"] == [2, 1, False]  # JSON has no tuples
    back = BertConfig.from_json_file(path)
    assert back == cfg and isinstance(back.kernels.norm_blocks, tuple)
    assert hash(back) == hash(cfg)
    assert BertConfig.from_dict(stored).kernels.gelu_blocks == (4, 512, 2)


def test_configs_saved_with_flat_kernel_fields_load(tmp_path):
    """A config.json written before the kernel options became one sub-config (every field at
    the top level) loads into the same BertConfig."""
    cfg = BertConfig(hidden_size=128, num_attention_heads=2,
                     kernels=KernelOptions(layer_norm_impl="flax", **OPTIONS))
    flat = {k: v for k, v in cfg.to_dict().items() if k != "kernels"}
    flat.update(json.loads(json.dumps(dataclasses.asdict(cfg.kernels))))
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"format": "bert_jax", "config": flat}))
    assert BertConfig.from_json_file(path) == cfg
    assert BertConfig.from_dict(flat) == cfg


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
    with pytest.raises(BertJaxError, match=f"BertConfig.kernels.{field}: .*{message}"):
        KernelOptions(**{field: value})
    with pytest.raises(BertJaxError, match=f"BertConfig.kernels.{field}: .*{message}"):
        BertConfig(kernels={field: value})


def test_command_line_overrides():
    config = train_config.base_config()
    apply_overrides(config, [
        "--config.model.preset=tiny", "--config.model.kernels.fused_gelu=off",
        "--config.model.kernels.norm_blocks=(2, 1, True)",
        "--config.model.kernels.gelu_sum_blocks=4",
        "--config.model.kernels.split_norm_grads=false"])
    model = train_config.model_config(config)
    assert model.kernels.fused_gelu == "off" and model.kernels.norm_blocks == (2, 1, True)
    assert model.kernels.gelu_sum_blocks == 4 and model.kernels.split_norm_grads is False
    assert model.kernels.gelu_blocks is None
    assert model.kernels.layer_norm_impl == "auto"  # the preset's where unset


@pytest.mark.parametrize("field", ["layer_norm_impl", "fused_gelu", "norm_blocks"])
def test_moved_fields_name_their_new_place(field):
    """``--config.model.<kernel field>`` and ``BertConfig.replace(<kernel field>=...)`` fail
    naming where the field lives now."""
    config = train_config.base_config()
    with pytest.raises(BertJaxError, match=rf"--config\.model\.{field} moved to "
                                           rf"--config\.model\.kernels\.{field}"):
        apply_overrides(config, [f"--config.model.{field}=off"])
    with pytest.raises(BertJaxError, match=rf"BertConfig\.kernels\.{field}"):
        BertConfig().replace(**{field: None})


def test_runtime_fields_name_every_kernel_field():
    from bert_jax.config import RUNTIME_FIELDS

    names = {f.name for f in dataclasses.fields(BertConfig)}
    assert set(RUNTIME_FIELDS) <= names and "kernels" in RUNTIME_FIELDS
    assert set(OPTIONS) <= set(KERNEL_FIELDS) and not set(KERNEL_FIELDS) & names
    # Shapes come from these: never runtime.
    assert not {"vocab_size", "hidden_size", "vocab_pad_multiple", "share_layers"} & set(
        RUNTIME_FIELDS)
