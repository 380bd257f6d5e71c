"""Google's original TF checkpoints: the test writes one with the original variable names
(tf.compat.v1 Saver, as Google's run_pretraining.py does, with Adam slots and global_step) from
a transformers model's weights, and checks the import numerically against transformers."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from hf_helpers import HF_CONFIGS, make_batch, make_hf_model, write_vocab

from bert_jax import modeling
from bert_jax.checkpoint.google_tf import load_google_tf
from bert_jax.cli import main
from bert_jax.errors import BertJaxError

tf = pytest.importorskip("tensorflow")

CONFIG_NAME = "2L-32H-4A"


def google_variables(hf_model, num_layers: int) -> dict[str, np.ndarray]:
    """transformers BertForPreTraining weights under Google's names and layouts (dense kernels
    [in, out]; seq_relationship output_weights [2, hidden] as torch stores it)."""
    sd = {k: v.numpy() for k, v in hf_model.state_dict().items()}
    out = {
        "bert/embeddings/word_embeddings": sd["bert.embeddings.word_embeddings.weight"],
        "bert/embeddings/token_type_embeddings":
            sd["bert.embeddings.token_type_embeddings.weight"],
        "bert/embeddings/position_embeddings": sd["bert.embeddings.position_embeddings.weight"],
        "bert/embeddings/LayerNorm/gamma": sd["bert.embeddings.LayerNorm.weight"],
        "bert/embeddings/LayerNorm/beta": sd["bert.embeddings.LayerNorm.bias"],
        "bert/pooler/dense/kernel": sd["bert.pooler.dense.weight"].T,
        "bert/pooler/dense/bias": sd["bert.pooler.dense.bias"],
        "cls/predictions/transform/dense/kernel": sd["cls.predictions.transform.dense.weight"].T,
        "cls/predictions/transform/dense/bias": sd["cls.predictions.transform.dense.bias"],
        "cls/predictions/transform/LayerNorm/gamma":
            sd["cls.predictions.transform.LayerNorm.weight"],
        "cls/predictions/transform/LayerNorm/beta":
            sd["cls.predictions.transform.LayerNorm.bias"],
        "cls/predictions/output_bias": sd["cls.predictions.bias"],
        "cls/seq_relationship/output_weights": sd["cls.seq_relationship.weight"],
        "cls/seq_relationship/output_bias": sd["cls.seq_relationship.bias"],
    }
    for i in range(num_layers):
        g, h = f"bert/encoder/layer_{i}", f"bert.encoder.layer.{i}"
        dense = {"attention/self/query": "attention.self.query",
                 "attention/self/key": "attention.self.key",
                 "attention/self/value": "attention.self.value",
                 "attention/output/dense": "attention.output.dense",
                 "intermediate/dense": "intermediate.dense", "output/dense": "output.dense"}
        for gname, hname in dense.items():
            out[f"{g}/{gname}/kernel"] = sd[f"{h}.{hname}.weight"].T
            out[f"{g}/{gname}/bias"] = sd[f"{h}.{hname}.bias"]
        for gname, hname in {"attention/output/LayerNorm": "attention.output.LayerNorm",
                             "output/LayerNorm": "output.LayerNorm"}.items():
            out[f"{g}/{gname}/gamma"] = sd[f"{h}.{hname}.weight"]
            out[f"{g}/{gname}/beta"] = sd[f"{h}.{hname}.bias"]
    return out


def write_google_checkpoint(directory, variables, bert_config, vocab_size):
    """bert_config.json + bert_model.ckpt.{index,data-*} (v1 Saver names) + vocab.txt."""
    directory.mkdir(parents=True, exist_ok=True)
    slots = {f"{name}/{slot}": np.zeros_like(value) for name, value in variables.items()
             for slot in ("adam_m", "adam_v")}
    graph = tf.Graph()
    with graph.as_default():
        tf_vars = [tf.compat.v1.Variable(value, name=name)
                   for name, value in {**variables, **slots}.items()]
        tf_vars.append(tf.compat.v1.Variable(np.int64(1000), name="global_step"))
        saver = tf.compat.v1.train.Saver(tf_vars)
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            saver.save(sess, str(directory / "bert_model.ckpt"), write_meta_graph=False)
    (directory / "bert_config.json").write_text(json.dumps(bert_config))
    write_vocab(directory, size=vocab_size)


@pytest.fixture(scope="module")
def google_checkpoint(tmp_path_factory):
    hf_model = make_hf_model("BertForPreTraining", CONFIG_NAME, seed=7)
    cfg = HF_CONFIGS[CONFIG_NAME]
    bert_config = {k: getattr(hf_model.config, k) for k in (
        "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
        "intermediate_size", "hidden_act", "hidden_dropout_prob",
        "attention_probs_dropout_prob", "max_position_embeddings", "type_vocab_size",
        "initializer_range")}
    directory = tmp_path_factory.mktemp("google") / "uncased_L-2_H-32_A-4"
    write_google_checkpoint(directory, google_variables(hf_model, cfg["num_hidden_layers"]),
                            bert_config, cfg["vocab_size"])
    return directory, hf_model


def test_checkpoint_has_original_names(google_checkpoint):
    directory, _ = google_checkpoint
    names = dict(tf.train.list_variables(str(directory / "bert_model.ckpt")))
    assert names["bert/encoder/layer_0/attention/self/query/kernel"] == [32, 32]
    assert names["cls/seq_relationship/output_weights"] == [2, 32]
    assert "bert/encoder/layer_1/output/LayerNorm/gamma/adam_m" in names


def test_google_import_matches_transformers(google_checkpoint):
    directory, hf_model = google_checkpoint
    params, config, tokenizer, report = load_google_tf(str(directory))
    assert report.unused == []
    assert "global_step" in report.ignored
    assert "cls/predictions/output_bias/adam_v" in report.ignored
    assert report.heads == ["mlm", "nsp"]
    assert tokenizer is not None and tokenizer.vocab_size == config.vocab_size
    assert tokenizer.do_lower_case  # inferred from the lower-case vocabulary

    ids, mask, segments = make_batch(config.vocab_size, seed=3)
    out = modeling.BertForPreTraining(config).apply(
        {"params": params}, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(segments))
    with torch.no_grad():
        ref = hf_model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                       token_type_ids=torch.tensor(segments), output_hidden_states=True)
    valid = mask[..., None].astype(bool)
    seq = np.where(valid, np.asarray(out["sequence_output"]) - ref.hidden_states[-1].numpy(), 0)
    assert np.abs(seq).max() <= 1e-4
    mlm = np.asarray(out["mlm_logits"])[..., :config.vocab_size]
    assert np.abs(mlm - ref.prediction_logits.numpy()).max() <= 1e-4
    assert np.abs(np.asarray(out["nsp_logits"]) - ref.seq_relationship_logits.numpy()).max() \
        <= 1e-4


def test_prefix_path_and_cli_convert(google_checkpoint, tmp_path, capsys):
    directory, _ = google_checkpoint
    from bert_jax.checkpoint.store import load_model

    rc = main(["convert", "--from", "google", str(directory / "bert_model.ckpt"),
               "--output", str(tmp_path / "out"), "--scan-layers"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "global_step" in printed and "heads: mlm, nsp" in printed
    params, config, tokenizer, extra = load_model(str(tmp_path / "out"))
    assert config.scan_layers and "layers" in params["bert"]["encoder"]
    assert extra["converted_from"]["format"] == "google"
    assert tokenizer.kind == "wordpiece"
    reference, *_ = load_google_tf(str(directory), scan_layers=True)
    np.testing.assert_array_equal(params["bert"]["encoder"]["layers"]["mlp_in"]["kernel"],
                                  reference["bert"]["encoder"]["layers"]["mlp_in"]["kernel"])


def test_unknown_variables_are_listed_and_shape_errors_named(google_checkpoint, tmp_path):
    directory, hf_model = google_checkpoint
    variables = google_variables(hf_model, 2)
    variables["bert/encoder/layer_0/extra_gate/kernel"] = np.ones((32, 2), np.float32)
    write_google_checkpoint(tmp_path / "extra", variables,
                            json.loads((directory / "bert_config.json").read_text()), 99)
    _, _, _, report = load_google_tf(str(tmp_path / "extra"))
    assert report.unused == ["bert/encoder/layer_0/extra_gate/kernel"]

    variables = google_variables(hf_model, 2)
    variables["bert/encoder/layer_1/intermediate/dense/kernel"] = np.ones((32, 36), np.float32)
    write_google_checkpoint(tmp_path / "bad", variables,
                            json.loads((directory / "bert_config.json").read_text()), 99)
    with pytest.raises(BertJaxError, match=r"bert/encoder/layer_1/intermediate/dense/kernel.*"
                       r"\(36, 32\).*bert/encoder/layer_1/mlp_in/kernel needs \(37, 32\)"):
        load_google_tf(str(tmp_path / "bad"))


def test_missing_config_is_a_clear_error(google_checkpoint, tmp_path):
    directory, _ = google_checkpoint
    for f in directory.iterdir():
        if f.name != "bert_config.json":
            (tmp_path / f.name).write_bytes(f.read_bytes())
    with pytest.raises(BertJaxError, match="bert_config.json not found"):
        load_google_tf(str(tmp_path))
    with pytest.raises(BertJaxError, match="checkpoint prefix"):
        load_google_tf(str(tmp_path / "nope.ckpt"))
