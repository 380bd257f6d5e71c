"""Performance levers the benchmarks can toggle without touching the model or the engine.

* XLA flag presets (must be applied before jax is imported: :func:`apply_xla_flags`).
* Non-finite skip through ``lax.cond`` instead of ``jnp.where`` over every parameter and
  optimizer-state leaf (:func:`make_cond_skip_train_step`).
* The model's runtime choices passed straight to ``BertConfig`` (:data:`MODEL_CHOICES`:
  ``--hidden-dropout``, ``--dropout-hash``, ``--qkv``, ``--layer-norm``,
  ``--residual-dtype``), defined once for every benchmark.

A lever that pays is then proposed as a patch to bert_jax (see docs/performance.md).
"""

from __future__ import annotations

import argparse
import os

# bench option -> BertConfig field it sets (choices and default come from bert_jax.config).
MODEL_CHOICES = {"hidden_dropout": "hidden_dropout_impl", "dropout_hash": "dropout_hash",
                 "qkv": "qkv_projection", "layer_norm": "layer_norm_impl",
                 "residual_dtype": "residual_dtype"}


def add_model_choice_arguments(ap: argparse.ArgumentParser) -> None:
    """One option per :data:`MODEL_CHOICES` entry (docs/pretraining.md, runtime fields)."""
    from bert_jax.config import CHOICE_FIELDS, BertConfig

    defaults = BertConfig()
    for option, field in MODEL_CHOICES.items():
        ap.add_argument("--" + option.replace("_", "-"), default=getattr(defaults, field),
                        choices=CHOICE_FIELDS[field], help=f"model.{field}")


def model_choice_fields(args) -> dict:
    """``{BertConfig field: value}`` of the model-choice options."""
    return {field: getattr(args, option) for option, field in MODEL_CHOICES.items()}


def model_choice_record(args) -> dict:
    """``{option: value}`` of the model-choice options, for result records."""
    return {option: getattr(args, option) for option in MODEL_CHOICES}

# name -> XLA_FLAGS additions. Each name was checked against the XLA flag parser of jaxlib
# 0.10 (an unknown flag aborts the process, so a typo cannot pass silently).
XLA_FLAG_PRESETS: dict[str, tuple[str, ...]] = {
    "none": (),
    # Overlaps independent work (collectives, copies) with compute; the default on TPU.
    "lhs": ("--xla_gpu_enable_latency_hiding_scheduler=true",),
    # cuBLAS for every GEMM instead of Triton-generated GEMM fusions.
    "no_triton_gemm": ("--xla_gpu_enable_triton_gemm=false",),
    # cuBLAS-Lt for every GEMM: XLA's GemmRewriter folds vector biases (and matrix addends)
    # into cuBLAS-Lt epilogues only for cuBLAS-Lt calls.
    "cublaslt": ("--xla_gpu_enable_cublaslt=true",),
    # Every kernel of the step into CUDA graphs (XLA command buffers): fewer launch gaps.
    "graphs": ("--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN",
               "--xla_gpu_graph_min_graph_size=1"),
    # Multi-GPU: overlap collectives with compute (FSDP all-gathers / reduce-scatters).
    "collectives": ("--xla_gpu_enable_latency_hiding_scheduler=true",
                    "--xla_gpu_enable_pipelined_all_gather=true",
                    "--xla_gpu_enable_pipelined_reduce_scatter=true",
                    "--xla_gpu_enable_pipelined_all_reduce=true",
                    "--xla_gpu_enable_while_loop_double_buffering=true",
                    "--xla_gpu_all_reduce_combine_threshold_bytes=134217728",
                    "--xla_gpu_all_gather_combine_threshold_bytes=134217728",
                    "--xla_gpu_reduce_scatter_combine_threshold_bytes=134217728"),
}


def apply_xla_flags(preset: str) -> str:
    """Appends the preset's flags to ``XLA_FLAGS`` (call before importing jax); returns the
    resulting value."""
    if preset not in XLA_FLAG_PRESETS:
        raise SystemExit(f"--xla-flags {preset!r}: choose one of {sorted(XLA_FLAG_PRESETS)}")
    flags = " ".join(XLA_FLAG_PRESETS[preset])
    value = " ".join(v for v in (os.environ.get("XLA_FLAGS", ""), flags) if v)
    os.environ["XLA_FLAGS"] = value
    return value


def use_erfc_gelu() -> None:
    """``--gelu erfc``: the exact GELU as ``jax.nn.gelu(approximate=False)`` computes it
    (through ``erfc``), instead of bert-jax's ``modeling.ops.gelu_erf`` (process-wide; call
    before the model is traced). The same function; the A/B of its cost."""
    import functools

    import jax

    from bert_jax.modeling import ops

    erf_activation = ops.activation

    def activation(name: str):
        if name == "gelu":
            return functools.partial(jax.nn.gelu, approximate=False)
        return erf_activation(name)

    ops.activation = activation


