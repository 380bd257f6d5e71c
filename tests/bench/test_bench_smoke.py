"""Smoke tests of the benchmark suites on CPU: tiny model (one layer, a vocabulary of 100),
2 steps, real code paths."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bench import collectives, summarize
from bench import finetune as bench_finetune
from bench import loop as bench_loop
from bench import pretrain as bench_pretrain
from bench.common import REPO, train_flops_per_sequence

# One layer and a vocabulary of 100 (padded to 128) instead of the preset's two and BERT's
# 30,522: the same code paths, less to compile, initialise and update.
VOCAB = 100
TINY = ["--model", "tiny", "--layers", "1", "--vocab-size", str(VOCAB), "--seq-len", "32",
        "--batch-size", "8", "--steps", "2", "--repeats", "1", "--warmup", "1",
        "--peak-size", "128"]
# Without dropout for the records and the census: its random masks are a large part of the
# tiny step's compile, and none of what they check depends on it (the cond-skip step keeps
# dropout: it must draw the engine's masks).
NO_DROPOUT = ["--attention-dropout", "0", "--hidden-dropout-rate", "0"]


@pytest.mark.slow
def test_pretrain_record_and_fsdp_shards_state(tmp_path):
    r = bench_pretrain.main(TINY + NO_DROPOUT + ["--out", str(tmp_path), "--mesh", "fsdp",
                                                 "--devices", "4"])
    assert math.isfinite(r["loss"]) and r["skipped_steps"] == 0
    assert r["seq_per_s"] > 0 and 0 < r["mfu"] and r["devices"] == 4
    assert (r["layers"], r["vocab_size"]) == (1, VOCAB)  # unpadded, as the FLOPs count it
    assert r["flops_per_seq"] == train_flops_per_sequence(1, 128, 32, VOCAB, 5)
    # FSDP shards parameters and both Adam moments over 4 devices (small replicated leaves
    # such as the step count keep it just above a quarter).
    per_device = r["param_bytes_per_device"] + r["opt_state_bytes_per_device"]
    assert 0.24 < per_device / r["state_bytes_total"] < 0.30
    assert json.loads((tmp_path / "step.jsonl").read_text())["mesh"] == "fsdp"
    assert os.listdir(tmp_path) == ["step.jsonl"]


def test_collectives_census(tmp_path):
    """``bench scaling collectives``: the census of an HLO line, and the compiled FSDP step (tiny,
    4 devices) with no activation gathered over the batch (exit code 0)."""
    line = ('  %ag = (f32[16,32,64]{2,1,0}, bf16[64,64]{1,0}) all-gather-start(%a, %b), '
            'metadata={op_name="jit(train_step)/bert/encoder/mlp_in/dot_general"}')
    records = collectives.census(line)
    assert [(r["dtype"], r["shape"], r["op"]) for r in records] == [
        ("bf16", [64, 64], "bert/encoder/mlp_in/dot_general"),
        ("f32", [16, 32, 64], "bert/encoder/mlp_in/dot_general")]
    assert collectives.batch_activations(records, 16, 32) == [records[1]]
    # a combined all-reduce's tuple shape carries /*index=N*/ comments (each "=" inside one
    # used to end the match, so such all-reduces went uncounted)
    combined = ('  %ar = (f32[2]{0}, f32[3]{0}, f32[4]{0}, f32[5]{0}, f32[6]{0}, /*index=5*/'
                'f32[30592,128]{1,0}) all-reduce(%a, %b, %c, %d, %e, %f), to_apply=%add')
    assert [(r["collective"], r["shape"]) for r in collectives.census(combined)] == [
        ("all-reduce", [2]), ("all-reduce", [3]), ("all-reduce", [30592, 128]),
        ("all-reduce", [4]), ("all-reduce", [5]), ("all-reduce", [6])]
    # the batch and options of test_pretrain_record_and_fsdp_shards_state's step (TINY on 4
    # FSDP devices), so that the persistent compilation cache can serve both one program
    assert collectives.main(["--model", "tiny", "--layers", "1", "--vocab-size", str(VOCAB),
                             "--seq-len", "32", "--batch-size", "8", "--mesh", "fsdp",
                             "--devices", "4", *NO_DROPOUT, "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "collectives.jsonl").read_text())
    assert record["batch_activation_gathers"] == 0
    assert record["per_device"]["gflop"] > 0 and record["per_device"]["gb_accessed"] > 0
    assert any(r["collective"] == "all-gather" and r["shape"] == [128, 512]
               for r in record["collectives"])  # the MLP kernel is gathered


SCHEDULED = """HloModule m, is_scheduled=true

