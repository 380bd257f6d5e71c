"""``python -m bench variants`` in two phases: --prepare-only (tensorflow) packs the batches of
every (data, masking) pair; --prepared rebuilds them and runs without tensorflow."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from xla_env import cpu_flags

from bench import variants, variants_prep
from bench.common import REPO

pytestmark = pytest.mark.slow

pytest.importorskip("tensorflow")

TINY = ["--model", "tiny", "--vocab-size", "300", "--batch-size", "8", "--seq-len", "32",
        "--tasks", "mrpc", "--seeds", "2", "--max-train-examples", "24", "--epochs", "1",
        "--num-workers", "1", "--variants", "bert,ernie"]


def write_inputs(root):
    """A small corpus from the demo texts and an MRPC-format file of sentence pairs."""
    corpus = root / "corpus"
    corpus.mkdir()
    with open(os.path.join(REPO, "bert_jax", "demo_data", "austen-persuasion.txt"),
              encoding="utf-8") as f:
        text = f.read()[:60_000]
    (corpus / "austen.txt").write_text(text)
    sentences = [s.strip().replace("\n", " ") for s in text.split(".") if len(s.split()) > 6]
    rng = np.random.default_rng(0)
    rows = ["Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"]
    for i, s in enumerate(sentences[:40]):
        words = s.split()
        other = " ".join(rng.permutation(words[:3]).tolist() + words[3:]) if i % 2 \
            else sentences[-1 - i]
        rows.append(f"{i % 2}\t{i}\t{1000 + i}\t{s}\t{other}")
    (root / "glue" / "MRPC").mkdir(parents=True)
    (root / "glue" / "MRPC" / "train.tsv").write_text("\n".join(rows) + "\n")
    return corpus, root / "glue"


def test_prepare_then_run_prepared_without_tensorflow(tmp_path):
    corpus, glue = write_inputs(tmp_path)
    prep = tmp_path / "prep"
    assert variants.main(["--prepare-only", str(prep), "--corpus", str(corpus), "--glue",
                          str(glue), "--out", str(tmp_path / "work"), "--batches", "4",
                          "--steps", "6", *TINY]) == 0
    assert sorted(os.listdir(prep)) == [variants_prep.PREPARED_JSON, variants_prep.ARCHIVE]
    prepared = json.loads((prep / variants_prep.PREPARED_JSON).read_text())
    assert set(prepared["combos"]) == {"nsp_token", "nsp_knowledge"}
    assert prepared["batches"] == 4 and prepared["steps"] == 6

    # Unpacked batches are exactly what materialize-batches wrote (masked ids and labels
    # rebuilt from the shared unmasked ids); knowledge and token masks of one kind differ.
    paths = variants_prep.unpack(str(prep), str(tmp_path / "unpacked"))
    for combo in prepared["combos"]:
        original = tmp_path / "work" / "work" / "materialized" / combo
        for name in os.listdir(original):
            if name.endswith(".npy"):
                np.testing.assert_array_equal(np.load(os.path.join(paths[combo], name)),
                                              np.load(original / name), err_msg=name)
    token = np.load(os.path.join(paths["nsp_token"], "masked_lm_positions.npy"))
    knowledge = np.load(os.path.join(paths["nsp_knowledge"], "masked_lm_positions.npy"))
    assert not np.array_equal(token, knowledge)

    # The GPU phase in a process where tensorflow cannot be imported, on one device (the
    # bench's setting; one simulated device also compiles faster than the tests' eight).
    out = tmp_path / "out"
    code = ("import sys; sys.modules['tensorflow'] = None; from bench import variants; "
            f"sys.exit(variants.main(['--prepared', {str(prep)!r}, '--out', {str(out)!r}, "
            f"'--unpack-dir', {str(tmp_path / 'unpacked2')!r}, '--tasks', 'mrpc', "
            "'--seeds', '2', '--max-train-examples', '24', '--epochs', '1', "
            "'--variants', 'bert,ernie']))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True,
                          env={**os.environ, "PYTHONPATH": REPO, "XLA_FLAGS": cpu_flags(1)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records = [json.loads(line) for line in (out / "variants.jsonl").read_text().splitlines()]
    assert [r["variant"] for r in records] == ["bert", "ernie"]
    for r in records:
        assert r["pretrain_steps"] == 6 and r["distinct_batches"] == 4
        assert len(r["tasks"]["mrpc"]["scores"]) == 2
        assert r["last_loss"] == r["last_loss"]  # finite, logged
    table = (out / "variants.md").read_text()
    assert "4 distinct batches per (data, masking) pair" in table and "cycling" in table
    assert "| bert | 2 x 128 | 6 (4) |" in table
    # The two seeds of a variant, and both variants (one encoder shape), share the programs.
    assert "(1 distinct fine-tuning shapes)" in table


def test_prepared_folder_errors(tmp_path, capsys):
    with pytest.raises(SystemExit, match="no prepared.json"):
        variants.main(["--prepared", str(tmp_path), "--out", str(tmp_path / "o")])
    with pytest.raises(SystemExit):
        variants.main(["--prepared", str(tmp_path), "--corpus", "c", "--out", "o"])
    assert "--corpus: not with --prepared" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        variants.main(["--corpus", "c", "--out", "o"])
    assert "--glue is required" in capsys.readouterr().err
