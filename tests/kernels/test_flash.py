"""The Pallas flash-attention kernel with in-kernel dropout (interpret mode on the CPU):
forward and gradients against the jax.numpy reference with the same mask, the mask's
statistics, and the model's training path through it, on one device and split over a mesh."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from float_sums import assert_same_sums
from packing import assert_packed_equals_alone, segment_ids
from tolerance import close
from triton_lowering import cuda_lowering_text

from bert_jax import parallel
from bert_jax.config import KERNEL_FIELDS, KernelOptions, get_preset
from bert_jax.kernels import flash
from bert_jax.modeling import BertModel
from bert_jax.modeling.attention import (
    dropout_attention,
    dropout_attention_packed,
    resolve_dropout_implementation,
)

# One worker runs the module: its module fixtures are computed once (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("flash")


def _inputs(seed, batch=2, seq=64, heads=3, dim=16, dtype=jnp.float32):
    ks = jax.random.split(jax.random.key(seed), 4)
    q, k, v = (jax.random.normal(kk, (batch, seq, heads, dim), dtype) for kk in ks[:3])
    lengths = jnp.array([seq, seq // 2 + 7] * batch)[:batch]
    salt = flash.salt_from_rng(ks[3], batch, heads)
    return q, k, v, lengths, salt


# Several tilings: one block, several key blocks in forward and backward, uneven q/k blocks.
# (The fused backward's defaults are 16-query blocks: the first tiling covers those.)
BLOCKS = [dict(backward="fused"), dict(block_q=32, block_k=16, block_q_bwd=16, block_k_bwd=32,
                                      backward="split"),
          dict(block_q=16, block_k=64, block_q_bwd=64, block_k_bwd=16, backward="split"),
          dict(block_q=16, block_q_bwd=16, block_k_bwd=16, num_stages=3, backward="split"),
          # the dQ kernel with its own tiling (16 queries x 32-key steps; dK/dV: 32 x 16)
          dict(block_q_bwd=16, block_k_bwd=32, dq_kernel=(16, 32, 4, 2), backward="split")]


def _outputs_and_grads(fn, *args, cot):
    """fn(*args) and the gradients of sum(cot * fn(*args)) for every argument (op by op:
    the kernels' programs are compiled once for all tests of the same shapes)."""
    def loss(*a):
        out = fn(*a)
        return jnp.sum(cot * out), out

    (_, out), grads = jax.value_and_grad(loss, range(len(args)), has_aux=True)(*args)
    return out, grads


@pytest.mark.parametrize("rate,blocks", [(0.5, b) for b in range(len(BLOCKS))]
                         + [(0.0, 0), (0.0, 1)])
def test_flash_matches_reference_forward_and_gradients(rate, blocks):
    """A high rate on every tiling, no dropout on the fused and a split backward (rate 0.1,
    the default: the bias tests below)."""
    q, k, v, lengths, salt = _inputs(blocks)
    cot = jax.random.normal(jax.random.key(9), q.shape)

    def ours(*qkv):
        return flash.flash_attention(*qkv, lengths, salt=salt, dropout_rate=rate,
                                     **BLOCKS[blocks])

    def ref(*qkv):
        return flash.reference_attention(*qkv, lengths, salt=salt, dropout_rate=rate)

    out, g_ours = _outputs_and_grads(ours, q, k, v, cot=cot)
    want, g_ref = _outputs_and_grads(ref, q, k, v, cot=cot)
    np.testing.assert_allclose(out, want, **close(atol=2e-6, rtol=1e-5))
    for a, b in zip(g_ours, g_ref, strict=True):
        np.testing.assert_allclose(a, b, **close(atol=1e-5, rtol=1e-4))


@pytest.mark.parametrize("blocks", [0, 1, 2, 4])
def test_flash_with_projection_biases(blocks):
    """qkv_bias: attention over query + bq etc.; values and gradients match the reference on
    biased inputs for the fused backward and split tilings with several query and key blocks
    per backward program and a dQ kernel of its own, the biases' gradients (the backward
    kernels' partial sums) included."""
    q, k, v, lengths, salt = _inputs(blocks + 20)
    biases = tuple(jax.random.normal(jax.random.key(30 + i), (3, 16)) for i in range(3))
    cot = jax.random.normal(jax.random.key(9), q.shape)

    def ours(q, k, v, bq, bk, bv):
        return flash.flash_attention(q, k, v, lengths, salt=salt, dropout_rate=0.1,
                                     qkv_bias=(bq, bk, bv), **BLOCKS[blocks])

    def ref(q, k, v, bq, bk, bv):
        return flash.reference_attention(q + bq, k + bk, v + bv, lengths, salt=salt,
                                         dropout_rate=0.1)

    args = (q, k, v, *biases)
    out, grads = _outputs_and_grads(ours, *args, cot=cot)
    want, want_grads = _outputs_and_grads(ref, *args, cot=cot)
    np.testing.assert_allclose(jnp.sum(cot * out), jnp.sum(cot * want), **close(rtol=1e-5))
    for a, b in zip(grads, want_grads, strict=True):
        np.testing.assert_allclose(a, b, **close(atol=2e-5, rtol=1e-4))
    with pytest.raises(ValueError, match="qkv_bias"):
        flash.flash_attention(q, k, v, lengths, qkv_bias=biases[:2])


@pytest.mark.parametrize("blocks", [0, 2, 4])
def test_packed_equals_separate_query_key_value(blocks):
    """flash_attention_packed reads q/k/v as slots of one [b, s, 3, h, d] array and writes
    the gradient packed (whole-array stores; the split backward's dQ kernel writes slot 0 of
    the dK/dV kernel's output in place): values and every gradient, bias included, equal the
    separate-array kernels' for the fused backward and for split ones with the dK/dV
    kernel's tiling and with a dQ tiling of its own."""
    q, k, v, lengths, salt = _inputs(blocks + 40)
    bias = jax.random.normal(jax.random.key(50), (3, 3, 16))
    cot = jax.random.normal(jax.random.key(9), q.shape)

    def packed(qkv, b):
        return flash.flash_attention_packed(qkv, lengths, salt=salt, dropout_rate=0.1,
                                            qkv_bias=b, **BLOCKS[blocks])

    def separate(qkv, b):
        return flash.flash_attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], lengths,
                                     salt=salt, dropout_rate=0.1, qkv_bias=tuple(b),
                                     **BLOCKS[blocks])

    qkv = jnp.stack([q, k, v], axis=2)
    out, grads = _outputs_and_grads(packed, qkv, bias, cot=cot)
    want, want_grads = _outputs_and_grads(separate, qkv, bias, cot=cot)
    np.testing.assert_allclose(jnp.sum(cot * out), jnp.sum(cot * want), **close(rtol=1e-6))
    for a, b in zip(grads, want_grads, strict=True):
        assert a.shape == b.shape
        # The bias gradient sums over the tokens in another grouping (tests/float_sums.py).
        assert_same_sums(a, b, q.shape[0] * q.shape[1])
    # Without a bias, and against the jax.numpy reference.
    out = flash.flash_attention_packed(qkv, lengths, salt=salt, dropout_rate=0.1,
                                       **BLOCKS[blocks])
    ref = flash.reference_attention(q, k, v, lengths, salt=salt, dropout_rate=0.1)
    np.testing.assert_allclose(out, ref, **close(atol=2e-6, rtol=1e-5))
    with pytest.raises(ValueError, match=r"\[batch, seq, 3, heads, head_dim\]"):
        flash.flash_attention_packed(q, lengths)
    with pytest.raises(ValueError, match="packed qkv_bias"):
        flash.flash_attention_packed(qkv, lengths, qkv_bias=bias[:2])


