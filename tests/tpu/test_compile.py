"""``bert-jax compile``: slice names, and the loop's own train step compiled ahead of time by
libtpu for TPU slices on this CPU machine (multi-host, multislice, FSDP vs DP on v5e chips),
with memory per chip, the fit verdict, the roofline prediction and the CLI's exit codes."""

import json
import re

import pytest

from bert_jax.cli import main
from bert_jax.errors import BertJaxError
from bert_jax.tpu.compile import compile_pretraining
from bert_jax.tpu.hlo import main as hlo_main
from bert_jax.tpu.topologies import GIB, abstract_devices, chip_grid, parse_slice
from bert_jax.training.config import load_config

pytestmark = pytest.mark.xdist_group("tpu_compile")

SCAN = "--config.model.scan_layers=true"


@pytest.mark.parametrize("name,chips,shape,hosts", [
    ("v4-8", 4, (2, 2, 1), 1), ("v4-32", 16, (2, 2, 4), 4), ("v5p-128", 64, (4, 4, 4), 16),
    ("v5e-256", 256, (16, 16), 64), ("v5litepod-16", 16, (4, 4), 4), ("v6e-64", 64, (8, 8), 16),
    ("v5e-1", 1, (1, 1), 1)])
def test_slice_names(name, chips, shape, hosts):
    tpu = parse_slice(name)
    assert (tpu.chips, tpu.shape, tpu.hosts) == (chips, shape, hosts)
    assert parse_slice(name, 2).chips == 2 * chips


def test_chip_grids_double_the_smallest_axis():
    assert [chip_grid(n, 3) for n in (4, 8, 16, 32, 64, 128)] == [
        (2, 2, 1), (2, 2, 2), (2, 2, 4), (2, 4, 4), (4, 4, 4), (4, 4, 8)]
    assert [chip_grid(n, 2) for n in (1, 2, 4, 8, 16, 32)] == [
        (1, 1), (1, 2), (2, 2), (2, 4), (4, 4), (4, 8)]


@pytest.mark.parametrize("bad,match", [("v9-8", "unknown TPU generation"),
                                       ("v4-5", "count TensorCores"), ("v5e-24", "powers"),
                                       ("tpu", "slice name")])
def test_bad_slice_names(bad, match):
    with pytest.raises(BertJaxError, match=match):
        parse_slice(bad)


def test_abstract_devices_span_hosts_and_slices():
    devices = abstract_devices(parse_slice("v4-32", 2))
    assert len(devices) == 32 and devices[0].platform == "tpu"
    assert {d.slice_index for d in devices} == {0, 1}
    assert len({d.process_index for d in devices}) == 8  # 4 hosts per slice


def _compile(variant, topology, *overrides, num_slices=1, layer_costs="extrapolate"):
    config = load_config(f"experiments/pretrain.py:{variant}", list(overrides))
    return compile_pretraining(config, parse_slice(topology, num_slices),
                               layer_costs=layer_costs)


