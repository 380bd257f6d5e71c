"""FP8 matrix multiplies with delayed per-tensor scaling (``BertConfig.fp8``).

The forward pass quantizes the input and the kernel to float8 e4m3 and multiplies them with a
bfloat16 (the compute dtype) result; the backward pass quantizes the output gradient to
float8 e5m2 (more range, less precision: gradients span more decades) and computes the
input and weight gradients from the saved float8 operands. Hopper GPUs run these as FP8
tensor-core GEMMs (cuBLASLt); elsewhere XLA emulates them.

Each tensor has a scale (the value of one float8 unit: ``x ≈ q * scale``). A matmul's three
scales (input, kernel, output gradient) are model variables in the :data:`FP8_COLLECTION`
collection; the "gradient" this module's backward pass returns for a scale is the absolute
maximum of its tensor in this step (it is never an optimizer's input).

The training step keeps the scaling state (:func:`initial_state`): the scales as the model
takes them, and the absolute maxima of the last ``BertConfig.fp8_amax_history`` steps of
every tensor in one [tensors, history] array, newest first. :func:`next_state` records a
step's maxima and sets each scale to ``max(history) / float8_max`` (delayed scaling, as in
NVIDIA's Transformer Engine recipe; the previous scale while the history holds only zeros):
a handful of operations on two arrays per step, whatever the number of matmuls.

:func:`fp8_gelu_mlp` is the MLP (two such matmuls around the GELU) for the fused GELU
kernels, which then write the activation and its gradient in float8 themselves
(``BertConfig.kernels.fp8_gelu_quantize``), and transposed for the weight gradients
(``BertConfig.kernels.fp8_gelu_transpose``).

An apply without the collection multiplies in the compute dtype (evaluation, fine-tuning,
export of a model pretrained in FP8).
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.kernels import fp8_cast, fused_gelu
from bert_jax.modeling import placement

FP8_COLLECTION = "_overwrite_with_gradient"
FORWARD_DTYPE = jnp.float8_e4m3fn  # activations and weights
GRADIENT_DTYPE = jnp.float8_e5m2  # output gradients
# The scales of one matmul: its input, its kernel, its output's gradient.
SCALES = ("input_scale", "kernel_scale", "output_grad_scale")


def meta_variables(module: nn.Module) -> dict[str, jax.Array] | None:
    """The FP8 scales of ``module``'s matmul (created at init, 1), or None when the apply
    carries no :data:`FP8_COLLECTION` (then the matmul runs unquantized)."""
    if not (module.is_mutable_collection(FP8_COLLECTION)
            or module.has_variable(FP8_COLLECTION, "input_scale")):
        return None
    return {name: module.variable(FP8_COLLECTION, name, jnp.ones, (), jnp.float32).value
            for name in SCALES}


def _fp8_max(dtype) -> float:
    return float(jnp.finfo(dtype).max)


def _quantize(x, scale, dtype):
    """``x / scale`` saturated to ``dtype``'s range, in ``dtype``."""
    limit = _fp8_max(dtype)
    inverse = (1.0 / scale).astype(x.dtype)
    return jnp.clip(x * inverse, -limit, limit).astype(dtype)


def _amax(x):
    return jnp.max(jnp.abs(x)).astype(jnp.float32)


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


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def fp8_matmul(x, kernel, meta, in_dims: int, cast: bool = False):
    """``x @ kernel`` contracting x's last ``in_dims`` axes with kernel's first ones, in FP8
    with the scales of ``meta`` (:func:`meta_variables`); the result in ``x.dtype``. The
    cotangent returned for each scale is its tensor's absolute maximum. With ``cast`` the
    input and the output gradient are quantized by ``kernels/fp8_cast.py``, which also writes
    the transposed copies the weight gradient takes (no XLA transposes)."""
    return _forward(x, kernel, meta, in_dims)[0]


def _forward(x, kernel, meta, in_dims):
    forward, _, _ = _dims(x.ndim, kernel.ndim, in_dims)
    sx, sk = meta["input_scale"], meta["kernel_scale"]
    qx, qk = _quantize(x, sx, FORWARD_DTYPE), _quantize(kernel, sk, FORWARD_DTYPE)
    y = jax.lax.dot_general(qx, qk, forward, preferred_element_type=x.dtype)
    y = y * (sx * sk).astype(x.dtype)
    return y, (qx, qk, sx, sk)


