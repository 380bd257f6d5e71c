"""Hash dropout for hidden states (bert_jax/kernels/dropout.py): mask statistics, forward and
gradient against the explicit masked product, no stored mask, mesh-split equals one device,
and the model's training path with either implementation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from float_sums import assert_same_sums
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from bert_jax import parallel
from bert_jax.config import KernelOptions, get_preset
from bert_jax.errors import BertJaxError
from bert_jax.kernels.dropout import (
    Dropout,
    dropout_keep_mask,
    flat_index,
    hash_dropout,
    salt_from_rng,
)
from bert_jax.modeling import BertModel


def test_flat_index_is_row_major():
    np.testing.assert_array_equal(flat_index((3, 4, 5)), np.arange(60).reshape(3, 4, 5))
    np.testing.assert_array_equal(jax.jit(lambda: flat_index((7,)))(), np.arange(7))


def _fmix32(x):
    """MurmurHash3's 32-bit finalizer in NumPy uint32 (the definition the hashes follow)."""
    x = x ^ (x >> np.uint32(16))
    x = x * np.uint32(0x85EBCA6B)
    x = x ^ (x >> np.uint32(13))
    x = x * np.uint32(0xC2B2AE35)
    return x ^ (x >> np.uint32(16))


def _numpy_mask(shape, salt: int, rate: float, mask_hash: str):
    """The documented hashes written out in unsigned NumPy: ``rowcol`` = one finalizer round of
    (two-round row code) ^ (two-round column code) without the last xor-shift, ``flat`` = two
    rounds of (salt, flat index); kept where the top 31 bits reach the threshold."""
    s = np.uint32(salt % 2 ** 32)
    threshold = np.uint32(min(int(round(rate * 2.0 ** 31)), 2 ** 31 - 1))
    with np.errstate(over="ignore"):
        if mask_hash == "flat":
            x = _fmix32(_fmix32(np.arange(np.prod(shape), dtype=np.uint32) ^ s) + s)
            return (x >> np.uint32(1)).reshape(shape) >= threshold
        rows = np.arange(np.prod(shape[:-1]), dtype=np.uint32)
        rows = _fmix32(_fmix32(rows ^ s) + s)[:, None]
        cols = np.arange(shape[-1], dtype=np.uint32)
        cols = _fmix32(_fmix32(cols ^ np.uint32(0x3C6EF372)) + np.uint32(0x1B873593))[None, :]
        x = rows ^ cols
        x = x ^ (x >> np.uint32(16))
        x = x * np.uint32(0x85EBCA6B)
        x = x ^ (x >> np.uint32(13))
        x = x * np.uint32(0xC2B2AE35)
        return ((x >> np.uint32(1)) >= threshold).reshape(shape)


@pytest.mark.parametrize("mask_hash", ["rowcol", "flat"])
def test_masks_follow_the_documented_hash(mask_hash):
    """The int32 arithmetic (signed multiplies, logical shifts, the codes carrying the element
    round's first xor-shift, one unsigned compare) gives the documented unsigned hash bit for
    bit, at ordinary and extreme rates and salts, eagerly and jitted."""
    shape = (3, 5, 72)
    for salt in (0, 1, -7, 2 ** 31 - 1, -2 ** 31, 123456789):
        for rate in (0.0, 0.1, 0.5, 0.999, 1.0):
            want = _numpy_mask(shape, salt, rate, mask_hash)
            got = dropout_keep_mask(shape, jnp.int32(salt), rate, mask_hash)
            np.testing.assert_array_equal(np.asarray(got), want, err_msg=f"{salt=} {rate=}")
    jitted = jax.jit(lambda s: dropout_keep_mask(shape, s, 0.1, mask_hash))(jnp.int32(-7))
    np.testing.assert_array_equal(np.asarray(jitted), _numpy_mask(shape, -7, 0.1, mask_hash))