def test_base_phase1_compiles_for_multihost_multislice_v4(tmp_path, capsys):
    """The BERT-Base phase-1 step (vocab 30522, 12 layers scanned) through the CLI on two
    v4-16 slices over DCN (16 chips of 4 hosts), data parallel: the data axis spans both
    slices (parallel.dcn_mesh unset), parameters and Adam moments replicated on every chip.
    At a global batch of 32 (2 sequences a chip) instead of the recipe's 256: the mesh, the
    replicated state and the scanned count do not depend on the batch, and the TPU compiler
    takes a third less time. The scanned program's own counts (``--layer-costs scanned``):
    XLA counts the loop body once, so its FLOPs fall short of the model's (the
    extrapolation: the next test). ``--save-hlo`` keeps the compiled program, and
    ``python -m bert_jax.tpu.hlo`` walks it again to the record's bytes and collectives."""
    out, program = tmp_path / "report.json", tmp_path / "step.hlo"
    rc = main(["compile", "--config", "experiments/pretrain.py:bert_base_phase1", "--topology",
               "v4-16", "--num-slices", "2", "--json", str(out), SCAN,
               "--config.global_batch_size=32", "--layer-costs", "scanned",
               "--save-hlo", str(program)])
    text = capsys.readouterr().out
    assert rc == 0 and "FITS" in text and "MFU" in text and "chip-hours" in text
    e = json.loads(out.read_text())
    assert e["fits"] and e["chips"] == 16 and e["num_slices"] == 2
    assert e["topology"] == "v4:2x2x2"
    assert e["mesh"] == {"data": 16, "fsdp": 1, "tensor": 1} and e["batch_per_chip"] == 2
    assert e["params_bytes"] == 110_160_258 * 4  # float32, whole on every chip (vocab 30592)
    assert e["optimizer_bytes"] == pytest.approx(2 * e["params_bytes"], rel=0.01)  # m and v
    assert e["total_bytes"] < 32 * GIB
    # the scanned count is several times short: the roofline takes the model's FLOPs
    assert e["loop_scale"] > 3.0 and not any("extrapolated" in n for n in e["notes"])
    assert 0.0 < e["mfu"] < 1.0 and e["step_seconds"] > 0
    assert e["schedule_hours"] == pytest.approx(900_000 * e["step_seconds"] / 3600)
    assert program.read_text().startswith("HloModule")
    assert hlo_main([str(program), "--devices", "16", "--slices", "2"]) == 0
    walked = capsys.readouterr().out
    assert f"(sum {sum(e['hbm_parts'].values()) / 1e9:.3f} GB)" in walked
    assert all(f"{c['kind']} over groups of {c['group']}:" in walked for c in e["collectives"])
    assert hlo_main([str(program), "--devices", "16", "--slices", "2", "--every-memory"]) == 0
    everywhere = float(re.search(r"\(sum ([\d.]+) GB\)", capsys.readouterr().out)[1])
    assert everywhere > sum(e["hbm_parts"].values()) / 1e9


def test_scanned_layer_costs_are_extrapolated_from_unrolled_compiles():
    """Six scanned layers (the tiny model with a 1024-word vocabulary on a v4-8): FLOPs and
    bytes come from two unrolled compiles (1 and 2 layers) extrapolated to 6, within 15% of
    the model count (the rest: softmax, LayerNorm, optimizer), so the roofline takes them as
    they are (where the scanned count alone falls short: the Base test above)."""
    e = _compile("tiny", "v4-8", SCAN, "--config.model.num_hidden_layers=6",
                 "--config.model.vocab_size=1024")
    model = e.model_flops_per_sequence * e.batch_per_chip
    assert model < e.compiled_flops < 1.15 * model
    assert any("extrapolated to 6 layers" in n for n in e.notes)
    assert e.loop_scale == 1.0 and e.fits


# BERT-Large phase 1 at 80 sequences per chip on v5e (16 GiB chips). What fits is a per-chip
# question: 8 chips (global batch 640) hold what each of a v5e-256's chips holds at 20480,
# except that FSDP's parameter and optimizer shards are 8 ways instead of 256.
LARGE_80 = ["compile", "--config", "experiments/pretrain.py:bert_large_phase1", "--topology",
            "v5e-8", SCAN, "--config.global_batch_size=640"]


def test_large_dp_does_not_fit_v5e_and_names_the_levers(tmp_path, capsys):
    """Data parallel: every chip holds the fp32 parameters, both Adam moments and the
    gradients (~5 GiB) besides 80 sequences of activations; the TPU compiler itself refuses
    the step for HBM, and the command exits 1 naming the levers."""
    out = tmp_path / "dp.json"
    rc = main([*LARGE_80, "--json", str(out)])
    err = capsys.readouterr().err
    assert rc == 1 and "does not fit" in err and "RESOURCE_EXHAUSTED" in err
    assert "fsdp=-1" in err and "remat_policy" in err and "microbatches" in err
    record = json.loads(out.read_text())
    assert record["fits"] is False
    assert record["total_bytes"] >= record["compiler_hbm_limit_bytes"] > 15 * GIB


