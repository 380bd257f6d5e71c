"""materialize-batches -> MaterializedBatches round trip; the reader needs no tensorflow."""

import json
import subprocess
import sys

import numpy as np
import pytest

from bert_jax.cli import main
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
