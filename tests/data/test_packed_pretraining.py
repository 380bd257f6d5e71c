"""`create-pretraining-data --pack`: packed rows of whole NSP examples (with knowledge units
kept inside their examples), read by the pipeline with per-example NSP labels and masks inside
examples, materialized, and trained for a few steps from shards and from batches."""

import json

import numpy as np
import pytest

from bert_jax.cli import main
from bert_jax.data.mask_settings import MaskSettings
from bert_jax.data.pipeline import PACKED_BATCH_KEYS, PretrainingIterator
from data.helpers import CLS, PAD, SEP, write_corpus, write_vocab

tf = pytest.importorskip("tensorflow")

SEQ, K = 64, 4


def _packed_data(tmp_path, *options, name="out", pack=True):
    if not (tmp_path / "corpus").exists():
        write_corpus(tmp_path / "corpus", n_files=2, docs_per_file=10)
    vocab = write_vocab(str(tmp_path))
    out = tmp_path / name
    packing = ["--pack", "--max-examples-per-row", str(K)] if pack else []
    rc = main(["create-pretraining-data", "--input", str(tmp_path / "corpus"), "--tokenizer",
               vocab, "--output-dir", str(out), "--max-seq-length", str(SEQ),
               "--short-seq-prob", "0.7", "--num-shards", "1", "--num-workers", "1",
               *packing, *options, "--no-progress"])
    assert rc == 0
    return out, vocab


def _records(out, features):
    meta = json.loads((out / "metadata.json").read_text())
    path = str(out / meta["splits"]["train"]["shards"][0]["file"])
    return [{k: v.numpy() for k, v in tf.io.parse_single_example(record, features).items()}
            for record in tf.data.TFRecordDataset(path)]


def _renumbered(units):
    """unit_ids numbered 1, 2, ... in order of appearance (0 stays 0)."""
    order = {}
    return tuple(order.setdefault(u, len(order) + 1) if u else 0 for u in units.tolist())


def test_pack_writes_whole_examples_and_the_pipeline_reads_them(tmp_path):
    out, _ = _packed_data(tmp_path)
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["packed"] and meta["max_examples_per_row"] == K
    rows = meta["splits"]["train"]["examples"]
    assert rows < meta["packed_examples"]["train"]  # several examples a row
    features = {name: tf.io.FixedLenFeature([SEQ], tf.int64)
                for name in ("input_ids", "segment_ids", "example_ids", "position_ids")}
    features.update({name: tf.io.FixedLenFeature([K], tf.int64)
                     for name in ("cls_positions", "next_sentence_label", "example_slots")})
    examples = 0
    for record in tf.data.TFRecordDataset(str(out / meta["splits"]["train"]["shards"][0]["file"])):
        r = {k: v.numpy() for k, v in tf.io.parse_single_example(record, features).items()}
        n = int((r["input_ids"] != PAD).sum())
        assert (r["example_ids"][:n] > 0).all() and (r["example_ids"][n:] == 0).all()
        for slot in range(int(r["example_slots"].sum())):
            tokens = np.flatnonzero(r["example_ids"] == slot + 1)
            start = r["cls_positions"][slot]
            assert tokens[0] == start and np.array_equal(tokens, np.arange(start, tokens[-1] + 1))
            ids = r["input_ids"][tokens]
            assert ids[0] == CLS and ids[-1] == SEP and (ids == SEP).sum() == 2
            assert r["position_ids"][tokens].tolist() == list(range(len(tokens)))
            examples += 1
    assert examples == meta["packed_examples"]["train"]

    it = PretrainingIterator.from_data_dir(str(out), per_host_batch_size=rows,
                                           max_predictions_per_seq=10, shuffle_buffer=1)
    batch = next(it)  # the whole epoch
    assert set(PACKED_BATCH_KEYS) <= set(batch)
    assert batch["next_sentence_labels"].shape == (rows, K)
    assert batch["next_sentence_weights"].sum() == examples
    # Every masked position lies inside an example.
    hit = np.take_along_axis(batch["example_ids"], batch["masked_lm_positions"], 1)
    assert (hit[batch["masked_lm_weights"] > 0] > 0).all()


