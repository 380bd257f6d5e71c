"""The fine-tuning loop end to end on tiny fixtures: learning, each task kind, evaluate and
predict on the workdir it keeps, frozen encoders."""

from __future__ import annotations

import csv
import json
import os

import numpy as np
import pytest

from bert_jax.checkpoint import store
from bert_jax.cli import main
from bert_jax.finetuning.config import load_config
from bert_jax.finetuning.finetune import finetune
from bert_jax.modeling.params import encoder_layout, flatten_params
from tests.finetuning import helpers as H

FAST = ["--config.max_seq_length=32", "--config.log_every=0", "--config.eval_batch_size=32"]
# Without dropout: its random masks are a large part of each tiny step's compile, and what
# these tests check (task kinds, evaluate / predict, frozen encoders, program reuse) does not
# depend on it; the end-to-end run through the CLI keeps the default dropout.
NO_DROPOUT = ["--config.model.hidden_dropout_prob=0.0",
              "--config.model.attention_probs_dropout_prob=0.0"]


def config(spec, *overrides):
    return load_config(spec, [*FAST, *NO_DROPOUT, *overrides])


def test_learns_toy_task_then_evaluate_and_predict(data, tmp_path, capsys):
    workdir = str(tmp_path / "run")
    rc = main(["finetune", "--config", "experiments/glue.py:sst2", "--workdir", workdir,
               f"--config.init_checkpoint={data['ckpt']}", f"--config.data_dir={data['sst2']}",
               "--config.optimizer.learning_rate=3e-3", "--config.epochs=4", *FAST])
    assert rc == 0
    metrics = json.load(open(os.path.join(workdir, "metrics.json")))
    assert [e["epoch"] for e in metrics["epochs"]] == [1, 2, 3, 4]
    assert metrics["dev_examples"] == {"dev": 80}
    assert metrics["best"]["value"] >= 0.9  # chance is 0.5
    # The workdir is a bert-jax model dir holding the best epoch.
    params, cfg, tok, extra = store.load_model(workdir)
    assert extra["task"] == "sst2" and extra["num_labels"] == 2
    # The short run computed on XLA's ops (kernel_min_sequences) with scanned layers
    # (unroll_min_sequences); the model keeps `auto` and the checkpoint's unrolled layers.
    assert cfg.kernels.dropout_attention_impl == "auto" and cfg.kernels.fused_gelu == "auto"
    assert not cfg.scan_layers and encoder_layout(params["bert"]["encoder"]) == "unrolled"
    assert extra["best"]["epoch"] == metrics["best"]["epoch"]
    # Monitoring: a progress bar over all steps; dev metrics per epoch to TensorBoard + jsonl.
    assert "finetune: 100%" in capsys.readouterr().err
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        dev = [r for r in map(json.loads, f) if r["split"] == "dev"]
    assert len(dev) == 4 and dev[-1]["accuracy"] == metrics["epochs"][-1]["dev"]["accuracy"]
    assert any(n.startswith("events") for n in os.listdir(os.path.join(workdir, "tensorboard")))

    assert main(["evaluate", "--workdir", workdir]) == 0
    evaluated = json.loads(capsys.readouterr().out)
    assert evaluated["dev"]["accuracy"] == pytest.approx(metrics["best"]["value"])

    out = str(tmp_path / "pred")
    assert main(["predict", "--workdir", workdir, "--output", out]) == 0
    rows = open(os.path.join(out, "SST-2.tsv")).read().splitlines()
    assert rows[0] == "index\tprediction" and len(rows) == 21
    texts, labels = H.sentences(20, 3)
    predicted = [r.split("\t")[1] for r in rows[1:]]
    assert np.mean([p == y for p, y in zip(predicted, labels, strict=True)]) >= 0.8


def test_ner_one_epoch_and_predictions(data, tmp_path):
    workdir = str(tmp_path / "run")
    c = config("experiments/ner.py:conll2003", f"--config.init_checkpoint={data['ckpt']}",
               f"--config.data_dir={data['conll']}", "--config.epochs=1",
               "--config.optimizer.learning_rate=1e-3")
    result = finetune(c, workdir)
    assert {"precision", "recall", "f1", "accuracy"} <= set(result["final"]["dev"])
    out = str(tmp_path / "pred")
    assert main(["predict", "--workdir", workdir, "--output", out]) == 0
    sentences = open(os.path.join(out, "predictions.test.txt")).read().strip().split("\n\n")
    assert len(sentences) == 40
    assert all(len(line.split()) == 3 for s in sentences for line in s.splitlines())