def test_flash_bfloat16_close_to_float32():
    q, k, v, lengths, salt = _inputs(4)
    bf = [x.astype(jnp.bfloat16) for x in (q, k, v)]
    out = flash.flash_attention(*bf, lengths, salt=salt, dropout_rate=0.1)
    assert out.dtype == jnp.bfloat16
    ref = flash.reference_attention(*bf, lengths, salt=salt, dropout_rate=0.1)
    np.testing.assert_allclose(out.astype(np.float32), ref.astype(np.float32), **close(atol=3e-2))


def test_dropout_changes_output_and_padding_is_ignored():
    q, k, v, lengths, salt = _inputs(5)
    plain = flash.flash_attention(q, k, v, lengths)
    dropped = flash.flash_attention(q, k, v, lengths, salt=salt, dropout_rate=0.1)
    assert float(jnp.abs(plain - dropped).max()) > 1e-2
    # keys beyond an example's length do not matter: change them, outputs stay the same
    n = int(lengths[1])
    k2 = k.at[1, n:].set(100.0)
    v2 = v.at[1, n:].set(-100.0)
    again = flash.flash_attention(q, k2, v2, lengths, salt=salt, dropout_rate=0.1)
    np.testing.assert_allclose(again, dropped, **close(atol=1e-6))


