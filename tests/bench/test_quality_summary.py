"""``bench quality finetune``'s summary: per-seed rows and per-task means over seeds."""



from bench import quality_finetune as quality


def _record(name, seed, ours, peer):
    def side(value):
        return {"metrics": {"dev": {m: value for m in quality.TASKS[name][6]}},
                "train_seconds": 2.0, "epochs": []}
    return {"name": name, "seed": seed, "bert_jax": side(ours), "transformers": side(peer)}


def test_seed_rows_and_means():
    records = [_record("squad_v1", 0, 30.0, 40.0), _record("squad_v1", 1, 38.0, 41.0),
               _record("rte", 0, 0.6, 0.5)]
    table = quality.markdown(records, "cpu")
    assert "| squad_v1 (seed 1) | exact_match | 38.00 | 41.00 | -3.00 |" in table
    assert "| squad_v1 (mean of 2 / 2 seeds) | exact_match | 34.00 | 40.50 | -6.50 |" in table
    assert "rte (mean" not in table  # one seed: no mean row
    assert "| rte | accuracy | 60.00 | 50.00 | +10.00 |" in table
