"""The pod path, through the CLI, against a Cloud Storage server (fake-gcs-server).

Tokenizer, pretraining data (pairs and documents), pretraining with a SIGKILL and a resume,
a damaged newest step, a second run refused, fine-tuning, evaluation, predictions, export and
embeddings all live in a bucket; the working directory gains nothing, and no local folder
named ``gs:`` ever appears.
"""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from xla_env import cpu_flags

from bert_jax import storage

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("bucket_cli")]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXPERIMENTS = os.path.join(REPO, "experiments")
DEMO = os.path.join(REPO, "bert_jax", "demo_data", "austen-persuasion.txt")

SMALL = ["--config.model.hidden_size=32", "--config.model.num_attention_heads=4",
         "--config.model.intermediate_size=64", "--config.model.num_hidden_layers=1",
         "--config.global_batch_size=16", "--config.progress_bar=false",
         "--config.data.max_seq_length=32", "--config.data.max_predictions_per_seq=5",
         "--config.log_every=1", "--config.checkpoint.every_steps=4", "--config.eval_steps=0",
         "--config.optimizer.warmup_steps=2", "--config.optimizer.decay_steps=1000"]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    from gcs_server import server

    gcs = server()
    cwd = tmp_path_factory.mktemp("cwd")
    environment = dict(os.environ, STORAGE_EMULATOR_HOST=gcs.url, XLA_FLAGS=cpu_flags(2),
                       PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    # The CLI derives tensorstore's settings from STORAGE_EMULATOR_HOST itself.
    for key in ("TENSORSTORE_GCS_HTTP_URL", "GOOGLE_AUTH_TOKEN_FOR_TESTING"):
        environment.pop(key, None)
    return {"gcs": gcs, "env": environment, "cwd": str(cwd),
            "bucket": f"gs://{gcs.create_bucket()}"}


def cli(env, *args, check=True, timeout=600):
    done = subprocess.run([sys.executable, "-m", "bert_jax", *args], env=env["env"],
                          cwd=env["cwd"], capture_output=True, text=True, timeout=timeout)
    if check:
        assert done.returncode == 0, done.stdout + done.stderr
    return done


def pretrain_command(env, data, workdir, steps):
    return [sys.executable, "-m", "bert_jax", "pretrain", "--config",
            f"{EXPERIMENTS}/pretrain.py:tiny", "--workdir", workdir,
            f"--config.data.directory={data}/pairs", f"--config.data.tokenizer={data}/tok",
            *SMALL, f"--config.num_train_steps={steps}"]


def steps_in(workdir):
    root = f"{workdir}/checkpoints"
    return sorted(int(d) for d in storage.listdir(root) if d.isdigit()) \
        if storage.isdir(root) else []


def losses(workdir):
    records = [json.loads(line) for line in storage.read_text(f"{workdir}/metrics.jsonl")
               .splitlines() if line.strip()]
    return {r["step"]: r["loss"] for r in records if r["split"] == "train"}


@pytest.fixture(scope="module")
def data(env):
    """Corpus, tokenizer and pretraining data (pairs and documents) in the bucket."""
    bucket = env["bucket"]
    lines = open(DEMO, encoding="utf-8").read().splitlines()
    for i in range(2):
        storage.put_bytes(f"{bucket}/corpus/part{i}.txt",
                          "\n".join(lines[i * 1200:(i + 1) * 1200]).encode())
    cli(env, "train-tokenizer", "--input", f"{bucket}/corpus", "--output", f"{bucket}/tok",
        "--vocab-size", "300")
    for name, extra in (("pairs", []), ("docs", ["--format", "documents"])):
        cli(env, "create-pretraining-data", "--input", f"{bucket}/corpus", "--tokenizer",
            f"{bucket}/tok", "--output-dir", f"{bucket}/{name}", "--max-seq-length", "32",
            "--num-shards", "2", "--holdout-fraction", "0.05", "--no-progress", *extra)
    return bucket


def test_tokenizer_and_data_live_in_the_bucket(env, data):
    assert {"tokenizer.json", "spm.model"} <= set(storage.listdir(f"{data}/tok"))
    for name in ("pairs", "docs"):
        files = storage.listdir(f"{data}/{name}")
        assert "metadata.json" in files and any(f.endswith(".tfrecord") for f in files)
    assert os.listdir(env["cwd"]) == []


def test_pipeline_reads_shards_and_documents_from_the_bucket(env, data):
    from bert_jax.data.documents import load_document_table
    from bert_jax.data.metadata import load_metadata
    from bert_jax.data.pipeline import make_pretraining_dataset

    os.environ["STORAGE_EMULATOR_HOST"] = env["gcs"].url
    meta = load_metadata(f"{data}/pairs")
    ds = make_pretraining_dataset(f"{data}/pairs", per_host_batch_size=4, seq_len=32,
                                  max_predictions_per_seq=5, vocab_size=meta.vocab_size,
                                  special_ids=[0, 1, 2, 3, 4], mask_id=4, seed=0)
    batch = next(iter(ds))
    assert np.asarray(batch["input_ids"]).shape == (4, 32)
    docs = load_metadata(f"{data}/docs")
    table = load_document_table(docs.train_files, docs.vocab_size)
    assert table.tokens.size > 1000


def test_pretrain_killed_and_resumed_in_the_bucket_equals_uninterrupted(env, data):
    run, full = f"{data}/run", f"{data}/full"
    proc = subprocess.Popen(pretrain_command(env, data, run, 1000), env=env["env"],
                            cwd=env["cwd"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    deadline = time.time() + 300
    while not any(s >= 8 for s in steps_in(run)):
        assert proc.poll() is None, proc.stdout.read()
        assert time.time() < deadline, "no checkpoint appeared in the bucket"
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    end = steps_in(run)[-1] + 4
    resumed = subprocess.run(pretrain_command(env, data, run, end), env=env["env"],
                             cwd=env["cwd"], capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "taking over the stale lock" in resumed.stderr + resumed.stdout
    assert f"resumed from {run}/checkpoints/" in resumed.stdout + resumed.stderr
    subprocess.run(pretrain_command(env, data, full, end), env=env["env"], cwd=env["cwd"],
                   check=True, capture_output=True, timeout=600)
    want, got = losses(full), losses(run)
    assert sorted(got) == list(range(1, end + 1))
    assert [got[s] for s in sorted(got)] == [want[s] for s in sorted(got)]  # bit-identical
    from bert_jax.checkpoint import store

    a = store.load_params(f"{run}/checkpoints/{end}/params")
    b = store.load_params(f"{full}/checkpoints/{end}/params")
    for x, y in zip(_leaves(a), _leaves(b), strict=True):
        np.testing.assert_array_equal(x, y)
    assert storage.isfile(f"{run}/checkpoints/{end}/sha256.json")
    assert os.listdir(env["cwd"]) == []


def pretrained(env, data):
    """The bucket run of the kill-and-resume test (made here when that test did not run)."""
    run = f"{data}/run"
    if not steps_in(run):
        subprocess.run(pretrain_command(env, data, run, 8), env=env["env"], cwd=env["cwd"],
                       check=True, capture_output=True, timeout=600)
    return run


def _leaves(tree):
    import jax

    return jax.tree_util.tree_leaves(tree)


def test_second_run_refused_and_damaged_step_falls_back(env, data):
    run = pretrained(env, data)
    last = steps_in(run)[-1]
    # A live holder of the lock (this test process, on this host) refuses a second run.
    storage.put_bytes(f"{run}/.lock", json.dumps(
        {"pid": os.getpid(), "host": __import__("socket").gethostname()}).encode())
    refused = subprocess.run(pretrain_command(env, data, run, last + 4), env=env["env"],
                             cwd=env["cwd"], capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2
    assert f"in use by process {os.getpid()}" in refused.stderr
    storage.remove(f"{run}/.lock")
    # Damage an object of the newest step: the run names it and resumes from the one before.
    manifest = json.loads(storage.read_text(f"{run}/checkpoints/{last}/sha256.json"))
    damaged = next(rel for rel in manifest["files"] if "/d/" in rel)
    storage.put_bytes(f"{run}/checkpoints/{last}/{damaged}", b"\0" * 16)
    done = subprocess.run(pretrain_command(env, data, run, last + 4), env=env["env"],
                          cwd=env["cwd"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    warnings = [line for line in (done.stdout + done.stderr).splitlines()
                if "is damaged and skipped" in line]
    assert len(warnings) == 1 and damaged.split("/")[-1] in warnings[0]
    assert storage.isdir(f"{data}/checkpoints.damaged/{last}") is False
    assert storage.isdir(f"{run}/checkpoints.damaged/{last}")


def test_finetune_evaluate_predict_export_embed_from_and_to_the_bucket(env, data):
    bucket = env["bucket"]
    pretrained(env, data)
    rows = ["text,label"] + [f"{'good fine happy' if i % 2 else 'bad sad poor'} day {i},"
                             f"{'pos' if i % 2 else 'neg'}" for i in range(64)]
    storage.put_bytes(f"{bucket}/task/train.csv", "\n".join(rows).encode())
    storage.put_bytes(f"{bucket}/task/test.csv", b"text\ngood fine happy\nbad sad poor\n")
    ft = f"{bucket}/ft"
    cli(env, "finetune", "--config", f"{EXPERIMENTS}/custom.py:classification", "--workdir", ft,
        f"--config.init_checkpoint={bucket}/run", f"--config.train_file={bucket}/task/train.csv",
        f"--config.test_file={bucket}/task/test.csv", "--config.text_column=text",
        "--config.label_column=label", "--config.epochs=1", "--config.max_seq_length=16",
        "--config.log_every=0")
    assert storage.isfile(f"{ft}/metrics.json") and storage.isfile(f"{ft}/config.json")
    evaluated = cli(env, "evaluate", "--workdir", ft)
    assert "accuracy" in evaluated.stdout
    cli(env, "predict", "--workdir", ft, "--output", f"{bucket}/pred")
    assert storage.isfile(f"{bucket}/pred/predictions.test.csv")
    cli(env, "export", f"{bucket}/run", "--output", f"{bucket}/hf")
    assert {"config.json", "model.safetensors"} <= set(storage.listdir(f"{bucket}/hf"))
    cli(env, "embed", f"{bucket}/run", "--text", "Anne was proud.", "--output",
        f"{bucket}/vecs.npy")
    import io

    vectors = np.load(io.BytesIO(storage.read_bytes(f"{bucket}/vecs.npy")))
    assert vectors.shape[0] == 1 and np.isfinite(vectors).all()
    assert os.listdir(env["cwd"]) == []
