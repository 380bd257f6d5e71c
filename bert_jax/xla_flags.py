"""XLA flags that the commands add to ``XLA_FLAGS`` from config fields, before the backend
starts (jax reads ``XLA_FLAGS`` once, when it creates its first client).

A flag the user already named in ``XLA_FLAGS`` is never overridden. Every flag here is one of
XLA's GPU options: other platforms parse and ignore them (libtpu takes its own flags from
``LIBTPU_INIT_ARGS``).

* :data:`TRITON_GEMM_OFF` — fine-tuning's ``triton_gemm=False``: cuBLAS for every matmul,
  whose autotuning tries a few library algorithms instead of searching Triton tilings.
* :data:`COLLECTIVE_OVERLAP` — pretraining's ``parallel.collective_overlap``: the collectives
  of a multi-GPU step run under the compute (docs/performance.md, data parallel and FSDP).

TPU options go to the compile itself instead (:func:`tpu_compiler_options`, jit's
``compiler_options``), so each step compiled in one process can take its own:

* :data:`TPU_COLLECTIVE_MATMUL_OFF` — pretraining's ``parallel.tpu_collective_matmul`` (off,
  or auto on an FSDP mesh): no windowed collective matmuls (XLA:TPU's loops of
  collective-permutes that gather a sharded operand a window at a time inside the matmul);
  the gathers and reduce-scatters stay whole (docs/tpu.md: FSDP on v4).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

ENV = "XLA_FLAGS"

TRITON_GEMM_OFF = ("--xla_gpu_enable_triton_gemm=false",)

# The latency-hiding scheduler overlaps the collectives with independent compute; FSDP's
# all-gathers and reduce-scatters (and DP's all-reduces) of a layer are pipelined with the
# neighbouring layers' compute, a scanned loop's body is double-buffered, and collectives are
# combined into 128 MiB buckets.
COLLECTIVE_OVERLAP = (
    "--xla_gpu_enable_latency_hiding_scheduler=true",
    "--xla_gpu_enable_pipelined_all_gather=true",
    "--xla_gpu_enable_pipelined_reduce_scatter=true",
    "--xla_gpu_enable_pipelined_all_reduce=true",
    "--xla_gpu_enable_while_loop_double_buffering=true",
    "--xla_gpu_all_reduce_combine_threshold_bytes=134217728",
    "--xla_gpu_all_gather_combine_threshold_bytes=134217728",
    "--xla_gpu_reduce_scatter_combine_threshold_bytes=134217728",
)


TPU_COLLECTIVE_MATMUL_OFF = {"xla_tpu_enable_windowed_einsum_for_all_gather": False,
                             "xla_tpu_enable_windowed_einsum_for_reduce_scatter": False}


COLLECTIVE_MATMUL = ("auto", "allowed", "off")


def tpu_compiler_options(platform: str, collective_matmul: str = "auto",
                         mesh_shape: dict[str, int] | None = None) -> dict | None:
    """The compile options of a step for devices of ``platform`` (None: XLA's defaults).
    ``collective_matmul`` (``parallel.tpu_collective_matmul``): ``allowed`` leaves windowed
    collective matmuls to XLA, ``off`` turns them off, ``auto`` turns them off on a mesh
    that shards the parameters (fsdp) without tensor parallelism, where XLA would gather
    the weights a window at a time and re-read and re-write whole activations each window
    (docs/tpu.md)."""
    from bert_jax.errors import BertJaxError

    if collective_matmul not in COLLECTIVE_MATMUL:
        raise BertJaxError(f"parallel.tpu_collective_matmul={collective_matmul!r}: expected "
                           f"one of {COLLECTIVE_MATMUL}")
    shape = mesh_shape or {}
    fsdp_only = shape.get("fsdp", 1) > 1 and shape.get("tensor", 1) == 1
    if platform != "tpu" or collective_matmul == "allowed" or (
            collective_matmul == "auto" and not fsdp_only):
        return None
    return dict(TPU_COLLECTIVE_MATMUL_OFF)


def flag_name(flag: str) -> str:
    """``--xla_foo=1`` -> ``--xla_foo``."""
    return flag.split("=", 1)[0]


def add(flags: Sequence[str]) -> list[str]:
    """Appends each of ``flags`` to ``$XLA_FLAGS`` unless ``$XLA_FLAGS`` already names it;
    returns the flags it added. Call before the first computation of the process."""
    current = os.environ.get(ENV, "")
    named = {flag_name(f) for f in current.split()}
    added = [f for f in flags if flag_name(f) not in named]
    if added:
        os.environ[ENV] = " ".join([current, *added]).strip()
    return added
