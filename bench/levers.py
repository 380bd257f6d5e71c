"""Performance levers the step benchmarks can toggle, every one a setting of the software:

* XLA flag presets (must be applied before jax is imported: :func:`apply_xla_flags`).
* Non-finite skip through ``lax.cond`` instead of ``jnp.where`` over every parameter and
  optimizer-state leaf (:func:`make_cond_skip_train_step`).
* The model's runtime choices passed straight to ``BertConfig`` (:data:`MODEL_CHOICES`:
  ``--hidden-dropout``, ``--dropout-hash``, ``--qkv``, ``--layer-norm``,
  ``--residual-dtype``) and its kernel choices (:data:`KERNEL_LEVERS`: ``--fused-gelu``,
  ``--fused-mlm-loss``, ``--norm-blocks``, ...), defined once for every benchmark. A lever
  is a BertConfig or KernelOptions field (:func:`model_fields`); nothing patches a module.
"""

from __future__ import annotations

import argparse
import os

from bert_jax.xla_flags import COLLECTIVE_OVERLAP, TRITON_GEMM_OFF

# bench option -> BertConfig or KernelOptions field it sets (choices and default come from
# bert_jax.config).
MODEL_CHOICES = {"hidden_dropout": "hidden_dropout_impl", "dropout_hash": "dropout_hash",
                 "qkv": "qkv_projection", "layer_norm": "layer_norm_impl",
                 "residual_dtype": "residual_dtype"}


def add_model_choice_arguments(ap: argparse.ArgumentParser) -> None:
    """One option per :data:`MODEL_CHOICES` entry (docs/pretraining.md, runtime fields)."""
    from bert_jax.config import CHOICE_FIELDS, KERNEL_CHOICE_FIELDS, BertConfig

    defaults = BertConfig()
    for option, field in MODEL_CHOICES.items():
        kernel = field in KERNEL_CHOICE_FIELDS
        ap.add_argument("--" + option.replace("_", "-"),
                        default=getattr(defaults.kernels if kernel else defaults, field),
                        choices=(KERNEL_CHOICE_FIELDS if kernel else CHOICE_FIELDS)[field],
                        help=f"model.{model_path(field)}")


def model_path(field: str) -> str:
    """Where a BertConfig or KernelOptions field lives under an experiment's model section."""
    from bert_jax.config import KERNEL_FIELDS

    return f"kernels.{field}" if field in KERNEL_FIELDS else field


def model_fields(fields: dict) -> dict:
    """``{field: value}`` of BertConfig and KernelOptions fields as ``get_preset`` keywords:
    the kernel options gathered under ``kernels``."""
    from bert_jax.config import KERNEL_FIELDS, KernelOptions

    out = {k: v for k, v in fields.items() if k not in KERNEL_FIELDS}
    kernels = {k: v for k, v in fields.items() if k in KERNEL_FIELDS}
    if kernels:
        out["kernels"] = KernelOptions(**kernels)
    return out


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
    "no_triton_gemm": TRITON_GEMM_OFF,
    # cuBLAS-Lt for every GEMM: XLA's GemmRewriter folds vector biases (and matrix addends)
    # into cuBLAS-Lt epilogues only for cuBLAS-Lt calls.
    "cublaslt": ("--xla_gpu_enable_cublaslt=true",),
    # Every kernel of the step into CUDA graphs (XLA command buffers): fewer launch gaps.
    "graphs": ("--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN",
               "--xla_gpu_graph_min_graph_size=1"),
    # Multi-GPU: overlap collectives with compute (FSDP all-gathers / reduce-scatters); what
    # pretraining's parallel.collective_overlap adds (bert_jax/xla_flags.py).
    "collectives": COLLECTIVE_OVERLAP,
    # Data parallel: the gradient all-reduces (one psum of the whole tree, parallel.grad_reduce)
    # start as soon as their bucket's gradients exist and run under the rest of the backward
    # pass: the latency-hiding scheduler, 64 MiB buckets (Large's 1.25 GiB of float32
    # gradients in ~20, the first ready after a few layers) and the collectives on the
    # highest-priority stream.
    "dp_overlap": ("--xla_gpu_enable_latency_hiding_scheduler=true",
                   "--xla_gpu_all_reduce_combine_threshold_bytes=67108864",
                   "--xla_gpu_enable_highest_priority_async_stream=true"),
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


def _on_off(value: str) -> bool:
    if value not in ("on", "off"):
        raise argparse.ArgumentTypeError(f"expected on or off, got {value!r}")
    return value == "on"