@pytest.mark.parametrize("mask_hash", ["rowcol", "flat"])
def test_mask_statistics(mask_hash):
    salt = flash.salt_from_rng(jax.random.key(0), 4, 4)
    for rate in (0.1, 0.3):
        keep = np.asarray(flash.dropout_keep_mask(salt, 128, 128, rate, mask_hash))
        assert abs(keep.mean() - (1 - rate)) < 0.005  # 262k draws: sd 0.0006-0.0009
        # per (example, head) rates and neighbouring elements look independent
        assert np.abs(keep.mean(axis=(2, 3)) - (1 - rate)).max() < 0.02
        x = keep.astype(np.float64) - keep.mean()
        for shifted in (np.roll(x, 1, axis=-1), np.roll(x, 1, axis=-2), np.roll(x, 1, axis=1)):
            assert abs((x * shifted).mean() / x.var()) < 0.02
    # different salts give different masks; the same salt the same mask
    other = flash.salt_from_rng(jax.random.key(1), 4, 4)
    a = flash.dropout_keep_mask(salt, 64, 64, 0.1, mask_hash)
    assert float(jnp.mean(a != flash.dropout_keep_mask(other, 64, 64, 0.1, mask_hash))) > 0.1
    assert bool(jnp.all(a == flash.dropout_keep_mask(salt, 64, 64, 0.1, mask_hash)))


@pytest.mark.parametrize("blocks", [1, 0])
def test_flat_hash_matches_reference(blocks):
    """The kernels with the ``flat`` mask hash (split and fused backward) against the
    reference with the same hash."""
    q, k, v, lengths, salt = _inputs(blocks)
    cot = jax.random.normal(jax.random.key(9), q.shape)
    kw = dict(salt=salt, dropout_rate=0.3, mask_hash="flat")
    ours = lambda *a: flash.flash_attention(*a, lengths, **kw, **BLOCKS[blocks])  # noqa: E731
    ref = lambda *a: flash.reference_attention(*a, lengths, **kw)  # noqa: E731
    out, g_ours = _outputs_and_grads(ours, q, k, v, cot=cot)
    want, g_ref = _outputs_and_grads(ref, q, k, v, cot=cot)
    np.testing.assert_allclose(out, want, **close(atol=2e-6, rtol=1e-5))
    assert float(jnp.abs(out - flash.reference_attention(
        q, k, v, lengths, salt=salt, dropout_rate=0.3)).max()) > 1e-2  # rowcol differs
    for a, b in zip(g_ours, g_ref, strict=True):
        np.testing.assert_allclose(a, b, **close(atol=1e-5, rtol=1e-4))


def test_unsupported_shapes_and_missing_salt_are_refused():
    q, k, v, lengths, _ = _inputs(0, seq=40)
    with pytest.raises(ValueError, match="divisible by 16"):
        flash.flash_attention(q, k, v, lengths)
    q, k, v, lengths, _ = _inputs(0)
    with pytest.raises(ValueError, match="salt"):
        flash.flash_attention(q, k, v, lengths, dropout_rate=0.1)
    with pytest.raises(ValueError, match="dq_kernel"):
        flash.flash_attention(q, k, v, lengths, backward="split", dq_kernel=(64, 64))
    # auto picks the explicit path off GPU and for unsupported shapes
    assert resolve_dropout_implementation("auto", q, k) in ("explicit", "flash")
    assert resolve_dropout_implementation("auto", q[:, :40], k[:, :40]) == "explicit"


