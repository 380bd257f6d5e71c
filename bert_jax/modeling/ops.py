"""Custom-VJP building blocks of the encoder and heads, each written for what XLA makes of its
backward pass on GPUs (found with ``bench/profile_step.py``; measurements in
docs/performance.md):

* :func:`column_sum`: parameter gradients summed over tokens in two stages (XLA's one-stage
  column reduction runs on a handful of thread blocks);
* :func:`add_bias` / :func:`add_bias_activate`: dense-layer epilogues whose backward keeps only
  the matmul output and recomputes the activation's derivative (the erf GELU optionally as a
  Pallas kernel pair, ``kernels.fused_gelu``, ``bert_jax/kernels/fused_gelu.py``);
* :func:`layer_norm_two_stage` / :class:`TwoStageLayerNorm`: LayerNorm with a written-out
  backward (``kernels.layer_norm_impl=two_stage``).

Every backward recomputation sits behind ``lax.optimization_barrier``: without it XLA merges
the recomputation with the forward pass (CSE) and stores the intermediates after all.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.kernels import fused_gelu
from bert_jax.kernels.reference import gelu_erf
from bert_jax.modeling import placement


def activation(name: str):
    if name == "gelu":
        return gelu_erf  # exact erf GELU, as BERT
    if name in ("gelu_new", "gelu_approx"):
        return functools.partial(jax.nn.gelu, approximate=True)
    return {"relu": jax.nn.relu, "tanh": jnp.tanh}[name]


# Column sums (bias gradients: a sum over every token) run in two stages: over the sequence
# (every leading axis but the first) first, then over the batch. In one stage, XLA's GPU
# column reduction runs on a handful of thread blocks however long the column. The first
# stage stays local to each batch shard under a mesh.


def column_sum(x, out_ndim: int):
    """Sum of ``x`` over all but its last ``out_ndim`` axes, accumulated in float32, returned
    in ``x.dtype``."""
    lead, dtype = x.ndim - out_ndim, x.dtype
    if lead >= 2:
        x = jax.lax.optimization_barrier(
            jnp.sum(x, axis=tuple(range(1, lead)), dtype=jnp.float32))
        lead = 1
    return jnp.sum(x, axis=tuple(range(lead)), dtype=jnp.float32).astype(dtype)


@jax.custom_vjp
def add_bias(y, bias):
    """``y + bias`` (bias broadcast over the leading axes) whose bias gradient is a
    two-stage :func:`column_sum`."""
    return y + bias


def _add_bias_fwd(y, bias):
    # The residual is an empty array carrying the bias's rank and dtype.
    return y + bias, jnp.zeros((0,) * bias.ndim, bias.dtype)


def _add_bias_bwd(like, g):
    return g, column_sum(g, like.ndim).astype(like.dtype)


add_bias.defvjp(_add_bias_fwd, _add_bias_bwd)


def use_fused_gelu(y, bias, name: str, fused: str) -> bool:
    """Whether ``add_bias_activate`` runs ``fused_gelu.py``'s kernel pair: ``fused`` is
    ``BertConfig.kernels.fused_gelu`` (auto: on GPUs where the kernels apply, the intermediate axis
    not split over a mesh; off; force: wherever they apply, any backend)."""
    if name != "gelu" or fused == "off":
        return False
    applies = (y.ndim >= 2 and bias.shape == y.shape[-1:] and y.dtype == bias.dtype
               and fused_gelu.supported(y.shape[-1]))
    if fused == "force":
        return applies
    return (applies and placement.target_platform() == "gpu"
            and placement.split_axes("mlp") is None)


def add_bias_activate(y, bias, name: str, *, fused: str = "off", blocks: tuple | None = None,
                      sum_blocks: int | None = None):
    """``activation(name)(y + bias)`` whose backward pass keeps only ``y`` (the matmul output,
    in memory anyway) and recomputes the activation's derivative. Autodiff of the plain
    expression makes the forward fusion write the activation's partial derivatives as extra
    [tokens, intermediate] arrays (three outputs for the erf GELU instead of one). ``fused``
    (``BertConfig.kernels.fused_gelu``: auto | off | force; default off, XLA's fusions) runs
    the erf GELU as ``fused_gelu.bias_gelu``'s kernels instead, with tiles ``blocks`` and
    ``sum_blocks`` (``BertConfig.kernels.gelu_blocks``, ``gelu_sum_blocks``; None: the
    kernel's defaults)."""
    if use_fused_gelu(y, bias, name, fused):
        rows, cols, warps = (None, None, None) if blocks is None else blocks
        return fused_gelu.bias_gelu(y, bias, block_rows=rows, block_cols=cols,
                                    num_warps=warps, sum_blocks=sum_blocks,
                                    shards=placement.gelu_shards())
    return _add_bias_activate(y, bias, name)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _add_bias_activate(y, bias, name: str):
    return activation(name)(y + bias)


def _add_bias_activate_fwd(y, bias, name):
    return activation(name)(y + bias), (y, bias)


def _add_bias_activate_bwd(name, residuals, g):
    # The barrier keeps XLA from merging the recomputation with the forward pass (CSE),
    # which would make the forward fusion write the derivative's terms after all.
    y, bias = jax.lax.optimization_barrier(residuals)
    _, pullback = jax.vjp(activation(name), y + bias)
    (dx,) = pullback(g)
    return dx, column_sum(dx, bias.ndim).astype(bias.dtype)


_add_bias_activate.defvjp(_add_bias_activate_fwd, _add_bias_activate_bwd)


def _layer_norm_stats(x, epsilon: float):
    """float32 mean and 1/std over the last axis (Flax's fast variance: E[x^2] - E[x]^2)."""
    xf = x.astype(jnp.float32)
    mean = jnp.mean(xf, axis=-1, keepdims=True)
    var = jnp.maximum(0.0, jnp.mean(xf * xf, axis=-1, keepdims=True) - mean * mean)
    return mean, jax.lax.rsqrt(var + epsilon)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def layer_norm_two_stage(x, scale, bias, epsilon: float, dtype):
    """``nn.LayerNorm``'s computation (float32 statistics, output in ``dtype``) whose scale and
    bias gradients are two-stage :func:`column_sum` s, computed apart from the input gradient.
    Autodiff of ``nn.LayerNorm`` lets XLA fuse the input gradient into the one-stage column
    reduction of the parameter gradients: a [tokens, hidden] output written by a handful of
    thread blocks, a large share of a fine-tuning step (docs/performance.md)."""
    return _layer_norm_fwd(x, scale, bias, epsilon, dtype)[0]


def _layer_norm_fwd(x, scale, bias, epsilon, dtype):
    mean, rstd = _layer_norm_stats(x, epsilon)
    y = ((x - mean) * (rstd * scale) + bias).astype(dtype)
    return y, (x, mean, rstd, scale, jnp.zeros((0,), bias.dtype))


def _layer_norm_bwd(epsilon, dtype, residuals, g):
    del epsilon, dtype
    x, mean, rstd, scale, bias_like = jax.lax.optimization_barrier(residuals)  # no CSE
    g = g.astype(jnp.float32)
    xhat = (x - mean) * rstd
    dscale = column_sum(g * xhat, 1).astype(scale.dtype)
    dbias = column_sum(g, 1).astype(bias_like.dtype)
    gx = g * scale
    dx = rstd * (gx - jnp.mean(gx, axis=-1, keepdims=True)
                 - xhat * jnp.mean(gx * xhat, axis=-1, keepdims=True))
    return dx.astype(x.dtype), dscale, dbias


layer_norm_two_stage.defvjp(_layer_norm_fwd, _layer_norm_bwd)


class TwoStageLayerNorm(nn.Module):
    """LayerNorm over the last axis with :func:`layer_norm_two_stage`'s backward pass; the
    same parameters (``scale``, ``bias``) and forward values as ``nn.LayerNorm``."""

    epsilon: float
    dtype: str
    param_dtype: str
    scale_init: Any
    bias_init: Any

    @nn.compact
    def __call__(self, x):
        features = (x.shape[-1],)
        scale = self.param("scale", self.scale_init, features, self.param_dtype)
        bias = self.param("bias", self.bias_init, features, self.param_dtype)
        return layer_norm_two_stage(x, scale, bias, self.epsilon, jnp.dtype(self.dtype))