def _int_tuple(spec: str, size: int, flag: str | None = None) -> tuple:
    """``A:B[:C]`` -> ints (``size`` of them); with ``flag`` a last ``:flag`` part is allowed
    and becomes a final bool (False when present: 'hold' = do not recompute)."""
    parts = spec.split(":")
    hold = flag is not None and parts[-1] == flag
    if hold:
        parts = parts[:-1]
    try:
        numbers = tuple(int(p) for p in parts)
    except ValueError:
        numbers = ()
    if len(numbers) != size:
        shape = ":".join(["N"] * size) + (f"[:{flag}]" if flag else "")
        raise argparse.ArgumentTypeError(f"{spec!r}: expected {shape}")
    return (*numbers, not hold) if flag else numbers


def _norm_blocks(spec: str) -> tuple:
    return _int_tuple(spec, 2, "hold")


def _gelu_blocks(spec: str) -> tuple:
    return _int_tuple(spec, 3)


# bench option -> (KernelOptions field, parser, choices, default, help). The default is the
# field's default in bert_jax.config; only values that differ from it reach the config.
KERNEL_LEVERS = {
    "fused_gelu": ("fused_gelu", str, ("auto", "off", "force"), "auto",
                   "the MLP's bias + GELU as fused_gelu's Pallas kernels (auto: on GPUs; off: "
                   "XLA's fusions of gelu_erf)"),
    "fused_mlm_loss": ("fused_mlm_loss", str, ("auto", "off", "force"), "auto",
                       "the MLM decoder's softmax cross-entropy as fused_xent's Pallas kernels "
                       "over the float32 logits (auto: on GPUs; off: XLA's passes)"),
    "split_norm_grads": ("split_norm_grads", _on_off, ("on", "off"), True,
                         "the two gradients of a fused LayerNorm output with two consumers "
                         "(next matmul, residual) summed by the LayerNorm's backward kernel "
                         "(on) or by XLA (off)"),
    "direct_weight_grads": ("direct_weight_grads", _on_off, ("on", "off"), True,
                            "projection weight gradients as one dot in the kernel's layout "
                            "(on) or JAX's rule, [out, in] then a transpose (off)"),
    "flash_bias_grads": ("flash_bias_grads", _on_off, ("on", "off"), True,
                         "query/key/value bias gradients summed by the flash backward kernels "
                         "(on) or by XLA column sums over dQ, dK, dV (off)"),
    "norm_blocks": ("norm_blocks", _norm_blocks, None, None,
                    "ROWS:WARPS[:hold]: the fused LayerNorm kernel's blocks for every shape "
                    "(hold: the backward keeps rows in registers); default: the kernel's table"),
    "norm_sum_blocks": ("norm_sum_blocks", int, None, None,
                        "row blocks per program of the fused LayerNorm backward (one partial "
                        "sum of the parameter gradients each); default: the kernel's table"),
    "gelu_blocks": ("gelu_blocks", _gelu_blocks, None, None,
                    "ROWS:COLS:WARPS: the fused GELU kernels' tile for every shape; default: "
                    "the kernel's table"),
    "gelu_sum_blocks": ("gelu_sum_blocks", int, None, None,
                        "row blocks per program of the fused GELU backward; default: the "
                        "kernel's table"),
}


def add_kernel_lever_arguments(ap: argparse.ArgumentParser) -> None:
    """One option per :data:`KERNEL_LEVERS` entry (``--fused-gelu``, ``--norm-blocks``, ...)."""
    group = ap.add_argument_group("kernel levers (BertConfig fields)")
    for option, (field, parse, choices, default, text) in KERNEL_LEVERS.items():
        shown = default if not isinstance(default, bool) else ("on" if default else "off")
        group.add_argument("--" + option.replace("_", "-"), type=parse, default=default,
                           choices=choices if parse is str else None,
                           metavar="|".join(choices) if choices else None,
                           help=f"model.{field}: {text} (default: {shown})")


def kernel_lever_fields(args) -> dict:
    """``{KernelOptions field: value}`` of the kernel levers that differ from the defaults."""
    return {field: getattr(args, option)
            for option, (field, _, _, default, _) in KERNEL_LEVERS.items()
            if getattr(args, option, default) != default}


def kernel_lever_record(args) -> dict:
    """``{option: value}`` of every kernel lever, for result records."""
    return {option: getattr(args, option, default)
            for option, (_, _, _, default, _) in KERNEL_LEVERS.items()}


def apply_process_levers(args) -> None:
    """The process-wide lever (``--xla-flags``), before jax is imported; every other lever is
    a BertConfig field (:func:`kernel_lever_fields`, :func:`model_choice_fields`)."""
    apply_xla_flags(args.xla_flags)


def make_cond_skip_train_step(model, tx, schedule, *, pair_head: bool = True):
    """The engine's train step with the non-finite skip as a ``lax.cond``: the optimizer
    update runs only when the loss and gradient norm are finite, instead of computing it
    always and selecting every leaf with ``jnp.where``."""
    from bert_jax.training.steps import make_train_step

    return make_train_step(model, tx, schedule, pair_head=pair_head, skip="cond")