ENTRY %main (p: bf16[8,8]) -> bf16[8,8] {
  %p = bf16[8,8]{1,0} parameter(0)
  %all-reduce-start = ((bf16[1024]{0}), bf16[1024]{0}) async-start(%p), calls=%ar
  %f.1 = bf16[8,8]{1,0} fusion(%p), kind=kCustom, calls=%gemm_fusion_dot.1
  %c.2 = (bf16[8,8]{1,0}, s8[4]{0}) custom-call(%p, %p), custom_call_target="__cublas$lt$matmul"
  %f.3 = bf16[8,8]{1,0} fusion(%p), kind=kLoop, calls=%loop_add
  %all-reduce-done = bf16[1024]{0} async-done(%all-reduce-start)
  %all-gather-start.1 = (f32[16]{0}, f32[64]{0}) all-gather-start(%p), dimensions={0}
  %all-gather-done.1 = f32[64]{0} all-gather-done(%all-gather-start.1)
  ROOT %r = bf16[8,8]{1,0} copy(%p)
}
"""


def test_collectives_overlap_schedule(tmp_path):
    """``bench scaling collectives --hlo``: each async collective of a scheduled module's entry
    computation with its bytes and the work between its start and its done (both the
    async-start/async-done and the all-gather-start/-done spellings), and the summary."""
    report = collectives.overlap(SCHEDULED)
    assert report["instructions"] == 9
    assert report["collectives"] == [
        {"collective": "all-reduce", "start": 1, "done": 5, "bytes": 2048, "between": 3,
         "matmuls_between": 2},
        {"collective": "all-gather", "start": 6, "done": 7, "bytes": 256, "between": 0,
         "matmuls_between": 0}]
    summary = collectives.overlap_summary(report)
    assert summary["collectives"] == 2 and summary["first_start_at"] == 1 / 9
    assert summary["fraction_with_at_most_one_matmul"] == 256 / (2048 + 256)
    dump = tmp_path / "m.after_optimizations.txt"
    dump.write_text(SCHEDULED)
    out = tmp_path / "c.jsonl"
    assert collectives.main(["--hlo", str(dump), "--out", str(out)]) == 0
    assert json.loads(out.read_text())["overlap_summary"] == summary
    with pytest.raises(ValueError, match="no ENTRY"):
        collectives.overlap("HloModule m")


def test_finetune_record(tmp_path):
    r = bench_finetune.main(TINY + NO_DROPOUT + ["--out", str(tmp_path)])
    assert r["task"] == "classify" and math.isfinite(r["loss"]) and r["seq_per_s"] > 0
    assert (r["layers"], r["vocab_size"]) == (1, VOCAB)
    assert r["flops_per_seq"] == train_flops_per_sequence(1, 128, 32, VOCAB, predictions=0)


def _tiny_training():
    from bench.pretrain import experiment_config, parse_args, random_pretraining_batch
    from bert_jax import parallel
    from bert_jax.training.config import model_config
    from bert_jax.training.setup import build_training

    args = parse_args(TINY + ["--devices", "1"])
    config = experiment_config(args)
    mesh = parallel.create_mesh(config.parallel.mesh, devices=jax.devices()[:1])
    training = build_training(config, model_config(config), mesh)
    batch = random_pretraining_batch(np.random.default_rng(0), 8, 32, 5, VOCAB)
    return training, batch


@pytest.mark.slow
def test_cond_skip_step_matches_engine_and_skips_non_finite():
    from bench.levers import make_cond_skip_train_step

    training, batch = _tiny_training()
    cond_step = jax.jit(make_cond_skip_train_step(training.model, training.tx,
                                                  training.schedule))
    engine_step = training.train_step  # donates its state: give it a copy
    rng = jax.random.PRNGKey(3)
    state = training.init_state(jax.random.PRNGKey(0))
    good = training.global_batch(batch)
    ref_state, ref_metrics = engine_step(jax.tree.map(jnp.copy, state), good, rng)
    new_state, metrics = cond_step(jax.tree.map(jnp.copy, state), good, rng)
    assert float(metrics["loss"]) == pytest.approx(float(ref_metrics["loss"]), rel=1e-6)
    for a, b in zip(jax.tree.leaves(new_state.params), jax.tree.leaves(ref_state.params),
                    strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)
    bad = dict(batch, masked_lm_weights=np.full_like(batch["masked_lm_weights"], np.nan))
    before = jax.device_get(new_state.params)
    skipped_state, bad_metrics = cond_step(new_state, training.global_batch(bad), rng)
    assert int(bad_metrics["skipped"]) == 1 and int(skipped_state.skipped_in_row) == 1
    for a, b in zip(jax.tree.leaves(skipped_state.params), jax.tree.leaves(before), strict=True):
        np.testing.assert_array_equal(np.asarray(a), b)


def test_summarize_scaling_tables_skip_failed_runs():
    """One table per scaling summary, labelled with its extra flags; the error record of a
    scaling run that was skipped goes to the failed list, not into a table."""
    summary = {"task": "scaling_summary", "model": "large", "seq_len": 128,
               "per_device_batch": 128, "device": "NVIDIA H200",
               "extra_args": ["--xla-flags", "collectives"],
               "dp": {"1": {"seq_per_s": 1850.0, "efficiency": 1.0},
                      "4": {"seq_per_s": 6850.0, "efficiency": 0.923}},
               "fsdp": {"4": {"seq_per_s": 6960.0, "throughput_cost": -0.015,
                              "state_gib_per_device": 0.94, "dp_state_gib_per_device": 3.76,
                              "peak_memory_gib": 14.6, "dp_peak_memory_gib": 17.3}}}
    skipped = {"tag": "scaling-levers", "task": "scaling_summary", "model": "large",
               "seq_len": 128, "batch_size": 0, "error": "skipped: timeout"}
    text = summarize.render([skipped, summary])
    assert "128 sequences per device, NVIDIA H200, --xla-flags collectives" in text
    assert "| 4 | 6,850 | 92.3% | 6,960 | -1.5% | 0.94 (3.76) |" in text
    assert "scaling-levers large/128: skipped: timeout" in text


def test_every_xla_flag_preset_parses():
    """XLA aborts on an unknown flag: every preset's flags, together, must start a backend."""
    from bench.levers import XLA_FLAG_PRESETS

    flags = " ".join(f for preset in XLA_FLAG_PRESETS.values() for f in preset)
    env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, "-c", "import jax; print(jax.device_count())"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_scaling_variants_summarized_against_the_same_baseline():
    """``bench scaling run --variant NAME=ARGS``: a data-parallel run with those step options
    at every n >= 2, its efficiency against the one-device run and its gain over plain DP."""
    from bench import scaling

    args = scaling.parse_args(["--device-counts", "1,4", "--variant",
                               "overlap=--xla-flags dp_overlap", "--out", "/nonexistent"])
    assert args.variant == [("overlap", ["--xla-flags", "dp_overlap"])]
    with pytest.raises(SystemExit):
        scaling.parse_args(["--variant", "dp=--xla-flags lhs"])
    run = {"seq_per_s": 0.0, "mfu": 0.5, "param_bytes_per_device": 4,
           "opt_state_bytes_per_device": 8, "peak_memory_gib": 17.0}
    records = {("dp", 1): dict(run, seq_per_s=1600.0), ("dp", 4): dict(run, seq_per_s=6000.0),
               ("overlap", 4): dict(run, seq_per_s=6240.0),
               ("partitioner", 4): {"error": "exit code 1"}}
    summary = scaling.summarize(records)
    assert summary["variants"]["overlap"][4]["efficiency"] == 6240.0 / 6400.0
    assert abs(summary["variants"]["overlap"][4]["vs_dp"] - 0.04) < 1e-12
    assert summary["failed"] == ["partitioner_4"] and summary["fsdp"] == {}


