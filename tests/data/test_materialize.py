"""materialize-batches -> MaterializedBatches round trip; the reader needs no tensorflow."""

import json
import subprocess
import sys

import numpy as np
import pytest

from bert_jax.cli import main
from bert_jax.data.mask_settings import MaskSettings
from bert_jax.data.materialize import MaterializedBatches
from bert_jax.errors import BertJaxError
from data.helpers import write_shards

pytest.importorskip("tensorflow")


def test_round_trip_matches_pipeline_and_host_slices(tmp_path):
    from bert_jax.data.pipeline import PretrainingIterator

    write_shards(str(tmp_path / "data"), num_examples=40, num_shards=2)
    rc = main(["materialize-batches", "--data-dir", str(tmp_path / "data"), "--output",
               str(tmp_path / "mat"), "--steps", "5", "--batch-size", "8",
               "--max-predictions", "5", "--seed", "9", "--no-progress"])
    assert rc == 0
    live = PretrainingIterator.from_data_dir(str(tmp_path / "data"), per_host_batch_size=8,
                                             max_predictions_per_seq=5, seed=9)
    expected = [next(live) for _ in range(5)]
    reader = MaterializedBatches(str(tmp_path / "mat"))
    got = list(reader)
    assert len(got) == 5 and reader.state()["step"] == 5
    for g, e in zip(got, expected, strict=True):
        assert g.keys() == e.keys()
        for k in g:
            np.testing.assert_array_equal(g[k], e[k])
            assert g[k].dtype == e[k].dtype
    halves = [MaterializedBatches(str(tmp_path / "mat"), start_step=2, process_index=i,
                                  process_count=2) for i in range(2)]
    a, b = next(halves[0]), next(halves[1])
    np.testing.assert_array_equal(np.concatenate([a["input_ids"], b["input_ids"]]),
                                  expected[2]["input_ids"])
    with pytest.raises(BertJaxError, match="cannot be split"):
        MaterializedBatches(str(tmp_path / "mat"), process_count=3)
    manifest = json.loads((tmp_path / "mat" / "manifest.json").read_text())
    assert manifest["keys"]["input_ids"]["shape"] == [5, 8, 32]


