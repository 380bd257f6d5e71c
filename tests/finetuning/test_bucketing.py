"""Length bucketing: every row in exactly one batch, the same number of batches as without,
deterministic plans, and predictions (hence metrics) equal to unbucketed ones."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from bert_jax.errors import BertJaxError
from bert_jax.finetuning import bucketing
from bert_jax.finetuning.config import load_config
from bert_jax.finetuning.evaluate import score
from bert_jax.finetuning.inputs import featurize, train_and_dev
from bert_jax.finetuning.model_init import initial_model, merge_encoder
from bert_jax.finetuning.trainer import build_finetuner, model_outputs
from bert_jax.tasks.registry import get_task


def test_bucket_lengths():
    assert bucketing.bucket_lengths(128, 32) == (32, 64, 128)
    assert bucketing.bucket_lengths(384, 32) == (32, 64, 128, 256, 384)
    assert bucketing.bucket_lengths(128, 0) == (128,)
    assert bucketing.bucket_lengths(128, 128) == (128,)
    with pytest.raises(BertJaxError, match="multiple of 8"):
        bucketing.bucket_lengths(128, 20)


def test_row_lengths_last_attended_position():
    mask = np.zeros((3, 2, 10), np.int32)  # multiple choice: the longest choice counts
    mask[0, 0, :3] = 1
    mask[0, 1, :7] = 1
    mask[1, :, :10] = 1
    np.testing.assert_array_equal(bucketing.row_lengths(mask), [7, 10, 1])


@pytest.mark.parametrize("n, batch", [(103, 8), (64, 16), (5, 8)])
def test_plan_covers_every_row_once(n, batch):
    rng = np.random.default_rng(0)
    lengths = rng.integers(3, 129, size=n)
    order = rng.permutation(n)
    buckets = (32, 64, 128)
    plan = bucketing.plan_batches(lengths, buckets, order, batch)
    rows = np.concatenate([p.rows for p in plan])
    assert sorted(rows.tolist()) == list(range(n))  # each row exactly once
    assert len(plan) == -(-n // batch)  # as many batches as without buckets
    assert all(len(p.rows) == batch for p in plan[:-1])
    assert all(lengths[p.rows].max() <= p.seq_len for p in plan)
    assert any(p.seq_len < 128 for p in plan) or n < batch
    again = bucketing.plan_batches(lengths, buckets, order, batch)
    assert all(np.array_equal(a.rows, b.rows) and a.seq_len == b.seq_len
               for a, b in zip(plan, again, strict=True))
    first = bucketing.shuffled(plan, seed=0, epoch=0)
    assert [p.rows.tolist() for p in first] == \
        [p.rows.tolist() for p in bucketing.shuffled(plan, seed=0, epoch=0)]
    assert sorted(np.concatenate([p.rows for p in first]).tolist()) == list(range(n))


def test_gather_cuts_sequence_arrays_and_pads_rows():
    feats = {"input_ids": np.arange(5 * 16).reshape(5, 16), "label_ids": np.arange(5),
             "tags": np.ones((5, 16))}
    batch, real = bucketing.gather(feats, ("input_ids", "label_ids", "tags"),
                                   bucketing.PlannedBatch(np.array([3, 1]), 8), 4, 16)
    assert real == 2
    assert batch["input_ids"].shape == (4, 8) and batch["tags"].shape == (4, 8)
    np.testing.assert_array_equal(batch["label_ids"], [3, 1, 3, 3])
    np.testing.assert_array_equal(batch["input_ids"][1], np.arange(16, 24))


def _predictions(spec, min_length, *overrides):
    config = load_config(spec, ["--config.max_seq_length=32", "--config.eval_batch_size=16",
                                f"--config.length_bucket_min={min_length}",
                                "--config.model.dtype=float32", *overrides])
    task = get_task(config.task)
    model_cfg, tokenizer, pretrained, _ = initial_model(task, config)
    _, devs, _ = train_and_dev(task, config)
    dev = next(iter(devs.values()))
    feats = featurize(task, dev, tokenizer, config)
    finetuner = build_finetuner(task, config, model_cfg, None)
    params, _ = merge_encoder(jax.device_get(finetuner.init_params(jax.random.PRNGKey(3))),
                              pretrained, model_cfg)
    params = finetuner.place_params(params)
    metrics, _ = score(finetuner, params, task, dev, feats, config)
    outputs = finetuner.predict(params, feats)
    return finetuner, feats, metrics, model_outputs(task.kind, outputs)


@pytest.mark.parametrize("spec, data_key", [("experiments/glue.py:sst2", "sst2"),
                                            ("experiments/ner.py:conll2003", "conll")])
def test_bucketed_predictions_equal_unbucketed(data, spec, data_key):
    args = (f"--config.init_checkpoint={data['ckpt']}", f"--config.data_dir={data[data_key]}")
    plain, feats, metrics, out = _predictions(spec, 0, *args)
    bucketed, _, metrics_b, out_b = _predictions(spec, 8, *args)
    assert plain.buckets == (32,) and bucketed.buckets == (8, 16, 32)
    lengths = bucketing.row_lengths(feats["input_mask"])
    assert lengths.max() <= 16  # the fixtures use the short buckets
    assert metrics_b == metrics
    if out.ndim == 3:  # per-token logits: equal at attended positions, zeros after a bucket
        attended = feats["input_mask"] > 0
        out, out_b = out[attended], out_b[attended]
    np.testing.assert_allclose(out_b, out, rtol=1e-5, atol=1e-5)


def test_small_buckets_that_would_not_pay_for_their_compile_are_dropped():
    buckets = (32, 64, 128)
    lengths = np.array([10] * 50 + [40] * 30 + [100] * 20)
    # every bucket holds enough rows x passes: all kept
    assert bucketing.keep_worthwhile(buckets, lengths, 3, 60) == (32, 64, 128)
    # 32 holds 50 x 3 = 150 < 200: its rows join 64's (80 x 3 = 240), which stays
    assert bucketing.keep_worthwhile(buckets, lengths, 3, 200) == (64, 128)
    # nothing reaches the threshold below max_seq_length: one bucket
    assert bucketing.keep_worthwhile(buckets, lengths, 1, 1000) == (128,)
    assert bucketing.keep_worthwhile(buckets, lengths, 1, 0) == buckets


def test_finetuning_keeps_one_bucket_for_a_small_task(data, tmp_path):
    """The default threshold leaves a tiny task one compiled length; 0 keeps every bucket."""
    config = load_config("experiments/glue.py:sst2", [
        f"--config.init_checkpoint={data['ckpt']}", f"--config.data_dir={data['sst2']}",
        "--config.max_seq_length=32", "--config.length_bucket_min=8"])
    task = get_task(config.task)
    model_cfg, tokenizer, _, _ = initial_model(task, config)
    train, _, _ = train_and_dev(task, config)
    mask = featurize(task, train, tokenizer, config)["input_mask"]
    assert build_finetuner(task, config, model_cfg, 10, mask, 3).buckets == (32,)
    with config.unlocked():
        config.length_bucket_min_sequences = 0
    assert build_finetuner(task, config, model_cfg, 10, mask, 3).buckets == (8, 16, 32)