def test_squad_holdout_by_article_evaluate_and_predict(data, tmp_path, capsys):
    workdir = str(tmp_path / "run")
    c = config("experiments/squad.py:v1_quick", f"--config.init_checkpoint={data['ckpt']}",
               f"--config.train_file={data['squad']}", "--config.data_dir=",
               "--config.holdout_fraction=0.25", "--config.featurize.doc_stride=8",
               "--config.optimizer.learning_rate=1e-3")
    result = finetune(c, workdir)
    assert result["dev_examples"] == {"dev": 12}  # 3 of 12 articles x 4 questions
    assert {"exact_match", "f1"} == set(result["final"]["dev"])
    capsys.readouterr()
    assert main(["evaluate", "--workdir", workdir]) == 0
    assert json.loads(capsys.readouterr().out)["dev"]["f1"] == pytest.approx(
        result["best"]["value"])
    out = str(tmp_path / "pred")
    assert main(["predict", "--workdir", workdir, "--split", "dev", "--output", out]) == 0
    predictions = json.load(open(os.path.join(out, "predictions.json")))
    assert len(predictions) == 12 and all(isinstance(v, str) for v in predictions.values())


def test_swag_one_epoch_and_predictions(data, tmp_path):
    workdir = str(tmp_path / "run")
    c = config("experiments/swag.py:swag_quick", f"--config.init_checkpoint={data['ckpt']}",
               f"--config.data_dir={data['swag']}", "--config.optimizer.learning_rate=1e-3")
    result = finetune(c, workdir)
    assert set(result["final"]["dev"]) == {"accuracy"}
    out = str(tmp_path / "pred")
    assert main(["predict", "--workdir", workdir, "--output", out]) == 0
    rows = list(csv.reader(open(os.path.join(out, "predictions.test.csv"))))
    assert rows[0] == ["index", "prediction"] and len(rows) == 33
    assert {r[1] for r in rows[1:]} <= {"0", "1", "2", "3"}


def test_freeze_encoder_leaves_encoder_unchanged(data, tmp_path):
    workdir = str(tmp_path / "run")
    c = config("experiments/glue.py:sst2", f"--config.init_checkpoint={data['ckpt']}",
               f"--config.data_dir={data['sst2']}", "--config.freeze_encoder=true",
               "--config.epochs=1", "--config.optimizer.learning_rate=1e-2",
               "--config.max_train_examples=64")
    finetune(c, workdir)
    tuned = flatten_params(store.load_model(workdir)[0])
    original = flatten_params(store.load_model(data["ckpt"])[0])
    encoder = [p for p in tuned if p.startswith("bert/")]
    assert encoder and all(np.array_equal(tuned[p], original[p]) for p in encoder)
    assert np.abs(tuned["classifier/bias"]).max() > 0  # bias starts at zero


def test_regression_from_random_init_and_finetuner_cache(data, tmp_path):
    """STS-B (MSE on one output) from random weights; dev held out from train by row. Runs
    that differ only in seed (or data folder) reuse one Finetuner and give the same results
    as runs that build their own; another schedule length gets its own."""
    from bert_jax.finetuning.trainer import FinetunerCache

    def stsb(*extra, epochs=1):
        return config("experiments/glue.py:stsb", "--config.init_checkpoint=",
                      f"--config.tokenizer={data['vocab_dir']}", "--config.model.preset=tiny",
                      "--config.model.hidden_size=32", "--config.model.intermediate_size=64",
                      "--config.model.max_position_embeddings=64", f"--config.epochs={epochs}",
                      f"--config.data_dir={data['stsb']}", "--config.holdout_fraction=0.25",
                      "--config.global_batch_size=16", "--config.progress_bar=false", *extra)

    programs = FinetunerCache()
    fresh = finetune(stsb("--config.seed=1"), str(tmp_path / "fresh"))
    shared = [finetune(stsb(f"--config.seed={s}"), str(tmp_path / f"s{s}"), programs=programs)
              for s in (0, 1)]
    assert len(programs) == 1 and programs.hits == 1
    assert shared[1]["final"]["dev"] == fresh["final"]["dev"]
    assert shared[1]["final"]["train_loss"] == fresh["final"]["train_loss"]
    assert shared[0]["final"]["train_loss"] != fresh["final"]["train_loss"]  # its own seed

    result = shared[0]
    assert result["dev_examples"] == {"dev": 12} and result["train_examples"] == 36
    assert result["report"][0].startswith("random initialisation")
    assert set(result["final"]["dev"]) == {"pearson", "spearman", "corr"}
    assert np.isfinite(result["final"]["train_loss"])
    out = str(tmp_path / "pred")
    assert main(["predict", "--workdir", str(tmp_path / "s0"), "--split", "dev",
                 "--output", out]) == 0
    rows = open(os.path.join(out, "STS-B.dev.tsv")).read().splitlines()
    assert len(rows) == 13 and all(len(r.split("\t")[1].split(".")[1]) == 3 for r in rows[1:])

    finetune(stsb(epochs=2), str(tmp_path / "longer"), programs=programs)
    assert len(programs) == 2 and programs.hits == 1


