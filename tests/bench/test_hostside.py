"""``python -m bench hostside``: the replicated corpus loads as distinct documents, a point
measures the table and the plans, and the report extrapolates along the measured line."""

import json
import os

import numpy as np
import pytest
from data.helpers import wordpiece, write_corpus

from bench import hostside
from bert_jax.data.create_pretraining import CreationConfig, create_pretraining_data
from bert_jax.data.documents import load_document_table
from bert_jax.data.metadata import load_metadata

pytest.importorskip("tensorflow")


@pytest.fixture(scope="module")
def documents(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostside")
    write_corpus(str(root / "corpus"), n_files=2, docs_per_file=10)
    create_pretraining_data([str(root / "corpus")], wordpiece(str(root)), str(root / "docs"),
                            CreationConfig(output_format="documents", max_record_tokens=30),
                            num_shards=2, progress=False)
    return root


def test_replicate_subset_point_and_report(documents, tmp_path, capsys):
    source = load_metadata(str(documents / "docs"))
    one = load_document_table(source.train_files, source.vocab_size)
    big = str(tmp_path / "big")
    hostside.replicate(str(documents / "docs"), big, copies=4)
    meta = load_metadata(big)
    table = load_document_table(meta.train_files, meta.vocab_size)
    # every copy's documents are distinct to the loader, and hold the source's text
    assert table.num_documents == 4 * one.num_documents
    assert table.tokens.size == 4 * one.tokens.size
    assert np.array_equal(np.sort(table.tokens), np.sort(np.tile(one.tokens, 4)))
    raw = json.load(open(os.path.join(big, "metadata.json")))
    assert raw["replicated"]["copies"] == 4 and raw["replicated"]["source_words"] > 0

    records = tmp_path / "hostside.jsonl"
    for copies in (1, 2, 4):
        sub = hostside.subset(big, copies, str(tmp_path / f"c{copies}"))
        rec = hostside.point(sub, rate=copies == 4, steps=3, batch=8)
        assert rec["tokens"] == copies * one.tokens.size
        assert rec["table_bytes"] >= rec["tokens"] * 2
        assert rec["plans"]["128"]["examples"] > 0 and rec["plans"]["512"]["examples"] > 0
        records.open("a").write(json.dumps(rec) + "\n")
    assert rec["pipeline"][0]["sequences_per_s"] > 0
    sweep = tmp_path / "sweep.jsonl"
    sweep.write_text(json.dumps({"compiled": True, "slice": "v5p-128", "num_slices": 1,
                                 "label": "Large/128", "seq_len": 128,
                                 "sequences_per_second": 160_000}) + "\n")
    assert hostside.report(str(records), str(sweep)) == 0
    text = capsys.readouterr().out
    assert "BERT's corpus, 3.3 B words" in text
    # 160,000 seq/s over 16 hosts of v5p-128
    assert "| Large/128 | v5p-128 | 16 | 160,000 | 10,000 |" in text


def test_fit_is_exact_on_a_line():
    a, b, resid = hostside.fit([1, 2, 4], [3, 5, 9])
    assert a == pytest.approx(2) and b == pytest.approx(1) and resid < 1e-9
