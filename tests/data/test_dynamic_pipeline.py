"""Document shards and the pipeline that pairs them each epoch: round trip, exact resume,
disjoint hosts, N -> M hosts, errors, materialized batches, packed rows."""

import collections
import json
import os

import numpy as np
import pytest

from bert_jax.cli import main
from bert_jax.data import text
from bert_jax.data.create_pretraining import CreationConfig, create_pretraining_data
from bert_jax.data.documents import load_document_table
from bert_jax.data.dynamic_pipeline import DocumentStream
from bert_jax.data.metadata import load_metadata
from bert_jax.data.pairing import materialize
from bert_jax.data.pipeline import BATCH_KEYS, PACKED_BATCH_KEYS, PretrainingIterator
from bert_jax.errors import BertJaxError
from data.helpers import (
    CLS,
    MASK,
    PAD,
    SEP,
    unmasked,
    wordpiece,
    write_corpus,
    write_shards,
    write_vocab,
)

pytest.importorskip("tensorflow")

SEQ = 48


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("documents")
    write_corpus(str(root / "corpus"), n_files=3, docs_per_file=20)
    tokenizer = wordpiece(str(root))
    meta = create_pretraining_data(
        [str(root / "corpus")], tokenizer, str(root / "out"),
        CreationConfig(output_format="documents", max_record_tokens=30, holdout_fraction=0.2),
        num_shards=3, progress=False)
    return str(root), str(root / "out"), tokenizer, meta


def iterator(data_dir, tokenizer, batch=16, **kwargs):
    return PretrainingIterator.from_data_dir(data_dir, per_host_batch_size=batch,
                                             max_predictions_per_seq=6, seq_len=SEQ,
                                             tokenizer=tokenizer, **kwargs)


def test_document_shards_hold_the_tokenized_corpus(data):
    root, out, tokenizer, meta = data
    assert meta["format"] == "documents" and meta["mode"] is None
    config = load_metadata(out)
    assert config.format == "documents"
    train = load_document_table(config.train_files, config.vocab_size)
    held_out = load_document_table(config.eval_files, config.vocab_size)
    assert train.num_documents == meta["splits"]["train"]["documents"]
    assert held_out.num_documents == meta["splits"]["eval"]["documents"] > 0
    records = meta["splits"]["train"]["examples"]
    assert records == sum(s["examples"] for s in meta["splits"]["train"]["shards"])
    assert records > train.num_documents  # long documents were stored in chunks
    expected = set()
    for name in sorted(os.listdir(os.path.join(root, "corpus"))):
        raw = text.read_text_file(os.path.join(root, "corpus", name)).text
        for doc in text.split_documents(raw, "lines"):
            expected.add(tuple(tuple(ids) for ids in tokenizer.encode_batch(doc)))

    def documents(table):
        return {tuple(tuple(table.tokens[table.sentence_starts[k]:table.sentence_starts[k + 1]]
                            .tolist())
                      for k in range(table.document_sentences[d],
                                     table.document_sentences[d + 1]))
                for d in range(table.num_documents)}

    got_train, got_eval = documents(train), documents(held_out)
    assert not got_train & got_eval and got_train | got_eval == expected


def test_exact_resume_across_epochs(data):
    _, out, tokenizer, _ = data
    full = iterator(out, tokenizer, seed=3)
    epoch_size = full.stream.epoch_size(0)
    steps = epoch_size // 16 + 4  # crosses into the second epoch
    stream = [next(full) for _ in range(steps)]
    for step in (0, steps - 1):  # the pipeline's layout is pairing.materialize's
        ids, segs, labels = full.stream.host_batch(step)
        np.testing.assert_array_equal(unmasked(stream[step]), ids)
        np.testing.assert_array_equal(stream[step]["segment_ids"], segs)
        np.testing.assert_array_equal(stream[step]["next_sentence_labels"], labels)
    assert full.state()["epoch"] == 1
    first = iterator(out, tokenizer, seed=3)
    for _ in range(steps - 3):
        next(first)
    state = json.loads(json.dumps(first.state()))
    for saved in (state, {k: v for k, v in state.items() if k not in ("epoch", "position")}):
        resumed = iterator(out, tokenizer, seed=3, state=saved)
        for expected in stream[steps - 3:]:
            got = next(resumed)
            for key in BATCH_KEYS:
                np.testing.assert_array_equal(got[key], expected[key])
    with pytest.raises(BertJaxError, match="does not match"):
        iterator(out, tokenizer, seed=3, state={**state, "pairing": "sop"}, pairing="nsp")
    # Epochs pair the text differently.
    plans = [full.stream.epoch(e)[0] for e in (0, 1)]
    pairs = [set(zip(p.piece_lo.tolist(), p.piece_hi.tolist(), strict=True)) for p in plans]
    assert len(pairs[0] & pairs[1]) < 0.5 * len(pairs[0])


