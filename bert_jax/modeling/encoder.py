"""The BERT encoder in Flax linen: embeddings, self-attention, layers, layer stack, pooler.

Parameters carry logical axis names (``vocab``, ``embed``, ``heads``, ``kv``, ``mlp``,
``layers``); the mesh rules that map them onto devices live in the training config. Compute
runs in ``config.dtype`` (e.g. bfloat16) with parameters kept in ``config.param_dtype``.

Packed rows (several examples per row, ``bert_jax/data/packing.py``) pass ``example_ids``
(attention stays within each example), ``position_ids`` (positions restart at each example)
and ``cls_positions`` (the pooler reads each example's first token); without them the graph
is the unpacked one.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.config import BertConfig
from bert_jax.errors import BertJaxError
from bert_jax.kernels import fused_gelu
from bert_jax.kernels.dropout import Dropout, salt_from_rng
from bert_jax.modeling import placement
from bert_jax.modeling.attention import (
    dropout_attention,
    dropout_attention_packed,
    explicit_attention,
    fused_attention,
    resolve_dropout_implementation,
)
from bert_jax.modeling.fp8 import FP8_COLLECTION, fp8_gelu_mlp, fp8_matmul, meta_variables
from bert_jax.modeling.ops import (
    TwoStageLayerNorm,
    add_bias,
    add_bias_activate,
    use_fused_gelu,
)
from bert_jax.modeling.ops import activation as activation_fn
from bert_jax.parallel import constrain

# Logical axis names of activations between layers (mapped to mesh axes by the rules).
ACTIVATION_AXES = ("batch", "length", "activation_embed")
# Activations inside a layer. Pinning them keeps the batch split over (data, fsdp) under FSDP:
# left free, XLA's sharding propagation follows the fsdp-sharded kernels instead, gathers
# the activations of the whole batch and all-reduces the matmul outputs.
HEAD_AXES = ("batch", "length", "heads", "kv")  # query, key, value, context
PACKED_AXES = ("batch", "length", None, "heads", "kv")  # [b, s, 3, heads, head_dim]
MLP_AXES = ("batch", "length", "mlp")

REMAT_POLICIES = {
    "full": None,  # save nothing, recompute everything
    "dots": jax.checkpoint_policies.checkpoint_dots,
    "dots_no_batch": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
    "offload_dots": jax.checkpoint_policies.offload_dot_with_no_batch_dims("device",
                                                                          "pinned_host"),
}


def gather_positions(sequence, positions):
    """[batch, seq, hidden], [batch, P] -> [batch, P, hidden], as a one-hot product: its
    backward is a matmul, not a scatter-add (padded predictions all point at position 0)."""
    one_hot = jax.nn.one_hot(positions, sequence.shape[1], dtype=sequence.dtype)  # [b, P, seq]
    return jnp.einsum("bps,bsh->bph", one_hot, sequence)


def initializer(config: BertConfig, axes: tuple[str | None, ...]):
    """Truncated normal (Google BERT's init) annotated with logical axis names."""
    return nn.with_logical_partitioning(
        nn.initializers.truncated_normal(config.initializer_range), axes)


def zeros(axes):
    return nn.with_logical_partitioning(nn.initializers.zeros_init(), axes)


def ones(axes):
    return nn.with_logical_partitioning(nn.initializers.ones_init(), axes)


def layer_norm(config: BertConfig, name: str) -> nn.Module:
    """``nn.LayerNorm`` (``kernels.layer_norm_impl=flax``) or :class:`TwoStageLayerNorm`; the output
    (the residual stream) in ``residual_dtype``."""
    dtype = "float32" if config.residual_dtype == "float32" else config.dtype
    kwargs = dict(epsilon=config.layer_norm_eps, dtype=dtype,
                  param_dtype=config.param_dtype, scale_init=ones(("embed",)),
                  bias_init=zeros(("embed",)), name=name)
    if config.kernels.layer_norm_impl == "flax":
        return nn.LayerNorm(**kwargs)
    return TwoStageLayerNorm(**kwargs)  # also where fused/auto has no sublayer to fuse


def use_fp8_cast(config: BertConfig) -> bool:
    """Whether the FP8 matmuls quantize their inputs and output gradients with the cast kernel
    (``kernels/fp8_cast.py``, ``kernels.fp8_cast_kernel``): where the layers run the fused
    LayerNorm kernels (GPUs, or ``kernels.layer_norm_impl=fused``)."""
    return config.fp8 and config.kernels.fp8_cast_kernel and use_fused_norm(config)


def use_fused_norm(config: BertConfig) -> bool:
    """Whether the layers end their sublayers in :class:`FusedResidualNorm`:
    ``kernels.layer_norm_impl=fused``, or ``auto`` on GPU where the kernel applies (hash
    dropout with the rowcol hash, a hidden size divisible by 16, activations not split on
    hidden)."""
    options = config.kernels
    if options.layer_norm_impl == "fused":
        return True
    from bert_jax.kernels import fused_norm

    if options.layer_norm_impl != "auto" or placement.target_platform() != "gpu":
        return False
    if options.hidden_dropout_impl != "hash" or options.dropout_hash != "rowcol":
        return False
    return fused_norm.supported(config.hidden_size) and placement.hidden_split_axes() is None


class FusedResidualNorm(nn.Module):
    """``LayerNorm(residual + dropout(y + b))`` in one Pallas kernel each way
    (``kernels.layer_norm_impl=fused``, :mod:`bert_jax.kernels.fused_norm`): the same
    ``scale`` and ``bias`` parameters as the LayerNorm it replaces; ``b`` is the output
    projection's bias (``Projection(skip_bias_add=True)``). With ``split_output`` (and
    ``kernels.split_norm_grads``) the output comes back as a pair (for the matmul, for the
    residual) of one array, and the kernel's backward adds the two gradients as it reads them
    (``fused_norm.residual_dropout_layer_norm(split_output=True)``); without, XLA sums them
    first, one more pass over [tokens, hidden] per sublayer (same values).
    ``kernels.norm_blocks`` and ``norm_sum_blocks`` override the kernel's tiles."""

    config: BertConfig
    split_output: bool = False

    @nn.compact
    def __call__(self, residual, y, b, deterministic: bool):
        from bert_jax.kernels.fused_norm import residual_dropout_layer_norm

        cfg, options = self.config, self.config.kernels
        features = (y.shape[-1],)
        scale = self.param("scale", ones(("embed",)), features, cfg.param_dtype)
        bias = self.param("bias", zeros(("embed",)), features, cfg.param_dtype)
        rate = 0.0 if deterministic else cfg.hidden_dropout_prob
        salt = salt_from_rng(self.make_rng("dropout")) if rate > 0.0 else None
        dtype = "float32" if cfg.residual_dtype == "float32" else cfg.dtype
        rows, warps, recompute = options.norm_blocks or (None, None, None)
        return residual_dropout_layer_norm(
            residual, y, b, scale, bias, salt=salt, rate=rate, epsilon=cfg.layer_norm_eps,
            out_dtype=dtype, block_rows=rows, num_warps=warps, recompute=recompute,
            sum_blocks=options.norm_sum_blocks,
            split_output=self.split_output and options.split_norm_grads,
            shards=placement.norm_shards())


def hidden_dropout(config: BertConfig) -> Dropout:
    """Hidden-state dropout as the config says (rate, ``kernels.hidden_dropout_impl``,
    ``kernels.dropout_hash``)."""
    return Dropout(config.hidden_dropout_prob, config.kernels.hidden_dropout_impl,
                   config.kernels.dropout_hash)


# Weight gradients of the projections as one dot_general whose output is the kernel's own
# [in..., out...] layout (``kernels.direct_weight_grads``). JAX's transpose rule computes
# dot_general(dy, x) -> [out..., in...] and then transposes; on the GPU, XLA splits the q/k/v
# and attention-output weight gradients over the tokens (split-K) and its reduction of the
# split then writes the transposed result, a slow strided pass. Same values either way
# (docs/performance.md, "The defaults, and why").


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _project(x, kernel, in_dims: int):
    """``x @ kernel`` contracting x's last ``in_dims`` axes with kernel's first ones."""
    return jax.lax.dot_general(x, kernel, _contract_last(x.ndim, in_dims))


def _contract_last(ndim: int, in_dims: int):
    return (tuple(range(ndim - in_dims, ndim)), tuple(range(in_dims))), ((), ())


def _project_fwd(x, kernel, in_dims):
    return _project(x, kernel, in_dims), (x, kernel)


def _project_bwd(in_dims, saved, g):
    x, kernel = saved
    lead = x.ndim - in_dims
    dx = jax.lax.dot_general(g, kernel, ((tuple(range(lead, g.ndim)),
                                          tuple(range(in_dims, kernel.ndim))), ((), ())))
    # Contract the token axes of x and g: [in..., out...], the kernel's shape, directly.
    dk = jax.lax.dot_general(x, g, ((tuple(range(lead)), tuple(range(lead))), ((), ())))
    return dx.astype(x.dtype), dk.astype(kernel.dtype)


_project.defvjp(_project_fwd, _project_bwd)


class Projection(nn.Module):
    """A dense layer contracting the last ``in_dims`` input axes into ``features`` output axes.

    Unlike ``nn.DenseGeneral`` the kernel is created in its full shape (e.g. [embed, 3, heads,
    head_dim]), so its logical-axis annotation applies as written under an active mesh.
    """

    features: tuple[int, ...]
    in_dims: int
    axes: tuple[str | None, ...]
    config: BertConfig
    activation: str | None = None  # applied after the bias (see add_bias_activate)
    # Output axis (index into ``features``) computed as one matmul per slice, returned as a
    # tuple of arrays; the parameters keep their full shape.
    split_output: int | None = None
    # Return (matmul output, bias) unadded: the consumer adds the bias (FusedResidualNorm).
    skip_bias_add: bool = False
    # An encoder-layer matmul: FP8 under ``config.fp8`` (``modeling/fp8.py``) when the apply
    # carries the scaling state.
    fp8: bool = False

    @nn.compact
    def __call__(self, x, *, operands: bool = False):
        """The projection of ``x``; with ``operands``, (kernel, bias, FP8 scales or None) as
        stored instead, for a caller that computes it (``x``: anything with the input's
        ``shape``)."""
        cfg = self.config
        in_shape = x.shape[len(x.shape) - self.in_dims:]
        kernel = self.param("kernel", initializer(cfg, self.axes),
                            (*in_shape, *self.features), cfg.param_dtype)
        bias = self.param("bias", zeros(self.axes[self.in_dims:]), self.features,
                          cfg.param_dtype)
        meta = meta_variables(self) if self.fp8 and cfg.fp8 else None
        if operands:
            return kernel, bias, meta
        x, kernel, bias = nn.dtypes.promote_dtype(x, kernel, bias, dtype=cfg.dtype)
        if self.split_output is not None and meta is not None:
            # One FP8 matmul (one set of scales) over the whole kernel, then the slices.
            axis = self.split_output
            y = self._matmul(x, kernel, meta)
            out_axis = y.ndim - len(self.features) + axis
            parts = [(jax.lax.index_in_dim(y, i, out_axis, False),
                      jax.lax.index_in_dim(bias, i, axis, False))
                     for i in range(self.features[axis])]
            if self.skip_bias_add:
                return tuple(parts)
            return tuple(add_bias(y_i, b_i) for y_i, b_i in parts)
        if self.split_output is not None:
            axis = self.split_output
            parts = [(jax.lax.index_in_dim(kernel, i, self.in_dims + axis, False),
                      jax.lax.index_in_dim(bias, i, axis, False))
                     for i in range(self.features[axis])]
            if self.skip_bias_add:  # ((matmul output, bias) per slice)
                return tuple((self._matmul(x, k), b) for k, b in parts)
            return tuple(self._biased(x, k, b) for k, b in parts)
        if len(self.features) > 1 and not self.skip_bias_add and self.activation is None:
            return self._biased(x, kernel, bias, meta)
        y = self._matmul(x, kernel, meta)
        if self.skip_bias_add:
            return y, bias
        if self.activation is not None:
            options = cfg.kernels
            return add_bias_activate(y, bias, self.activation, fused=options.fused_gelu,
                                     blocks=options.gelu_blocks,
                                     sum_blocks=options.gelu_sum_blocks)
        return add_bias(y, bias)

    def _matmul(self, x, kernel, meta=None):
        if meta is not None:
            return fp8_matmul(x, kernel, meta, self.in_dims, use_fp8_cast(self.config))
        if self.config.kernels.direct_weight_grads:
            return _project(x, kernel, self.in_dims)
        return jax.lax.dot_general(x, kernel, _contract_last(x.ndim, self.in_dims))

    def _biased(self, x, kernel, bias, meta=None):
        """``x @ kernel + bias`` for a kernel with several output axes, computed against the
        kernel flattened to one output axis and reshaped after the bias: the bias add is then
        a vector bias on the matmul's 2-D output, the form XLA can fold into a cuBLAS
        epilogue (it does for the float32 MLM decoder; for bfloat16 outputs the add stays one
        pass, see docs/performance.md, "Tried and not kept")."""
        out_shape = kernel.shape[self.in_dims:]
        flat = kernel.reshape(*kernel.shape[:self.in_dims], -1)
        y = add_bias(self._matmul(x, flat, meta), bias.reshape(-1))
        return y.reshape(*y.shape[:-1], *out_shape)


def dense(config: BertConfig, features, axes, name: str, axis=-1,
          activation: str | None = None, skip_bias_add: bool = False,
          fp8: bool = False) -> Projection:
    """Projection with logical ``axes`` (input axes then output axes); ``axis`` = the
    contracted input axes (-1, or (-2, -1) for [heads, head_dim] -> hidden); ``activation``
    (a ``modeling.ops.activation`` name) is applied after the bias; ``skip_bias_add`` returns
    (output, bias) instead; ``fp8``: an encoder-layer matmul (see ``Projection.fp8``)."""
    features = features if isinstance(features, tuple) else (features,)
    in_dims = len(axis) if isinstance(axis, tuple) else 1
    return Projection(features, in_dims, tuple(axes), config, activation,
                      skip_bias_add=skip_bias_add, fp8=fp8, name=name)


class BertEmbeddings(nn.Module):
    """Token + segment + absolute position embeddings, LayerNorm, dropout.

    With ALBERT's factorized embeddings the tables are ``embedding_size`` wide and a dense
    projection maps them to ``hidden_size``.
    """

    config: BertConfig

    def setup(self):
        cfg = self.config
        # Tables are looked up in the parameter dtype and the sum is cast afterwards: the
        # backward pass then scatter-adds in float32 (bfloat16 atomics serialize on GPUs).
        emb = functools.partial(nn.Embed, features=cfg.embedding_dim, dtype=cfg.param_dtype,
                                param_dtype=cfg.param_dtype)
        self.word_embeddings = emb(num_embeddings=cfg.padded_vocab_size,
                                   embedding_init=initializer(cfg, ("vocab", "embed")))
        self.position_embeddings = emb(num_embeddings=cfg.max_position_embeddings,
                                       embedding_init=initializer(cfg, (None, "embed")))
        if cfg.use_token_types:  # DistilBERT has no token-type table
            self.token_type_embeddings = emb(num_embeddings=cfg.type_vocab_size,
                                             embedding_init=initializer(cfg, (None, "embed")))
        self.layer_norm = layer_norm(cfg, "LayerNorm")
        self.dropout = hidden_dropout(cfg)
        if cfg.embedding_dim != cfg.hidden_size:
            self.projection = dense(cfg, cfg.hidden_size, ("embed", "mlp"),
                                    "embedding_projection")

    def __call__(self, input_ids, segment_ids, deterministic: bool = True, position_ids=None):
        seq_len = input_ids.shape[-1]
        words = self.word_embeddings(input_ids)  # [batch, seq, embedding_dim]
        # Positions are a slice and segments a one-hot product: neither needs a scatter in
        # the backward pass (every token of a batch hits the same few rows).
        offset = self.config.position_offset  # RoBERTa: positions start at pad_token_id + 1
        positions = self.position_embeddings.embedding[None, offset:offset + seq_len]
        if position_ids is not None:  # packed rows: [batch, seq] positions within the example
            positions = jax.nn.one_hot(position_ids, seq_len, dtype=words.dtype) @ positions[0]
        x = words + positions
        if self.config.use_token_types:
            table = self.token_type_embeddings.embedding
            if self.config.type_vocab_size == 1:  # one type (RoBERTa): every token has it
                x = x + table[0]
            else:
                x = x + jax.nn.one_hot(segment_ids, self.config.type_vocab_size,
                                       dtype=words.dtype) @ table
        # The table is split on its hidden axis under FSDP; the lookup would carry that split
        # into the activations (batch replicated) without this constraint.
        x = constrain(x.astype(self.config.dtype), ACTIVATION_AXES)
        x = self.layer_norm(x)
        x = self.dropout(x, deterministic=deterministic)
        if self.config.embedding_dim != self.config.hidden_size:
            x = self.projection(x)
        return x


class BertSelfAttention(nn.Module):
    """Multi-head self-attention with a fused QKV projection and an output projection."""

    config: BertConfig
    deterministic: bool = True
    output_attentions: bool = False
    # Return (output projection's matmul, its bias) for FusedResidualNorm to add.
    return_bias: bool = False

    @nn.compact
    def __call__(self, x, kv_lengths, example_ids=None):
        cfg, options = self.config, self.config.kernels
        n, d = cfg.num_attention_heads, cfg.head_dim
        # [batch, seq, 3, heads, head_dim]
        axes = ("embed", None, "heads", "kv")
        dropout_active = not self.deterministic and cfg.attention_probs_dropout_prob > 0.0
        # Training attention takes the query/key/value biases unadded
        # (``kernels.flash_bias_grads``): the flash kernel's backward sums their gradients in
        # passing instead of XLA's column sums re-reading dQ, dK and dV; the other paths add
        # them (dropout_attention).
        bias_to_attention = (options.flash_bias_grads and dropout_active
                             and not self.output_attentions
                             and options.qkv_projection in ("split", "packed"))
        qkv_bias = None
        if (options.qkv_projection == "packed" and dropout_active and not self.output_attentions
                and self._flash_runs(x)):
            # One matmul into [batch, seq, 3, heads, head_dim], read in place by the flash
            # kernel, whose gradient comes back packed: one input-gradient and one
            # weight-gradient matmul in the backward pass. (Elsewhere packed computes as
            # split, below.)
            packed, bias = Projection((3, n, d), 1, axes, cfg, skip_bias_add=True,
                                      fp8=True, name="qkv")(x)
            if not bias_to_attention:
                packed, bias = packed + bias.astype(packed.dtype), None
            context = dropout_attention_packed(
                constrain(packed, PACKED_AXES), kv_lengths, dropout_rng=self.make_rng("dropout"),
                dropout_rate=cfg.attention_probs_dropout_prob, implementation="flash",
                mask_hash=options.dropout_hash, qkv_bias=bias, example_ids=example_ids)
            return self._output(context, None)
        if options.qkv_projection in ("split", "packed"):
            # Three matmuls on slices of the [embed, 3, heads, head_dim] kernel: query, key
            # and value come out contiguous (no strided copies for the attention kernels) and
            # their gradients feed the weight gradients without a concatenation.
            projected = Projection((3, n, d), 1, axes, cfg, split_output=0,
                                   skip_bias_add=bias_to_attention, fp8=True, name="qkv")(x)
            if bias_to_attention:
                (query, key, value), qkv_bias = zip(*projected, strict=True)
            else:
                query, key, value = projected
        else:
            qkv = dense(cfg, (3, n, d), axes, "qkv", fp8=True)(x)
            query, key, value = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        query, key, value = (constrain(t, HEAD_AXES) for t in (query, key, value))
        if self.output_attentions:
            rng = self.make_rng("dropout") if dropout_active else None
            context, probs = explicit_attention(
                query, key, value, kv_lengths, dropout_rng=rng,
                dropout_rate=cfg.attention_probs_dropout_prob, deterministic=self.deterministic,
                example_ids=example_ids)
        elif dropout_active:
            context, probs = dropout_attention(
                query, key, value, kv_lengths, dropout_rng=self.make_rng("dropout"),
                dropout_rate=cfg.attention_probs_dropout_prob,
                implementation=options.dropout_attention_impl, mask_hash=options.dropout_hash,
                qkv_bias=qkv_bias, example_ids=example_ids), None
        else:
            context, probs = fused_attention(query, key, value, kv_lengths,
                                             options.attention_impl, example_ids), None
        return self._output(context, probs)

    def _flash_runs(self, x) -> bool:
        """Whether dropout attention over ``x``'s shape resolves to the flash kernel."""
        cfg = self.config
        like = jax.ShapeDtypeStruct((*x.shape[:2], cfg.num_attention_heads, cfg.head_dim),
                                    cfg.dtype)
        implementation = cfg.kernels.dropout_attention_impl
        return resolve_dropout_implementation(implementation, like, like) == "flash"

    def _output(self, context, probs):
        cfg = self.config
        context = constrain(context, HEAD_AXES)
        out = dense(cfg, cfg.hidden_size, ("heads", "kv", "embed"), "out", axis=(-2, -1),
                    skip_bias_add=self.return_bias, fp8=True)(context)
        if self.return_bias:  # (matmul output, bias): the layer's FusedResidualNorm adds it
            return (constrain(out[0], ACTIVATION_AXES), out[1]), probs
        return constrain(out, ACTIVATION_AXES), probs


def _handles(x):
    """(input of the next matmul, residual) from a layer input: one array used for both, or
    the pair a fused LayerNorm returned with ``split_output``."""
    return x if isinstance(x, tuple) else (x, x)


class PlainSublayerEnd:
    """How a sublayer ends, ``LayerNorm(residual + dropout(y))``, unfused: the hidden dropout
    and Flax's or the two-stage LayerNorm (:func:`layer_norm`), XLA's fusions between them.
    Made inside a layer's compact call, so its modules are the layer's."""

    bias_apart = False  # the sublayers add their output projection's bias themselves

    def __init__(self, config: BertConfig, deterministic: bool):
        self.config, self.deterministic = config, deterministic
        self.dropout = hidden_dropout(config)  # one module for both sublayers (its rng)

    def __call__(self, residual, y, name: str, split_output: bool = False):
        del split_output  # one array: XLA sums its two consumers' gradients
        dropped = self.dropout(y, deterministic=self.deterministic)
        return layer_norm(self.config, name)(residual + dropped)


class FusedSublayerEnd:
    """How a sublayer ends as one Pallas kernel each way (:class:`FusedResidualNorm`): the
    output projection's bias, the dropout, the residual add and the LayerNorm. ``y`` is the
    (matmul output, bias) pair; with ``split_output`` the result is the pair of handles the
    next sublayer's matmul and residual take (``kernels.split_norm_grads``)."""

    bias_apart = True  # the sublayers return (matmul output, bias) for the kernel to add

    def __init__(self, config: BertConfig, deterministic: bool):
        self.config, self.deterministic = config, deterministic

    def __call__(self, residual, y, name: str, split_output: bool = False):
        product, bias = y
        return FusedResidualNorm(self.config, split_output=split_output, name=name)(
            residual, product, bias, self.deterministic)


def sublayer_end(config: BertConfig, deterministic: bool) -> PlainSublayerEnd | FusedSublayerEnd:
    """The sublayer ending the config picks: fused where :func:`use_fused_norm`, else plain."""
    cls = FusedSublayerEnd if use_fused_norm(config) else PlainSublayerEnd
    return cls(config, deterministic)


def feed_forward(cfg: BertConfig, x, bias_apart: bool = False):
    """The MLP sublayer ``mlp_out(act(mlp_in(x)))``, [batch, seq, hidden]. ``bias_apart``: the
    output projection's bias comes back unadded, as (product, bias), for a fused sublayer
    ending; the MLP is then, where its GELU kernels apply under FP8,
    :func:`fp8_gelu_feed_forward`."""
    mlp_in = dense(cfg, cfg.intermediate_size, ("embed", "mlp"), "mlp_in",
                   activation=cfg.hidden_act, fp8=True)
    if bias_apart:
        fp8_out = fp8_gelu_feed_forward(cfg, mlp_in, x)
        if fp8_out is not None:
            product, bias = fp8_out
            return constrain(product, ACTIVATION_AXES), bias
    mlp_out = dense(cfg, cfg.hidden_size, ("mlp", "embed"), "mlp_out",
                    skip_bias_add=bias_apart, fp8=True)
    y = mlp_out(constrain(mlp_in(x), MLP_AXES))
    if bias_apart:
        product, bias = y
        return constrain(product, ACTIVATION_AXES), bias
    return constrain(y, ACTIVATION_AXES)


def fp8_gelu_feed_forward(cfg: BertConfig, mlp_in: Projection, x):
    """The MLP as ``fp8.fp8_gelu_mlp`` (the GELU kernels writing float8): (its output without
    ``mlp_out``'s bias, that bias), when the apply carries the FP8 scales, the activation is
    the GELU and its kernels apply (``kernels.fp8_gelu_quantize``); else None, before
    ``mlp_out`` exists."""
    options = cfg.kernels
    if not (cfg.fp8 and options.fp8_gelu_quantize):
        return None
    kernel_in, bias_in, meta_in = mlp_in(x, operands=True)
    h = jax.ShapeDtypeStruct((*x.shape[:-1], cfg.intermediate_size), cfg.dtype)
    b = jax.ShapeDtypeStruct(bias_in.shape, cfg.dtype)
    if meta_in is None or not use_fused_gelu(h, b, cfg.hidden_act, options.fused_gelu):
        return None
    kernel_out, bias_out, meta_out = dense(cfg, cfg.hidden_size, ("mlp", "embed"), "mlp_out",
                                           skip_bias_add=True, fp8=True)(h, operands=True)
    x, kernel_in, bias_in, kernel_out, bias_out = nn.dtypes.promote_dtype(
        x, kernel_in, bias_in, kernel_out, bias_out, dtype=cfg.dtype)
    if options.fp8_gelu_transpose:  # the transposing kernels' own tiles
        tiles = fused_gelu.tile_settings(h, bias_in, transposed=True,
                                         shards=placement.gelu_shards())
    else:
        rows, cols, warps = options.gelu_blocks or (None, None, None)
        tiles = fused_gelu.tile_settings(h, bias_in, block_rows=rows, block_cols=cols,
                                         num_warps=warps, sum_blocks=options.gelu_sum_blocks,
                                         shards=placement.gelu_shards())
    return (fp8_gelu_mlp(x, kernel_in, bias_in, kernel_out, meta_in, meta_out, tiles,
                         options.fp8_gelu_transpose, use_fp8_cast(cfg)), bias_out)


class BertLayer(nn.Module):
    """One post-LayerNorm Transformer block, as in the original BERT:
    ``x = LayerNorm(x + dropout(attention(x)))``, then ``LayerNorm(x + dropout(mlp(x)))``.
    How each sublayer ends (:func:`sublayer_end`: plain, or one fused kernel) is chosen once
    from the config.

    ``x`` is [batch, seq, hidden], or the (matmul input, residual) pair of one array that the
    previous layer returns with ``split_output`` (fused LayerNorm only, ``split_norm_grads``:
    the layer's first LayerNorm then adds the two gradients in its backward kernel)."""

    config: BertConfig
    deterministic: bool = True
    output_attentions: bool = False
    split_output: bool = False

    @nn.compact
    def __call__(self, x, kv_lengths, example_ids=None):
        cfg = self.config
        add_norm = sublayer_end(cfg, self.deterministic)
        x, residual = _handles(x)
        attended, probs = BertSelfAttention(cfg, self.deterministic, self.output_attentions,
                                            return_bias=add_norm.bias_apart, name="attention")(
            x, kv_lengths, example_ids)
        x, residual = _handles(add_norm(residual, attended, "attention_norm", split_output=True))
        x = add_norm(residual, feed_forward(cfg, x, add_norm.bias_apart), "output_norm",
                     split_output=self.split_output)
        if isinstance(x, tuple):
            return tuple(constrain(t, ACTIVATION_AXES) for t in x), probs
        return constrain(x, ACTIVATION_AXES), probs


class _ScanLayer(BertLayer):
    """BertLayer with the (carry, broadcast) -> (carry, per-layer outputs) scan signature."""

    @nn.compact
    def __call__(self, x, kv_lengths, example_ids=None):
        x, probs = super().__call__(x, kv_lengths, example_ids)
        return x, (x, probs)


class BertEncoder(nn.Module):
    """The layer stack: unrolled, ``nn.scan``-ned (stacked params on a ``layers`` axis), or
    one shared layer (ALBERT); each optionally rematerialized."""

    config: BertConfig
    deterministic: bool = True
    output_hidden_states: bool = False
    output_attentions: bool = False

    @nn.compact
    def __call__(self, x, kv_lengths, example_ids=None):
        cfg = self.config
        hidden_states, attentions = [x], []
        layer_cls = BertLayer
        if cfg.remat_policy != "none":
            layer_cls = nn.remat(layer_cls if not cfg.scan_layers else _ScanLayer,
                                 policy=REMAT_POLICIES[cfg.remat_policy],
                                 prevent_cse=not cfg.scan_layers)
        elif cfg.scan_layers:
            layer_cls = _ScanLayer
        kwargs = dict(config=cfg, deterministic=self.deterministic,
                      output_attentions=self.output_attentions)
        if cfg.scan_layers:
            scanned = nn.scan(
                layer_cls,
                variable_axes={} if cfg.share_layers else {
                    "params": 0, **({FP8_COLLECTION: 0} if cfg.fp8 else {})},
                variable_broadcast="params" if cfg.share_layers else False,
                split_rngs={"params": not cfg.share_layers, "dropout": True},
                in_axes=nn.broadcast, length=cfg.num_hidden_layers,
                metadata_params={nn.PARTITION_NAME: "layers"})
            x, (per_layer, probs) = scanned(**kwargs, name="layers")(x, kv_lengths, example_ids)
            # per_layer: [layers, batch, seq, hidden] -> list
            hidden_states += [per_layer[i] for i in range(cfg.num_hidden_layers)]
            if probs is not None:
                attentions = [probs[i] for i in range(cfg.num_hidden_layers)]
        else:
            shared = layer_cls(**kwargs, name="layer") if cfg.share_layers else None
            last = cfg.num_hidden_layers - 1
            for i in range(cfg.num_hidden_layers):
                # Every layer but the last hands the next its output as two handles (the
                # fused LayerNorm's gradient sum, split_norm_grads); one shared module can't.
                layer = shared if shared is not None else layer_cls(
                    **kwargs, split_output=i < last, name=f"layer_{i}")
                x, probs = layer(x, kv_lengths, example_ids)
                hidden_states.append(_handles(x)[0])
                attentions.append(probs)
        return {
            "sequence_output": x,
            "hidden_states": tuple(hidden_states) if self.output_hidden_states else None,
            "attentions": tuple(attentions) if self.output_attentions else None,
        }


class BertModel(nn.Module):
    """Embeddings + encoder + pooler. Inputs are right-padded: ``input_mask`` marks real tokens.

    Returns a dict: ``sequence_output`` [batch, seq, hidden], ``pooled_output``
    [batch, hidden], and when requested ``hidden_states`` (embeddings + every layer) and
    ``attentions`` (per layer [batch, heads, seq, seq]).

    Packed rows (left-aligned examples, padding at the end): ``example_ids`` [batch, seq]
    (0 = padding, 1..k), ``position_ids`` [batch, seq] (restarting at 0 per example) and
    ``cls_positions`` [batch, k] (each example's first token; empty slots any in-row index):
    ``pooled_output`` is then [batch, k, hidden], one per example slot.
    """

    config: BertConfig
    add_pooler: bool = True

    @nn.compact
    def __call__(self, input_ids, input_mask=None, segment_ids=None, *,
                 deterministic: bool = True, output_hidden_states: bool = False,
                 output_attentions: bool = False, example_ids=None, position_ids=None,
                 cls_positions=None) -> dict[str, Any]:
        cfg = self.config
        if input_ids.shape[-1] > cfg.max_sequence_length:
            raise BertJaxError(f"sequence length {input_ids.shape[-1]} exceeds the position "
                               f"table (max_position_embeddings={cfg.max_position_embeddings}"
                               f", position_offset={cfg.position_offset})")
        if input_mask is None:
            input_mask = jnp.ones_like(input_ids)
        if segment_ids is None:
            segment_ids = jnp.zeros_like(input_ids)
        kv_lengths = jnp.sum(input_mask, axis=-1).astype(jnp.int32)  # [batch]
        x = BertEmbeddings(cfg, name="embeddings")(input_ids, segment_ids,
                                                   deterministic=deterministic,
                                                   position_ids=position_ids)
        x = constrain(x, ACTIVATION_AXES)
        out = BertEncoder(cfg, deterministic, output_hidden_states, output_attentions,
                          name="encoder")(x, kv_lengths, example_ids)
        if self.add_pooler:
            pooler = dense(cfg, cfg.hidden_size, ("embed", "mlp"), "pooler")
            sequence = out["sequence_output"]
            if cls_positions is None:
                first = pooler(sequence[:, 0])
            else:  # [batch, k, hidden]: each packed example's first token
                first = pooler(gather_positions(sequence, cls_positions))
            out["pooled_output"] = activation_fn(cfg.pooler_activation)(first)
        return out

    def word_embedding_table(self):
        """[padded_vocab, embedding_dim] word embeddings (the tied MLM decoder); call after
        ``__call__`` within the same apply."""
        table = self.variables["params"]["embeddings"]["word_embeddings"]["embedding"]
        return nn.unbox(table)
