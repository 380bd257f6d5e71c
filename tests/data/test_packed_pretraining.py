"""`create-pretraining-data --pack`: packed rows of whole NSP examples, read by the pipeline
with per-example NSP labels and masks inside examples, and trained for a few steps."""

import json

import numpy as np
import pytest

from bert_jax.cli import main
from bert_jax.data.pipeline import PACKED_BATCH_KEYS, PretrainingIterator
from data.helpers import CLS, PAD, SEP, write_corpus, write_vocab

tf = pytest.importorskip("tensorflow")

SEQ, K = 64, 4


def _packed_data(tmp_path):
    write_corpus(tmp_path / "corpus", n_files=2, docs_per_file=10)
    vocab = write_vocab(str(tmp_path))
    out = tmp_path / "out"
    rc = main(["create-pretraining-data", "--input", str(tmp_path / "corpus"), "--tokenizer",
               vocab, "--output-dir", str(out), "--max-seq-length", str(SEQ),
               "--short-seq-prob", "0.7", "--num-shards", "1", "--num-workers", "1",
               "--pack", "--max-examples-per-row", str(K), "--no-progress"])
    assert rc == 0
    return out, vocab


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


def test_packed_data_trains(tmp_path):
    from training.helpers import EXPERIMENT, SMALL

    from bert_jax.training.config import load_config
    from bert_jax.training.loop import train_and_evaluate

    out, vocab = _packed_data(tmp_path)
    overrides = [o for o in SMALL if not o.startswith(("--config.data.source",
                                                        "--config.model.vocab_size",
                                                        "--config.data.max_seq_length",
                                                        "--config.model.max_position"))]
    config = load_config(f"{EXPERIMENT}:tiny", [
        *overrides, f"--config.data.directory={out}", f"--config.data.tokenizer={vocab}",
        "--config.model.vocab_size=39", "--config.log_every=1",
        f"--config.data.max_seq_length={SEQ}",
        f"--config.model.max_position_embeddings={SEQ}", "--config.num_train_steps=3",
        "--config.eval_steps=0", "--config.optimizer.warmup_steps=0",
        "--config.data.shuffle_buffer=1"])
    result = train_and_evaluate(config, str(tmp_path / "run"))
    assert result["step"] == 3
    assert np.isfinite(result["loss"]) and np.isfinite(result["nsp_loss"])
    assert result["nsp_loss"] > 0 and result["mlm_loss"] > 0
