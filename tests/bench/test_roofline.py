"""``bench roofline``: the step-time floor from FLOPs and bytes (pure arithmetic)."""

from __future__ import annotations

import json

import pytest

from bench import roofline
from bench.common import MODELS, train_flops_per_sequence


def test_parameter_count_is_the_models():
    """The formula counts what BertForPreTraining creates (padded vocabulary included);
    Base ~110M, Large ~335M parameters."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    from bert_jax import modeling
    from bert_jax.config import get_preset

    for name in ("tiny", "small"):
        cfg = get_preset(name)
        ids = jnp.ones((1, 8), jnp.int32)
        shapes = jax.eval_shape(modeling.BertForPreTraining(cfg).init, jax.random.key(0), ids,
                                ids, ids * 0)
        assert roofline.param_count(cfg) == sum(
            x.size for x in jax.tree.leaves(nn.unbox(shapes)["params"])), name
    assert 108e6 < roofline.param_count(get_preset("base")) < 112e6
    assert 330e6 < roofline.param_count(get_preset("large")) < 340e6


def test_one_pass_by_hand():
    """The q/k/v bias add reads and writes the [tokens, 3 x hidden] bf16 projection once per
    layer; an epilogue removes it."""
    (qkv,) = [p for p in roofline.passes("base", 128, 256) if p.name.startswith("q/k/v")]
    assert qkv.bytes == 12 * 2 * 3 * (256 * 128 * 768) * 2
    assert qkv.epilogue_bytes == 0.0


def test_floors_are_consistent():
    """Epilogues only remove bytes; the floor's MFU is its counted FLOPs over the peak and
    below 100%; the MFU of a rate agrees with the floor's own."""
    for model, seq, batch in (("base", 128, 256), ("large", 128, 256), ("large", 512, 32)):
        kernels = roofline.floor(model, seq, batch, 733.0, 3.35)
        epilogues = roofline.floor(model, seq, batch, 733.0, 3.35, epilogues=True)
        assert epilogues["memory_ms"] < kernels["memory_ms"]
        assert kernels["matmul_ms"] == epilogues["matmul_ms"]
        assert 0.5 < kernels["mfu"] < epilogues["mfu"] < 1.0
        rate = kernels["seq_per_s"]
        assert roofline.required_mfu(model, seq, rate, 733.0) == pytest.approx(kernels["mfu"])
        layers, hidden, _, _ = MODELS[model]
        counted_ms = batch * train_flops_per_sequence(layers, hidden, seq) / 733e12 * 1e3
        assert kernels["matmul_ms"] > counted_ms  # the flash backward's recomputation on top


def test_cli_rows_and_target(capsys, tmp_path):
    rows = roofline.main(["--peak", "733", "--peer", "base:128:256=3862",
                          "--workloads", "base:128:256", "--out", str(tmp_path)])
    written = [json.loads(line) for line in (tmp_path / "roofline.jsonl").read_text().splitlines()]
    assert [r["floor"] for r in written] == ["kernels", "epilogues"]
    assert [r["floor"] for r in rows] == ["kernels", "epilogues"]
    # 1.5 x 3,862 seq/s at 733 TFLOP/s is a 55% MFU target for Base/128
    assert rows[0]["target_mfu"] == pytest.approx(0.553, abs=0.002)
    assert "| base/128 b256 | kernels |" in capsys.readouterr().out


def test_bad_peer_is_named():
    with pytest.raises(SystemExit, match="--peer 'huge:128:256=1'"):
        roofline.main(["--peer", "huge:128:256=1"])


def test_measured_attention_replaces_its_flops_at_the_peak():
    """``attention_ms`` swaps attention's FLOPs at the peak (the counted 12 s^2 H per layer
    plus the flash backward's recomputation) for the measured time per layer: at exactly the
    peak's time it is the same floor, and each extra millisecond per layer adds ``layers``
    milliseconds to the step."""
    layers, hidden, _, _ = MODELS["large"]
    at_peak = 32 * roofline.attention_flops_per_sequence("large", 512) / 733e12 * 1e3 / layers
    plain = roofline.floor("large", 512, 32, 733.0, 4.8)
    same = roofline.floor("large", 512, 32, 733.0, 4.8, attention_ms=at_peak)
    assert same["step_ms"] == pytest.approx(plain["step_ms"])
    slower = roofline.floor("large", 512, 32, 733.0, 4.8, attention_ms=at_peak + 1.0)
    assert slower["step_ms"] == pytest.approx(plain["step_ms"] + layers)
    # per layer and sequence, 12 s^2 H counted + 3 x 2 s^2 H recomputed at length 512
    assert roofline.attention_flops_per_sequence("large", 512) == layers * 18 * 512 ** 2 * hidden


def test_cli_attention_ms(capsys, tmp_path):
    rows = roofline.main(["--out", str(tmp_path), "--peak", "733", "--bandwidth", "4.8", "--peer",
                          "large:128:256=1550", "--attention-ms", "large:128:256=0.581",
                          "--workloads", "large:128:256"])
    # with attention at its measured H200 speed the kernels floor allows 1.43x the peer
    assert rows[0]["attention_ms"] == 0.581
    assert rows[0]["max_ratio"] == pytest.approx(1.43, abs=0.01)
    assert "| large/128 b256 | kernels | 0.581 ms/layer |" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="--attention-ms 'large:128=1': expected "
                                         "MODEL:SEQ:BATCH=MS"):
        roofline.main(["--attention-ms", "large:128=1"])
