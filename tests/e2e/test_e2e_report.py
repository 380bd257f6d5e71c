"""The end-to-end recipe's pieces that run without a GPU: GLUE dev holdout files, the e2e
experiment configs, and the report (collect -> tables + PNGs) on fake run outputs."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

from bench import e2e_report as report_mod

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _load(relative: str, name: str):
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, relative))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


glue_data = _load("scripts/e2e_glue_data.py", "e2e_glue_data")

SCORES = {  # (task, init) -> final main metric per seed 0, 1 (fractions, as metrics.json)
    ("sst2", "pretrained"): (0.85, 0.87), ("sst2", "random"): (0.78, 0.80),
    ("cola", "pretrained"): (0.20, 0.22), ("cola", "random"): (0.02, 0.00),
    ("mrpc", "pretrained"): (0.76, 0.78), ("mrpc", "random"): (0.74, 0.74),
    ("stsb", "pretrained"): (0.70, 0.72), ("stsb", "random"): (0.10, 0.14),
    ("rte", "pretrained"): (0.55, 0.57), ("rte", "random"): (0.53, 0.51),
}


def _fake_finetune_dir(root: str) -> None:
    for (task, init), values in SCORES.items():
        key = report_mod.TASK_METRICS[task][0]
        for seed, value in enumerate(values):
            run = os.path.join(root, init, task, f"seed{seed}")
            os.makedirs(run)
            epochs = [{"epoch": e, "train_loss": 1.0 / e, "dev": {key: value - 0.01 * (3 - e)}}
                      for e in (1, 2, 3)]
            with open(os.path.join(run, "metrics.json"), "w") as f:
                json.dump({"task": task, "epochs": epochs, "final": epochs[-1],
                           "best": {"epoch": 3}, "seed": seed, "report": ["x"]}, f)
            with open(os.path.join(run, "config.json"), "w") as f:
                json.dump({"format": "bert_jax", "config": {"hidden_size": 128},
                           "finetune": {"learning_rate": 5e-5, "epochs": 3, "seed": seed,
                                        "init_checkpoint": ""}}, f)
    os.makedirs(os.path.join(root, "random", "rte", "seed2"))  # a run that never finished


def _fake_pretrain_metrics(path: str) -> None:
    with open(path, "w") as f:
        for step in (10, 20, 30):
            f.write(json.dumps({"step": step, "split": "train", "loss": 9.0 - step / 10,
                                "mlm_accuracy": step / 100, "nsp_accuracy": 0.5 + step / 100,
                                "seq_per_sec": 1000.0}) + "\n")
        f.write(json.dumps({"step": 30, "split": "eval", "loss": 6.5, "mlm_accuracy": 0.25,
                            "nsp_accuracy": 0.7}) + "\n")


def test_collect_and_report(tmp_path):
    results, docs = tmp_path / "results", tmp_path / "docs"
    results.mkdir()
    docs.mkdir()
    _fake_finetune_dir(str(tmp_path / "ft"))
    _fake_pretrain_metrics(str(results / "pretrain_metrics.jsonl"))
    assert report_mod.main(["collect", str(tmp_path / "ft"), "--output",
                            str(results / "finetune_results.json")]) == 0
    collected = json.loads((results / "finetune_results.json").read_text())
    assert len(collected["runs"]) == 20
    assert collected["missing"] == [{"init": "random", "task": "rte", "seed": 2}]
    assert collected["runs"][0]["finetune_config"]["learning_rate"] == 5e-5
    assert "report" not in collected["runs"][0]
    (results / "time_gpu-pretrain.json").write_text(
        json.dumps({"stage": "gpu-pretrain", "scale": "gpu", "seconds": 300}))
    (docs / "results.md").write_text("# Results\n\nintro\n\n<!-- e2e:begin -->\nold\n"
                                     "<!-- e2e:end -->\n\noutro\n")

    assert report_mod.main(["report", str(results), "--docs", str(docs)]) == 0
    text = (docs / "results.md").read_text()
    assert "old" not in text and text.startswith("# Results\n\nintro") and "outro" in text
    assert "| SST-2 acc | 86.0 ± 1.4 | 79.0 ± 1.4 | +7.0 |" in text
    assert "| CoLA MCC | 21.0 ± 1.4 | 1.0 ± 1.4 | +20.0 |" in text
    # average over the five tasks per seed: pretrained (61.2, 63.2), random (43.4, 43.8)
    assert "| **average** | **62.2 ± 1.4** | **43.6 ± 0.3** | **+18.6** |" in text
    assert "learning rate 5e-05 for both inits" in text
    assert "random rte seed 2" in text
    assert "gpu-pretrain 5.0 min" in text
    assert "| 30 | 6.000 | 0.300 | 0.800 | 0.250 | 0.700 |" in text
    for name in ("e2e_pretraining.png", "e2e_finetuning.png"):
        data = (docs / name).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) < 200_000
    # Idempotent: a second report replaces the section instead of appending another.
    report_mod.main(["report", str(results), "--docs", str(docs)])
    assert (docs / "results.md").read_text().count("<!-- e2e:begin -->") == 1


def test_glue_holdout_files_keep_the_original_format(tmp_path):
    glue, out = tmp_path / "glue", tmp_path / "out"
    (glue / "CoLA").mkdir(parents=True)
    (glue / "RTE").mkdir()
    cola = [f"src{i}\t{i % 2}\t\tSentence number {i} \x0c here." for i in range(40)]
    (glue / "CoLA" / "train.tsv").write_text("\n".join(cola) + "\n")
    rte = ["index\tsentence1\tsentence2\tlabel"] + [
        f"{i}\tA \"quoted {i}.\tB {i}.\t{'entailment' if i % 3 else 'not_entailment'}"
        for i in range(30)]
    (glue / "RTE" / "train.tsv").write_text("\n".join(rte) + "\n")
    assert glue_data.main(["--glue", str(glue), "--output", str(out), "--tasks", "cola",
                           "rte"]) == 0
    for folder, source, header in (("CoLA", cola, []), ("RTE", rte[1:], rte[:1])):
        train = (out / folder / "train.tsv").read_text().split("\n")[:-1]
        dev = (out / folder / "dev.tsv").read_text().split("\n")[:-1]
        assert train[:len(header)] == header and dev[:len(header)] == header
        train, dev = train[len(header):], dev[len(header):]
        assert len(dev) == round(0.1 * len(source)) and not set(train) & set(dev)
        assert sorted(train + dev) == sorted(source)
    # Same seed, same split.
    first = (out / "RTE" / "dev.tsv").read_text()
    glue_data.main(["--glue", str(glue), "--output", str(tmp_path / "again"), "--tasks", "rte"])
    assert (tmp_path / "again" / "RTE" / "dev.tsv").read_text() == first


def test_e2e_configs_share_one_model():
    from bert_jax.runs.config import load_config as load_run_config
    from bert_jax.runs.config import model_config as run_model_config
    from bert_jax.training.config import base_config, load_config, model_config

    path = os.path.join(REPO, "experiments", "e2e.py")
    for scale in ("", "_check"):
        ft = {task: load_run_config(f"{path}:finetune_{task}{scale}") for task in
              ("sst2", "cola", "mrpc", "stsb", "rte")}
        models = {run_model_config(c).replace(dtype="float32") for c in ft.values()}
        assert len(models) == 1
        if "repeat" not in base_config().data:
            pytest.skip("the trainer has no data.repeat yet")
        pre = load_config(f"{path}:pretrain{scale}")
        assert model_config(pre).replace(dtype="float32") in models
        assert pre.data.source == "materialized" and pre.data.repeat
    with pytest.raises(Exception, match="unknown e2e variant"):
        load_config(f"{path}:nope")
