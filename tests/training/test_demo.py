"""`make demo` end to end on a tiny budget: tokenizer -> TFRecord data -> pretraining -> the
report (baseline, PNG, fill-mask), and the workdir loads as a model checkpoint with its
tokenizer."""

import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest
from xla_env import cpu_flags

from bert_jax.checkpoint import store

pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytest.importorskip("tensorflow")


def test_demo_script_runs_end_to_end(tmp_path):
    env = dict(os.environ, DEMO_DIR=str(tmp_path), DEMO_STEPS="12", DEMO_VOCAB="600",
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],
               XLA_FLAGS=cpu_flags(1),
               DEMO_EXTRA="--config.global_batch_size=8 --config.log_every=4 "
                          "--config.eval_every=6 --config.eval_steps=1 "
                          "--config.checkpoint.every_steps=6 --config.optimizer.warmup_steps=2 "
                          "--config.progress_bar=false")
    done = subprocess.run(["bash", os.path.join(REPO, "scripts", "demo.sh")], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "held-out masked-LM accuracy" in done.stdout and "Next:" in done.stdout
    assert "unigram baseline" in done.stdout and "fill-mask (top 3;" in done.stdout
    # It says what the model saw, scores the [MASK] positions alone, and counts each prompt's
    # answer phrase in the training text.
    assert "trained on: Persuasion by Jane Austen 1818" in done.stdout
    assert "held-out accuracy at the [MASK] positions alone" in done.stdout
    assert ("15% of the tokens masked afresh in every batch (80% of them shown as [MASK], "
            "10% as a random token, 10% unchanged)") in done.stdout
    assert "['Sir Walter' 73x]" in done.stdout
    assert (tmp_path / "pretrain" / "curves.png").read_bytes()[:4] == b"\x89PNG"
    # The packaged corpus directory's README is not trained on, and the output says so.
    assert "1 README/LICENSE-like skipped" in done.stdout
    workdir = tmp_path / "pretrain"
    with open(workdir / "metrics.jsonl") as f:
        records = [json.loads(line) for line in f]
    assert [r["step"] for r in records if r["split"] == "train"] == [4, 8, 12]
    # masked-LM only: no sentence-pair metrics (they would be zeros) in the logs
    assert records and not any(k.startswith("nsp_") for r in records for k in r)
    params, config, tokenizer, extra = store.load_model(str(workdir))
    assert tokenizer is not None and tokenizer.vocab_size == config.vocab_size == 600
    assert extra["experiment"]["data"]["source"] == "tfrecord"
    assert sorted(os.listdir(workdir / "checkpoints")) == ["12", "6"]
    if importlib.util.find_spec("transformers") is None:
        return
    # `python -m bench quality demo`: transformers trained on the same batches, and the run's
    # checkpoint scored on the held-out batches the report used.
    from bench import demo_peer

    record = demo_peer.main([str(workdir), "--steps", "2", "--out", str(tmp_path / "q")])
    printed = re.search(r"\[MASK\] positions alone: ([0-9.]+)", done.stdout).group(1)
    assert f"{record['bert_jax']['mask_accuracy']:.3f}" == printed
    assert record["steps"] == 2 and record["bert_jax_steps"] == 12
    for side in ("bert_jax", "transformers"):
        assert record[side]["mask_tokens"] > 0 and 0 < record[side]["loss"] < 10