def use_fused_gelu(on: bool) -> None:
    """``--gelu kernel`` (the default) or not: the MLP's ``gelu_erf(y + b)``
    (``ops.add_bias_activate``) as ``modeling.fused_gelu``'s Pallas kernel pair on GPUs, or
    XLA's fusions (process-wide; call before the model is traced). The same function."""
    from bert_jax.modeling import ops

    ops.FUSED_GELU = on


def use_fused_norm_blocks(spec: str) -> None:
    """``--fused-norm-blocks ROWS:WARPS[:hold]``: the fused LayerNorm kernel's settings for
    every shape (process-wide; ``hold`` keeps whole rows in registers in the backward
    pass instead of recomputing them)."""
    from bert_jax.kernels import fused_norm

    parts = spec.split(":")
    try:
        rows, warps = int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        raise SystemExit(f"--fused-norm-blocks {spec!r}: expected ROWS:WARPS or "
                         "ROWS:WARPS:hold") from None
    fused_norm.DEFAULT_BLOCKS = (rows, warps, parts[2:] != ["hold"])


def use_flash_settings(spec: str) -> None:
    """``--flash BACKWARD[:BQ:BK:BQB:BKB:WARPS:STAGES[:DQ_BQ:DQ_BK:DQ_WARPS:DQ_STAGES]]``: the
    flash kernel's backward variant (``fused`` or ``split``; see ``flash.flash_attention``)
    and optionally its blocks, warps and pipeline stages, and the split backward's dQ kernel's
    (four zeros: the dK/dV kernel's, as before the twelfth session), for every call in the
    process (call before the model is traced)."""
    import functools

    from bert_jax.kernels import flash

    parts = spec.split(":")
    names = ("block_q", "block_k", "block_q_bwd", "block_k_bwd", "num_warps", "num_stages")
    if parts[0] not in flash.BACKWARDS or len(parts) not in (1, 1 + len(names),
                                                             5 + len(names)):
        raise SystemExit(f"--flash {spec!r}: expected BACKWARD, "
                         f"BACKWARD:{':'.join(n.upper() for n in names)} or that plus "
                         f":DQ_BQ:DQ_BK:DQ_WARPS:DQ_STAGES, BACKWARD one of {flash.BACKWARDS}")
    try:
        numbers = [int(p) for p in parts[1:]]
    except ValueError:
        raise SystemExit(f"--flash {spec!r}: blocks, warps and stages are integers") from None
    settings = dict(zip(names, numbers, strict=False))
    if len(numbers) > len(names):
        dq = tuple(numbers[len(names):])
        settings["dq_kernel"] = () if not any(dq) else dq
    flash.flash_attention = functools.partial(flash.flash_attention, backward=parts[0],
                                              **settings)
    flash.flash_attention_packed = functools.partial(flash.flash_attention_packed,
                                                     backward=parts[0], **settings)


def apply_process_levers(args) -> None:
    """The process-wide levers, before anything is traced: ``--xla-flags``, ``--gelu``,
    ``--fused-norm-blocks``, ``--norm-sum-blocks``, ``--flash``,
    ``--qkv-bias-grad xla``, ``--residual-grad``, ``--weight-grad`` and ``--mlm-loss``."""
    apply_xla_flags(args.xla_flags)
    gelu = getattr(args, "gelu", "kernel")
    if gelu == "erfc":
        use_erfc_gelu()
    use_fused_gelu(gelu == "kernel")
    if getattr(args, "fused_norm_blocks", ""):
        use_fused_norm_blocks(args.fused_norm_blocks)
    if getattr(args, "norm_sum_blocks", 0):
        from bert_jax.kernels import fused_norm

        fused_norm.SUM_BLOCKS = int(args.norm_sum_blocks)
    if getattr(args, "flash", ""):
        use_flash_settings(args.flash)
    if getattr(args, "qkv_bias_grad", "kernel") == "xla":
        from bert_jax.modeling import encoder

        encoder.FLASH_BIAS_GRADS = False
    from bert_jax.modeling import encoder

    encoder.SPLIT_NORM_GRADS = getattr(args, "residual_grad", "kernel") == "kernel"
    encoder.DIRECT_WEIGHT_GRADS = getattr(args, "weight_grad", "direct") == "direct"
    from bert_jax.modeling import heads

    heads.FUSED_MLM_LOSS = getattr(args, "mlm_loss", "kernel") == "kernel"


def make_cond_skip_train_step(model, tx, schedule, *, pair_head: bool = True):
    """The engine's train step with the non-finite skip as a ``lax.cond``: the optimizer
    update runs only when the loss and gradient norm are finite, instead of computing it
    always and selecting every leaf with ``jnp.where``."""
    from bert_jax.training.steps import make_train_step

    return make_train_step(model, tx, schedule, pair_head=pair_head, skip="cond")