def _rectangle_correlation(x):
    """Mean of x[r, c] x[r, c+1] x[r+1, c] x[r+1, c+1] over the last two axes, over var**2:
    the statistic the rowcol hash's structure (row code ^ column code) could bias."""
    return float((x * np.roll(x, 1, -1) * np.roll(x, 1, -2) * np.roll(np.roll(x, 1, -1), 1, -2)
                  ).mean() / x.var() ** 2)


@pytest.mark.parametrize("mask_hash", ["rowcol", "flat"])
@pytest.mark.parametrize("rate", [0.1, 0.3])
def test_mask_statistics(rate, mask_hash):
    salt = salt_from_rng(jax.random.key(0))
    keep = np.asarray(dropout_keep_mask((16, 128, 256), salt, rate, mask_hash))
    assert abs(keep.mean() - (1 - rate)) < 0.004  # 524k draws: sd 0.0004-0.0006
    assert np.abs(keep.mean(axis=(1, 2)) - (1 - rate)).max() < 0.01  # per example (32k each)
    x = keep.astype(np.float64) - keep.mean()
    for axis in range(3):  # neighbours along every axis look independent
        assert abs((x * np.roll(x, 1, axis=axis)).mean() / x.var()) < 0.01
    assert abs(_rectangle_correlation(x)) < 0.03
    # another salt: a different, uncorrelated mask; the same salt: the same mask
    other = np.asarray(dropout_keep_mask((16, 128, 256), salt_from_rng(jax.random.key(1)),
                                         rate, mask_hash)).astype(np.float64)
    assert abs((x * (other - other.mean())).mean() / x.var()) < 0.01
    again = np.asarray(dropout_keep_mask((16, 128, 256), salt, rate, mask_hash))
    np.testing.assert_array_equal(again, keep)


def test_the_two_hashes_differ_and_bad_hash_is_refused():
    salt = salt_from_rng(jax.random.key(0))
    a, b = (dropout_keep_mask((8, 64), salt, 0.5, h) for h in ("rowcol", "flat"))
    assert 0.3 < float(jnp.mean(a != b)) < 0.7
    with pytest.raises(ValueError, match="dropout hash"):
        hash_dropout(jnp.ones((4, 4)), salt, 0.1, "xor")
    with pytest.raises(BertJaxError, match="dropout_hash"):
        get_preset("tiny", kernels=KernelOptions(dropout_hash="xor"))


@pytest.mark.parametrize("mask_hash", ["rowcol", "flat"])
def test_forward_and_gradient_use_the_same_mask(mask_hash):
    x = jax.random.normal(jax.random.key(0), (4, 32, 48))
    w = jax.random.normal(jax.random.key(1), x.shape)
    salt = salt_from_rng(jax.random.key(2))
    keep = dropout_keep_mask(x.shape, salt, 0.2, mask_hash)
    np.testing.assert_allclose(hash_dropout(x, salt, 0.2, mask_hash),
                               jnp.where(keep, x / 0.8, 0.0), rtol=1e-6)
    grad = jax.grad(lambda x: jnp.sum(hash_dropout(x, salt, 0.2, mask_hash) * w))(x)
    np.testing.assert_allclose(grad, jnp.where(keep, w / 0.8, 0.0), rtol=1e-6)
    # bf16 keeps its dtype
    assert hash_dropout(x.astype(jnp.bfloat16), salt, 0.2, mask_hash).dtype == jnp.bfloat16


@pytest.mark.parametrize("mask_hash, saved", [("flat", 1), ("rowcol", 8 * 64 + 32)])
def test_backward_keeps_no_mask(mask_hash, saved):
    """The VJP's residuals are the salt (flat) or one code per row and column (rowcol), not a
    mask the size of x."""
    x = jnp.ones((8, 64, 32))
    salt = salt_from_rng(jax.random.key(0))
    _, vjp = jax.vjp(lambda x: hash_dropout(x, salt, 0.1, mask_hash), x)
    assert sum(leaf.size for leaf in jax.tree.leaves(vjp)) == saved


