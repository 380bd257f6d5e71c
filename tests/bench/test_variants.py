"""``python -m bench variants``: the equal-FLOPs steps, the CoNLL entity lexicon, the job order
and the claims table, without a model."""

from __future__ import annotations

import json
import os

import pytest

from bench import variants


def test_steps_spend_bert_flops():
    steps, flops = variants.SETTINGS["steps"], variants.SETTINGS["train_flops"]
    bert = flops("bert") * steps("bert")
    for name in variants.VARIANTS:
        assert abs(flops(name) * steps(name) / bert - 1) < 1e-3, name
    # ELECTRA pays for its generator, DistilBERT's half-depth student outweighs the
    # teacher's forward pass: fewer and more steps than BERT.
    assert steps("electra") < steps("bert") < steps("distilbert")
    assert steps("roberta") == steps("ernie") == steps("bert")


def test_conll_lexicon_takes_entities_across_lines(tmp_path):
    path = tmp_path / "train.txt"
    path.write_text("-DOCSTART- -X- -X- O\n\n"
                    "EU NNP B-NP B-ORG\nrejects VBZ B-VP O\nGerman JJ B-NP B-MISC\n"
                    "call NN I-NP O\n\n"
                    "Peter NNP B-NP B-PER\nBlackburn NNP I-NP I-PER\n\n"
                    "New NNP B-NP B-LOC\nYork NNP I-NP I-LOC\nEU NNP B-NP B-ORG\n")
    assert variants.conll_lexicon(str(path)) == ["EU", "German", "Peter Blackburn", "New York"]


def test_claim_cells_run_first_and_every_cell_once():
    jobs = variants.jobs()
    assert len(jobs) == len(set(jobs)) == (len(variants.VARIANTS) * len(variants.TASKS)
                                           + len(variants.ABLATIONS) * len(variants.GLUE)) * 3
    assert {v for v, _, _ in jobs[-len(variants.ABLATIONS) * 15:]} == set(variants.ABLATIONS)
    claim = {(v, t) for v, t in variants.CLAIM_CELLS}
    first_other = next(i for i, (v, t, _) in enumerate(jobs) if (v, t) not in claim)
    assert all((v, t) in claim for v, t, _ in jobs[:first_other])
    assert first_other == len(claim) * 3


def _record(name, glue, squad, conll):
    tasks = {t: {str(s): {variants.GLUE_METRIC[t]: (glue + s) / 100} for s in range(3)}
             for t in variants.GLUE}
    tasks["squad"] = {str(s): {"f1": squad + s, "exact_match": 0.0} for s in range(3)}
    tasks["conll"] = {str(s): {"f1": conll + s} for s in range(3)}
    return {"variant": name, "steps": 3000, "flops_per_seq": 1.56e10, "tasks": tasks}


def test_claims_and_report(tmp_path):
    records = [_record("bert", 60, 30, 70), _record("electra", 64, 30, 70),
               _record("roberta", 59, 30, 70), _record("spanbert", 60, 35, 70),
               _record("ernie", 60, 30, 69), _record("ernie_lexicon", 60, 30, 72),
               _record("albert", 55, 30, 70), _record("distilbert", 57.5, 25, 65)]
    by = {r["variant"]: r for r in records}
    assert variants.mean_std(variants.task_scores(by["electra"], "glue")) == \
        pytest.approx((65.0, 1.0))
    verdicts = [v.split(" (")[0] for *_, v in variants.claims(by)]
    assert verdicts == ["held", "did not hold", "held", "held", "did not hold", "not measured",
                        "held"]
    albert = variants.claims(by, {"albert": 4_300_000, "bert": 23_200_000})[5][3]
    assert albert == "-5.0 points with 4.3 M encoder parameters against 23.2 M"
    by["bert_fresh_pooler"] = dict(_record("bert_fresh_pooler", 59, 30, 70), pretrained="bert",
                                   overrides=["--config.reinitialize=bert/pooler"])
    records.append(by["bert_fresh_pooler"])
    assert "95.9% of BERT" in variants.claims(by)[-1][3]
    env = {"environment": {"device": "test", "params": {"bert": 22_000_000},
                           "speed": {"bert": {"layers": 6, "inference_seq_per_s": 100,
                                              "finetune_seq_per_s": 50},
                                     "distilbert": {"layers": 3, "inference_seq_per_s": 190,
                                                    "finetune_seq_per_s": 95}}}}
    path = tmp_path / "records.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [env, *records]) + "\n")
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "variants.md").write_text("intro\n<!-- variants:begin -->\nSTALE\n"
                                      "<!-- variants:end -->\nafter\n")
    assert variants.main(["report", str(path), "--docs", str(docs)]) == 0
    text = (docs / "variants.md").read_text()
    assert "STALE" not in text and text.startswith("intro") and text.endswith("after\n")
    assert "| electra | 3,000 | – | 65.0 ± 1.0 |" in text
    assert "| bert_fresh_pooler | `--config.reinitialize=bert/pooler` | STS-B corr | 60.0 ± 1.0 " \
        "| 61.0 ± 1.0 (bert) |" in text
    assert "| bert_fresh_pooler | 3,000 | 15.6" not in text  # no pretraining row of its own
    assert "190 (1.90x)" in text
    assert (docs / "variants.png").stat().st_size > 0


