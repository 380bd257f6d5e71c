"""``python -m bench quality squad``: the held-out split by article and the seeds summary."""

from __future__ import annotations

import json

import pytest

from bench import quality_squad
from bert_jax.errors import BertJaxError
from bert_jax.tasks.splits import holdout_groups


def _squad(n_articles: int) -> dict:
    return {"version": "1.1", "data": [
        {"title": f"A{a}", "paragraphs": [
            {"context": f"article {a} paragraph {p}",
             "qas": [{"id": f"{a}-{p}-{q}", "question": "which?",
                      "answers": [{"text": "article", "answer_start": 0}]} for q in range(2)]}
            for p in range(3)]} for a in range(n_articles)]}


def test_split_files_whole_articles_deterministic(tmp_path):
    data = _squad(24)
    path = tmp_path / "sample.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    outs = []
    for name in ("one", "two"):
        assert quality_squad.main(["split", "--input", str(path), "--dev-articles", "6",
                                   "--out", str(tmp_path / name)]) == 0
        outs.append([json.loads((tmp_path / name / f).read_text(encoding="utf-8"))
                     for f in quality_squad.FILES])
    assert outs[0] == outs[1]  # same seed, same files
    train, dev = outs[0]
    titles = [a["title"] for a in train["data"]], [a["title"] for a in dev["data"]]
    assert len(titles[0]) == 18 and len(titles[1]) == 6
    assert sorted(titles[0] + titles[1], key=lambda t: int(t[1:])) == \
        [a["title"] for a in data["data"]]  # disjoint, complete, in the original order
    by_title = {a["title"]: a for a in data["data"]}
    assert all(a == by_title[a["title"]] for a in train["data"] + dev["data"])  # verbatim
    # the articles that the run-time holdout (holdout_fraction=0.25, same seed) would pick
    _, dev_idx = holdout_groups(range(24), 0.25, 1234)
    assert titles[1] == [f"A{i}" for i in dev_idx]
    other = quality_squad.split_articles(data, 6, seed=7)[1]
    assert [a["title"] for a in other["data"]] != titles[1]


def test_split_refuses_bad_counts():
    with pytest.raises(BertJaxError, match="expected 1..23 of 24"):
        quality_squad.split_articles(_squad(24), 24, 0)
    with pytest.raises(BertJaxError, match="SQuAD layout"):
        quality_squad.split_articles({"data": "x"}, 1, 0)


def test_summary_mean_and_sample_std():
    records = [{"variant": "default", "seed": s, "learning_rate": 3e-5,
                "bert_jax": {"exact_match": em, "f1": f1},
                "transformers": {"exact_match": em + 1, "f1": f1 + 2}}
               for s, (em, f1) in enumerate([(10.0, 20.0), (20.0, 30.0), (30.0, 40.0)])]
    records.append({"variant": "google", "seed": 0, "learning_rate": 3e-5,
                    "bert_jax": {"exact_match": 5.0, "f1": 6.0}})
    records.append({"variant": "default", "seed": 0, "learning_rate": 1e-4,
                    "bert_jax": {"exact_match": 40.0, "f1": 50.0},
                    quality_squad.HEAD_SHARED: {"exact_match": 41.0, "f1": 52.0}})
    table = quality_squad.summary(records)
    assert "| 3e-05 | bert_jax | 3 | 20.00 ± 10.00 | 30.00 ± 10.00 | 20.0, 30.0, 40.0 |" in table
    assert "| 3e-05 | transformers | 3 | 21.00 ± 10.00 | 32.00 ± 10.00 |" in table
    assert "| 3e-05 | bert_jax google | 1 | 5.00 ± 0.00 | 6.00 ± 0.00 | 6.0 |" in table
    assert "| 0.0001 | transformers from bert-jax's head | 1 | 41.00 ± 0.00 | 52.00 ± 0.00 |" \
        in table


def test_cli_command_is_the_documented_recipe():
    cmd = quality_squad.cli_command("W", "D", "C", 3, 5e-5, ("--config.epochs=3",))
    assert cmd[1:5] == ["-m", "bert_jax", "finetune", "--config"]
    assert cmd[5].endswith("experiments/squad.py:v1")
    assert cmd[6:] == ["--workdir", "W", "--config.data_dir=D", "--config.init_checkpoint=C",
                       "--config.seed=3", "--config.optimizer.learning_rate=5e-05",
                       "--config.progress_bar=False", "--config.epochs=3"]
