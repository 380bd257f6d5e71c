"""Packed rows for the attention kernels' segment-id tests, and the property the model relies
on: every example of a packed row gets the outputs and gradients it gets alone."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from tolerance import close


def segment_ids(example_lengths, seq: int):
    """int32 [batch, seq]: row r holds examples of lengths ``example_lengths[r]`` left-aligned
    with ids 1, 2, ..., then padding (id 0)."""
    ids = np.zeros((len(example_lengths), seq), np.int32)
    for row, lengths in enumerate(example_lengths):
        start = 0
        for example, n in enumerate(lengths, start=1):
            ids[row, start:start + n] = example
            start += n
    return jnp.asarray(ids)


def qkv(seed, batch, seq, heads, dim, dtype=jnp.float32):
    ks = jax.random.split(jax.random.key(seed), 3)
    return tuple(jax.random.normal(kk, (batch, seq, heads, dim), dtype) for kk in ks)


def _examples(ids):
    """(row, start, length) of every example of the packed rows."""
    ids = np.asarray(ids)
    found = []
    for row in range(ids.shape[0]):
        for example in np.unique(ids[row][ids[row] != 0]):
            where = np.flatnonzero(ids[row] == example)
            found.append((row, int(where[0]), len(where)))
    return found


def assert_packed_equals_alone(attention, q, k, v, ids, *, atol):
    """``attention(q, k, v, kv_lengths, segment_ids=...)`` on packed rows against each example
    alone at the start of its own row (``kv_lengths`` = its length, no segment ids, a zero
    cotangent on that row's padding): the example's outputs and query/key/value gradients
    are the same. Padding queries of the packed rows give output 0, and padding positions
    get no gradient."""
    cot = jax.random.normal(jax.random.key(99), q.shape, jnp.float32)
    lengths = jnp.sum(ids != 0, axis=1).astype(jnp.int32)

    def loss(q, k, v, lengths, ids, cot):
        out = attention(q, k, v, lengths, segment_ids=ids)
        return jnp.sum(out.astype(jnp.float32) * cot), out

    (_, out), grads = jax.value_and_grad(loss, (0, 1, 2), has_aux=True)(
        q, k, v, lengths, ids, cot)
    examples = _examples(ids)
    # One batch of the examples alone: row e holds example e from position 0 (gathered in
    # numpy: no program per example's length).
    packed = [np.asarray(x) for x in (q, k, v, cot)]
    alone = [np.zeros((len(examples),) + x.shape[1:], x.dtype) for x in packed]
    for e, (row, start, n) in enumerate(examples):
        for a, x in zip(alone, packed, strict=True):
            a[e, :n] = x[row, start:start + n]
    alone = [jnp.asarray(a) for a in alone]
    alone_lengths = jnp.array([n for _, _, n in examples], jnp.int32)

    def alone_loss(q, k, v):
        out = attention(q, k, v, alone_lengths, segment_ids=None)
        return jnp.sum(out.astype(jnp.float32) * alone[3]), out

    (_, out_alone), grads_alone = jax.value_and_grad(alone_loss, (0, 1, 2), has_aux=True)(
        *alone[:3])
    out, out_alone = np.asarray(out, np.float32), np.asarray(out_alone, np.float32)
    grads = [np.asarray(g, np.float32) for g in grads]
    grads_alone = [np.asarray(g, np.float32) for g in grads_alone]
    for e, (row, start, n) in enumerate(examples):
        np.testing.assert_allclose(out[row, start:start + n], out_alone[e, :n], **close(atol))
        for g, g_alone in zip(grads, grads_alone, strict=True):
            np.testing.assert_allclose(g[row, start:start + n], g_alone[e, :n], **close(atol))
    padding = np.asarray(ids) == 0
    assert padding.any()
    assert float(np.abs(out[padding]).max()) == 0.0
    for g in grads:
        assert float(np.abs(g[padding]).max()) == 0.0
