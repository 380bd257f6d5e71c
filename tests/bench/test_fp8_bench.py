"""Smoke test of ``python -m bench fp8`` on CPU: the throughput part (bf16 and fp8 steps of a
one-layer tiny model) and the parity part on a small materialized batch folder, written
here."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from bench import fp8 as bench_fp8

pytestmark = pytest.mark.slow

VOCAB, BATCHES, BATCH, SEQ, PREDS = 100, 5, 8, 32, 5


def write_batches(directory) -> None:
    """A materialized batch folder (``bert_jax.data.materialize``'s layout) of random rows."""
    rng = np.random.default_rng(0)
    directory.mkdir()
    positions = np.sort(np.argsort(rng.random((BATCHES, BATCH, SEQ - 2)), -1)[..., :PREDS] + 1,
                        -1)
    arrays = {
        "input_ids": rng.integers(5, VOCAB, (BATCHES, BATCH, SEQ)),
        "input_mask": np.ones((BATCHES, BATCH, SEQ)),
        "segment_ids": np.broadcast_to(np.arange(SEQ) >= SEQ // 2, (BATCHES, BATCH, SEQ)),
        "masked_lm_positions": positions,
        "masked_lm_ids": rng.integers(5, VOCAB, (BATCHES, BATCH, PREDS)),
        "masked_lm_weights": np.ones((BATCHES, BATCH, PREDS)),
        "next_sentence_labels": rng.integers(0, 2, (BATCHES, BATCH)),
    }
    keys = {}
    for key, value in arrays.items():
        dtype = "float32" if key == "masked_lm_weights" else "int32"
        np.save(directory / f"{key}.npy", np.asarray(value, dtype))
        keys[key] = {"dtype": dtype, "shape": list(value.shape)}
    (directory / "manifest.json").write_text(json.dumps(
        {"steps": BATCHES, "batch_size": BATCH, "seq_len": SEQ, "max_predictions": PREDS,
         "shuffle_buffer": 10, "keys": keys}))


def test_fp8_suite_throughput_and_parity(tmp_path):
    batches = tmp_path / "batches"
    write_batches(batches)
    out = tmp_path / "out"
    assert bench_fp8.main(["--shapes", "tiny/32:8", "--no-peer", "--steps", "1", "--repeats",
                           "1", "--warmup", "1", "--peak-size", "64", "--devices", "1",
                           "--batches-dir", str(batches), "--vocab-size", str(VOCAB),
                           "--model", "tiny", "--layers", "1",
                           "--parity-steps", "4", "--eval-batches", "2",
                           "--out", str(out)]) == 0
    records = [json.loads(line) for line in (out / "fp8.jsonl").read_text().splitlines()]
    assert [r["part"] for r in records] == ["throughput", "parity", "parity", "parity_summary"]
    row = records[0]
    assert row["bf16_seq_per_s"] > 0 and row["fp8_seq_per_s"] > 0 and row["layers"] == 1
    assert math.isclose(row["fp8_over_bf16"], row["fp8_seq_per_s"] / row["bf16_seq_per_s"])
    steps = [json.loads(line) for line in (out / "step.jsonl").read_text().splitlines()]
    assert [s["fp8"] for s in steps] == [False, True]
    bf16, fp8, summary = records[1:]
    assert (bf16["mode"], fp8["mode"], bf16["seed"], fp8["seed"]) == ("bf16", "fp8", 0, 0)
    assert bf16["steps"] == fp8["steps"] == 4 and bf16["train_batches"] == 3
    assert bf16["layers"] == fp8["layers"] == 1
    assert "heldout_mlm_accuracy_fp8_forward" in fp8
    assert "heldout_mlm_accuracy_fp8_forward" not in bf16
    for r in (bf16, fp8):
        assert 0.0 <= r["heldout_mlm_accuracy"] <= 1.0 and math.isfinite(r["last_loss"])
    assert math.isclose(summary["fp8_minus_bf16_points"],
                        100 * (fp8["heldout_mlm_accuracy"] - bf16["heldout_mlm_accuracy"]))
    table = (out / "fp8.md").read_text()
    assert "| tiny/32 | 8 |" in table and "held-out MLM acc" in table


def test_parity_summary_averages_seeds_and_reports_bf16_spread():
    runs = [{"part": "parity", "mode": mode, "seed": seed, "heldout_mlm_accuracy": acc}
            for mode, seed, acc in [("bf16", 0, 0.30), ("fp8", 0, 0.29), ("bf16", 1, 0.32),
                                    ("fp8", 1, 0.325)]]
    summary = bench_fp8.parity_summary(runs)
    assert summary["seeds"] == [0, 1]
    assert summary["fp8_minus_bf16_points_per_seed"] == pytest.approx([-1.0, 0.5])
    assert summary["fp8_minus_bf16_points"] == pytest.approx(-0.25)
    assert summary["within_half_point"] is True
    assert summary["bf16_seed_spread_points"] == pytest.approx(2.0)
    assert "bf16_seed_spread_points" not in bench_fp8.parity_summary(runs[:2])
    with pytest.raises(ValueError, match="fp8 seed 1"):
        bench_fp8.parity_summary(runs[:3])
