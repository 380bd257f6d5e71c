"""Scaled dot-product attention backends behind one function.

Padding is expressed as per-example key lengths (``kv_lengths``, right-padded inputs, which
every bert-jax pipeline produces) so that cuDNN's fused kernel can skip it; a general boolean
mask is used only where lengths cannot describe it. The explicit (einsum) path is used when
attention probabilities are requested or attention dropout is active, since fused kernels
return neither.

Packed rows (several examples per row, ``data/packing.py``) add ``example_ids`` [batch, seq]
int32 (0 = padding, 1..k = the example of the row a token belongs to): a token attends only
to the tokens of its own example. The einsum and XLA paths build that as a boolean mask, the
Pallas kernels take it as ``segment_ids``. Without ``example_ids`` no op is added.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp

from bert_jax.modeling.ops import add_bias


def resolve_implementation(name: str) -> str:
    """``auto`` -> cudnn on GPU, xla elsewhere."""
    from bert_jax.modeling.placement import target_platform

    if name == "auto":
        return "cudnn" if target_platform() == "gpu" else "xla"
    return name


def lengths_to_mask(kv_lengths: jax.Array, seq_len: int) -> jax.Array:
    """[batch] lengths -> bool[batch, 1, 1, seq] key mask."""
    return (jnp.arange(seq_len)[None, :] < kv_lengths[:, None])[:, None, None, :]


def example_mask(example_ids: jax.Array) -> jax.Array:
    """[batch, seq] example ids -> bool[batch, 1, q_seq, kv_seq]: query and key belong to the
    same example (padding, id 0, matches only padding; the key lengths mask it)."""
    return (example_ids[:, :, None] == example_ids[:, None, :])[:, None]


def explicit_attention(query, key, value, kv_lengths, *, dropout_rng=None, dropout_rate=0.0,
                       deterministic=True, example_ids=None):
    """Attention with materialized probabilities. Returns (context, probs).

    query/key/value: [batch, seq, heads, head_dim]; probs: [batch, heads, q_seq, kv_seq];
    ``example_ids`` [batch, seq] confines attention to each packed example.
    """
    depth = query.shape[-1]
    scores = jnp.einsum("bqhd,bkhd->bhqk", query, key,
                        preferred_element_type=jnp.float32) / jnp.sqrt(depth).astype(jnp.float32)
    mask = lengths_to_mask(kv_lengths, key.shape[1])
    if example_ids is not None:
        mask = mask & example_mask(example_ids)
    scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1)
    attn = probs
    if not deterministic and dropout_rate > 0.0:
        keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, probs.shape)
        attn = jnp.where(keep, probs / (1.0 - dropout_rate), 0.0)
    context = jnp.einsum("bhqk,bkhd->bqhd", attn.astype(value.dtype), value)
    return context, probs


def fused_attention(query, key, value, kv_lengths, implementation: str, example_ids=None):
    """``jax.nn.dot_product_attention`` (XLA or cuDNN) with padding given as key lengths.

    Packed rows (``example_ids``): splash takes them as segment ids; the XLA path gets the
    boolean same-example mask; cuDNN, whose fused kernel takes no general mask here, falls
    back to XLA."""
    impl = resolve_implementation(implementation)
    if impl == "splash":
        from bert_jax.kernels.splash import splash_attention

        return splash_attention(query, key, value, kv_lengths, segment_ids=example_ids)
    if impl == "cudnn" and (query.dtype not in (jnp.bfloat16, jnp.float16)
                            or example_ids is not None):
        impl = "xla"  # cuDNN fused attention needs half precision inputs and no mask
    mask = None if example_ids is None else example_mask(example_ids)
    return jax.nn.dot_product_attention(
        query, key, value, mask=mask, key_value_seq_lengths=kv_lengths.astype(jnp.int32),
        implementation=impl)


def resolve_dropout_implementation(name: str, query, key) -> str:
    """``auto`` -> the flash kernel on GPU (``flash_tpu`` on TPU) when its shapes are
    supported, else explicit. The platform is the one the step is traced for
    (``placement.target_platform``)."""
    from bert_jax.kernels import flash, flash_tpu
    from bert_jax.modeling.placement import target_platform

    if name != "auto":
        return name
    shapes = (query.shape[1], key.shape[1], query.shape[-1])
    platform = target_platform()
    if platform == "tpu":
        return "flash_tpu" if flash_tpu.supported(*shapes) else "explicit"
    return "flash" if platform == "gpu" and flash.supported(*shapes) else "explicit"


def dropout_attention(query, key, value, kv_lengths, *, dropout_rng, dropout_rate: float,
                      implementation: str = "auto", mask_hash: str = "rowcol", qkv_bias=None,
                      example_ids=None):
    """Training-time attention with dropout on the probabilities. Returns the context.

    ``flash`` runs the Pallas kernel of ``bert_jax.kernels.flash`` (dropout in the kernel,
    probabilities never in memory, mask from the counter hash ``mask_hash``), split over the
    active mesh with ``shard_map`` because a Pallas call is not partitioned by XLA;
    ``explicit`` is the einsum path (a threefry Bernoulli mask). ``example_ids`` (packed rows)
    go to the kernels as ``segment_ids``, to the einsum path as a mask.
    """
    impl = resolve_dropout_implementation(implementation, query, key)
    if qkv_bias is not None and impl != "flash":  # only the kernel takes them unadded
        query, key, value = (add_bias(t, b) for t, b in zip((query, key, value), qkv_bias,
                                                            strict=True))
        qkv_bias = None
    if impl == "explicit":
        return explicit_attention(query, key, value, kv_lengths, dropout_rng=dropout_rng,
                                  dropout_rate=dropout_rate, deterministic=False,
                                  example_ids=example_ids)[0]
    if impl == "flash_tpu":  # the TPU kernel: the same salts and masks as the GPU kernel
        from bert_jax.kernels import flash, flash_tpu
        from bert_jax.modeling.placement import target_platform

        interpret = target_platform() != "tpu"

        def local_tpu(q, k, v, lengths, s, _, ids):
            return flash_tpu.flash_attention(q, k, v, lengths, salt=s,
                                             dropout_rate=dropout_rate, mask_hash=mask_hash,
                                             segment_ids=ids, interpret=interpret)

        salt = flash.salt_from_rng(dropout_rng, query.shape[0], query.shape[2])
        return _over_mesh(local_tpu, query, key, value, kv_lengths, salt,
                          example_ids=example_ids)
    if impl != "flash":
        raise ValueError(f"unknown dropout attention implementation {impl!r}")
    from bert_jax.kernels import flash

    salt = _flash_salt(dropout_rng, query.shape[0], query.shape[2])

    def local(q, k, v, lengths, s, biases, ids):
        return flash.flash_attention(q, k, v, lengths, salt=s, dropout_rate=dropout_rate,
                                     mask_hash=mask_hash, qkv_bias=biases,
                                     segment_ids=ids)

    return _over_mesh(local, query, key, value, kv_lengths, salt, qkv_bias, example_ids)


def dropout_attention_packed(qkv, kv_lengths, *, dropout_rng, dropout_rate: float,
                             implementation: str = "auto", mask_hash: str = "rowcol",
                             qkv_bias=None, example_ids=None):
    """``dropout_attention`` over query, key and value packed as one [batch, seq, 3, heads,
    head_dim] array (one projection matmul's output) with an optional [3, heads, head_dim]
    bias. The flash kernel reads the slots in place and returns the gradient packed
    (``flash.flash_attention_packed``); the other implementations get the slices."""
    query, key = qkv[:, :, 0], qkv[:, :, 1]
    impl = resolve_dropout_implementation(implementation, query, key)
    if impl != "flash":
        biases = None if qkv_bias is None else tuple(qkv_bias)
        return dropout_attention(query, key, qkv[:, :, 2], kv_lengths, dropout_rng=dropout_rng,
                                 dropout_rate=dropout_rate, implementation=impl,
                                 mask_hash=mask_hash, qkv_bias=biases, example_ids=example_ids)
    from bert_jax.kernels import flash

    salt = _flash_salt(dropout_rng, qkv.shape[0], qkv.shape[3])

    def local(packed, lengths, s, bias, ids):
        return flash.flash_attention_packed(packed, lengths, salt=s, dropout_rate=dropout_rate,
                                            mask_hash=mask_hash, qkv_bias=bias,
                                            segment_ids=ids)

    return _over_mesh_packed(local, qkv, kv_lengths, salt, qkv_bias, example_ids)


def _flash_salt(dropout_rng, batch: int, heads: int):
    """The flash kernel's [batch, heads] salts (a warning off GPU, where it is interpreted)."""
    from bert_jax.kernels import flash
    from bert_jax.modeling.placement import target_platform

    if target_platform() != "gpu":
        warnings.warn("dropout_attention_impl='flash' off GPU runs the Pallas kernel in "
                      "interpret mode (for tests; slow): use 'auto' or 'explicit' here",
                      stacklevel=3)
    return flash.salt_from_rng(dropout_rng, batch, heads)


def _mesh_axes(batch: int, heads: int):
    """(mesh, batch mesh axes, head mesh axes) when inside a mesh that splits batch and heads
    evenly, else None (one device, or uneven: XLA gathers)."""
    from bert_jax import parallel

    mesh = parallel.entered_mesh()
    if mesh is None:
        return None
    import flax.linen as nn

    batch_axes, _, head_axes, _ = nn.logical_to_mesh_axes(("batch", "length", "heads", None))
    if (batch % parallel.mesh_axes_size(mesh, batch_axes)
            or heads % parallel.mesh_axes_size(mesh, head_axes)):
        return None
    return mesh, batch_axes, head_axes


def _over_mesh(fn, query, key, value, kv_lengths, salt, qkv_bias=None, example_ids=None):
    """Runs ``fn`` per shard: batch and heads split as the logical-axis rules say, sequence
    and head_dim whole (attention needs every key of an example); the [heads, head_dim]
    biases split on heads (shard_map sums their per-shard gradients over the batch axes);
    the [batch, seq] example ids split on batch."""
    from bert_jax import parallel

    axes = _mesh_axes(query.shape[0], query.shape[2])
    if axes is None:
        return fn(query, key, value, kv_lengths, salt, qkv_bias, example_ids)
    from jax.sharding import PartitionSpec as P

    mesh, batch_axes, head_axes = axes
    qkv = P(batch_axes, None, head_axes, None)
    bias_specs = None if qkv_bias is None else (P(head_axes, None),) * 3
    ids_spec = None if example_ids is None else P(batch_axes, None)
    return parallel.shard_map_unchecked(
        fn, mesh, in_specs=(qkv, qkv, qkv, P(batch_axes), P(batch_axes, head_axes), bias_specs,
                            ids_spec),
        out_specs=qkv)(query, key, value, kv_lengths, salt, qkv_bias, example_ids)


def _over_mesh_packed(fn, qkv, kv_lengths, salt, qkv_bias, example_ids=None):
    """``_over_mesh`` for the packed [batch, seq, 3, heads, head_dim] array and its
    [3, heads, head_dim] bias."""
    from bert_jax import parallel

    axes = _mesh_axes(qkv.shape[0], qkv.shape[3])
    if axes is None:
        return fn(qkv, kv_lengths, salt, qkv_bias, example_ids)
    from jax.sharding import PartitionSpec as P

    mesh, batch_axes, head_axes = axes
    bias_spec = None if qkv_bias is None else P(None, head_axes, None)
    ids_spec = None if example_ids is None else P(batch_axes, None)
    return parallel.shard_map_unchecked(
        fn, mesh, in_specs=(P(batch_axes, None, None, head_axes, None), P(batch_axes),
                            P(batch_axes, head_axes), bias_spec, ids_spec),
        out_specs=P(batch_axes, None, head_axes, None))(qkv, kv_lengths, salt, qkv_bias,
                                                        example_ids)