def _cast(x, scale, dtype):
    """``x`` [..., width] quantized by the cast kernel: (q [tokens, width], q transposed
    [width, tokens], max |x|)."""
    return fp8_cast.cast_transposed(_tokens(x), scale, dtype, shards=placement.row_shards())


def _forward_2d(x, kernel, meta, in_dims):
    """:func:`_forward` on x as [tokens, K] and the kernel as [K, N], x quantized by the cast
    kernel: (y shaped [..., *out], (x's float8 copy transposed [K, tokens], max |x|), the
    kernel quantized [K, N]). The row-major copy serves the forward GEMM only."""
    in_shape, out_shape = kernel.shape[:in_dims], kernel.shape[in_dims:]
    k = int(np.prod(in_shape))
    sx, sk = meta["input_scale"], meta["kernel_scale"]
    qx, qx_t, amax_x = _cast(x.reshape(*x.shape[:x.ndim - in_dims], k), sx, FORWARD_DTYPE)
    qk = _quantize(kernel.reshape(k, -1), sk, FORWARD_DTYPE)
    y = jax.lax.dot_general(qx, qk, (((1,), (0,)), ((), ())), preferred_element_type=x.dtype)
    y = (y * (sx * sk).astype(x.dtype)).reshape(*x.shape[:x.ndim - in_dims], *out_shape)
    return y, (qx_t, amax_x), qk


def _fp8_matmul_fwd(x, kernel, meta, in_dims, cast):
    if cast:
        y, (qx_t, amax_x), qk = _forward_2d(x, kernel, meta, in_dims)
        sx, sk = meta["input_scale"], meta["kernel_scale"]
        # the kernel's shape and dtype, and x's, in arrays of no elements
        like = (jnp.zeros((*kernel.shape, 0), kernel.dtype), jnp.zeros((*x.shape, 0), x.dtype))
        return y, (qx_t, qk, sx, sk, meta["output_grad_scale"], (amax_x, _amax(kernel)), like)
    y, (qx, qk, sx, sk) = _forward(x, kernel, meta, in_dims)
    amaxes = (_amax(x), _amax(kernel))
    # float8 residuals: half the bytes the bfloat16 operands would keep for the backward
    return y, (qx, qk, sx, sk, meta["output_grad_scale"], amaxes,
               jnp.zeros((0,), kernel.dtype))


def _fp8_matmul_bwd(in_dims, cast, residuals, g):
    if cast:
        return _fp8_matmul_bwd_2d(residuals, g)
    qx, qk, sx, sk, sg, (amax_x, amax_k), kernel_like = residuals
    _, input_grad, weight_grad = _dims(qx.ndim, qk.ndim, in_dims)
    qg = _quantize(g, sg, GRADIENT_DTYPE)
    dx = jax.lax.dot_general(qg, qk, input_grad, preferred_element_type=g.dtype)
    dx = dx * (sg * sk).astype(g.dtype)
    dk = jax.lax.dot_general(qx, qg, weight_grad, preferred_element_type=g.dtype)
    dk = (dk * (sx * sg).astype(g.dtype)).astype(kernel_like.dtype)
    return dx, dk, {"input_scale": amax_x, "kernel_scale": amax_k,
                    "output_grad_scale": _amax(g)}


def _fp8_matmul_bwd_2d(residuals, g):
    qx_t, qk, sx, sk, sg, (amax_x, amax_k), (kernel_like, x_like) = residuals
    qg, qg_t, amax_g = _cast(g.reshape(-1, qk.shape[1]), sg, GRADIENT_DTYPE)
    dx = jax.lax.dot_general(qg, qk, (((1,), (1,)), ((), ())), preferred_element_type=g.dtype)
    dx = (dx * (sg * sk).astype(g.dtype)).reshape(x_like.shape[:-1])
    # [K, N]: both operands with the tokens innermost
    dk = jax.lax.dot_general(qx_t, qg_t, (((1,), (1,)), ((), ())),
                             preferred_element_type=g.dtype)
    dk = (dk * (sx * sg).astype(g.dtype)).astype(kernel_like.dtype)
    return dx, dk.reshape(kernel_like.shape[:-1]), {
        "input_scale": amax_x, "kernel_scale": amax_k, "output_grad_scale": amax_g}