def test_workers_take_each_members_jobs_once_it_is_pretrained(tmp_path):
    work = str(tmp_path)
    pretrain = tmp_path / "pretrain"
    (pretrain / "bert").mkdir(parents=True)
    assert variants.next_job(work, check=False) is None  # nothing pretrained yet: wait
    (pretrain / "bert" / "done.json").write_text("{}")
    bert_jobs = [j for j in variants.jobs() if variants.pretrained_member(j[0]) == "bert"]
    taken = [variants.next_job(work, check=False) for _ in bert_jobs]
    assert taken == bert_jobs  # in the claims' order, each claimed once
    assert variants.next_job(work, check=False) is None  # the others may still come
    # a finished run is not taken again, even without its claim
    done = variants.finetune_dir(work, *bert_jobs[0])
    (tmp_path / "finetune" / (os.path.basename(done) + ".claim")).unlink()
    os.makedirs(done)
    with open(os.path.join(done, "metrics.json"), "w") as f:
        f.write("{}")
    assert variants.next_job(work, check=False) is None
    (pretrain / variants.FINISHED).write_text("{}")  # no member pretrains any more
    assert variants.next_job(work, check=False) is False


def test_cells_limit_the_members_and_jobs_and_merge_joins_runs(tmp_path):
    cells = variants.parse_cells("electra:glue,distilbert:rte")
    assert len(cells) == 6 and ("electra", "cola") in cells
    assert variants.members(cells) == ["bert", "electra", "distilbert"]  # with the teacher
    assert {(v, t) for v, t, _ in variants.jobs(cells=cells)} == set(cells)
    with pytest.raises(SystemExit, match="'bert:mnli' is not VARIANT:TASK"):
        variants.parse_cells("bert:mnli")
    # an ablation row fine-tunes its member's pretraining: only that member is pretrained
    ablation = variants.parse_cells("bert_fresh_pooler:stsb")
    assert variants.members(ablation) == ["bert"]
    (tmp_path / "work" / "pretrain" / "bert").mkdir(parents=True)
    (tmp_path / "work" / "pretrain" / "bert" / "done.json").write_text('{"seconds": 3}')
    (tmp_path / "work" / variants.CELLS).write_text(json.dumps(ablation))
    assert variants.next_job(str(tmp_path / "work"), check=False) == \
        ("bert_fresh_pooler", "stsb", 0)
    run = variants.finetune_dir(str(tmp_path / "work"), "bert_fresh_pooler", "stsb", 0)
    os.makedirs(run)
    with open(os.path.join(run, "metrics.json"), "w") as f:
        json.dump({"final": {"dev": {"corr": 0.5}}}, f)
    rows = {r["variant"]: r for r in variants.collect(str(tmp_path / "work"), "")}
    assert rows["bert_fresh_pooler"]["pretrained"] == "bert"
    assert rows["bert_fresh_pooler"]["overrides"] == ["--config.reinitialize=bert/pooler"]
    assert rows["bert_fresh_pooler"]["tasks"] == {"stsb": {0: {"corr": 0.5,
                                                               "train_seq_per_s": None}}}
    assert "pretrain_seconds" not in rows["bert_fresh_pooler"]
    assert rows["bert"]["pretrain_seconds"] == 3 and "electra" in rows
    first = [{"environment": {"date": "a", "pretrained": False}},
             {"variant": "bert", "steps": 1, "flops_per_seq": 1, "last": {"loss": 9.0},
              "tasks": {"rte": {"0": 1}}},
             {"variant": "electra", "steps": 2, "flops_per_seq": 1, "pretrain_seconds": 5,
              "tasks": {}}]
    def speed(rate):
        return {"bert": {"layers": 6, "inference_seq_per_s": rate}}

    first[0]["environment"]["speed"] = speed(1)
    second = [{"environment": {"date": "b", "cells": ["bert:squad"],
                               "speed_runs": [speed(3), speed(10)]}},
              {"variant": "bert", "steps": 1, "flops_per_seq": 1, "pretrain_seconds": 7,
               "last": {"loss": 2.0},
               "tasks": {"squad": {"0": 2}}}]
    paths = []
    for i, lines in enumerate((first, second)):
        paths.append(str(tmp_path / f"{i}.jsonl"))
        with open(paths[-1], "w") as f:
            f.write("\n".join(json.dumps(x) for x in lines))
    out = str(tmp_path / "merged.jsonl")
    assert variants.main(["merge", *paths, "--out", out]) == 0
    env, *recs = [json.loads(line) for line in open(out)]
    by = {r["variant"]: r for r in recs}
    assert by["bert"]["tasks"] == {"rte": {"0": 1}, "squad": {"0": 2}}
    assert by["bert"]["last"] == {"loss": 2.0}  # the run in which it finished pretraining
    assert env["environment"]["speed"] == speed(3)  # the median of the runs' timings
    assert env["environment"]["speed_runs"] == [speed(1), speed(3), speed(10)]
    assert [r["date"] for r in env["environment"]["runs"]] == ["a", "b"]