def test_dropout_attention_split_over_mesh_equals_one_device():
    """shard_map over batch (data x fsdp) and heads (tensor) gives the one-device result: the
    salts are drawn for the global batch before the split."""
    q, k, v, lengths, _ = _inputs(6, batch=4, heads=2)
    rng = jax.random.key(3)

    def run(*a):
        return dropout_attention(*a, dropout_rng=rng, dropout_rate=0.1,
                                 implementation="flash")

    with pytest.warns(UserWarning, match="interpret mode"):
        single = jax.jit(run)(q, k, v, lengths)
    mesh = parallel.create_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    # A function of its own: jit's trace cache does not see the entered mesh.
    sharded = jax.jit(parallel.traced_in_mesh(lambda *a: run(*a), mesh,
                                              parallel.DEFAULT_RULES))(q, k, v, lengths)
    np.testing.assert_allclose(sharded, single, **close(atol=1e-6))


def test_flash_biases_split_over_mesh_equal_one_device():
    """With the projection biases, shard_map splits them on heads and sums their per-shard
    gradients over the batch axes: values and all gradients equal one device's."""
    q, k, v, lengths, _ = _inputs(7, batch=4, heads=2)
    biases = tuple(jax.random.normal(jax.random.key(40 + i), (2, 16)) for i in range(3))
    cot = jax.random.normal(jax.random.key(8), q.shape)
    rng = jax.random.key(3)

    def loss(q, k, v, bq, bk, bv):
        out = dropout_attention(q, k, v, lengths, dropout_rng=rng, dropout_rate=0.1,
                                implementation="flash", qkv_bias=(bq, bk, bv))
        return jnp.sum(out * cot)

    args = (q, k, v, *biases)
    with pytest.warns(UserWarning, match="interpret mode"):
        single = jax.jit(jax.value_and_grad(loss, range(6)))(*args)
    mesh = parallel.create_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    sharded = jax.jit(parallel.traced_in_mesh(jax.value_and_grad(
        lambda *a: loss(*a), range(6)), mesh, parallel.DEFAULT_RULES))(*args)
    np.testing.assert_allclose(sharded[0], single[0], **close(rtol=1e-5))
    for a, b in zip(sharded[1], single[1], strict=True):
        np.testing.assert_allclose(a, b, **close(atol=1e-5, rtol=1e-5))


def test_packed_split_over_mesh_equals_one_device():
    """dropout_attention_packed under shard_map (batch over data x fsdp, heads over tensor,
    the packed axis whole): value and gradients, the [3, heads, head_dim] bias's included,
    equal one device's."""
    q, k, v, lengths, _ = _inputs(8, batch=4, heads=2)
    qkv = jnp.stack([q, k, v], axis=2)
    bias = jax.random.normal(jax.random.key(41), (3, 2, 16))
    cot = jax.random.normal(jax.random.key(8), q.shape)
    rng = jax.random.key(3)

    def loss(qkv, b):
        out = dropout_attention_packed(qkv, lengths, dropout_rng=rng, dropout_rate=0.1,
                                       implementation="flash", qkv_bias=b)
        return jnp.sum(out * cot)

    with pytest.warns(UserWarning, match="interpret mode"):
        single = jax.jit(jax.value_and_grad(loss, (0, 1)))(qkv, bias)
    mesh = parallel.create_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    sharded = jax.jit(parallel.traced_in_mesh(jax.value_and_grad(
        lambda *a: loss(*a), (0, 1)), mesh, parallel.DEFAULT_RULES))(qkv, bias)
    np.testing.assert_allclose(sharded[0], single[0], **close(rtol=1e-5))
    for a, b in zip(sharded[1], single[1], strict=True):
        np.testing.assert_allclose(a, b, **close(atol=1e-5, rtol=1e-5))
    # The explicit implementation takes the slices (and adds the bias) instead.
    explicit = dropout_attention_packed(qkv, lengths, dropout_rng=rng, dropout_rate=0.0,
                                        implementation="explicit", qkv_bias=bias)
    ref = flash.reference_attention(q + bias[0], k + bias[1], v + bias[2], lengths)
    np.testing.assert_allclose(explicit, ref, **close(atol=2e-6, rtol=1e-5))