def test_large_fsdp_fits_v5e(tmp_path):
    """The same step with FSDP over the 8 chips: parameters and optimizer state sharded 8
    ways (1.26 GiB of fp32 parameters: under 0.16 GiB a chip), and it fits. The step
    compiles with ``parallel.tpu_collective_matmul=auto``'s options (windowed collective
    matmuls off on this FSDP mesh), which the TPU compiler would refuse if it did not know
    them."""
    out = tmp_path / "fsdp.json"
    rc = main([*LARGE_80, "--config.parallel.mesh.data=1", "--config.parallel.mesh.fsdp=-1",
               "--layer-costs", "scanned", "--json", str(out)])
    record = json.loads(out.read_text())
    assert rc == 0 and record["fits"] and record["total_bytes"] < 16 * GIB
    assert record["mesh"] == {"data": 1, "fsdp": 8, "tensor": 1}
    assert record["params_bytes"] < 0.16 * GIB


def test_cli_bad_topology_is_one_error_line(capsys):
    rc = main(["compile", "--config", "experiments/pretrain.py:tiny", "--topology", "v7x-8"])
    assert rc == 2 and capsys.readouterr().err.startswith("error: --topology 'v7x-8'")


def test_default_config_on_a_tpu_host_takes_no_gpu_kernel(monkeypatch):
    """As on a TPU VM (default backend 'tpu'): the step's "auto" kernel choices (fused
    LayerNorm, GELU, MLM cross-entropy, flash attention) leave out every GPU (Triton) kernel
    and take the TPU attention kernel (a Mosaic custom call)."""
    import jax
    import jax.numpy as jnp

    from bert_jax import parallel
    from bert_jax.training.config import model_config
    from bert_jax.training.setup import abstract_batch, build_training

    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    config = load_config("experiments/pretrain.py:bert_base_phase1",
                         ["--config.model.num_hidden_layers=1", "--config.global_batch_size=8"])
    mesh = parallel.create_mesh(config.parallel.mesh, config.parallel.dcn_mesh,
                                devices=abstract_devices(parse_slice("v5e-8")))
    training = build_training(config, model_config(config), mesh)
    batch = abstract_batch(training.batch_shardings, 8, 128, 20)
    rng = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=parallel.replicated(mesh))
    text = training.train_step.lower(training.abstract_state, batch, rng).as_text()
    assert "triton" not in text.lower()
    assert text.count("tpu_custom_call") == 2  # the attention kernel, forward and backward


def test_finetuning_step_compiles(tmp_path, capsys):
    """The fine-tuning loop's step (GLUE MRPC: classification head, AdamW, batch 32) on a
    v5e-8 slice (the tiny model, one layer)."""
    out = tmp_path / "mrpc.json"
    rc = main(["compile", "--task", "glue:mrpc", "--topology", "v5e-8", "--json", str(out),
               "--config.model.preset=tiny", "--config.model.num_hidden_layers=1",
               "--config.model.vocab_size=1024"])
    text = capsys.readouterr().out
    assert rc == 0 and "fine-tuning mrpc (classification)" in text
    record = json.loads(out.read_text())
    assert record["fits"] and record["mesh"] == {"data": 8, "fsdp": 1, "tensor": 1}
    assert record["batch_per_chip"] == 4 and record["seq_len"] == 128
    assert record["compiled_flops"] > 0.95 * record["model_flops_per_sequence"] * 4