def test_packed_data_trains_from_shards_and_from_materialized_batches(tmp_path):
    """Materialized packed batches are the pipeline's, field by field, and a run trained from
    them takes the same steps as one trained from the shards."""
    from training.helpers import EXPERIMENT, SMALL, without_keys

    from bert_jax.data.materialize import MaterializedBatches
    from bert_jax.training.config import load_config
    from bert_jax.training.inputs import examples_per_row
    from bert_jax.training.loop import train_and_evaluate

    out, vocab = _packed_data(tmp_path)
    steps, batch_size, preds = 3, 16, 5
    settings = [
        f"--config.data.tokenizer={vocab}", "--config.model.vocab_size=39",
        "--config.model.num_hidden_layers=1", "--config.log_every=1",
        f"--config.data.max_seq_length={SEQ}",
        f"--config.model.max_position_embeddings={SEQ}", f"--config.num_train_steps={steps}",
        f"--config.global_batch_size={batch_size}",
        f"--config.data.max_predictions_per_seq={preds}", "--config.eval_steps=0",
        "--config.optimizer.warmup_steps=0", "--config.data.shuffle_buffer=1",
        # no dropout: a cheaper compile; the batches, not the random masks, are compared
        "--config.model.hidden_dropout_prob=0.0",
        "--config.model.attention_probs_dropout_prob=0.0"]
    base = [o for o in without_keys(SMALL, settings)
            if not o.startswith("--config.data.source")]

    def train(directory, name):
        config = load_config(f"{EXPERIMENT}:tiny", [
            *base, *settings, f"--config.data.directory={directory}"])
        assert examples_per_row(config) == K
        return train_and_evaluate(config, str(tmp_path / name))

    result = train(out, "run")
    assert result["step"] == steps
    assert np.isfinite(result["loss"]) and np.isfinite(result["nsp_loss"])
    assert result["nsp_loss"] > 0 and result["mlm_loss"] > 0

    mat = tmp_path / "mat"
    assert main(["materialize-batches", "--data-dir", str(out), "--output", str(mat),
                 "--steps", str(steps), "--batch-size", str(batch_size), "--max-predictions",
                 str(preds), "--shuffle-buffer", "1", "--no-progress"]) == 0
    manifest = json.loads((mat / "manifest.json").read_text())
    assert manifest["packed"] and manifest["max_examples_per_row"] == K
    assert manifest["keys"]["next_sentence_labels"]["shape"] == [steps, batch_size, K]
    live = PretrainingIterator.from_data_dir(str(out), per_host_batch_size=batch_size,
                                             max_predictions_per_seq=preds, shuffle_buffer=1)
    for got in MaterializedBatches(str(mat)):
        expected = next(live)
        assert got.keys() == expected.keys() and set(PACKED_BATCH_KEYS) <= set(got)
        for key, value in expected.items():
            np.testing.assert_array_equal(got[key], value, err_msg=key)
            assert got[key].dtype == value.dtype, key

    replay = train(mat, "replay")
    assert replay["step"] == steps
    for key in ("loss", "mlm_loss", "nsp_loss"):
        np.testing.assert_allclose(replay[key], result[key], rtol=1e-6, err_msg=key)


def test_packed_knowledge_units_stay_inside_examples_and_mask_whole(tmp_path):
    from data.helpers import wordpiece

    out, _ = _packed_data(tmp_path, "--knowledge-units")
    flat, _ = _packed_data(tmp_path, "--knowledge-units", name="flat", pack=False)
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["knowledge_units"] and "numbered on" in meta["features"]["unit_ids"]
    per_token = ("input_ids", "segment_ids", "example_ids", "unit_ids")
    features = {name: tf.io.FixedLenFeature([SEQ], tf.int64) for name in per_token}
    features.update({name: tf.io.FixedLenFeature([K], tf.int64)
                     for name in ("next_sentence_label", "example_slots")})
    rows = _records(out, features)
    packed = []
    for r in rows:
        for u in np.unique(r["unit_ids"][r["unit_ids"] > 0]):
            tokens = np.flatnonzero(r["unit_ids"] == u)  # one unit: one run in one example
            assert np.array_equal(tokens, np.arange(tokens[0], tokens[-1] + 1))
            assert len(set(r["example_ids"][tokens].tolist())) == 1
        for slot in range(int(r["example_slots"].sum())):
            tokens = r["example_ids"] == slot + 1
            packed.append((tuple(r["input_ids"][tokens].tolist()),
                           _renumbered(r["unit_ids"][tokens]),
                           int(r["next_sentence_label"][slot])))
    flat_features = {name: tf.io.FixedLenFeature([SEQ], tf.int64)
                     for name in ("input_ids", "unit_ids")}
    flat_features["next_sentence_label"] = tf.io.FixedLenFeature([1], tf.int64)
    unpacked = [(tuple(r["input_ids"][r["input_ids"] != PAD].tolist()),
                 _renumbered(r["unit_ids"][r["input_ids"] != PAD]),
                 int(r["next_sentence_label"][0])) for r in _records(flat, flat_features)]
    # Packing keeps every example once, with the units it has unpacked.
    assert sorted(packed) == sorted(unpacked)
    assert sum(max(units) for _, units, _ in packed) > len(packed)  # units to mask

    it = PretrainingIterator.from_data_dir(
        str(out), per_host_batch_size=len(rows), max_predictions_per_seq=12, shuffle_buffer=1,
        tokenizer=wordpiece(str(tmp_path)),
        mask=MaskSettings(masking="knowledge", basic_fraction=0.0))
    batch = next(it)  # the whole epoch, rows in file order
    whole = 0
    for r, row in enumerate(rows):
        n = int(batch["masked_lm_weights"][r].sum())
        selected = np.zeros(SEQ, bool)
        selected[batch["masked_lm_positions"][r, :n]] = True
        assert (row["example_ids"][selected] > 0).all()
        for u in np.unique(row["unit_ids"][row["unit_ids"] > 0]):
            inside = selected[row["unit_ids"] == u]
            assert inside.all() or not inside.any()  # whole units only
            whole += inside.all()
    assert whole > len(rows) // 4  # units are masked, not only the words around them