# Loss and gradients of two float32 summation orders (tests/float_sums.py): in the one layer,
# the parameter gradients' sums over 64 tokens and the sums over hidden.
_SUMMANDS = 64 + 128


def _tiny_training_loss(cfg, mask=None):
    """(params, loss(params, **config overrides)): a tiny BertModel trained with dropout on
    one fixed batch, two examples of 32 tokens (the second padded after 20 unless ``mask``
    is given), its sequence output against a fixed probe."""
    ids = jax.random.randint(jax.random.key(0), (2, 32), 5, 300)
    if mask is None:
        mask = jnp.stack([jnp.ones(32, jnp.int32), (jnp.arange(32) < 20).astype(jnp.int32)])
    params = jax.jit(BertModel(cfg).init)(jax.random.key(1), ids, mask)
    probe = jax.random.normal(jax.random.key(3), (2, 32, cfg.hidden_size))

    def loss(p, **overrides):
        kernels = {k: overrides.pop(k) for k in list(overrides) if k in KERNEL_FIELDS}
        out = BertModel(cfg.replace(**overrides).with_kernels(**kernels)).apply(
            p, ids, mask, deterministic=False, rngs={"dropout": jax.random.key(2)})
        return jnp.mean(out["sequence_output"] * probe)

    return params, loss


@pytest.fixture(scope="module")
def flash_model_runs():
    """(config, params, {(qkv_projection, flash_bias_grads): (loss, gradients)}): the tiny
    model (one layer) trained through the flash kernel, each way of projecting and of summing
    the bias gradients."""
    cfg = get_preset("tiny", vocab_size=300, num_hidden_layers=1,
                     kernels=KernelOptions(dropout_attention_impl="flash"))
    params, loss = _tiny_training_loss(cfg)
    runs = {(projection, bias_grads): jax.jit(jax.value_and_grad(functools.partial(
        loss, qkv_projection=projection, flash_bias_grads=bias_grads)))(params)
        for projection in ("packed", "split") for bias_grads in (True, False)}
    return cfg, params, runs


@pytest.mark.parametrize("bias_grads", [True, False])
def test_model_packed_projection_equals_split(bias_grads, flash_model_runs):
    """qkv_projection=packed (one matmul, the kernel reading the slots in place, the
    gradient packed) trains to the same loss and gradients as split; evaluation, which has no
    dropout and so no flash kernel, computes as split."""
    cfg, params, runs = flash_model_runs
    cfg = cfg.with_kernels(flash_bias_grads=bias_grads)
    packed, split = runs["packed", bias_grads], runs["split", bias_grads]
    np.testing.assert_allclose(packed[0], split[0], **close(rtol=1e-6))
    bias_grad = packed[1]["params"]["encoder"]["layer_0"]["attention"]["qkv"]["bias"]
    assert float(jnp.abs(nn.unbox(bias_grad)).max()) > 0
    for a, b in zip(jax.tree.leaves(packed[1]), jax.tree.leaves(split[1]), strict=True):
        assert_same_sums(a, b, _SUMMANDS)
    ids = jax.random.randint(jax.random.key(0), (2, 32), 5, 300)
    evaluated = [jax.jit(BertModel(cfg.with_kernels(qkv_projection=p)).apply)(
        params, ids, jnp.ones_like(ids)) for p in ("packed", "split")]
    np.testing.assert_array_equal(evaluated[0]["sequence_output"],
                                  evaluated[1]["sequence_output"])


def test_model_bias_gradients_from_the_kernel_equal_xla_sums(flash_model_runs):
    """The encoder hands the query/key/value biases to flash_attention
    (BertConfig.flash_bias_grads): same loss and gradients as XLA's bias adds and column
    sums."""
    _, _, runs = flash_model_runs
    in_kernel, with_xla = runs["packed", True], runs["packed", False]
    np.testing.assert_allclose(in_kernel[0], with_xla[0], **close(rtol=1e-6))
    bias_grad = in_kernel[1]["params"]["encoder"]["layer_0"]["attention"]["qkv"]["bias"]
    assert float(jnp.abs(nn.unbox(bias_grad)).max()) > 0  # trained through the kernel's sums
    for a, b in zip(jax.tree.leaves(in_kernel[1]), jax.tree.leaves(with_xla[1]), strict=True):
        assert_same_sums(a, b, _SUMMANDS)


