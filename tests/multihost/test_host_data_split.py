"""Hosts read disjoint data and nothing is dropped: the tf.data pipeline over shards made by
``create-pretraining-data`` and the materialized batches, for 2, 3 and 4 hosts (simulated
process indices in one process; the pipeline only sees the index and count)."""

from __future__ import annotations

import collections
import functools
import math

import numpy as np
import pytest

from bert_jax.data.materialize import MaterializedBatches
from bert_jax.data.metadata import load_metadata

from .conftest import SEQ_LEN

pytestmark = pytest.mark.multiprocess


@functools.cache
def stored_examples(data_dir: str, split: str) -> collections.Counter:
    """Every example in the split's shards, as (input_ids, segment_ids, label) tuples."""
    import tensorflow as tf

    features = {"input_ids": tf.io.FixedLenFeature([SEQ_LEN], tf.int64),
                "segment_ids": tf.io.FixedLenFeature([SEQ_LEN], tf.int64),
                "next_sentence_label": tf.io.FixedLenFeature([1], tf.int64)}
    out = collections.Counter()
    for path in load_metadata(data_dir).files(split)[0]:
        for record in tf.data.TFRecordDataset(path):
            ex = tf.io.parse_single_example(record, features)
            out[(tuple(ex["input_ids"].numpy()), tuple(ex["segment_ids"].numpy()),
                 int(ex["next_sentence_label"].numpy()[0]))] += 1
    return out


def rows_as_examples(batch: dict[str, np.ndarray]) -> list[tuple]:
    """Undoes the masking (positions/ids/weights) and returns each row as a stored example."""
    ids = batch["input_ids"].copy()
    for r in range(len(ids)):
        for p, t, w in zip(batch["masked_lm_positions"][r], batch["masked_lm_ids"][r],
                           batch["masked_lm_weights"][r], strict=True):
            if w:
                ids[r, p] = t
    return [(tuple(ids[r]), tuple(batch["segment_ids"][r]), int(batch["next_sentence_labels"][r]))
            for r in range(len(ids))]


def host_iterator(data_dir, vocab, split, index, count, **kwargs):
    from bert_jax.data.pipeline import PretrainingIterator
    from bert_jax.tokenization import load_tokenizer

    return PretrainingIterator.from_data_dir(
        data_dir, per_host_batch_size=4, max_predictions_per_seq=5, tokenizer=load_tokenizer(vocab),
        split=split, seed=7, shuffle_buffer=64, process_index=index, process_count=count,
        **kwargs)


# 3 train shards: 2 and 3 hosts split the files, 4 hosts split the examples; the single eval
# shard is always split by examples.
@pytest.mark.parametrize(("hosts", "split"), [(2, "train"), (3, "train"), (4, "train"),
                                              (3, "eval")])
def test_pipeline_hosts_disjoint_and_complete(pretraining_data, hosts, split):
    data_dir, vocab = pretraining_data
    everything = stored_examples(data_dir, split)
    assert sum(everything.values()) >= 2 * hosts  # enough data that every host has some
    one_pass, training_epoch = collections.Counter(), collections.Counter()
    for host in range(hosts):
        # One epoch read to its end (evaluation style) ...
        mine = [row for batch in host_iterator(data_dir, vocab, split, host, hosts,
                                               repeat=False) for row in rows_as_examples(batch)]
        one_pass.update(mine)
        # ... and the first epoch of the repeating training stream (full batches running across
        # the epoch end): the same examples, nothing dropped at the boundary.
        stream = host_iterator(data_dir, vocab, split, host, hosts)
        rows = [row for _ in range(math.ceil(len(mine) / 4)) for row in
                rows_as_examples(next(stream))]
        training_epoch.update(rows[:len(mine)])
        assert collections.Counter(rows[:len(mine)]) == collections.Counter(mine)
    assert one_pass == everything  # union is the whole split, and no example read twice
    assert training_epoch == everything


@pytest.mark.parametrize("hosts", [2, 3, 4])
def test_materialized_hosts_tile_each_global_batch(materialized, hosts):
    whole = list(MaterializedBatches(materialized))
    parts = [list(MaterializedBatches(materialized, process_index=h, process_count=hosts))
             for h in range(hosts)]
    assert all(len(p) == len(whole) == 6 for p in parts)
    for step, batch in enumerate(whole):
        for key, value in batch.items():
            # Host h holds rows [h*B/n, (h+1)*B/n): concatenated in process order they are the
            # global batch, so no row is missing or duplicated.
            np.testing.assert_array_equal(np.concatenate([p[step][key] for p in parts]), value)
            assert all(len(p[step][key]) == 24 // hosts for p in parts)
