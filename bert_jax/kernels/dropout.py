"""Dropout whose mask is a counter hash, recomputed in the backward pass instead of stored.

Flax's ``nn.Dropout`` draws the mask with ``jax.random.bernoulli``: threefry bits for every
element (a separate kernel on GPUs that writes 4 bytes per element), a boolean mask written in
the forward pass and read back in the backward pass. BERT applies hidden dropout twice per
layer plus once after the embeddings, so at Base/128 with batch 256 that is 25 masks of 25 M
elements per step.

``hash_dropout`` instead computes ``keep`` from (salt, element position) with MurmurHash3's
32-bit finalizer, in int32 arithmetic that XLA fuses into the elementwise consumer: nothing is
materialized, and the custom VJP keeps only the salt (or two small hash vectors), so the
backward pass recomputes the same bits inside its own fusion. The salt is one random int32 per
call, drawn from the module's Flax ``dropout`` key, so masks differ between layers and steps
and a run is reproducible from its seed. Positions are *global* (iotas that XLA's SPMD
partitioner slices), so a sharded run drops exactly what a one-device run drops. Two hashes
(``BertConfig.kernels.dropout_hash``):

* ``rowcol`` (default): an array is seen as rows (every axis but the last) x columns (the
  last axis). Each row gets a fully mixed 32-bit code from (salt, row) by two finalizer rounds
  and each column a code from its index; an element's bits are one finalizer round of
  ``row_code ^ column_code``, without the last xor-shift (it only touches the low 16 bits,
  below the threshold's resolution). The round's first xor-shift distributes over the xor
  (``(r ^ c) ^ (r ^ c) >> 16 == (r ^ r >> 16) ^ (c ^ c >> 16)``), so the codes carry it and
  each element costs 6 integer operations: xor, multiply, shift, xor, multiply and an unsigned
  compare. The row and column codes are computed once per row and column (the hidden dropout
  materializes them, a few hundred KB; the flash kernel computes them per block).
* ``flat``: two full finalizer rounds of (salt, flat element index) per element, about 20
  integer operations per element.

The flash attention kernel (``flash.py``) uses the same hashes with (query, key) as
(row, column).

Indices wrap modulo 2**32: arrays beyond 4.29 G elements would repeat mask bits (BERT-Large at
batch 8k x 512 tokens x 1024 is 4.29 G: split the batch before reaching that).
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from bert_jax.config import DROPOUT_HASHES, HIDDEN_DROPOUT_IMPLS

# ---------------------------------------------------------------------------------------------
# The hashes, in int32 arithmetic (wrapping multiplies and logical shifts behave the same in
# XLA and in Triton, so the Pallas kernels call these functions too).

def srl(x, n: int):
    """Logical right shift of int32 values."""
    return lax.shift_right_logical(x, jnp.full(x.shape, n, jnp.int32))


def fmix32(x):
    """MurmurHash3's 32-bit finalizer: a bijection with full avalanche."""
    return _xorshift16(_multiply_rounds(_xorshift16(x)))


def _xorshift16(x):
    """The finalizer's first and last step (``keep_from_codes`` leaves the first to the
    codes and skips the last)."""
    return x ^ srl(x, 16)


def _multiply_rounds(x):
    """The finalizer between its two 16-bit xor-shifts."""
    x = x * jnp.int32(-2048144789)  # 0x85ebca6b
    x = x ^ srl(x, 13)
    return x * jnp.int32(-1028477387)  # 0xc2b2ae35


def drop_threshold(rate: float) -> int:
    """Elements whose 31-bit hash is below this are dropped (probability ``rate``)."""
    return min(int(round(rate * 2.0 ** 31)), 2 ** 31 - 1)


def keep_from_index(index, salt, rate: float):
    """``flat`` hash. bool, ``index``'s shape: True where the element is kept (probability
    1 - rate). ``index`` and ``salt`` are int32; two finalizer rounds separate the salts (one
    round of ``fmix32(index ^ salt)`` would make two salts' masks permutations of each
    other)."""
    bits = srl(fmix32(fmix32(index ^ salt) + salt), 1)  # uniform in [0, 2**31)
    return bits >= drop_threshold(rate)


def row_code(rows, salt):
    """``rowcol`` hash: int32 code of each (global) row index for ``salt``: two full rounds,
    then the first xor-shift of the element round."""
    return _xorshift16(fmix32(fmix32(rows ^ salt) + salt))


def column_code(cols):
    """``rowcol`` hash: int32 code of each (global) column index (the same for every salt:
    the row code carries the salt), with the element round's first xor-shift."""
    return _xorshift16(fmix32(fmix32(cols ^ jnp.int32(0x3C6EF372)) + jnp.int32(0x1B873593)))