def test_model_trains_through_flash():
    """The encoder's training path with dropout_attention_impl=flash: dropout is active
    (output differs from eval), gradients are finite and close to the explicit path's
    without dropout noise (same parameters, attention dropout only differs by its mask)."""
    cfg = get_preset("tiny", vocab_size=300, num_hidden_layers=1, hidden_dropout_prob=0.0)
    ids = jax.random.randint(jax.random.key(0), (2, 32), 5, 300)
    mask = jnp.stack([jnp.ones(32, jnp.int32), (jnp.arange(32) < 20).astype(jnp.int32)])
    params = jax.jit(BertModel(cfg).init)(jax.random.key(1), ids, mask)
    probe = jax.random.normal(jax.random.key(3), (2, 32, cfg.hidden_size))

    def loss(p, impl, rate):
        model = BertModel(cfg.replace(attention_probs_dropout_prob=rate).with_kernels(
            dropout_attention_impl=impl))
        out = model.apply(p, ids, mask, deterministic=False,
                          rngs={"dropout": jax.random.key(2)})
        return jnp.mean(out["sequence_output"] * probe)

    eval_loss = jnp.mean(jax.jit(BertModel(cfg).apply)(params, ids, mask)["sequence_output"]
                         * probe)
    flash_loss, grads = jax.jit(jax.value_and_grad(loss), static_argnums=(1, 2))(
        params, "flash", 0.1)
    assert abs(float(flash_loss - eval_loss)) > 1e-6
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grads))
    # at a tiny rate the mask almost never drops: both paths agree with eval-mode gradients
    grad = jax.jit(jax.grad(loss), static_argnums=(1, 2))
    g_flash = grad(params, "flash", 1e-6)
    g_explicit = grad(params, "explicit", 1e-6)
    for a, b in zip(jax.tree.leaves(g_flash), jax.tree.leaves(g_explicit), strict=True):
        np.testing.assert_allclose(a, b, **close(atol=1e-5))


def test_flash_under_scan_and_remat():
    """The kernel's custom VJP composes with the scanned layer stack (finite gradients) and
    rematerialization: remat recomputes the forward (same salts from the same keys), so
    gradients are equal."""
    cfg = get_preset("tiny", vocab_size=300, scan_layers=True,
                     kernels=KernelOptions(dropout_attention_impl="flash"))
    params, loss = _tiny_training_loss(cfg, mask=jnp.ones((2, 32), jnp.int32))
    grads = jax.jit(jax.grad(functools.partial(loss, remat_policy="dots")))(params)
    reference = jax.jit(jax.grad(functools.partial(loss, remat_policy="none")))(params)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(reference), strict=True):
        np.testing.assert_allclose(a, b, **close(atol=1e-6))
        assert bool(jnp.all(jnp.isfinite(a))) and bool(jnp.all(jnp.isfinite(b)))


@pytest.mark.parametrize("backward", ["fused", "split"])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("packed", [False, True])
def test_triton_lowering_for_the_gpu(backward, with_bias, packed):
    """Both backward variants lower to Triton for CUDA from this CPU machine (bfloat16,
    BERT-Large's heads at length 256, default blocks, with and without the bias-gradient
    sums, separate or packed q/k/v): forward plus one (fused) or two (split) backward
    kernels."""
    sd = jax.ShapeDtypeStruct

    def loss(q, k, v, lengths, salt):
        biases = (jnp.ones((16, 64), jnp.bfloat16),) * 3 if with_bias else None
        kw = dict(salt=salt, dropout_rate=0.1, backward=backward, interpret=False)
        if packed:
            out = flash.flash_attention_packed(
                jnp.stack([q, k, v], axis=2), lengths,
                qkv_bias=None if biases is None else jnp.stack(biases), **kw)
        else:
            out = flash.flash_attention(q, k, v, lengths, qkv_bias=biases, **kw)
        return jnp.sum(out.astype(jnp.float32))

    qkv = sd((2, 256, 16, 64), jnp.bfloat16)
    text = cuda_lowering_text(jax.grad(loss, (0, 1, 2)), qkv, qkv, qkv, sd((2,), jnp.int32),
                              sd((2, 16), jnp.int32))
    assert text.count("xla.gpu.triton") == (3 if backward == "split" else 2)


