"""tf.data pipeline: host split, resume, per-epoch masking, fixed shapes, metadata checks."""

import json

import numpy as np
import pytest

from bert_jax.data.pipeline import BATCH_KEYS, PretrainingIterator, split_for_host
from bert_jax.errors import BertJaxError
from data.helpers import CLS, MASK, PAD, SEP, UNK, example_index, unmasked, write_shards

pytest.importorskip("tensorflow")

KW = dict(seq_len=32, max_predictions_per_seq=6, vocab_size=1000,
          special_ids=[PAD, UNK, CLS, SEP, MASK], mask_id=MASK, shuffle_buffer=16)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    directory = tmp_path_factory.mktemp("shards")
    examples = write_shards(str(directory), num_examples=50, num_shards=3)
    return str(directory), examples


@pytest.mark.parametrize("hosts", [1, 2, 3, 4])
def test_host_split_disjoint_and_complete(shards, hosts):
    directory, examples = shards
    seen = []
    for host in range(hosts):
        it = PretrainingIterator(directory, per_host_batch_size=8, process_index=host,
                                 process_count=hosts, repeat=False, **KW)
        mine = []
        for batch in it:
            assert batch["input_ids"].shape[1:] == (32,)
            ids = unmasked(batch)
            for r in range(len(ids)):
                i = example_index(batch, r)
                mine.append(i)
                expect = examples[i]
                np.testing.assert_array_equal(ids[r, :len(expect)], expect)  # exact content
                assert (ids[r, len(expect):] == PAD).all()
        seen += mine
    assert sorted(seen) == list(range(len(examples)))  # disjoint (no duplicates) and complete


def test_split_for_host_counts():
    files, counts = ["f0", "f1", "f2"], [10, 11, 12]
    assert [split_for_host(files, counts, i, 2).num_examples for i in range(2)] == [22, 11]
    assert [split_for_host(files, counts, i, 4).num_examples for i in range(4)] == [9, 8, 8, 8]
    with pytest.raises(BertJaxError):
        split_for_host(files, counts, 2, 2)


def test_batches_shapes_and_dtypes(shards):
    batch = next(PretrainingIterator(shards[0], per_host_batch_size=8, **KW))
    assert set(batch) == set(BATCH_KEYS)
    assert batch["input_ids"].shape == (8, 32) and batch["input_ids"].dtype == np.int32
    assert batch["masked_lm_positions"].shape == (8, 6)
    assert batch["masked_lm_weights"].dtype == np.float32
    assert batch["next_sentence_labels"].shape == (8,)
    np.testing.assert_array_equal(batch["input_mask"], unmasked(batch) != PAD)


def test_resume_equals_uninterrupted_stream(shards):
    full = PretrainingIterator(shards[0], per_host_batch_size=16, seed=5, **KW)
    stream = [next(full) for _ in range(12)]  # 192 examples: crosses three epoch ends
    first = PretrainingIterator(shards[0], per_host_batch_size=16, seed=5, **KW)
    for _ in range(7):
        next(first)
    state = json.loads(json.dumps(first.state()))
    resumed = PretrainingIterator(shards[0], per_host_batch_size=16, seed=5, state=state, **KW)
    for expected in stream[7:]:
        got = next(resumed)
        for key in BATCH_KEYS:
            np.testing.assert_array_equal(got[key], expected[key])
    with pytest.raises(BertJaxError, match="does not match"):
        PretrainingIterator(shards[0], per_host_batch_size=16, seed=6, state=state, **KW)


def test_masks_differ_across_epochs_and_seeds(shards):
    it = PretrainingIterator(shards[0], per_host_batch_size=10, seed=1, **KW)
    by_example: dict[int, list] = {}
    for _ in range(10):  # two epochs of 50
        batch = next(it)
        for r in range(10):
            by_example.setdefault(example_index(batch, r), []).append(
                tuple(batch["masked_lm_positions"][r]))
    assert all(len(v) == 2 for v in by_example.values())
    differ = sum(v[0] != v[1] for v in by_example.values())
    assert differ > 40  # re-masked each epoch
    a = next(PretrainingIterator(shards[0], per_host_batch_size=10, seed=1, **KW))
    b = next(PretrainingIterator(shards[0], per_host_batch_size=10, seed=2, **KW))
    assert not np.array_equal(a["masked_lm_positions"], b["masked_lm_positions"])


def test_metadata_tokenizer_check(shards, tmp_path):
    from data.helpers import wordpiece

    tokenizer = wordpiece(str(tmp_path))
    with pytest.raises(BertJaxError, match="vocab_size"):
        PretrainingIterator.from_data_dir(shards[0], per_host_batch_size=4,
                                          max_predictions_per_seq=4, tokenizer=tokenizer)
    with pytest.raises(BertJaxError, match="shorter than the stored"):
        PretrainingIterator(shards[0], per_host_batch_size=4, **{**KW, "seq_len": 16})