def test_summarize_ratio_and_targets(tmp_path):
    common = {"task": "pretrain", "model": "base", "seq_len": 128, "batch_size": 256,
              "device": "NVIDIA H100 80GB HBM3", "matmul_peak_tflops": 700.0}
    records = [dict(common, framework="bert-jax", tag="core", seq_per_s=6000.0, mfu=0.56,
                    peak_memory_gib=30.0),
               dict(common, framework="transformers", seq_per_s=4000.0, mfu=0.37),
               dict(common, framework="bert-jax", tag="lever:baseline", seq_per_s=6000.0,
                    mfu=0.56),
               dict(common, framework="bert-jax", tag="lever:scan", seq_per_s=5700.0,
                    mfu=0.53),
               dict(common, tag="lever:dropout_cudnn", error="exit code 1")]
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    text = summarize.render(summarize.load([str(path)]))
    assert "| pretrain | base | 128 | 256 | 6,000 | 56.0% | 30.0 | 4,000 | 37.0% |" in text
    assert "| 1.50 | met (≥1.5x, ≥55% MFU) |" in text
    assert "| scan | 5,700 | -5.0% |" in text
    assert "dropout_cudnn | failed: exit code 1" in text
    # MFU against the top peak of the records (one card: 700 here, so the same)
    assert "| bert-jax | pretrain | base | 128 | 256 | 392 | 56.0% (700) | 56.0% (700) |" in text
    faster = dict(common, framework="transformers", seq_per_s=1.0, mfu=0.5,
                  matmul_peak_tflops=800.0, tag="x")
    text = summarize.render(summarize.load([str(path)]) + [faster])
    assert "| bert-jax | pretrain | base | 128 | 256 | 392 | 56.0% (700) | 49.0% (800) |" in text
    # a run skipped in one run of the driver and completed in a later one is not failed
    skipped = [{"tag": "core", "task": "pretrain", "model": "base", "seq_len": 128,
                "batch_size": 256, "error": "skipped: timeout"},
               {"tag": "core", "task": "pretrain", "model": "large", "seq_len": 512,
                "batch_size": 32, "error": "skipped: timeout"}]
    text = summarize.render(skipped + summarize.load([str(path)]))
    assert "core base/128: skipped" not in text and "core large/512: skipped" in text
    # other tagged runs get a table of their own; core and lever runs do not repeat there
    ab = [dict(common, framework="bert-jax", tag="qkv:packed", seq_per_s=5255.0, mfu=0.5,
               peak_memory_gib=12.1)]
    text = summarize.render(summarize.load([str(path)]) + ab)
    others = text.split("## Other runs (by tag)")[1].split("##")[0]
    assert "| qkv:packed | pretrain | base | 128 | 256 | 5,255 | 50.0% | 12.1 |" in others
    assert "core" not in others and "lever:" not in others
    assert "Other runs" not in summarize.render(summarize.load([str(path)]))
    # a run bench/run_gpu.sh saw fail is listed with its command
    failed = {"command": ["step", "pretrain", "--model", "large"], "error": "exit code 124"}
    assert "- python -m bench step pretrain --model large: exit code 124" in summarize.render(
        summarize.load([str(path)]) + [failed])
    # the plain Flax step gets its own comparison and a row against the common peak
    plain = [dict(common, framework="plain-flax", tag="plain", seq_per_s=4800.0, mfu=0.45,
                  peak_memory_gib=20.0, hidden_dropout_rate=0.0)]
    text = summarize.render(summarize.load([str(path)]) + plain)
    assert ("| pretrain | base | 128 | 256 | 6,000 | 56.0% | 30.0 | 4,800 | 45.0% | 20.0 | "
            "hidden 0, attention 0 | 1.25 |") in text.split("plain Flax step")[1]
    assert "| plain-flax | pretrain | base | 128 | 256 | 315 | 45.0% (700) |" in text
    assert "plain Flax step" not in summarize.render(summarize.load([str(path)]))