# Packed rows of 64 tokens: three examples (10, 27, 13) and 14 padding tokens, the second
# example straddling the 16-, 32- and 64-token blocks; two examples filling a row.
PACKED = ((10, 27, 13), (20, 44))


@pytest.mark.parametrize("blocks", [0, 1, 4])
def test_segment_ids_match_reference(blocks):
    """Segment ids (packed rows) with dropout and the projection biases: values and the
    gradients of query, key, value and biases equal the reference with the same ids for the
    fused backward and two split tilings; padding queries give 0 and no gradient. (Without
    dropout: test_packed_rows_equal_examples_alone.)"""
    rate = 0.2
    q, k, v, _, salt = _inputs(blocks + 60, heads=2)
    ids = segment_ids(PACKED, 64)
    lengths = jnp.sum(ids != 0, axis=1)
    biases = tuple(jax.random.normal(jax.random.key(70 + i), (2, 16)) for i in range(3))
    cot = jax.random.normal(jax.random.key(9), q.shape)
    kw = dict(salt=salt, dropout_rate=rate, segment_ids=ids)

    def ours(q, k, v, bq, bk, bv):
        return flash.flash_attention(q, k, v, lengths, qkv_bias=(bq, bk, bv), **kw,
                                     **BLOCKS[blocks])

    def ref(q, k, v, bq, bk, bv, **overrides):
        return flash.reference_attention(q + bq, k + bk, v + bv, lengths,
                                         **{**kw, **overrides})

    args = (q, k, v, *biases)
    out, grads = _outputs_and_grads(ours, *args, cot=cot)
    want, want_grads = _outputs_and_grads(ref, *args, cot=cot)
    np.testing.assert_allclose(out, want, **close(atol=2e-6, rtol=1e-5))
    for a, b in zip(grads, want_grads, strict=True):
        np.testing.assert_allclose(a, b, **close(atol=2e-5, rtol=1e-4))
    padding = np.asarray(ids) == 0
    assert float(jnp.abs(out[padding]).max()) == 0.0
    assert float(jnp.abs(grads[0][padding]).max()) == 0.0
    # the masks differ from lengths alone: the first row's examples do not see each other
    plain = ref(*args[:3], *biases, segment_ids=None)
    assert float(jnp.abs(plain[0, :50] - out[0, :50]).max()) > 1e-2


@pytest.mark.parametrize("blocks", [0, 1])
def test_packed_qkv_with_segment_ids_matches_reference(blocks):
    """flash_attention_packed with segment ids, dropout and the [3, heads, head_dim] bias:
    values and gradients equal the reference on the slots."""
    q, k, v, _, salt = _inputs(blocks + 80, heads=2)
    ids = segment_ids(PACKED, 64)
    lengths = jnp.sum(ids != 0, axis=1)
    bias = jax.random.normal(jax.random.key(81), (3, 2, 16))
    cot = jax.random.normal(jax.random.key(9), q.shape)
    kw = dict(salt=salt, dropout_rate=0.1, segment_ids=ids)

    def packed(qkv, b):
        return flash.flash_attention_packed(qkv, lengths, qkv_bias=b, **kw, **BLOCKS[blocks])

    def ref(qkv, b):
        qkv = qkv + b
        return flash.reference_attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], lengths,
                                         **kw)

    qkv = jnp.stack([q, k, v], axis=2)
    out, grads = _outputs_and_grads(packed, qkv, bias, cot=cot)
    want, want_grads = _outputs_and_grads(ref, qkv, bias, cot=cot)
    np.testing.assert_allclose(jnp.sum(cot * out), jnp.sum(cot * want), **close(rtol=1e-5))
    for a, b in zip(grads, want_grads, strict=True):
        np.testing.assert_allclose(a, b, **close(atol=2e-5, rtol=1e-4))
    with pytest.raises(ValueError, match="segment_ids"):
        flash.flash_attention_packed(qkv, lengths, segment_ids=ids[:, :32])


