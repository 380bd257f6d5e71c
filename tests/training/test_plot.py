"""`bert-jax plot-metrics`: a run's metrics.jsonl becomes a PNG; bad input is one error line."""

import json

import pytest

from bert_jax.cli import main

pytest.importorskip("matplotlib")


def test_plot_metrics_writes_a_png(tmp_path, capsys):
    rows = [{"step": s, "split": "train", "mlm_loss": 7 - s / 100, "mlm_accuracy": s / 1000}
            for s in (50, 100, 150)]
    rows += [{"step": 100, "split": "eval", "mlm_loss": 6.5, "mlm_accuracy": 0.08}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["plot-metrics", str(tmp_path), "--baseline-accuracy", "0.04"]) == 0
    png = tmp_path / "curves.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert f"wrote {png}" in capsys.readouterr().out
    (tmp_path / "metrics.jsonl").write_text("{not json\n")
    assert main(["plot-metrics", str(tmp_path)]) == 2
    assert "metrics.jsonl:1: not a JSON object" in capsys.readouterr().err
    assert main(["plot-metrics", str(tmp_path / "nope")]) == 2