fp8_matmul.defvjp(_fp8_matmul_fwd, _fp8_matmul_bwd)


# ---- the MLP with its activation quantized by the GELU kernels ----------------------------
@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7, 8))
def fp8_gelu_mlp(x, kernel_in, bias_in, kernel_out, meta_in, meta_out, tiles, transposed,
                 cast=False):
    """``gelu_erf(x @ kernel_in + bias_in) @ kernel_out`` (no output bias) as two
    :func:`fp8_matmul`'s with the scales ``meta_in`` and ``meta_out``, where the fused GELU
    kernels (``kernels/fused_gelu.py``, settings ``tiles``) write the activation, and in the
    backward pass the pre-activation's gradient, directly in float8 with their maxima. That
    removes XLA's two largest quantizing passes ([tokens, intermediate] each way) and the
    bfloat16 copies they read. With ``transposed`` the kernels also write both transposed
    ([intermediate, tokens]), the layout the two weight-gradient GEMMs need (FP8 GEMMs take
    their operands with the contracted axis innermost): XLA's two largest transposes go too.
    With ``cast`` the MLP's input and its output gradient are quantized, with their
    transposed copies, by ``kernels/fp8_cast.py``. ``x`` [..., hidden], ``kernel_in``
    [hidden, intermediate], ``kernel_out`` [intermediate, hidden]; the result in
    ``x.dtype``."""
    return _mlp_forward(x, kernel_in, bias_in, kernel_out, meta_in, meta_out, tiles,
                        transposed, cast)[0]


def _tokens(a):
    """[..., width] as [tokens, width]."""
    return a.reshape(-1, a.shape[-1])


def _over_tokens(a, a_transposed: bool, b, b_transposed: bool, dtype):
    """``a^T b`` over the tokens, [Ca, Cb], from a [tokens, Ca] (or [Ca, tokens] when
    ``a_transposed``) and b likewise."""
    a = a if a_transposed else _tokens(a)
    b = b if b_transposed else _tokens(b)
    return jax.lax.dot_general(a, b, (((1 if a_transposed else 0,),
                                        (1 if b_transposed else 0,)), ((), ())),
                               preferred_element_type=dtype)


def _mlp_forward(x, kernel_in, bias_in, kernel_out, meta_in, meta_out, tiles, transposed,
                 cast):
    if cast:  # the input quantized by the cast kernel; qx is its transposed copy
        h, (qx, amax_x), qk_in = _forward_2d(x, kernel_in, meta_in, 1)
        sx, sk_in = meta_in["input_scale"], meta_in["kernel_scale"]
    else:
        h, (qx, qk_in, sx, sk_in) = _forward(x, kernel_in, meta_in, 1)
        amax_x = _amax(x)
    sa, sk_out = meta_out["input_scale"], meta_out["kernel_scale"]
    qa, *qa_t, amax_a = fused_gelu.forward_fp8(h, bias_in, sa, FORWARD_DTYPE, tiles,
                                               transposed)
    qk_out = _quantize(kernel_out, sk_out, FORWARD_DTYPE)
    forward, _, _ = _dims(qa.ndim, qk_out.ndim, 1)
    y = jax.lax.dot_general(qa, qk_out, forward, preferred_element_type=x.dtype)
    y = y * (sa * sk_out).astype(x.dtype)
    residuals = (qx, qk_in, h, bias_in, qa_t[0] if transposed else qa, qk_out,
                 (sx, sk_in, meta_in["output_grad_scale"]),
                 (sa, sk_out, meta_out["output_grad_scale"]),
                 (amax_x, _amax(kernel_in), amax_a, _amax(kernel_out)),
                 jnp.zeros((0,), kernel_in.dtype), jnp.zeros((0,), kernel_out.dtype))
    return y, residuals