@pytest.mark.parametrize("mask_hash", ["rowcol", "flat"])
def test_split_over_mesh_equals_one_device(mask_hash):
    """The index is the global position: a batch- and feature-sharded array drops exactly
    what the unsharded one drops."""
    x = jax.random.normal(jax.random.key(0), (8, 16, 32))
    salt = salt_from_rng(jax.random.key(1))
    fn = jax.jit(lambda x, s: hash_dropout(x, s, 0.1, mask_hash))
    single = fn(x, salt)
    mesh = parallel.create_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    sharded_x = jax.device_put(x, NamedSharding(mesh, P(("data", "fsdp"), None, "tensor")))
    sharded = fn(sharded_x, salt)
    assert len(sharded.sharding.device_set) == 8
    np.testing.assert_array_equal(np.asarray(sharded), np.asarray(single))


def test_module_deterministic_zero_rate_and_bad_implementation():
    x = jnp.ones((2, 8))
    rngs = {"dropout": jax.random.key(0)}
    assert Dropout(0.1).apply({}, x, deterministic=True) is x
    assert Dropout(0.0).apply({}, x, deterministic=False) is x
    for impl in ("hash", "prng"):
        y = Dropout(0.5, impl).apply({}, x, deterministic=False, rngs=rngs)
        assert set(np.unique(np.asarray(y)).tolist()) <= {0.0, 2.0}
    with pytest.raises(ValueError, match="not one of"):
        Dropout(0.5, "curand").apply({}, x, deterministic=False, rngs=rngs)
    with pytest.raises(BertJaxError, match="hidden_dropout_impl"):
        get_preset("tiny", kernels=KernelOptions(hidden_dropout_impl="curand"))


@pytest.mark.parametrize("impl", ["hash", "prng"])
@pytest.mark.slow
def test_model_training_path(impl):
    """Dropout is active and seeded: the same key gives the same output, another key another;
    gradients are finite; scan + remat recompute the same masks (equal gradients)."""
    cfg = get_preset("tiny", vocab_size=300, kernels=KernelOptions(hidden_dropout_impl=impl),
                     attention_probs_dropout_prob=0.0)
    ids = jax.random.randint(jax.random.key(0), (2, 32), 5, 300)
    mask = jnp.ones((2, 32), jnp.int32)
    params = jax.jit(BertModel(cfg).init)(jax.random.key(1), ids, mask)

    @jax.jit
    def out(key):
        return BertModel(cfg).apply(params, ids, mask, deterministic=False,
                                    rngs={"dropout": key})["sequence_output"]

    a, b = out(jax.random.key(2)), out(jax.random.key(3))
    evaluated = jax.jit(BertModel(cfg).apply)(params, ids, mask)
    np.testing.assert_array_equal(a, out(jax.random.key(2)))
    assert float(jnp.abs(a - b).max()) > 1e-3
    assert float(jnp.abs(a - evaluated["sequence_output"]).max()) > 1e-3

    scan_cfg = cfg.replace(scan_layers=True)
    scan_params = jax.jit(BertModel(scan_cfg).init)(jax.random.key(1), ids, mask)

    # A fixed random readout: the mean square of LayerNorm outputs would be nearly constant,
    # and its gradients (~1e-10) rounding noise.
    readout = jax.random.normal(jax.random.key(4), (*ids.shape, cfg.hidden_size))

    def loss(p, policy):
        y = BertModel(scan_cfg.replace(remat_policy=policy)).apply(
            p, ids, mask, deterministic=False, rngs={"dropout": jax.random.key(2)})
        return jnp.mean(y["sequence_output"] * readout)

    grad = jax.jit(jax.grad(loss), static_argnums=1)
    g_plain, g_remat = grad(scan_params, "none"), grad(scan_params, "full")
    for x, y in zip(jax.tree.leaves(g_plain), jax.tree.leaves(g_remat), strict=True):
        assert bool(jnp.all(jnp.isfinite(x)))
        # Recomputation may fuse, and so round, the sums differently (tests/float_sums.py):
        # per layer, sums over the 64 tokens and over hidden.
        assert_same_sums(x, y, cfg.num_hidden_layers * (ids.size + cfg.hidden_size))