def test_packed_rows_compile_with_their_layout(tmp_path):
    """Packed pretraining data (``create-pretraining-data --pack``, 4 examples a row): the
    step compiles for the slice with the packed batch (per-token example ids and positions,
    per-slot [CLS] positions, NSP labels and weights), as the loop would feed it."""
    pytest.importorskip("tensorflow")
    from data.helpers import write_corpus, write_vocab

    write_corpus(tmp_path / "corpus", n_files=1, docs_per_file=6)
    vocab = write_vocab(str(tmp_path))
    data = tmp_path / "packed"
    assert main(["create-pretraining-data", "--input", str(tmp_path / "corpus"), "--tokenizer",
                 vocab, "--output-dir", str(data), "--max-seq-length", "64", "--num-shards",
                 "1", "--num-workers", "1", "--pack", "--max-examples-per-row", "4",
                 "--no-progress"]) == 0
    e = _compile("tiny", "v5e-8", SCAN, "--config.data.source=tfrecord",
                 f"--config.data.directory={data}", "--config.data.max_seq_length=64",
                 "--config.model.num_hidden_layers=2", "--config.model.vocab_size=1024",
                 layer_costs="scanned")
    assert e.fits and e.batch_per_chip * 8 == e.global_batch_size


LAMB = ("bert_base_lamb_phase1", "bert_base_lamb_phase2", "bert_large_lamb_phase1",
        "bert_large_lamb_phase2")


@pytest.mark.parametrize("variant", LAMB)
def test_lamb_recipes_are_you_et_al(variant):
    """You et al.'s mixed-batch LAMB: 65,536 x 128 for 7,037 steps, then 32,768 x 512 for
    1,563, the accumulation left to the compile (microbatches=0)."""
    c = load_config(f"experiments/pretrain.py:{variant}")
    phase1 = variant.endswith("phase1")
    assert (c.global_batch_size, c.data.max_seq_length, c.num_train_steps) == (
        (65_536, 128, 7_037) if phase1 else (32_768, 512, 1_563))
    assert c.optimizer.name == "lamb" and c.microbatches == 0 and c.model.scan_layers
    assert (c.optimizer.learning_rate, c.optimizer.warmup_steps) == (
        (6e-3, 2_000) if phase1 else (4e-3, 200))


# A LAMB recipe shrunk to the tiny model (2 scanned layers) on a v5e-8: 64 sequences per chip
TINY_LAMB = ["--config.model.preset=tiny", "--config.model.vocab_size=1024",
             "--config.global_batch_size=512"]
TWO_LAYERS = "--config.model.num_hidden_layers=2"


def test_lamb_recipe_compiles_with_accumulation():
    """The phase-1 recipe's step with 4 microbatches of 16 sequences per chip (2 scanned
    layers): XLA counts each loop body once, so the bytes come from the compiled program
    with its loops weighted by their trip counts (the parts add up to them) and the FLOPs
    from the model's, scaled by one small unrolled compile's ratio. On its data-parallel
    mesh the gradients are all-reduced once per step, after the loop: less than the
    parameters' bytes (kernels summed in bf16), where one reduction per microbatch inside
    the loop (the partitioner's) moves 3x them."""
    e = _compile("bert_large_lamb_phase1", "v5e-8", *TINY_LAMB, TWO_LAYERS,
                 "--config.microbatches=4", layer_costs="auto")
    assert e.fits and e.microbatches == 4 and e.micro_batch_per_chip == 16
    model = e.model_flops_per_sequence * e.batch_per_chip
    assert model < e.compiled_flops < 1.2 * model and e.loop_scale == 1.0
    assert e.hbm_bytes_accessed == pytest.approx(sum(e.hbm_parts.values()))
    assert set(e.hbm_parts) == {"forward", "backward", "optimizer", "accumulate",
                                "collectives", "other"}
    assert any("x their trip counts" in n for n in e.notes)
    [reduce] = e.collectives
    assert reduce["kind"] == "all-reduce" and reduce["payload_bytes"] < e.params_bytes


