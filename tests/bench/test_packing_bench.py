"""Smoke test of ``python -m bench packing`` on CPU: tiny model, one short sequence length, a
small corpus and GLUE fixture; packed rows carry more real tokens a row than unpacked ones."""

from __future__ import annotations

import json

import pytest

from bench import packing as bench_packing
from tests.finetuning import helpers as H

pytestmark = pytest.mark.slow


def test_packing_bench_records(tmp_path):
    texts, _ = H.sentences(300, 0)
    corpus = tmp_path / "corpus.txt"
    # Documents of 3-6 sentences, a blank line between them.
    lines = []
    for i, text in enumerate(texts):
        lines.append(text)
        if i % 5 == 4:
            lines.append("")
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    glue = tmp_path / "glue"
    H.write_sst2(str(glue / "SST-2"), n_train=96)
    vocab = H.write_vocab(str(tmp_path / "vocab"))
    out = tmp_path / "out"
    records = bench_packing.main([
        "--corpus", str(corpus), "--glue", str(glue), "--glue-tasks", "sst2",
        "--tokenizer", vocab, "--model", "tiny", "--layers", "1", "--hidden", "64",
        "--seq-lens", "32", "--batch-size", "8",
        "--max-examples-per-row", "4", "--short-seq-prob", "0.5", "--batches", "2",
        "--devices", "1",
        "--steps", "1", "--repeats", "1", "--warmup", "1", "--dtype", "float32", "--dropout", "0",
        "--out", str(out)])
    assert [(r["step"], r["packed"]) for r in records] == [
        ("pretrain", False), ("pretrain", True), ("finetune", False), ("finetune", True)]
    assert all("error" not in r and r["effective_tokens_per_s"] > 0 for r in records)
    for unpacked, packed in (records[:2], records[2:]):
        assert packed["examples"] == unpacked["examples"] == unpacked["rows"]
        assert packed["rows"] < unpacked["rows"]
        assert packed["padding_fraction"] < unpacked["padding_fraction"]
    written = [json.loads(x) for x in (out / "packing.jsonl").read_text().splitlines()]
    assert len(written) == 4
