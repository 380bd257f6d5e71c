"""The plain math that the Pallas kernels of this package fuse, and that their tests compare
against: the exact erf GELU, the tied MLM decoder with a mixed-precision backward, and the
softmax cross-entropy of the MLM loss. Model layers (``bert_jax/modeling/``) use these directly
where no kernel applies."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

NEG_INF = -1e9

_SQRT_HALF = 0.7071067811865476
_INV_SQRT_2PI = 0.3989422804014327


def gelu_erf(x):
    """Exact GELU as BERT and torch define it, ``x * Phi(x) = x/2 * (1 + erf(x / sqrt 2))``,
    evaluated in float32 and returned in ``x.dtype``.

    ``jax.nn.gelu(approximate=False)`` computes the same function through ``erfc``, which XLA
    expands into two polynomial branches, an exponential and two divisions per element (and
    their derivatives in the backward pass), which makes the GELU's forward and backward
    fusions compute-bound on GPUs. ``erf`` is one clamped rational polynomial; its
    derivative here is ``Phi(x) + x * phi(x)``.
    """
    return _gelu_erf(x)


@jax.custom_jvp
def _gelu_erf(x):
    xf = x.astype(jnp.float32)
    return (xf * (0.5 + 0.5 * jax.lax.erf(xf * _SQRT_HALF))).astype(x.dtype)


@_gelu_erf.defjvp
def _gelu_erf_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    xf = x.astype(jnp.float32)
    cdf = 0.5 + 0.5 * jax.lax.erf(xf * _SQRT_HALF)
    slope = cdf + xf * (_INV_SQRT_2PI * jnp.exp(-0.5 * xf * xf))
    return (xf * cdf).astype(x.dtype), (t.astype(jnp.float32) * slope).astype(t.dtype)



@jax.custom_vjp
def decode(h, table):
    """Logits ``h @ table.T`` in float32 (h, table in the compute dtype). The backward pass
    casts the float32 logit gradient to the compute dtype before its two matmuls, as mixed
    precision does everywhere else; autodiff would promote them to float32 (TF32 GEMMs of
    [tokens, vocab], the step's largest)."""
    return jnp.einsum("...e,ve->...v", h, table, preferred_element_type=jnp.float32)


def _decode_fwd(h, table):
    return decode(h, table), (h, table)


def decode_grads(h, table, g):
    """(dh, dtable) of ``decode`` for the logit gradient ``g``, cast to the compute dtype
    first: two matmuls in h's dtype with float32 accumulation (also ``fused_xent``'s
    backward, whose kernel writes ``g`` in that dtype)."""
    g = g.astype(h.dtype)
    dh = jnp.einsum("...v,ve->...e", g, table, preferred_element_type=jnp.float32)
    dtable = jnp.einsum("...v,...e->ve", g, h, preferred_element_type=jnp.float32)
    return dh.astype(h.dtype), dtable.astype(table.dtype)


def _decode_bwd(residuals, g):
    return decode_grads(*residuals, g)


decode.defvjp(_decode_fwd, _decode_bwd)


def logits_cross_entropy(logits, ids):
    """(nll, correct) float32 of [..., vocab] logits and integer labels: optax's softmax
    cross-entropy, and 1.0 where the label's logit is the maximum (ties count as correct; no
    argmax pass over the vocabulary, the max is shared with the loss's logsumexp)."""
    logits = logits.astype(jnp.float32)
    nll = optax.softmax_cross_entropy_with_integer_labels(logits, ids)
    label_logit = jnp.take_along_axis(logits, ids[..., None], axis=-1)[..., 0]
    return nll, (label_logit >= jnp.max(logits, axis=-1)).astype(jnp.float32)