def test_reader_does_not_import_tensorflow(tmp_path):
    directory = tmp_path / "m"
    directory.mkdir()
    arrays = {"input_ids": ("int32", [2, 4, 8]), "masked_lm_weights": ("float32", [2, 4, 3])}
    for key, (dtype, shape) in arrays.items():
        np.save(directory / f"{key}.npy", np.ones(shape, dtype))
    (directory / "manifest.json").write_text(json.dumps({
        "steps": 2, "batch_size": 4,
        "keys": {k: {"dtype": d, "shape": s} for k, (d, s) in arrays.items()}}))
    code = ("import sys; from bert_jax.data.materialize import MaterializedBatches as M; "
            f"b = list(M({str(directory)!r}, process_index=1, process_count=2)); "
            "assert len(b) == 2 and b[0]['input_ids'].shape == (2, 8); "
            "assert 'tensorflow' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("masking", ["knowledge", "span"])
def test_masking_modes_materialize_as_the_pipeline_masks(tmp_path, masking):
    """--masking knowledge / span: the stored batches are the pipeline's (data.masking of a
    training run), and a knowledge batch masks the lexicon's units whole."""
    from bert_jax.data.pipeline import PretrainingIterator
    from data.helpers import wordpiece, write_vocab

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    rng = np.random.default_rng(0)
    docs = [" ".join(rng.choice(["the", "cat", "sat", "on", "a", "log", "dog", "ran"], size=12))
            + " . the big tree was very happy ." for _ in range(30)]
    (corpus / "a.txt").write_text("\n\n".join(docs) + "\n")
    (tmp_path / "lex.txt").write_text("big tree\nvery happy\n")
    vocab = write_vocab(str(tmp_path))
    assert main(["create-pretraining-data", "--input", str(corpus), "--tokenizer", vocab,
                 "--output-dir", str(tmp_path / "data"), "--max-seq-length", "40",
                 "--mode", "nsp", "--num-workers", "1", "--num-shards", "1", "--no-progress",
                 "--knowledge-lexicon", str(tmp_path / "lex.txt")]) == 0
    options = ["--basic-masking-fraction", "0"] if masking == "knowledge" else []
    assert main(["materialize-batches", "--data-dir", str(tmp_path / "data"), "--output",
                 str(tmp_path / "mat"), "--steps", "4", "--batch-size", "16",
                 "--max-predictions", "8", "--seed", "3", "--masking", masking, "--tokenizer",
                 vocab, "--shuffle-buffer", "50", "--no-progress", *options]) == 0
    tokenizer = wordpiece(str(tmp_path))
    live = PretrainingIterator.from_data_dir(
        str(tmp_path / "data"), per_host_batch_size=16, max_predictions_per_seq=8, seed=3,
        tokenizer=tokenizer, mask=MaskSettings(masking=masking, basic_fraction=0.0),
        shuffle_buffer=50)
    got = list(MaterializedBatches(str(tmp_path / "mat")))
    for g in got:
        e = next(live)
        for k in e:
            np.testing.assert_array_equal(g[k], e[k])
    manifest = json.loads((tmp_path / "mat" / "manifest.json").read_text())
    assert manifest["masking"] == masking
    if masking != "knowledge":
        return
    big, tree = tokenizer.encode_batch(["big tree"])[0]
    whole = cut = 0
    for batch in got:
        for r in range(16):
            k = int(batch["masked_lm_weights"][r].sum())
            labels = dict(zip(batch["masked_lm_positions"][r, :k].tolist(),
                              batch["masked_lm_ids"][r, :k].tolist(), strict=True))
            for p, label in labels.items():  # a masked "big" comes with its "tree"
                if label == big:
                    whole += labels.get(p + 1) == tree
                    cut += labels.get(p + 1) != tree
    assert whole > 0 and cut == 0


def test_masking_option_errors(tmp_path):
    from bert_jax.data.materialize import materialize_batches

    write_shards(str(tmp_path / "data"), num_examples=16, num_shards=1)
    common = {"steps": 1, "batch_size": 4, "max_predictions": 3, "progress": False}
    with pytest.raises(BertJaxError, match="--masking span needs --tokenizer"):
        materialize_batches(str(tmp_path / "data"), str(tmp_path / "m"), masking="span",
                            **common)
    with pytest.raises(BertJaxError, match="replaces --whole-word"):
        materialize_batches(str(tmp_path / "data"), str(tmp_path / "m"), masking="token",
                            whole_word=True, **common)
    with pytest.raises(BertJaxError, match="'spans'"):
        materialize_batches(str(tmp_path / "data"), str(tmp_path / "m"), masking="spans",
                            **common)


def test_mask_token_fraction_reaches_the_batches(tmp_path):
    from bert_jax.data.materialize import materialize_batches
    from bert_jax.data.metadata import load_metadata

    write_shards(str(tmp_path / "data"), num_examples=40, num_shards=1)
    rc = main(["materialize-batches", "--data-dir", str(tmp_path / "data"), "--output",
               str(tmp_path / "mat"), "--steps", "3", "--batch-size", "8",
               "--max-predictions", "5", "--mask-token-fraction", "1.0",
               "--random-token-fraction", "0.0", "--no-progress"])
    assert rc == 0
    mask_id = load_metadata(str(tmp_path / "data")).special_ids["mask"]
    shown = []
    for batch in MaterializedBatches(str(tmp_path / "mat")):
        at = np.take_along_axis(batch["input_ids"], batch["masked_lm_positions"], axis=1)
        shown.append(at[batch["masked_lm_weights"] > 0])
    shown = np.concatenate(shown)
    assert shown.size > 20 and (shown == mask_id).all()
    manifest = json.loads((tmp_path / "mat" / "manifest.json").read_text())
    assert manifest["mask_token_fraction"] == 1.0 and manifest["random_token_fraction"] == 0.0
    with pytest.raises(BertJaxError, match="random_token_fraction 0.5"):
        materialize_batches(str(tmp_path / "data"), str(tmp_path / "m2"), steps=1, batch_size=4,
                            max_predictions=3, random_token_fraction=0.5, progress=False)