def test_byte_breakdown_counts_loops_by_their_trip_counts():
    """The HLO walk (``tpu/hlo.py``) of the accumulating step with its loop rolled equals
    that of the same step unrolled (within 10%: the loop's own bookkeeping), where XLA's
    own count of the rolled program counts the loop body once."""
    from bert_jax.tpu.compile import _compile_step
    from bert_jax.tpu.topologies import abstract_devices

    tpu = parse_slice("v5e-8")
    devices = abstract_devices(tpu)
    config = load_config("experiments/pretrain.py:bert_large_lamb_phase1", [
        "--config.model.preset=tiny", "--config.model.vocab_size=1024",
        "--config.model.num_hidden_layers=1", "--config.model.scan_layers=false",
        "--config.global_batch_size=64", "--config.microbatches=2"])
    rolled = _compile_step(config, tpu, devices)
    unrolled = _compile_step(config, tpu, devices, unroll_microbatches=True)
    walk = sum(unrolled.hbm_parts.values())
    assert walk > 0 and sum(rolled.hbm_parts.values()) == pytest.approx(walk, rel=0.1)
    assert rolled.hbm_bytes_accessed < 0.8 * unrolled.hbm_bytes_accessed  # XLA: body once
    assert all(c["group"] == 8 for c in rolled.collectives)


def test_max_batch_finds_the_largest_micro_batch_that_fits():
    """``--max-batch`` (what microbatches=0 does) on a chip given HBM halfway between what
    the step needs at the whole batch per chip and its state alone: the search compiles at
    the whole batch first, then brackets the largest micro-batch that fits; the next larger
    one was compiled and did not fit."""
    import dataclasses

    config = load_config("experiments/pretrain.py:bert_large_lamb_phase1",
                         [*TINY_LAMB, "--config.model.scan_layers=false",
                          "--config.model.num_hidden_layers=1", "--config.microbatches=1"])
    tpu = parse_slice("v5e-8")
    whole = compile_pretraining(config, tpu, layer_costs="scanned")
    fixed = whole.argument_bytes + whole.output_bytes + whole.code_bytes
    limit = (whole.total_bytes + fixed) // 2
    small = dataclasses.replace(tpu, chip=dataclasses.replace(tpu.chip, hbm_bytes=limit))
    lines = []
    e = compile_pretraining(config, small, layer_costs="scanned", max_batch=True,
                            report=lines.append)
    assert e.fits and 1 < e.microbatches < 64
    chosen = e.micro_batch_per_chip
    assert len(lines) == len(e.search) >= 2 and lines[0].startswith("probe")
    assert {p["micro_batch"]: p["fits"] for p in e.search}[2 * chosen] is False


def test_tpu_collective_matmul_options():
    """``parallel.tpu_collective_matmul``: XLA:TPU's windowed collective matmuls off
    (``off``, or ``auto`` on an FSDP mesh without tensor parallelism), as compile options of
    the step; CPU steps and other meshes get none. That the TPU compiler takes them (it
    refuses any option it does not know): every FSDP compile here passes them
    (test_large_fsdp_fits_v5e)."""
    from bert_jax import xla_flags

    fsdp, tensor = {"data": 1, "fsdp": 4, "tensor": 1}, {"data": 1, "fsdp": 2, "tensor": 2}
    off = xla_flags.TPU_COLLECTIVE_MATMUL_OFF
    assert xla_flags.tpu_compiler_options("tpu", "auto", fsdp) == off
    assert xla_flags.tpu_compiler_options("tpu", "auto", tensor) is None
    assert xla_flags.tpu_compiler_options("tpu", "auto", {"data": 4}) is None
    assert xla_flags.tpu_compiler_options("tpu", "allowed", fsdp) is None
    assert xla_flags.tpu_compiler_options("tpu", "off", {"data": 4}) == off
    assert xla_flags.tpu_compiler_options("cpu", "off", fsdp) is None
    with pytest.raises(BertJaxError, match="tpu_collective_matmul='no'"):
        xla_flags.tpu_compiler_options("tpu", "no")