def test_loop_helpers(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    rows = [{"split": "train", "step": s, "seq_per_sec": v, "mfu": v / 1e4, "loss": 7.0}
            for s, v in ((20, 100.0), (40, 300.0), (60, 310.0), (80, 290.0))]
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = bench_loop.steady_state(str(tmp_path))
    assert result["loop_seq_per_s"] == 300.0  # the first interval is dropped
    assert bench_loop._drop_loop_options(
        ["--model", "base", "--steps", "120", "--log-every=20", "--source", "synthetic",
         "--scan"]) == ["--model", "base", "--scan"]
    from bert_jax.data.materialize import MaterializedBatches

    bench_loop.write_materialized(str(tmp_path / "m"), 3, 4, 32, 5, 30522)
    batch = next(MaterializedBatches(str(tmp_path / "m")))
    assert batch["input_ids"].shape == (4, 32) and batch["input_ids"].min() >= 5
    assert batch["masked_lm_weights"].dtype == np.float32


def test_run_gpu_script_parses():
    subprocess.run(["bash", "-n", os.path.join(REPO, "bench", "run_gpu.sh")], check=True)


def test_attention_sweeps_time_each_kernel_setting(tmp_path, monkeypatch):
    """``bench kernels --kernel attention --tune fwd / bwd`` on the CPU (interpret mode): one
    record per setting, each timed; the dQ kernel's settings are its own (a 4-tuple that is
    not the dK/dV kernel's)."""
    from bench import kernels

    monkeypatch.setattr(kernels, "FORWARD_TUNINGS", [(64, 64, 4, 3), (32, 16, 4, 2)])
    monkeypatch.setattr(kernels, "DKDV_TUNINGS", [(64, 64, 4, 3), (16, 32, 4, 2)])
    monkeypatch.setattr(kernels, "DQ_TUNINGS", [(32, 16, 4, 2)])
    for tune, count in (("fwd", 2), ("bwd", 3)):
        out = tmp_path / tune / "kernels.jsonl"
        kernels.main(["--kernel", "attention", "--shapes", "1x64x2x16", "--tune", tune,
                      "--impls", "none", "--out", str(out.parent)])
        records = [json.loads(line) for line in out.read_text().splitlines()]
        sweep = [r for r in records if "tune_fwd" in r or "tune_bwd" in r]
        assert len(sweep) == count and all(r["fwd_ms"] > 0 for r in sweep), sweep
        assert records[0]["check"] == "flash_vs_reference_grad_rel_err"
        assert max(records[0]["dq_dk_dv"]) < 1e-4
    assert [r["kernel"] for r in sweep] == ["dkdv", "dkdv", "dq"]
    assert all(r["fwd_bwd_ms"] > 0 for r in sweep)  # timed, never compared (a CPU's timings)


@pytest.mark.parametrize("kernel, shape, options", [
    ("norm", "1x16x128", ["--block-rows", "8", "--num-warps", "4", "--hold", "",
                          "--summed", ""]),
    ("gelu", "1x16x256", ["--blocks", "default", "--sum-blocks", "0"]),
    ("xent", "1x8x64", ["--blocks", "default", "--sum-blocks", "0", "--vocab", "256"]),
])
def test_kernel_harness_times_kernel_against_xla(tmp_path, kernel, shape, options):
    """``bench kernels --kernel norm|gelu|xent`` on the CPU (interpret mode): XLA's variant and
    the kernel's are both timed, into OUT/kernels.jsonl, and the kernel computes XLA's
    result (to bf16 rounding)."""
    from bench import kernels

    kernels.main(["--kernel", kernel, "--shapes", shape, "--iters", "1", "--repeats", "1",
                  "--out", str(tmp_path), *options])
    records = [json.loads(line) for line in (tmp_path / "kernels.jsonl").read_text().splitlines()]
    assert not any("error" in r for r in records), records
    variants = {r["variant"] for r in records}
    assert "xla" in variants and len(variants) >= 2, variants  # XLA's and the kernel's
    assert all(r.get("us", r.get("us_fwd_bwd", 0)) > 0 for r in records)
    assert all(r.get("max_diff_vs_xla", 0) < 0.1 for r in records)


def test_entry_point_lists_suites_and_rejects_unknown_ones():
    """``python -m bench --help`` lists every suite; an unknown suite or mode is one
    ``error:`` line and exit status 2; a suite's mode reaches the module's own parser."""
    def bench(*argv):
        return subprocess.run([sys.executable, "-m", "bench", *argv], cwd=REPO,
                              capture_output=True, text=True)

    done = bench("--help")
    assert done.returncode == 0
    for suite in ("step", "peers", "kernels", "scaling", "profile", "roofline", "quality",
                  "data", "tokenizer", "summary"):
        assert f"  {suite} " in done.stdout
    done = bench("steps")
    assert done.returncode == 2 and done.stderr.startswith("error: unknown suite 'steps'")
    done = bench("step", "pretrian")
    assert done.returncode == 2 and "unknown mode 'pretrian'" in done.stderr
    done = bench("kernels", "--help")
    assert done.returncode == 0 and "--kernel {attention,gelu,norm,xent}" in done.stdout


def test_kernel_levers_map_to_config_fields():
    """Each kernel lever is a BertConfig field: only values that differ from the defaults are
    set, block settings parse into the fields' tuples, bad ones are rejected."""
    from bench.levers import kernel_lever_fields, kernel_lever_record

    args = bench_pretrain.parse_args(TINY)
    assert kernel_lever_fields(args) == {}
    assert kernel_lever_record(args)["fused_gelu"] == "auto"
    args = bench_pretrain.parse_args(TINY + [
        "--fused-gelu", "off", "--fused-mlm-loss", "force", "--split-norm-grads", "off",
        "--direct-weight-grads", "off", "--flash-bias-grads", "off", "--norm-blocks",
        "16:8:hold", "--norm-sum-blocks", "4", "--gelu-blocks", "4:512:2",
        "--gelu-sum-blocks", "8"])
    assert kernel_lever_fields(args) == {
        "fused_gelu": "off", "fused_mlm_loss": "force", "split_norm_grads": False,
        "direct_weight_grads": False, "flash_bias_grads": False,
        "norm_blocks": (16, 8, False), "norm_sum_blocks": 4, "gelu_blocks": (4, 512, 2),
        "gelu_sum_blocks": 8}
    for bad in (["--norm-blocks", "16"], ["--gelu-blocks", "4:x:2"],
                ["--split-norm-grads", "yes"], ["--fused-gelu", "on"]):
        with pytest.raises(SystemExit):
            bench_pretrain.parse_args(TINY + bad)


def test_kernel_levers_reach_the_model_config():
    """The levers are set on the BertConfig the step builds (no module is patched)."""
    from bert_jax.training.config import model_config

    args = bench_pretrain.parse_args(TINY + ["--fused-gelu", "off", "--norm-blocks", "8:4",
                                             "--split-norm-grads", "off"])
    config = model_config(bench_pretrain.experiment_config(args))
    assert config.kernels.fused_gelu == "off" and config.kernels.norm_blocks == (8, 4, True)
    assert config.kernels.split_norm_grads is False and config.kernels.fused_mlm_loss == "auto"
