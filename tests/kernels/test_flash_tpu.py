"""The TPU attention kernel with in-kernel dropout (``kernels/flash_tpu.py``): values and
gradients against the reference in Pallas interpret mode (fp32 and bf16), the same dropout
masks as the GPU kernel and the reference path for the same salts, the masks' rate and
independence, the model choosing it for TPU targets, and ahead-of-time compiles of forward and
backward for v4, v5e and v5p chips (libtpu, no TPU needed)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from packing import assert_packed_equals_alone, segment_ids

from bert_jax.kernels import flash, flash_tpu
from bert_jax.modeling.attention import resolve_dropout_implementation
from bert_jax.parallel import target_platform, targeting


def _inputs(seed, batch=2, seq=64, heads=2, dim=32, dtype=jnp.float32):
    ks = jax.random.split(jax.random.key(seed), 4)
    q, k, v = (jax.random.normal(kk, (batch, seq, heads, dim), dtype) for kk in ks[:3])
    lengths = jnp.array([seq, seq // 2 + 5] * batch)[:batch]
    return q, k, v, lengths, flash.salt_from_rng(ks[3], batch, heads)


@pytest.mark.parametrize("rate,mask_hash", [(0.0, "rowcol"), (0.1, "rowcol"), (0.3, "flat")])
def test_values_and_gradients_match_reference_fp32(rate, mask_hash):
    q, k, v, lengths, salt = _inputs(0)

    def run(fn, **kw):
        def loss(q, k, v):
            out = fn(q, k, v, lengths, salt=salt, dropout_rate=rate, mask_hash=mask_hash, **kw)
            return jnp.sum(out * jnp.cos(out)), out  # a loss with a non-trivial cotangent

        (_, out), grads = jax.jit(jax.value_and_grad(loss, (0, 1, 2), has_aux=True))(q, k, v)
        return out, grads

    out, grads = run(flash_tpu.flash_attention, block_q=16)  # 4 query blocks
    ref, ref_grads = run(flash.reference_attention)
    np.testing.assert_allclose(out, ref, atol=2e-5, rtol=2e-5)
    for g, r in zip(grads, ref_grads, strict=True):
        np.testing.assert_allclose(g, r, atol=5e-5, rtol=5e-5)
    # padded keys get no weight: their values and gradients do not matter
    assert float(jnp.abs(grads[1][1, 40:]).max()) == 0.0
    assert float(jnp.abs(grads[2][1, 40:]).max()) == 0.0


# Packed rows of 64 tokens: three examples (10, 27, 13) and 14 padding tokens, the second
# example straddling the 16- and 32-query blocks; two examples filling a row.
PACKED = ((10, 27, 13), (20, 44))


def test_segment_ids_match_reference_fp32():
    """Segment ids (packed rows) with dropout: values and gradients equal the reference with
    the same ids; padding queries give 0 and no gradient."""
    q, k, v, _, salt = _inputs(10)
    ids = segment_ids(PACKED, 64)
    lengths = jnp.sum(ids != 0, axis=1)

    def run(fn, **kw):
        def loss(q, k, v):
            out = fn(q, k, v, lengths, salt=salt, dropout_rate=0.2, segment_ids=ids, **kw)
            return jnp.sum(out * jnp.cos(out)), out

        (_, out), grads = jax.jit(jax.value_and_grad(loss, (0, 1, 2), has_aux=True))(q, k, v)
        return out, grads

    out, grads = run(flash_tpu.flash_attention, block_q=16)
    ref, ref_grads = run(flash.reference_attention)
    np.testing.assert_allclose(out, ref, atol=2e-5, rtol=2e-5)
    for g, r in zip(grads, ref_grads, strict=True):
        np.testing.assert_allclose(g, r, atol=5e-5, rtol=5e-5)
    padding = np.asarray(ids) == 0
    assert float(jnp.abs(out[padding]).max()) == 0.0
    assert all(float(jnp.abs(g[padding]).max()) == 0.0 for g in grads)
    with pytest.raises(ValueError, match="segment_ids"):
        flash_tpu.flash_attention(q, k, v, lengths, segment_ids=ids[:, :32])


def test_packed_rows_equal_examples_alone():
    """Each example of a packed row gets the outputs and gradients it gets alone in a row of
    its own (kv_lengths, no segment ids)."""
    q, k, v, _, _ = _inputs(11)

    def attention(q, k, v, lengths, segment_ids):
        return flash_tpu.flash_attention(q, k, v, lengths, segment_ids=segment_ids, block_q=16)

    assert_packed_equals_alone(attention, q, k, v, segment_ids(PACKED, 64), atol=2e-5)


def test_bf16_close_to_fp32_reference():
    q, k, v, lengths, salt = _inputs(1, dtype=jnp.bfloat16)
    kw = dict(salt=salt, dropout_rate=0.1)
    out = flash_tpu.flash_attention(q, k, v, lengths, **kw)
    assert out.dtype == jnp.bfloat16
    ref = flash.reference_attention(*(x.astype(jnp.float32) for x in (q, k, v)), lengths, **kw)
    np.testing.assert_allclose(out.astype(jnp.float32), ref, atol=3e-2, rtol=3e-2)
    grad = jax.grad(lambda q: flash_tpu.flash_attention(q, k, v, lengths, **kw)
                    .astype(jnp.float32).sum())(q)
    ref_grad = jax.grad(lambda q: flash.reference_attention(
        q, k.astype(jnp.float32), v.astype(jnp.float32), lengths, **kw).sum())(
        q.astype(jnp.float32))
    assert grad.dtype == jnp.bfloat16
    np.testing.assert_allclose(grad.astype(jnp.float32), ref_grad, atol=6e-2, rtol=6e-2)


def _kept(fn, salt, rate, seq=64, mask_hash="rowcol", **kw):
    """The dropout mask an attention kernel applied, read from its output: with zero queries
    and keys every probability is 1/seq, and with the identity as values output [q, d=k] is
    keep[q, k] / (seq * (1 - rate))."""
    batch, heads = salt.shape
    zeros = jnp.zeros((batch, seq, heads, seq), jnp.float32)
    eye = jnp.broadcast_to(jnp.eye(seq, dtype=jnp.float32)[None, :, None, :], zeros.shape)
    out = fn(zeros, zeros, eye, jnp.full((batch,), seq), salt=salt, dropout_rate=rate,
             mask_hash=mask_hash, **kw)
    kept = np.asarray(out) * seq * (1.0 - rate)  # [b, q, h, k]
    assert np.allclose(kept, np.round(kept), atol=1e-4)
    return np.transpose(np.round(kept).astype(bool), (0, 2, 1, 3))  # [b, h, q, k]


@pytest.mark.parametrize("mask_hash", ["rowcol", "flat"])
def test_same_masks_as_gpu_kernel_and_reference(mask_hash):
    salt = flash.salt_from_rng(jax.random.key(3), 2, 2)
    rate = 0.25
    tpu = _kept(flash_tpu.flash_attention, salt, rate, mask_hash=mask_hash, block_q=32)
    gpu = _kept(flash.flash_attention, salt, rate, mask_hash=mask_hash, interpret=True)
    reference = np.asarray(flash.dropout_keep_mask(salt, 64, 64, rate, mask_hash))
    np.testing.assert_array_equal(tpu, reference)
    np.testing.assert_array_equal(gpu, reference)


def test_mask_rate_and_independence():
    rate = 0.1
    salt = flash.salt_from_rng(jax.random.key(7), 4, 4)
    keep = _kept(flash_tpu.flash_attention, salt, rate, seq=128)  # [4, 4, 128, 128]
    n = keep.size
    dropped = 1.0 - keep.mean()
    assert abs(dropped - rate) < 4 * np.sqrt(rate * (1 - rate) / n)  # 4 sigma
    flat = keep.reshape(16, -1).astype(np.float64)
    corr = np.corrcoef(flat)[np.triu_indices(16, 1)]  # between (example, head) masks
    assert np.abs(corr).max() < 0.05
    rows = keep.reshape(-1, 128).astype(np.float64)  # neighbouring query rows
    assert abs(np.corrcoef(rows[:-1].ravel(), rows[1:].ravel())[0, 1]) < 0.02
    cols = np.swapaxes(keep, -1, -2).reshape(-1, 128).astype(np.float64)
    assert abs(np.corrcoef(cols[:-1].ravel(), cols[1:].ravel())[0, 1]) < 0.02


def test_auto_picks_the_tpu_kernel_for_tpu_targets():
    q = jnp.zeros((2, 128, 4, 64))
    assert target_platform() == "cpu"
    assert resolve_dropout_implementation("auto", q, q) == "explicit"
    with targeting("tpu"):
        assert target_platform() == "tpu"
        assert resolve_dropout_implementation("auto", q, q) == "flash_tpu"
        short = jnp.zeros((2, 100, 4, 64))  # not a multiple of 128
        assert resolve_dropout_implementation("auto", short, short) == "explicit"
    with targeting("cuda"):
        assert resolve_dropout_implementation("auto", q, q) == "flash"
    assert target_platform() == "cpu"


@pytest.mark.parametrize("topology", ["v4-8", "v5e-1", "v5p-8"])
def test_compiles_for_tpu(topology):
    from jax.sharding import SingleDeviceSharding

    from bert_jax.tpu.topologies import abstract_devices, parse_slice

    device = abstract_devices(parse_slice(topology))[0]
    sharding = SingleDeviceSharding(device)
    batch, seq, heads, dim = 2, 512, 16, 64
    x = jax.ShapeDtypeStruct((batch, seq, heads, dim), jnp.bfloat16, sharding=sharding)
    lengths = jax.ShapeDtypeStruct((batch,), jnp.int32, sharding=sharding)
    salt = jax.ShapeDtypeStruct((batch, heads), jnp.int32, sharding=sharding)

    def step(q, k, v, lengths, salt):
        def loss(q, k, v):
            return flash_tpu.flash_attention(q, k, v, lengths, salt=salt, dropout_rate=0.1,
                                             interpret=False).astype(jnp.float32).sum()
        return jax.grad(loss, (0, 1, 2))(q, k, v)

    compiled = jax.jit(step).lower(x, x, x, lengths, salt).compile()
    text = compiled.as_text()
    assert "bert_flash_tpu_forward" in text and "bert_flash_tpu_backward" in text
    assert compiled.memory_analysis().temp_size_in_bytes < 64 * 2 ** 20
    # the kernels' cost estimates: 4 (forward) + 10 (backward) x b*h*q*k*d FLOPs
    assert compiled.cost_analysis()["flops"] >= 14 * batch * heads * seq * seq * dim


@pytest.mark.parametrize("topology", ["v4-8", "v5e-1", "v5p-8"])
def test_compiles_for_tpu_with_segment_ids(topology):
    """With segment ids (query ids [b, q, 1] and key ids [b, 1, k] in vector memory), forward
    and backward with dropout compile for TPU chips."""
    from jax.sharding import SingleDeviceSharding

    from bert_jax.tpu.topologies import abstract_devices, parse_slice

    sharding = SingleDeviceSharding(abstract_devices(parse_slice(topology))[0])
    batch, seq, heads, dim = 2, 512, 16, 64

    def sd(shape, dtype=jnp.int32):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)

    def step(q, k, v, lengths, salt, ids):
        def loss(q, k, v):
            return flash_tpu.flash_attention(q, k, v, lengths, salt=salt, dropout_rate=0.1,
                                             interpret=False, segment_ids=ids
                                             ).astype(jnp.float32).sum()
        return jax.grad(loss, (0, 1, 2))(q, k, v)

    x = sd((batch, seq, heads, dim), jnp.bfloat16)
    compiled = jax.jit(step).lower(x, x, x, sd((batch,)), sd((batch, heads)),
                                   sd((batch, seq))).compile()
    text = compiled.as_text()
    assert "bert_flash_tpu_forward" in text and "bert_flash_tpu_backward" in text
    assert compiled.memory_analysis().temp_size_in_bytes < 64 * 2 ** 20


def test_model_training_step_same_on_both_kernels():
    """The encoder trained with attention dropout gives the same output and gradients through
    the GPU kernel (dropout_attention_impl='flash') and the TPU kernel ('flash_tpu'), both in
    interpret mode here: same salts, same masks, so a run is reproducible across backends."""
    import warnings

    from bert_jax.config import get_preset
    from bert_jax.modeling import BertModel

    cfg = get_preset("tiny", vocab_size=300, num_hidden_layers=1, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.2)
    ids = jax.random.randint(jax.random.key(0), (2, 32), 5, 300)
    mask = jnp.stack([jnp.ones(32, jnp.int32), (jnp.arange(32) < 20).astype(jnp.int32)])
    params = jax.jit(BertModel(cfg).init)(jax.random.key(1), ids, mask)
    probe = jax.random.normal(jax.random.key(3), (2, 32, cfg.hidden_size))

    def loss(p, impl):
        out = BertModel(cfg.with_kernels(dropout_attention_impl=impl)).apply(
            p, ids, mask, deterministic=False, rngs={"dropout": jax.random.key(2)})
        return jnp.mean(out["sequence_output"] * probe)

    loss_and_grads = jax.jit(jax.value_and_grad(loss), static_argnums=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the GPU kernel's interpret-mode note
        gpu, gpu_grads = loss_and_grads(params, "flash")
    tpu, tpu_grads = loss_and_grads(params, "flash_tpu")
    # a threefry mask: a different draw
    explicit = jax.jit(loss, static_argnums=1)(params, "explicit")
    np.testing.assert_allclose(tpu, gpu, rtol=1e-5)
    assert abs(float(explicit - gpu)) > 1e-6
    for a, b in zip(jax.tree.leaves(tpu_grads), jax.tree.leaves(gpu_grads), strict=True):
        np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-4)


def test_split_over_mesh_equals_one_device():
    """Under a mesh the kernel runs per shard of batch and heads (shard_map); the salts are
    drawn for the global batch first, so the result is the one-device result."""
    from bert_jax import parallel
    from bert_jax.modeling.attention import dropout_attention

    q, k, v, lengths, _ = _inputs(6, batch=4, heads=2)
    rng = jax.random.key(3)

    def run(*a):
        return dropout_attention(*a, dropout_rng=rng, dropout_rate=0.1,
                                 implementation="flash_tpu")

    single = jax.jit(run)(q, k, v, lengths)
    mesh = parallel.create_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    sharded = jax.jit(parallel.traced_in_mesh(lambda *a: run(*a), mesh,
                                              parallel.DEFAULT_RULES))(q, k, v, lengths)
    np.testing.assert_allclose(sharded, single, atol=1e-6)