@pytest.mark.parametrize("blocks", [0, 3])
def test_packed_rows_equal_examples_alone(blocks):
    """Each example of a packed row gets the outputs and gradients it gets alone in a row of
    its own (kv_lengths, no segment ids); padding gets 0 and no gradient (fused backward;
    split backward with 16-token blocks)."""
    q, k, v = (x[:2, :, :2] for x in _inputs(90, heads=2)[:3])

    def attention(q, k, v, lengths, segment_ids):
        return flash.flash_attention(q, k, v, lengths, segment_ids=segment_ids,
                                     **BLOCKS[blocks])

    assert_packed_equals_alone(attention, q, k, v, segment_ids(PACKED, 64), atol=1e-5)
    with pytest.raises(ValueError, match="segment_ids"):
        flash.flash_attention(q, k[:, :32], v[:, :32], jnp.array([32, 32]),
                              segment_ids=segment_ids(PACKED, 64))


def test_reference_with_segment_ids_is_attention_per_example():
    """The reference's segment ids: each example attends to itself only, padding queries
    output 0, and one example per row (ids 1 up to the length) equals lengths alone on the
    real queries."""
    q, k, v, lengths, _ = _inputs(95, heads=2)
    reference = jax.jit(flash.reference_attention)  # one program per call, not per operation
    ids = segment_ids(PACKED, 64)
    out = reference(q, k, v, jnp.sum(ids != 0, axis=1), segment_ids=ids)
    for row, start, n in ((0, 10, 27), (1, 20, 44)):
        alone = reference(q[row:row + 1, start:start + n], k[row:row + 1, start:start + n],
                          v[row:row + 1, start:start + n], jnp.array([n]))
        np.testing.assert_allclose(out[row, start:start + n], alone[0], **close(atol=1e-6))
    assert float(jnp.abs(out[0, 50:]).max()) == 0.0
    single = (jnp.arange(64)[None, :] < lengths[:, None]).astype(jnp.int32)
    with_ids = reference(q, k, v, lengths, segment_ids=single)
    plain = reference(q, k, v, lengths)
    real = np.asarray(single, bool)
    np.testing.assert_allclose(with_ids[real], plain[real], **close(atol=1e-6))
    assert float(jnp.abs(with_ids[~real]).max()) == 0.0


@pytest.mark.parametrize("backward", ["fused", "split"])
def test_triton_lowering_with_segment_ids(backward):
    """With segment ids (one more operand of every kernel), the packed kernels with dropout
    and the bias-gradient sums lower to Triton for CUDA."""
    sd = jax.ShapeDtypeStruct

    def loss(qkv, lengths, salt, ids):
        out = flash.flash_attention_packed(
            qkv, lengths, salt=salt, dropout_rate=0.1, backward=backward, interpret=False,
            qkv_bias=jnp.ones((3, 16, 64), jnp.bfloat16), segment_ids=ids)
        return jnp.sum(out.astype(jnp.float32))

    text = cuda_lowering_text(jax.grad(loss), sd((2, 256, 3, 16, 64), jnp.bfloat16),
                              sd((2,), jnp.int32), sd((2, 16), jnp.int32),
                              sd((2, 256), jnp.int32))
    assert text.count("xla.gpu.triton") == (3 if backward == "split" else 2)


def test_fit_block_is_a_power_of_two_dividing_the_length():
    """Triton's blocks are powers of two: a length below the block (or not a multiple of it)
    gets the largest power of two dividing it, never the length itself."""
    from bert_jax.kernels.flash import fit_block

    cases = {(128, 512): 128, (128, 48): 16, (4, 3): 1, (4, 6): 2, (8, 8): 8, (256, 768): 256,
             (64, 96): 32, (16, 1): 1}
    for (block, length), want in cases.items():
        assert fit_block(block, length) == want, (block, length)
