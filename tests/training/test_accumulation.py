"""Gradient accumulation sized to the device memory: the micro-batch search (with made-up
memory curves, no compiles) and the loop's own resolution of ``microbatches=0`` on CPU
devices (real compiles of a one-layer model)."""

import pytest

from bert_jax.errors import BertJaxError
from bert_jax.training.accumulation import Probe, largest_fitting, micro_batch_options

GIB = 2 ** 30


def _search(per_chip: int, limit: float, memory):
    """Runs the search over 64 chips with ``memory(m)`` GiB per chip at micro-batch m."""
    options = micro_batch_options(per_chip * 64, 64)

    def probe(m):
        used = memory(m)
        return Probe(m, per_chip // m, int(used * GIB), int(limit * GIB), used <= limit)

    return options, *largest_fitting(options, probe)


@pytest.mark.parametrize("per_chip,limit,memory", [
    (1024, 95, lambda m: 5 + 0.4 * m),  # BERT-Large/128 on v5p: ~227 fit, 128 chosen
    (512, 16, lambda m: 3 + m + 0.01 * m * m),  # curving upwards
    (1024, 100, lambda m: 1 + 0.05 * m),  # everything fits: no accumulation, one probe
    (96, 10, lambda m: 2 + 0.3 * m),  # divisors of 96, not only powers of two
])
def test_search_finds_the_largest_fitting_micro_batch(per_chip, limit, memory):
    options, best, made = _search(per_chip, limit, memory)
    truth = max(m for m in options if memory(m) <= limit)
    assert best.micro_batch == truth and best.fits
    assert best.microbatches * best.micro_batch == per_chip
    assert len(made) <= 6  # each probe is a compile: bisection or better
    larger = [m for m in options if m > truth]
    if larger:  # the next larger option was compiled and did not fit
        assert any(p.micro_batch == larger[0] and not p.fits for p in made)


def test_nothing_fits_is_one_clear_error():
    with pytest.raises(BertJaxError, match="not even 1 sequence"):
        _search(64, 2, lambda m: 3 + m)


def test_options_split_the_batch_evenly():
    assert micro_batch_options(65_536, 64) == [2 ** i for i in range(11)]
    with pytest.raises(BertJaxError, match="multiple of the 64 batch shards"):
        micro_batch_options(1000, 64)


def test_loop_resolves_auto_by_compiling_on_its_devices():
    """``microbatches=0`` as the loop resolves it (``setup.fit_microbatches``): the one-layer
    tiny model on this machine's first device, with a memory limit halfway between what the
    whole batch of 64 at once needs and what one sequence at a time needs; without a known
    limit (CPU devices report none) it is 1."""
    import jax
    import jax.numpy as jnp

    from bert_jax import parallel
    from bert_jax.training.config import load_config, model_config
    from bert_jax.training.setup import (
        abstract_batch,
        build_training,
        device_memory_limit,
        fit_microbatches,
    )

    config = load_config("experiments/pretrain.py:tiny", [
        "--config.model.num_hidden_layers=1", "--config.model.vocab_size=512",
        "--config.global_batch_size=64", "--config.microbatches=0"])
    mesh = parallel.create_mesh(config.parallel.mesh, config.parallel.dcn_mesh,
                                devices=jax.devices()[:1])
    assert device_memory_limit(mesh) is None
    model_cfg = model_config(config)
    assert fit_microbatches(config, model_cfg, mesh, None) == 1

    def memory(k):
        trial = config.copy_and_resolve_references()
        with trial.unlocked():
            trial.microbatches = k
        training = build_training(trial, model_cfg, mesh)
        batch = abstract_batch(training.batch_shardings, 64, 128, 20)
        rng = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=parallel.replicated(mesh))
        m = training.train_step.lower(training.abstract_state, batch, rng).compile() \
            .memory_analysis()
        return (m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
                + m.temp_size_in_bytes + m.generated_code_size_in_bytes)

    lines = []
    k = fit_microbatches(config, model_cfg, mesh, (memory(1) + memory(64)) // 2,
                         lines.append)
    assert 1 < k < 64 and 64 % k == 0
    assert "does not fit" in lines[0] and any(line.endswith(" fits") for line in lines)
