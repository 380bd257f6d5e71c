"""The TPU sweep's rows and tables (no compiles here; tests/tpu/test_compile.py compiles)."""

import json

from bert_jax.tpu import sweep
from bert_jax.tpu.compile import Estimate
from bert_jax.tpu.topologies import GIB, parse_slice
from bert_jax.training.config import load_config


def test_rows_are_valid_commands(capsys):
    assert sweep.main(["--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(sweep.ROWS) and all(x.startswith("bert-jax compile") for x in lines)
    for row in sweep.ROWS:  # every slice name parses and every config loads with its overrides
        parse_slice(row.topology, row.num_slices)
        load_config(f"experiments/pretrain.py:{row.variant}", row.overrides)
    kinds = {(r.variant, r.topology.split("-")[0]) for r in sweep.ROWS}
    assert {"v4", "v5e", "v5p"} <= {k for _, k in kinds}
    assert any(r.num_slices == 2 for r in sweep.ROWS)
    for row in sweep.LAMB_ROWS:  # the large-batch set: its recipes find their accumulation
        parse_slice(row.topology, row.num_slices)
        assert load_config(f"experiments/pretrain.py:{row.variant}",
                           row.overrides).microbatches == 0


def _record(**changes):
    e = Estimate(slice="v5e-256", topology="v5e:16x16", chips=256, num_slices=1, chip="v5e",
                 mesh={"data": 1, "fsdp": 256, "tensor": 1}, global_batch_size=20480,
                 batch_per_chip=80.0, seq_len=128, num_train_steps=900_000,
                 params_bytes=5 * 2 ** 20, optimizer_bytes=10 * 2 ** 20,
                 argument_bytes=16 * 2 ** 20, output_bytes=0, temp_bytes=8 * GIB,
                 code_bytes=2 ** 20, hbm_bytes=16 * GIB, compiled_flops=2e13,
                 hbm_bytes_accessed=1e11, model_flops_per_sequence=2.4e11,
                 compile_seconds=1.0)
    return {"label": "Large/128 FSDP", "topology": "v5e-256", "num_slices": 1,
            "compiled": True, **e.to_dict(), **changes}


def test_table_recomputes_from_raw_fields(tmp_path, capsys):
    path = tmp_path / "sweep.jsonl"
    failed = {"label": "Large/128 DP", "topology": "v5e-256", "num_slices": 1,
              "compiled": False, "fits": False, "error": "RESOURCE_EXHAUSTED: out of HBM"}
    path.write_text(json.dumps(_record(mfu=9.9)) + "\n" + json.dumps(failed) + "\n")
    assert sweep.main(["--table", str(path)]) == 0
    table = capsys.readouterr().out
    fsdp, dp = table.splitlines()[2:]
    # 80 sequences in 8 GiB of temporaries (102 MiB each beyond the 22 MiB of state, code and
    # gradients): 160 fit 16 GiB; the stale mfu of the record is recomputed
    assert "| v5e-256 | fsdp256 | 80 |" in fsdp and "| yes | 160 |" in fsdp
    assert "990%" not in fsdp
    assert "| no |" in dp and "RESOURCE_EXHAUSTED" in dp


def test_an_interrupted_sweep_keeps_its_rows(tmp_path, monkeypatch, capsys):
    """Rows already in OUT/sweep.jsonl are not compiled again; the table keeps row order."""
    rows = sweep.ROWS[:3]
    compiled = []

    def fake_run_row(row):
        compiled.append(row.command())
        return _record(label=row.label, command=row.command(), seconds=1.0)

    monkeypatch.setitem(sweep.SETS, "paper", rows)
    monkeypatch.setattr(sweep, "run_row", fake_run_row)
    (tmp_path / "sweep.jsonl").write_text(json.dumps(
        _record(label="first", command=rows[1].command(), seconds=1.0)) + "\n")
    assert sweep.main(["--out", str(tmp_path)]) == 0
    assert compiled == [rows[0].command(), rows[2].command()]
    lines = (tmp_path / "sweep.jsonl").read_text().splitlines()
    assert len(lines) == 3
    table = (tmp_path / "sweep.md").read_text()
    assert table.index(rows[0].label) < table.index("first")
