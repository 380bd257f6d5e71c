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


def test_lamb_table_shows_collectives_by_kind_and_what_bounds_mfu(tmp_path, capsys):
    """FSDP / multislice rows list all-gather and reduce-scatter volume, async or not, with
    ICI and DCN time; the bound column's factors multiply to 1 / MFU."""
    collectives = [
        {"kind": "all-gather", "group": 256, "payload_bytes": 2e9, "asynchronous": True,
         "count": 48, "link_bytes": 2e9 * 255 / 256},
        {"kind": "reduce-scatter", "group": 256, "payload_bytes": 1e9, "asynchronous": False,
         "count": 24, "link_bytes": 1e9 * 255 / 256},
        {"kind": "all-reduce", "group": 2, "payload_bytes": 4e8, "asynchronous": False,
         "count": 1, "link_bytes": 4e8},
    ]
    record = _record(num_slices=2, chips=512, chips_per_slice=256, microbatches=4,
                     global_batch_size=80 * 512,
                     collectives=collectives, command="x")
    path = tmp_path / "sweep.jsonl"
    path.write_text(json.dumps(record) + "\n")
    assert sweep.main(["--set", "lamb", "--table", str(path)]) == 0
    row = capsys.readouterr().out.splitlines()[2]
    assert "| v5e-256 x2 | fsdp256 | 20 x 4 |" in row
    assert "all-gather 1.99 async; all-reduce 0.40 sync; reduce-scatter 1.00 sync" in row
    # ICI at 200 GB/s: (1.99 + 1.00) GB = 14.9 ms, 5.0 synchronous; DCN at 6.25 GB/s: 64 ms
    assert "| 14.9 (5.0), 64.0 (64.0) |" in row
    # 2e13 FLOPs at 197 TFLOP/s = 102 ms of compute; 1e11 bytes at 819 GB/s = 122 ms
    f = sweep.mfu_factors(record)
    assert abs(f["hbm"] - (1e11 / 819e9) / (2e13 / 197e12)) < 1e-9
    derived = sweep._derived(record)
    assert abs(f["hbm"] * f["flops"] - 1 / derived["mfu"]) < 1e-9
    assert f"HBM x{f['hbm']:.2f}, FLOPs x{f['flops']:.2f}" in row