def _fp8_gelu_mlp_bwd(tiles, transposed, cast, residuals, g):
    (qx, qk_in, h, bias_in, qa, qk_out, (sx, sk_in, sh), (sa, sk_out, sg),
     (amax_x, amax_k_in, amax_a, amax_k_out), like_in, like_out) = residuals
    _, input_grad, _ = _dims(g.ndim, qk_out.ndim, 1)
    if cast:  # qg_w: the weight gradient's operand, the transposed copy
        qg, qg_w, amax_g = _cast(g, sg, GRADIENT_DTYPE)
        qg = qg.reshape(g.shape)
    else:
        qg = qg_w = _quantize(g, sg, GRADIENT_DTYPE)
        amax_g = _amax(g)
    da = jax.lax.dot_general(qg, qk_out, input_grad, preferred_element_type=g.dtype)
    da = da * (sg * sk_out).astype(g.dtype)
    # the weight gradients contract the tokens, from the transposed copies where the kernels
    # wrote them
    dk_out = _over_tokens(qa, transposed, qg_w, cast, g.dtype)
    dk_out = (dk_out * (sa * sg).astype(g.dtype)).astype(like_out.dtype)
    qdh, *qdh_t, dbias, amax_dh = fused_gelu.backward_fp8(da, h, bias_in, sh, GRADIENT_DTYPE,
                                                          tiles, transposed)
    dx = jax.lax.dot_general(qdh, qk_in, (((qdh.ndim - 1,), (1,)), ((), ())),
                             preferred_element_type=g.dtype)
    dx = dx * (sh * sk_in).astype(g.dtype)
    dk_in = _over_tokens(qx, cast, qdh_t[0] if transposed else qdh, transposed, g.dtype)
    dk_in = (dk_in * (sx * sh).astype(g.dtype)).astype(like_in.dtype)
    return (dx, dk_in, dbias.astype(bias_in.dtype), dk_out,
            {"input_scale": amax_x, "kernel_scale": amax_k_in, "output_grad_scale": amax_dh},
            {"input_scale": amax_a, "kernel_scale": amax_k_out, "output_grad_scale": amax_g})


fp8_gelu_mlp.defvjp(_mlp_forward, _fp8_gelu_mlp_bwd)


# ---- the training step's scaling state -----------------------------------------------------
def initial_state(collection, history: int) -> dict:
    """The scaling state of a fresh run: the model's :data:`FP8_COLLECTION` (every scale 1)
    and an all-zero [tensors, ``history``] array of maxima (tensors: the scales' elements in
    tree order; a scanned layer stack contributes one per layer)."""
    size = sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(collection))
    return {"scale": collection, "amax_history": jnp.zeros((size, history), jnp.float32)}


def _limits(collection) -> np.ndarray:
    """Each tensor's float8 maximum, in the order of :func:`initial_state`'s rows."""
    limits = []
    for path, leaf in jax.tree_util.tree_leaves_with_path(collection):
        dtype = GRADIENT_DTYPE if jax.tree_util.keystr(path).endswith(
            "'output_grad_scale']") else FORWARD_DTYPE
        limits.extend([_fp8_max(dtype)] * int(np.prod(leaf.shape)))
    return np.asarray(limits, np.float32)


def next_state(state: dict, amaxes) -> dict:
    """``state`` after a step whose tensors had the maxima ``amaxes`` (the tree of scale
    "gradients" :func:`fp8_matmul` returns): the maxima in front of the history, the oldest
    dropped, and every scale from its history's largest finite maximum."""
    scales = state["scale"]
    flat = lambda tree: jnp.concatenate(
        [jnp.ravel(leaf).astype(jnp.float32) for leaf in jax.tree.leaves(tree)])
    history = jnp.concatenate([flat(amaxes)[:, None], state["amax_history"][:, :-1]], axis=1)
    largest = jnp.max(jnp.where(jnp.isfinite(history), history, 0.0), axis=1)
    new = jnp.where(largest > 0.0, largest / _limits(scales), flat(scales))
    leaves, treedef = jax.tree.flatten(scales)
    sizes = np.cumsum([int(np.prod(leaf.shape)) for leaf in leaves])[:-1]
    parts = jnp.split(new, sizes)
    return {"scale": jax.tree.unflatten(
                treedef, [p.reshape(leaf.shape) for p, leaf in zip(parts, leaves, strict=True)]),
            "amax_history": history}