@pytest.fixture(scope="module")
def table(data):
    config = load_metadata(data[1])
    return load_document_table(config.train_files, config.vocab_size)


def host_streams(table, hosts, start=(0, 0, 0), pairing="nsp", examples_per_row=0):
    """One DocumentStream per host (global batch 16), from ``start`` = (step, epoch,
    position)."""
    step, epoch, position = start
    return [DocumentStream(table, pairing=pairing, seq_len=SEQ, short_seq_prob=0.1, seed=1,
                           cls_id=CLS, sep_id=SEP, pad_id=PAD, per_host_batch_size=16 // hosts,
                           process_index=i, process_count=hosts, start_step=step,
                           start_epoch=epoch, start_position=position,
                           examples_per_row=examples_per_row) for i in range(hosts)]


def global_batches(streams, first, steps):
    """Per step: the hosts' ids and labels concatenated in host order."""
    return [tuple(np.concatenate(parts) for parts in zip(
        *[s.host_batch(k)[::2] for s in streams], strict=True))
        for k in range(first, first + steps)]


def test_hosts_are_disjoint_and_reshard_exactly(table):
    one_host = host_streams(table, 1)
    one = global_batches(one_host, 0, 12)
    assert one_host[0].position(12)[0] == 1  # the steps cross an epoch end
    for hosts in (2, 4):
        for (ids, labels), (ref_ids, ref_labels) in zip(
                global_batches(host_streams(table, hosts), 0, 12), one, strict=True):
            np.testing.assert_array_equal(ids, ref_ids)
            np.testing.assert_array_equal(labels, ref_labels)
    # Host rows are disjoint positions that add up to exactly one epoch.
    size = one_host[0].epoch_size(0)
    seen = [p for s in host_streams(table, 4) for step in range(-(-size // 16))
            for _, rows in s.host_rows(step, limit_epoch=0) for p in rows.tolist()]
    assert sorted(seen) == list(range(size))
    # Resumed on another number of hosts, the stream continues where the old one stood.
    two = host_streams(table, 2)
    resumed = global_batches(host_streams(table, 4, (7, *two[0].position(7))), 7, 5)
    for (ids, labels), (ref_ids, ref_labels) in zip(resumed, one[7:], strict=True):
        np.testing.assert_array_equal(ids, ref_ids)
        np.testing.assert_array_equal(labels, ref_labels)


def test_batches_layout(data):
    _, out, tokenizer, _ = data
    for pairing in ("nsp", "sop", "full_sentences", "doc_sentences"):
        batch = next(iterator(out, tokenizer, pairing=pairing))
        assert set(batch) == set(BATCH_KEYS) and batch["input_ids"].shape == (16, SEQ)
        ids = unmasked(batch)
        np.testing.assert_array_equal(batch["input_mask"], ids != PAD)
        if pairing in ("nsp", "sop"):
            assert ((ids == SEP).sum(axis=1) == 2).all()
            assert 0 < batch["next_sentence_labels"].sum() < 16
        else:
            assert (batch["segment_ids"] == 0).all() and (batch["next_sentence_labels"] == 0).all()


def test_pairing_and_shard_format_must_agree(data, tmp_path):
    _, out, tokenizer, _ = data
    with pytest.raises(BertJaxError, match="paired in the pipeline"):
        iterator(out, tokenizer, pairing="static")
    write_shards(str(tmp_path / "pairs"), num_examples=20, num_shards=1)
    with pytest.raises(BertJaxError, match="--format documents"):
        PretrainingIterator.from_data_dir(str(tmp_path / "pairs"), per_host_batch_size=4,
                                          max_predictions_per_seq=4, pairing="nsp")


def test_cli_and_materialized_batches(data, tmp_path):
    root, out, tokenizer, _ = data
    rc = main(["create-pretraining-data", "--input", os.path.join(root, "corpus"),
               "--tokenizer", write_vocab(str(tmp_path)), "--output-dir", str(tmp_path / "d"),
               "--format", "documents", "--num-workers", "1", "--no-progress"])
    assert rc == 0 and load_metadata(str(tmp_path / "d")).format == "documents"
    rc = main(["materialize-batches", "--data-dir", out, "--output", str(tmp_path / "mat"),
               "--steps", "3", "--batch-size", "8", "--max-predictions", "6", "--seed", "4",
               "--seq-len", str(SEQ), "--pairing", "sop", "--no-progress"])
    assert rc == 0
    from bert_jax.data.materialize import MaterializedBatches

    live = iterator(out, None, batch=8, seed=4, pairing="sop")
    for got in MaterializedBatches(str(tmp_path / "mat")):
        expected = next(live)
        for key in BATCH_KEYS:
            np.testing.assert_array_equal(got[key], expected[key])


def test_training_config_reads_document_shards(data):
    from bert_jax.data.pipeline import check_training_data
    from bert_jax.training.config import base_config
    from bert_jax.training.inputs import make_batches

    _, out, tokenizer, _ = data
    config = base_config()
    config.data.directory, config.data.max_seq_length = out, SEQ
    config.data.pairing = "sop"
    meta = load_metadata(out)
    check_training_data(meta, "sop", "sop", SEQ)
    with pytest.raises(BertJaxError, match="needs mode 'nsp'"):
        check_training_data(meta, "nsp", "sop", SEQ)
    with pytest.raises(BertJaxError, match="paired in the pipeline"):
        check_training_data(meta, "mlm", "static", SEQ)
    source = make_batches(config, "train", batch_size=4, vocab_size=meta.vocab_size,
                          process_index=0, process_count=1, tokenizer=tokenizer)
    batch = next(source)
    assert batch["input_ids"].shape == (4, SEQ) and source.state()["pairing"] == "sop"


K = 4  # examples per packed row


def packed_examples(rows):
    """(tokens, segments, label) of every example in packed rows (host_packed_batch's
    arrays), checking the layout the model relies on."""
    ids, segs, example_ids, position_ids, cls_positions, labels, slots = rows
    found = []
    for r in range(len(ids)):
        n = int((example_ids[r] > 0).sum())  # left-aligned, padding after the last example
        assert (example_ids[r, :n] > 0).all() and (ids[r, n:] == PAD).all()
        filled = int(slots[r].sum())
        assert 1 <= filled <= K and (slots[r, :filled] == 1).all()
        assert not slots[r, filled:].any() and not labels[r, filled:].any()
        assert set(example_ids[r, :n].tolist()) == set(range(1, filled + 1))
        for slot in range(filled):
            cols = np.flatnonzero(example_ids[r] == slot + 1)
            assert cols[0] == cls_positions[r, slot]
            np.testing.assert_array_equal(cols, np.arange(cols[0], cols[0] + len(cols)))
            assert position_ids[r, cols].tolist() == list(range(len(cols)))
            tokens = ids[r, cols]
            assert tokens[0] == CLS and tokens[-1] == SEP and (tokens[1:] != CLS).all()
            found.append((tuple(tokens.tolist()), tuple(segs[r, cols].tolist()),
                          int(labels[r, slot])))
    return found


@pytest.mark.parametrize("pairing", ["nsp", "doc_sentences"])
def test_packed_rows_hold_every_example_of_the_epoch_once(table, pairing):
    packed = host_streams(table, 1, pairing=pairing, examples_per_row=K)[0]
    rows = packed.epoch_size(0)
    steps = -(-rows // 16)
    found = [e for step in range(steps)
             for e in packed_examples(packed.host_packed_batch(step, limit_epoch=0))]
    # The unpacked stream of the same seed forms the same examples (the same plan).
    plan = host_streams(table, 1, pairing=pairing)[0].epoch(0).plan
    ids, segs, labels = materialize(table, plan, np.arange(plan.num_examples), SEQ, CLS, SEP,
                                    PAD)
    expected = [(tuple(i[i != PAD].tolist()), tuple(s[i != PAD].tolist()), int(label))
                for i, s, label in zip(ids, segs, labels, strict=True)]
    assert collections.Counter(found) == collections.Counter(expected)
    assert rows < 0.9 * plan.num_examples  # rows hold several examples
    # Hosts split the packed rows as they split examples, across an epoch end.
    one = [packed.host_packed_batch(step) for step in range(steps - 1, steps + 2)]
    two = host_streams(table, 2, pairing=pairing, examples_per_row=K)
    for step, whole in zip(range(steps - 1, steps + 2), one, strict=True):
        halves = [s.host_packed_batch(step) for s in two]
        for i, array in enumerate(whole):
            np.testing.assert_array_equal(np.concatenate([h[i] for h in halves]), array)


def test_packed_batches_mask_inside_examples_and_resume_exactly(data):
    _, out, tokenizer, _ = data
    full = iterator(out, tokenizer, seed=3, examples_per_row=K)
    steps = full.stream.epoch_size(0) // 16 + 3  # crosses into the second epoch
    stream = [next(full) for _ in range(steps)]
    for step, batch in enumerate(stream):
        assert set(batch) == {*BATCH_KEYS, *PACKED_BATCH_KEYS}
        assert batch["input_ids"].shape == (16, SEQ) and batch["cls_positions"].shape == (16, K)
        ids, segs, example_ids, position_ids, cls_positions, labels, slots = \
            full.stream.host_packed_batch(step)
        np.testing.assert_array_equal(unmasked(batch), ids)
        for key, value in (("segment_ids", segs), ("example_ids", example_ids),
                           ("position_ids", position_ids), ("cls_positions", cls_positions),
                           ("next_sentence_labels", labels), ("next_sentence_weights", slots)):
            np.testing.assert_array_equal(batch[key], value)
        np.testing.assert_array_equal(batch["input_mask"], example_ids > 0)
        chosen = batch["masked_lm_weights"] > 0
        assert chosen.sum(axis=1).min() > 0
        at = np.take_along_axis(ids, batch["masked_lm_positions"], 1)[chosen]
        assert (np.take_along_axis(example_ids, batch["masked_lm_positions"], 1)[chosen] > 0
                ).all()
        assert not np.isin(at, [PAD, CLS, SEP, MASK]).any()
    assert full.state()["epoch"] == 1 and full.state()["examples_per_row"] == K
    first = iterator(out, tokenizer, seed=3, examples_per_row=K)
    for _ in range(steps - 3):
        next(first)
    state = json.loads(json.dumps(first.state()))
    resumed = iterator(out, tokenizer, seed=3, examples_per_row=K, state=state)
    for expected in stream[steps - 3:]:
        got = next(resumed)
        for key in expected:
            np.testing.assert_array_equal(got[key], expected[key])
    with pytest.raises(BertJaxError, match="does not match"):
        iterator(out, tokenizer, seed=3, state=state)  # an unpacked run
    with pytest.raises(BertJaxError, match="examples_per_row -1"):
        iterator(out, tokenizer, examples_per_row=-1)


def test_pretrain_on_packed_document_shards(data, tmp_path):
    from training.helpers import EXPERIMENT, SMALL

    from bert_jax.training.config import load_config
    from bert_jax.training.inputs import examples_per_row
    from bert_jax.training.loop import train_and_evaluate

    root, out, _, _ = data
    # The model (one layer), rows and steps of test_packed_pretraining.py's run (packed pair
    # shards, 4 examples a row of 64), so that the test run's XLA cache compiles the step once.
    overrides = [o for o in SMALL if not o.startswith(("--config.data.source",
                                                        "--config.model.vocab_size",
                                                        "--config.model.num_hidden_layers",
                                                        "--config.data.max_seq_length",
                                                        "--config.model.max_position"))]
    config = load_config(f"{EXPERIMENT}:tiny", [
        *overrides, f"--config.data.directory={out}",
        f"--config.data.tokenizer={write_vocab(root)}", "--config.model.vocab_size=39",
        "--config.model.num_hidden_layers=1",
        "--config.log_every=1", "--config.data.max_seq_length=64",
        "--config.model.max_position_embeddings=64", "--config.num_train_steps=3",
        "--config.eval_steps=0", "--config.optimizer.warmup_steps=0",
        "--config.data.pairing=nsp", f"--config.data.max_examples_per_row={K}"])
    assert examples_per_row(config) == K
    result = train_and_evaluate(config, str(tmp_path / "run"))
    assert result["step"] == 3
    assert np.isfinite(result["loss"]) and result["mlm_loss"] > 0 and result["nsp_loss"] > 0
    # Pair shards are packed when created, not by this field.
    write_shards(str(tmp_path / "pairs"), num_examples=20, num_shards=1)
    config.data.directory = str(tmp_path / "pairs")
    with pytest.raises(BertJaxError, match="packed when created"):
        examples_per_row(config)


def _write_documents(path, records):
    """Document-shard records ``(key, sentences)`` written in the given order."""
    import tensorflow as tf

    from bert_jax.data.example_proto import ExampleEncoder

    encoder = ExampleEncoder(1 << 17)
    with tf.io.TFRecordWriter(path) as w:
        for key, sentences in records:
            w.write(encoder.encode({"token_ids": [t for s in sentences for t in s],
                                    "sentence_lengths": [len(s) for s in sentences],
                                    "document": list(key)}))


def test_table_load_puts_records_in_document_order(tmp_path):
    """Chunks of documents spread over two files in shuffled order come back as the
    documents in (unit, document, chunk) order; an id past the vocabulary is refused even
    where the narrow token type would wrap it."""
    from bert_jax.data.documents import table_from_documents

    rng = np.random.default_rng(0)
    docs = {(u, d): [[int(t) for t in rng.integers(5, 900, int(rng.integers(1, 6)))]
                     for _ in range(int(rng.integers(1, 7)))] for u in range(3) for d in range(5)}
    records = [((u, d, c), [sentence]) for (u, d), sents in docs.items()
               for c, sentence in enumerate(sents)]  # one sentence a chunk
    shuffled = [records[i] for i in rng.permutation(len(records))]
    half = len(shuffled) // 2
    files = [str(tmp_path / "a.tfrecord"), str(tmp_path / "b.tfrecord")]
    _write_documents(files[0], shuffled[:half])
    _write_documents(files[1], shuffled[half:])
    got = load_document_table(files, 1000)
    want = table_from_documents([docs[k] for k in sorted(docs)], 1000)
    for name in ("tokens", "sentence_starts", "document_sentences"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)
    in_order = str(tmp_path / "ordered.tfrecord")
    _write_documents(in_order, records)
    np.testing.assert_array_equal(load_document_table([in_order], 1000).tokens, want.tokens)
    wraps = str(tmp_path / "wraps.tfrecord")
    _write_documents(wraps, [((0, 0, 0), [[7, 65536 + 7]])])  # 65543 is 7 as uint16
    with pytest.raises(BertJaxError, match="token id outside vocab_size 1000"):
        load_document_table([wraps], 1000)


def test_next_epoch_is_drawn_ahead_and_the_same(table):
    stream = host_streams(table, 1)[0]
    stream.host_batch(0)  # epoch 0 drawn; epoch 1 starts drawing in the background
    assert list(stream._ahead) == [1]
    thread, result = stream._ahead[1]
    thread.join()
    assert result  # drawn ahead, taken when epoch 1 is first read
    ahead = stream.epoch(1)
    assert ahead is result[0] and list(stream._ahead) == [2]
    fresh = host_streams(table, 1)[0]._draw(1)
    np.testing.assert_array_equal(ahead.order, fresh.order)
    np.testing.assert_array_equal(ahead.plan.piece_lo, fresh.plan.piece_lo)
