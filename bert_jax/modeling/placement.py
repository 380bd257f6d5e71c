"""Where the model's kernels run, read once from the trace: the mesh ``parallel.traced_in_mesh``
entered (and its logical-axis rules) and the platform it targets. The kernels themselves are
told by argument (``kernels/sharding.RowShards``, ``interpret``); this is the one place the
model asks the trace context."""

from __future__ import annotations

import flax.linen as nn

from bert_jax import parallel
from bert_jax.kernels.sharding import WHOLE, RowShards


def target_platform() -> str:
    """``tpu`` / ``gpu`` / ``cpu``: the platform the step is traced for."""
    return parallel.target_platform()


def split_axes(logical: str):
    """The mesh axes that split the logical axis ``logical`` under the entered mesh, or None
    (unsplit, split one way, or no mesh)."""
    mesh = parallel.entered_mesh()
    if mesh is None:
        return None
    axes = nn.logical_to_mesh_axes((logical,))[0]
    if axes is None or parallel.mesh_axes_size(mesh, axes) == 1:
        return None
    return axes


def hidden_split_axes():
    """The mesh axes the hidden axis of activations is split over under the entered mesh
    (None: unsplit, or no mesh); the fused LayerNorm needs it unsplit."""
    if parallel.entered_mesh() is None:
        return None
    return nn.logical_to_mesh_axes(("activation_embed",))[0]


def row_shards(logical: str | None = None, refusal: str = "") -> RowShards:
    """The batch shards of the entered mesh (:data:`~bert_jax.kernels.sharding.WHOLE` without
    one) for kernels that run per batch shard and need the logical axis ``logical`` whole:
    where that axis is split, a ValueError with ``refusal`` (``{axes}``: the mesh axes)."""
    mesh = parallel.entered_mesh()
    if mesh is None:
        return WHOLE
    split = split_axes(logical) if logical else None
    if split is not None:
        raise ValueError(refusal.format(axes=repr(split)))
    return RowShards(mesh, nn.logical_to_mesh_axes(("batch",))[0])


def norm_shards() -> RowShards:
    """:func:`row_shards` for the fused LayerNorm (the hidden axis of activations whole)."""
    if parallel.entered_mesh() is None:
        return WHOLE
    embed_axes = hidden_split_axes()
    if embed_axes is not None:
        raise ValueError("the fused LayerNorm needs the hidden axis of activations unsplit "
                         "(logical axis 'activation_embed' is mapped to mesh axis "
                         f"{embed_axes!r}); use model.kernels.layer_norm_impl=two_stage")
    return row_shards()


def gelu_shards() -> RowShards:
    """:func:`row_shards` for the bias + GELU kernels (the intermediate axis whole)."""
    return row_shards(
        "mlp", "the fused bias + GELU kernel needs the intermediate axis unsplit (logical "
        "axis 'mlp' is mapped to mesh axes {axes}); set model.kernels.fused_gelu='auto' "
        "(XLA's fusions there) or 'off'")


def xent_shards() -> RowShards:
    """:func:`row_shards` for the fused MLM cross-entropy (the vocabulary axis whole)."""
    return row_shards(
        "vocab", "the fused MLM cross-entropy needs the vocabulary axis unsplit (logical axis "
        "'vocab' is mapped to mesh axes {axes}); set model.kernels.fused_mlm_loss='auto' "
        "(XLA's passes there) or 'off'")