def test_compile_ahead_compiles_each_program_once(data, tmp_path):
    """With compile_ahead the train and predict steps of every length bucket compile in
    background threads; each jitted step then holds exactly one program per length: the
    background compilation was the one the run used (so its results are those of compiling
    at the first call), none was compiled twice."""
    from bert_jax.finetuning.trainer import FinetunerCache

    def stsb(*extra):
        return load_config("experiments/glue.py:stsb", [
                      "--config.log_every=0", "--config.eval_batch_size=32",
                      "--config.init_checkpoint=",
                      f"--config.tokenizer={data['vocab_dir']}", "--config.model.preset=tiny",
                      "--config.model.hidden_size=32", "--config.model.intermediate_size=64",
                      "--config.model.max_position_embeddings=64", "--config.epochs=1",
                      f"--config.data_dir={data['stsb']}", "--config.holdout_fraction=0.25",
                      "--config.global_batch_size=16", "--config.progress_bar=false",
                      "--config.max_seq_length=64", "--config.length_bucket_min=16",
                      "--config.length_bucket_min_sequences=0", *NO_DROPOUT, *extra])

    programs = FinetunerCache()
    ahead = finetune(stsb(), str(tmp_path / "ahead"), programs=programs)
    (finetuner,) = programs._finetuners.values()
    train = {length for kind, length in finetuner._compiled_ahead if kind == "train"}
    predict = {length for kind, length in finetuner._compiled_ahead if kind == "predict"}
    assert len(train) >= 2 and predict  # several length buckets
    assert finetuner.train_step._cache_size() == len(train)
    assert finetuner.predict_step._cache_size() == len(predict)
    assert not finetuner._compiling  # every background compilation was waited for
    assert np.isfinite(ahead["final"]["train_loss"])


def test_short_runs_take_xla_ops_and_scanned_layers_unless_the_user_chose():
    from bert_jax.config import BertConfig, KernelOptions
    from bert_jax.finetuning.config import base_config
    from bert_jax.finetuning.trainer import run_model_config

    model = BertConfig(kernels=KernelOptions(fused_gelu="force"))  # set by the user: kept
    c = base_config()
    c.kernel_min_sequences = 3001
    c.unroll_min_sequences = 0
    mask = np.ones((1000, 8), np.int32)
    short = run_model_config(c, model, mask, passes=3)
    options = short.kernels
    assert (options.attention_impl, options.dropout_attention_impl, options.layer_norm_impl,
            options.fused_gelu) == ("xla", "explicit", "two_stage", "force")
    assert short == model.with_xla_kernels().with_kernels(fused_gelu="force")
    c.kernel_min_sequences = 3000  # 1000 rows x 3 passes: long enough
    assert run_model_config(c, model, mask, passes=3) == model
    c.kernel_min_sequences = 0
    assert run_model_config(c, model, mask, passes=3) == model
    assert run_model_config(base_config(), model) == model  # no rows to count

    c.unroll_min_sequences = 3001
    assert run_model_config(c, model, mask, passes=3) == model.replace(scan_layers=True)
    assert run_model_config(c, model, mask, passes=4) == model  # 4000: long enough
    c.model.scan_layers = False  # the user's choice is kept
    assert run_model_config(c, model, mask, passes=3) == model
    c.model.scan_layers = None
    albert = model.replace(share_layers=True)  # one shared layer: nothing to scan
    assert run_model_config(c, albert, mask, passes=3) == albert