def keep_from_codes(rows, cols, rate: float):
    """``rowcol`` hash: bool, the broadcast shape of ``rows`` and ``cols`` (row and column
    codes): True where the element is kept. One finalizer round without its first xor-shift
    (the codes hold it) and its last; the top 31 bits against the threshold, as one unsigned
    compare of all 32 (``x >> 1 >= t`` exactly when ``x >= 2 t``)."""
    x = _multiply_rounds(rows ^ cols)
    return lax.bitcast_convert_type(x, jnp.uint32) >= jnp.uint32(2 * drop_threshold(rate))


def flat_index(shape) -> jax.Array:
    """int32 row-major position of every element of ``shape`` (wrapping modulo 2**32)."""
    index = jnp.zeros(shape, jnp.int32)
    stride = 1
    for axis in reversed(range(len(shape))):
        # The stride as a wrapped int32 constant (strides beyond 2**31 wrap like the products).
        wrapped = np.array(stride % 2 ** 32, np.uint32).view(np.int32)
        index = index + lax.broadcasted_iota(jnp.int32, shape, axis) * wrapped
        stride *= shape[axis]
    return index


def rowcol_codes(shape, salt):
    """(row codes [*shape[:-1], 1], column codes [shape[-1]]) of the ``rowcol`` hash."""
    rows = row_code(flat_index(shape[:-1]), salt)[..., None]
    return rows, column_code(lax.iota(jnp.int32, shape[-1]))


def dropout_keep_mask(shape, salt, rate: float, mask_hash: str = "rowcol"):
    """The mask ``hash_dropout`` applies (for tests and analysis)."""
    if mask_hash == "flat":
        return keep_from_index(flat_index(shape), salt, rate)
    return keep_from_codes(*rowcol_codes(shape, salt), rate)


def _masked(x, keep, rate: float):
    scale = jnp.asarray(1.0 / (1.0 - rate), x.dtype)
    return jnp.where(keep, x * scale, jnp.zeros((), x.dtype))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def hash_dropout(x, salt, rate: float, mask_hash: str = "rowcol"):
    """Inverted dropout of ``x`` with the hash mask of int32 scalar ``salt``; ``mask_hash`` is
    ``rowcol`` or ``flat`` (module docstring).

    The backward pass recomputes the mask: no mask is saved."""
    return _hash_dropout_fwd(x, salt, rate, mask_hash)[0]


def _hash_dropout_fwd(x, salt, rate, mask_hash):
    if mask_hash == "flat":
        return _masked(x, keep_from_index(flat_index(x.shape), salt, rate), rate), salt
    if mask_hash != "rowcol":
        raise ValueError(f"dropout hash must be one of {DROPOUT_HASHES}, got {mask_hash!r}")
    # The barrier materializes the codes (one int32 per row and per column): otherwise XLA
    # fuses their two finalizer rounds into the consumer and recomputes them per element.
    codes = lax.optimization_barrier(rowcol_codes(x.shape, salt))
    return _masked(x, keep_from_codes(*codes, rate), rate), codes


def _hash_dropout_bwd(rate, mask_hash, saved, g):
    # The barrier on the saved salt or codes keeps XLA from merging this mask with the forward
    # pass's (CSE), which would make the forward fusion write the mask for the backward pass
    # to read. The barrier on the result materializes the dropped gradient once (the matmuls
    # of the layer before need it in memory anyway) instead of letting each consumer, e.g.
    # the bias gradient's column reduction, recompute the hash.
    saved = lax.optimization_barrier(saved)
    if mask_hash == "flat":
        keep = keep_from_index(flat_index(g.shape), saved, rate)
    else:
        keep = keep_from_codes(*saved, rate)
    return lax.optimization_barrier(_masked(g, keep, rate)), None


hash_dropout.defvjp(_hash_dropout_fwd, _hash_dropout_bwd)


def salt_from_rng(rng, shape=()):
    """Random int32 salts from a PRNG key."""
    return lax.bitcast_convert_type(jax.random.bits(rng, shape, jnp.uint32), jnp.int32)


class Dropout(nn.Module):
    """Inverted dropout; ``implementation`` is ``hash`` (above, with the mask hash ``mask_hash``)
    or ``prng`` (Flax's ``nn.Dropout``: a threefry Bernoulli mask). Both draw from the
    ``dropout`` RNG stream."""

    rate: float
    implementation: str = "hash"
    mask_hash: str = "rowcol"

    @nn.compact
    def __call__(self, x, deterministic: bool):
        if deterministic or self.rate == 0.0:
            return x
        if self.implementation == "prng":
            return nn.Dropout(self.rate)(x, deterministic=False)
        if self.implementation != "hash":
            raise ValueError(f"dropout implementation {self.implementation!r} is not one of "
                             f"{HIDDEN_DROPOUT_IMPLS}")
        return hash_dropout(x, salt_from_rng(self.make_rng("dropout")), self.rate, self.mask_hash)
