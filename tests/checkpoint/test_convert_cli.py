"""``bert-jax convert`` / ``bert-jax export`` through bert_jax.cli.main on fixtures written
here, and the clear errors (exit 2, no traceback) for bad inputs."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest
import transformers
from hf_helpers import make_hf_model
from safetensors.numpy import load_file, save_file

from bert_jax.checkpoint.hf import load_hf
from bert_jax.checkpoint.store import load_model, save_model, write_config
from bert_jax.cli import main
from bert_jax.errors import BertJaxError


def _run(capsys, *argv):
    rc = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def test_convert_then_export(hf_pretraining_dir, tmp_path, capsys):
    source, _ = hf_pretraining_dir
    rc, out, err = _run(capsys, "convert", source, "--output", tmp_path / "bj")
    assert rc == 0, err
    assert "heads: mlm, nsp" in out and "wrote bert-jax model directory" in out
    params, config, tokenizer, extra = load_model(str(tmp_path / "bj"))
    reference, ref_config, *_ = load_hf(source)
    assert config == ref_config and extra["converted_from"]["format"] == "hf"
    assert tokenizer is not None and tokenizer.vocab_size == config.vocab_size
    np.testing.assert_array_equal(params["mlm"]["bias"], reference["mlm"]["bias"])

    rc, out, err = _run(capsys, "export", tmp_path / "bj", "--output", tmp_path / "hf2",
                        "--format", "hf")
    assert rc == 0, err
    assert "architecture: BertForPreTraining" in out
    original, exported = load_file(source / "model.safetensors"), load_file(
        tmp_path / "hf2" / "model.safetensors")
    assert sorted(original) == sorted(exported)
    for key, value in original.items():
        np.testing.assert_array_equal(exported[key], value, err_msg=key)
    assert (tmp_path / "hf2" / "vocab.txt").read_text() == (source / "vocab.txt").read_text()


def test_export_from_training_workdir(hf_pretraining_dir, tmp_path, capsys):
    source, _ = hf_pretraining_dir
    params, config, tokenizer, _ = load_hf(source, scan_layers=True)
    workdir = tmp_path / "workdir"
    write_config(str(workdir), config)
    tokenizer.save(str(workdir / "tokenizer"))
    for step in (10, 20):
        save_model(str(workdir / "checkpoints" / str(step)), params, config)
    rc, out, err = _run(capsys, "export", workdir, "--output", tmp_path / "hf")
    assert rc == 0, err
    _, info = transformers.BertForPreTraining.from_pretrained(tmp_path / "hf",
                                                              output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]


def test_unused_source_weights_are_printed(hf_pretraining_dir, tmp_path, capsys):
    source, _ = hf_pretraining_dir
    state = load_file(source / "model.safetensors")
    state["bert.encoder.layer.2.output.dense.weight"] = np.zeros((32, 37), np.float32)
    state["adapter.scale"] = np.ones(3, np.float32)
    save_file(state, source / "model.safetensors", metadata={"format": "pt"})
    rc, out, _ = _run(capsys, "convert", "--from", "hf", source, "--output", tmp_path / "bj")
    assert rc == 0
    assert "UNUSED: source tensors not converted (2):" in out
    assert "  adapter.scale" in out and "  bert.encoder.layer.2.output.dense.weight" in out


def _edit_config(directory, **changes):
    path = directory / "config.json"
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("case,message", [
    ("missing", "checkpoint not found"),
    ("empty_dir", "neither a Hugging Face directory"),
    ("no_weights", "no weights found"),
    ("gpt2", "model_type 'gpt2' is not one of"),
    ("roberta", r"weight 'roberta\.embeddings\.word_embeddings\.weight' not found"),
    ("bad_json", "not valid JSON"),
    ("shape", r"bert\.encoder\.layer\.0\.intermediate\.dense\.weight has shape \(37, 32\) but "
              r"bert-jax parameter bert/encoder/layer_0/mlp_in/kernel needs \(64, 32\)"),
    ("missing_layer", r"weight 'bert\.encoder\.layer\.2\.attention\.self\.query\.weight' "
                      "not found"),
    ("heads", "hidden_size: 32 is not divisible by num_attention_heads=5"),
    ("into_source", "already holds a different checkpoint"),
])
def test_convert_errors(hf_pretraining_dir, tmp_path, capsys, case, message):
    source, _ = hf_pretraining_dir
    output = tmp_path / "out"
    if case == "missing":
        source = tmp_path / "nope"
    elif case == "empty_dir":
        source = tmp_path / "empty"
        source.mkdir()
    elif case == "no_weights":
        (source / "model.safetensors").unlink()
        (source / "model.safetensors.index.json").unlink(missing_ok=True)
    elif case in ("gpt2", "roberta"):
        _edit_config(source, model_type=case)
    elif case == "bad_json":
        (source / "config.json").write_text("{\n  \"vocab_size\": 99,\n")
    elif case == "shape":
        _edit_config(source, intermediate_size=64)
    elif case == "missing_layer":
        _edit_config(source, num_hidden_layers=3)
    elif case == "heads":
        _edit_config(source, num_attention_heads=5)
    elif case == "into_source":
        output = source
    argv = ["convert", source, "--output", output]
    if case == "no_weights":
        argv[1:1] = ["--from", "hf"]
    rc, out, err = _run(capsys, *argv)
    assert rc == 2
    assert err.startswith("error: ") and "Traceback" not in err
    assert re.search(message, err), err


def test_export_errors(hf_pretraining_dir, tmp_path, capsys):
    source, _ = hf_pretraining_dir
    rc, _, err = _run(capsys, "export", tmp_path / "nothing", "--output", tmp_path / "x")
    assert rc == 2 and "checkpoint path not found" in err
    (tmp_path / "empty").mkdir()
    rc, _, err = _run(capsys, "export", tmp_path / "empty", "--output", tmp_path / "x")
    assert rc == 2 and "no bert-jax checkpoint found" in err
    rc, _, _ = _run(capsys, "convert", source, "--output", tmp_path / "bj")
    assert rc == 0
    rc, _, err = _run(capsys, "export", tmp_path / "bj", "--output", tmp_path / "x",
                      "--architecture", "BertForQuestionAnswering")
    assert rc == 2 and "needs the ['qa_outputs'] head" in err
    rc, _, err = _run(capsys, "export", tmp_path / "bj", "--output", tmp_path / "bj")
    assert rc == 2 and "--output is the checkpoint itself" in err
    (tmp_path / "other").mkdir()
    shutil.copy(tmp_path / "bj" / "config.json", tmp_path / "other" / "config.json")
    rc, _, err = _run(capsys, "export", source, "--output", tmp_path / "other")
    assert rc == 2 and "already holds a different checkpoint" in err


def test_torch_bin_refuses_pickled_objects(hf_pretraining_dir, tmp_path):
    """pytorch_model.bin is read with weights_only=True: arbitrary objects are refused."""
    import torch

    source, _ = hf_pretraining_dir
    target = tmp_path / "pickled"
    shutil.copytree(source, target)
    (target / "model.safetensors").unlink()
    torch.save({"weights": load_file(source / "model.safetensors"), "fn": _Callable()},
               target / "pytorch_model.bin")
    with pytest.raises(BertJaxError, match="weights_only=True"):
        load_hf(target)


class _Callable:
    """An arbitrary picklable object that weights-only loading must refuse."""

    def __call__(self):
        return "executed"


def test_sharded_safetensors(tmp_path):
    model = make_hf_model("BertModel", "2L-32H-4A", seed=9)
    model.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").exists()
    model.save_pretrained(tmp_path / "single")
    sharded, *_ = load_hf(tmp_path / "sharded")
    single, *_ = load_hf(tmp_path / "single")
    np.testing.assert_array_equal(sharded["bert"]["encoder"]["layer_1"]["mlp_out"]["kernel"],
                                  single["bert"]["encoder"]["layer_1"]["mlp_out"]["kernel"])


def test_bfloat16_safetensors_load_as_float32(tmp_path):
    import torch

    model = make_hf_model("BertForPreTraining", "2L-32H-4A", seed=11)
    model.to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    params, config, _, report = load_hf(tmp_path / "bf16")
    assert report.unused == [] and config.param_dtype == "float32"
    kernel = params["bert"]["encoder"]["layer_0"]["mlp_in"]["kernel"]
    assert kernel.dtype == np.float32
    expected = model.bert.encoder.layer[0].intermediate.dense.weight.detach().float().numpy().T
    np.testing.assert_array_equal(kernel, expected)
