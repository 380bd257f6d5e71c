"""XLA flags the commands add to XLA_FLAGS from config fields (bert_jax/xla_flags.py): added
once, never over the user's own setting, and set by `bert-jax pretrain` / `bert-jax finetune`
before the run starts. That this jaxlib parses them: the bench presets that include them
(tests/bench/test_bench_smoke.py::test_every_xla_flag_preset_parses)."""

from __future__ import annotations

import os

import pytest

from bert_jax import xla_flags
from bert_jax.cli import finetune as finetune_commands
from bert_jax.cli import pretrain


def test_added_once_and_never_over_the_users(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    assert xla_flags.add(xla_flags.TRITON_GEMM_OFF) == ["--xla_gpu_enable_triton_gemm=false"]
    assert xla_flags.add(xla_flags.TRITON_GEMM_OFF) == []
    assert (os.environ["XLA_FLAGS"]
            == "--xla_force_host_platform_device_count=8 --xla_gpu_enable_triton_gemm=false")
    # The user's value of one flag stays; the others are added after it.
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_enable_pipelined_all_gather=false")
    added = xla_flags.add(xla_flags.COLLECTIVE_OVERLAP)
    assert len(added) == len(xla_flags.COLLECTIVE_OVERLAP) - 1
    assert "--xla_gpu_enable_pipelined_all_gather=true" not in os.environ["XLA_FLAGS"]
    assert os.environ["XLA_FLAGS"].split() == [
        "--xla_gpu_enable_pipelined_all_gather=false", *added]
    monkeypatch.delenv("XLA_FLAGS")
    assert xla_flags.add(xla_flags.TRITON_GEMM_OFF)
    assert os.environ["XLA_FLAGS"] == "--xla_gpu_enable_triton_gemm=false"


@pytest.mark.parametrize("overlap", [True, False])
def test_pretrain_adds_collective_overlap_before_the_run(overlap, monkeypatch, tmp_path):
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    seen = {}

    def fake_run(config, workdir, overwrite=False, exit_follows=False):
        seen["flags"] = os.environ.get("XLA_FLAGS", "")
        return {"step": 0}

    monkeypatch.setattr("bert_jax.training.loop.train_and_evaluate", fake_run)
    args = type("Args", (), {"config": "experiments/pretrain.py:tiny", "workdir": str(tmp_path),
                             "overwrite": False, "json": False,
                             "overrides": [f"--config.parallel.collective_overlap={overlap}"]})
    assert pretrain.Pretrain.run(args) == 0
    assert (seen["flags"].split() == list(xla_flags.COLLECTIVE_OVERLAP)) is overlap
    assert bool(seen["flags"]) is overlap


def test_finetune_turns_triton_gemm_off_before_the_run(monkeypatch, tmp_path):
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    seen = {}

    def fake_finetune(config, workdir, overwrite=False):
        seen["flags"] = os.environ.get("XLA_FLAGS", "")
        return {"best": {"metric": "dev/accuracy", "epoch": 1, "value": 0.5}}

    monkeypatch.setattr("bert_jax.finetuning.finetune.finetune", fake_finetune)
    args = type("Args", (), {"config": "experiments/glue.py:mrpc", "workdir": str(tmp_path),
                             "overwrite": False, "json": False,
                             "overrides": ["--config.compilation_cache=false"]})
    assert finetune_commands.Finetune.run(args) == 0
    assert seen["flags"] == "--xla_gpu_enable_triton_gemm=false"
