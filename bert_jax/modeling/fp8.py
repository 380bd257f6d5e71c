"""FP8 matrix multiplies with delayed per-tensor scaling (``BertConfig.fp8``).

The forward pass quantizes the input and the kernel to float8 e4m3 and multiplies them with a
bfloat16 (the compute dtype) result; the backward pass quantizes the output gradient to
float8 e5m2 (more range, less precision: gradients span more decades) and computes the
input and weight gradients from the saved float8 operands. Hopper GPUs run these as FP8
tensor-core GEMMs (cuBLASLt); elsewhere XLA emulates them.

Each tensor has a scale (the value of one float8 unit: ``x ≈ q * scale``) and a history of
its absolute maxima over the last ``BertConfig.fp8_amax_history`` steps, newest first. The
scale a step uses comes from the history of the steps before it (delayed scaling, as in
NVIDIA's Transformer Engine recipe): ``max(history) / float8_max``, the previous scale while
the history holds only zeros. The step records the tensor's current maximum as it quantizes.

The scales and histories are model variables in the :data:`FP8_COLLECTION` collection
(Flax's "overwrite with gradient" convention): the training step differentiates with respect
to them as well, and the "gradient" this module's backward pass returns for them is their new
value, which replaces the old one (it is never an optimizer's input). An apply without the
collection multiplies in the compute dtype (evaluation, fine-tuning, export of a model
pretrained in FP8).
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

FP8_COLLECTION = "_overwrite_with_gradient"
FORWARD_DTYPE = jnp.float8_e4m3fn  # activations and weights
GRADIENT_DTYPE = jnp.float8_e5m2  # output gradients
# The (scale, history) pairs of one matmul: its input, its kernel, its output's gradient.
TENSORS = ("input", "kernel", "output_grad")


def meta_variables(module: nn.Module, history: int) -> dict[str, jax.Array] | None:
    """The FP8 scales and amax histories of ``module``'s matmul (created at init), or None
    when the apply carries no :data:`FP8_COLLECTION` (then the matmul runs unquantized)."""
    if not (module.is_mutable_collection(FP8_COLLECTION)
            or module.has_variable(FP8_COLLECTION, "input_scale")):
        return None
    meta = {}
    for name in TENSORS:
        meta[f"{name}_scale"] = module.variable(
            FP8_COLLECTION, f"{name}_scale", jnp.ones, (), jnp.float32).value
        meta[f"{name}_amax_history"] = module.variable(
            FP8_COLLECTION, f"{name}_amax_history", jnp.zeros, (history,), jnp.float32).value
    return meta


def _fp8_max(dtype) -> float:
    return float(jnp.finfo(dtype).max)


def _delayed_scale(scale, history, dtype):
    """The scale this step uses: from the largest recorded maximum, else the old scale."""
    amax = jnp.max(history)
    ok = (amax > 0.0) & jnp.isfinite(amax)
    return jnp.where(ok, amax / _fp8_max(dtype), scale)


def _record(history, x):
    """``history`` with ``max|x|`` in front and the oldest entry dropped."""
    amax = jnp.max(jnp.abs(x)).astype(jnp.float32)
    return jnp.roll(history, 1).at[0].set(amax)


def _quantize(x, scale, dtype):
    """``x / scale`` saturated to ``dtype``'s range, in ``dtype``."""
    limit = _fp8_max(dtype)
    inverse = (1.0 / scale).astype(x.dtype)
    return jnp.clip(x * inverse, -limit, limit).astype(dtype)


def _update(meta, name, x, dtype):
    """(x quantized, the scale it used, meta entries for ``name`` after this step)."""
    scale = _delayed_scale(meta[f"{name}_scale"], meta[f"{name}_amax_history"], dtype)
    new = {f"{name}_scale": scale,
           f"{name}_amax_history": _record(meta[f"{name}_amax_history"], x)}
    return _quantize(x, scale, dtype), scale, new


def _dims(x_ndim: int, k_ndim: int, in_dims: int):
    """dot_general dimension numbers of the forward, input-gradient and weight-gradient
    products for x [lead..., in...] and kernel [in..., out...]."""
    lead, out_dims = x_ndim - in_dims, k_ndim - in_dims
    forward = ((tuple(range(lead, x_ndim)), tuple(range(in_dims))), ((), ()))
    # g [lead..., out...] with kernel's out axes -> [lead..., in...]
    input_grad = ((tuple(range(lead, lead + out_dims)), tuple(range(in_dims, k_ndim))),
                  ((), ()))
    # x with g over the token axes -> [in..., out...], the kernel's own layout
    weight_grad = ((tuple(range(lead)), tuple(range(lead))), ((), ()))
    return forward, input_grad, weight_grad


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def fp8_matmul(x, kernel, meta, in_dims: int):
    """``x @ kernel`` contracting x's last ``in_dims`` axes with kernel's first ones, in FP8
    with the scales of ``meta`` (:func:`meta_variables`); the result in ``x.dtype``. The
    cotangent returned for ``meta`` is its updated value."""
    return _forward(x, kernel, meta, in_dims)[0]


def _forward(x, kernel, meta, in_dims):
    forward, _, _ = _dims(x.ndim, kernel.ndim, in_dims)
    qx, sx, new_x = _update(meta, "input", x, FORWARD_DTYPE)
    qk, sk, new_k = _update(meta, "kernel", kernel, FORWARD_DTYPE)
    y = jax.lax.dot_general(qx, qk, forward, preferred_element_type=x.dtype)
    y = y * (sx * sk).astype(x.dtype)
    return y, (qx, qk, sx, sk, new_x, new_k)


def _fp8_matmul_fwd(x, kernel, meta, in_dims):
    y, (qx, qk, sx, sk, new_x, new_k) = _forward(x, kernel, meta, in_dims)
    grad_meta = {k: meta[k] for k in ("output_grad_scale", "output_grad_amax_history")}
    # float8 residuals: half the bytes the bfloat16 operands would keep for the backward
    return y, (qx, qk, sx, sk, new_x, new_k, grad_meta, jnp.zeros((0,), kernel.dtype))


def _fp8_matmul_bwd(in_dims, residuals, g):
    qx, qk, sx, sk, new_x, new_k, grad_meta, kernel_like = residuals
    _, input_grad, weight_grad = _dims(qx.ndim, qk.ndim, in_dims)
    qg, sg, new_g = _update(grad_meta, "output_grad", g, GRADIENT_DTYPE)
    dx = jax.lax.dot_general(qg, qk, input_grad, preferred_element_type=g.dtype)
    dx = dx * (sg * sk).astype(g.dtype)
    dk = jax.lax.dot_general(qx, qg, weight_grad, preferred_element_type=g.dtype)
    dk = (dk * (sx * sg).astype(g.dtype)).astype(kernel_like.dtype)
    return dx, dk, {**new_x, **new_k, **new_g}


fp8_matmul.defvjp(_fp8_matmul_fwd, _fp8_matmul_bwd)
