"""What a run trains on comes from what the user gives: the data directory's contents pick
the source, synthetic data only by name (and announced), a tokenizer that disagrees with the
model stops the run at start, missing held-out data is caught before training, and a failing
evaluation never costs the trained steps."""

import json
import os

import pytest

from bert_jax.checkpoint import store
from bert_jax.errors import BertJaxError
from bert_jax.training import loop
from bert_jax.training.inputs import check_eval_data, check_vocab, examples_per_row, resolve_source
from bert_jax.training.loop import train_and_evaluate

from .helpers import EXPERIMENT, SMALL, small_config

NO_SOURCE = [o for o in SMALL if not o.startswith("--config.data.source")]


def _config(*overrides):
    from bert_jax.training.config import load_config

    return load_config(f"{EXPERIMENT}:tiny", [*NO_SOURCE, *overrides])


def _tfrecord_dir(path, eval_shards: bool):
    """A data directory as create-pretraining-data leaves it (metadata + shard files)."""
    import tensorflow as tf

    def shard(name, records):  # framed records: the shard checks count them
        with tf.io.TFRecordWriter(str(path / name)) as w:
            for _ in range(records):
                w.write(b"x")

    path.mkdir()
    shard("train-00000-of-00001.tfrecord", 10)
    splits = {"train": {"examples": 10, "shards": [
        {"examples": 10, "file": "train-00000-of-00001.tfrecord"}]},
        "eval": {"examples": 0, "shards": []}}
    if eval_shards:
        shard("eval-00000-of-00001.tfrecord", 3)
        splits["eval"] = {"examples": 3, "shards": [
            {"examples": 3, "file": "eval-00000-of-00001.tfrecord"}]}
    (path / "metadata.json").write_text(json.dumps({
        "format_version": 1, "mode": "nsp", "max_seq_length": 32, "splits": splits,
        "tokenizer": {"vocab_size": 200, "fingerprint": "x", "special_ids": {
            "pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}}}))
    return str(path)


def test_source_follows_the_directory(tmp_path):
    data = _tfrecord_dir(tmp_path / "tf", eval_shards=True)
    assert resolve_source(_config(f"--config.data.directory={data}").data) == "tfrecord"
    batches = tmp_path / "mat"
    batches.mkdir()
    (batches / "manifest.json").write_text("{}")
    assert resolve_source(_config(f"--config.data.directory={batches}").data) == "materialized"
    # An explicit source that disagrees with the directory names what is there.
    with pytest.raises(BertJaxError, match="holds tfrecord data"):
        resolve_source(_config(f"--config.data.directory={data}",
                               "--config.data.source=materialized").data)
    with pytest.raises(BertJaxError, match="neither metadata.json"):
        resolve_source(_config(f"--config.data.directory={tmp_path}").data)


def test_packed_materialized_batches_give_their_example_slots(tmp_path):
    def batches(name, keys):
        path = tmp_path / name
        path.mkdir()
        (path / "manifest.json").write_text(json.dumps({"keys": {
            key: {"dtype": "int32", "shape": shape} for key, shape in keys.items()}}))
        return str(path)

    packed = batches("packed", {"input_ids": [2, 4, 32], "cls_positions": [2, 4, 3]})
    flat = batches("flat", {"input_ids": [2, 4, 32]})
    assert examples_per_row(_config(f"--config.data.directory={packed}")) == 3
    assert examples_per_row(_config(f"--config.data.directory={flat}")) == 0
    with pytest.raises(BertJaxError, match="eval_directory.*0 example slots"):
        examples_per_row(_config(f"--config.data.directory={packed}",
                                 f"--config.data.eval_directory={flat}"))


def test_synthetic_only_by_name(tmp_path):
    with pytest.raises(BertJaxError, match="no training data.*data.source=synthetic"):
        resolve_source(_config().data)
    data = _tfrecord_dir(tmp_path / "tf", eval_shards=True)
    # The old trap: a synthetic experiment silently ignoring the user's directory.
    with pytest.raises(BertJaxError, match="would ignore data.directory"):
        resolve_source(_config("--config.data.source=synthetic",
                               f"--config.data.directory={data}").data)
    assert resolve_source(_config("--config.data.source=synthetic").data) == "synthetic"


class _Tokenizer:
    vocab_size = 8000


def test_tokenizer_vocabulary_must_match_the_model():
    config = _config("--config.data.tokenizer=tok/")
    with pytest.raises(BertJaxError, match=r"tok/.*8000 entries.*vocab_size is 200 "
                                           r"\(from --config.model.vocab_size\)"):
        check_vocab(config, 200, _Tokenizer())
    check_vocab(config, 8000, _Tokenizer())
    check_vocab(config, 200, None)


def test_missing_held_out_data_is_an_error_at_start(tmp_path):
    data = _tfrecord_dir(tmp_path / "tf", eval_shards=False)
    config = _config(f"--config.data.directory={data}", "--config.data.source=tfrecord")
    with pytest.raises(BertJaxError, match="--holdout-fraction.*--config.eval_steps=0"):
        check_eval_data(config)
    check_eval_data(_config(f"--config.data.directory={data}", "--config.eval_steps=0",
                            "--config.data.source=tfrecord"))
    check_eval_data(_config(f"--config.data.directory={_tfrecord_dir(tmp_path / 'ok', True)}",
                            "--config.data.source=tfrecord"))


@pytest.mark.slow
def test_synthetic_run_is_announced_and_a_failed_final_evaluation_keeps_its_steps(
        tmp_path, monkeypatch, capsys):
    """A synthetic run says so first and records its source; an evaluation that fails at the
    end warns and keeps the trained (and saved) steps."""
    real = loop.make_batches

    def eval_fails(config, split, **kwargs):
        if split == "eval":
            raise BertJaxError("no eval shards")
        return real(config, split, **kwargs)

    monkeypatch.setattr(loop, "make_batches", eval_fails)
    result = train_and_evaluate(small_config(
        "--config.model.num_hidden_layers=1", "--config.num_train_steps=2",
        "--config.eval_every=100", "--config.eval_steps=2", "--config.checkpoint.every_steps=100",
        "--config.log_every=1", "--config.optimizer.warmup_steps=1"), str(tmp_path))
    assert result["step"] == 2 and result["stopped"] == "completed"
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("data: SYNTHETIC random token ids")
    assert "warning: evaluation at step 2 failed" in out
    # The final step is saved (it is saved before the final evaluation runs).
    assert os.listdir(tmp_path / "checkpoints") == ["2"]
    assert "eval_mlm_accuracy" not in result
    _, _, _, extra = store.load_model(str(tmp_path))
    assert extra["experiment"]["data"]["source"] == "synthetic"
