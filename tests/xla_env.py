"""XLA flags for every JAX process the tests run: this one and the CLI subprocesses they start.

The tests compile hundreds of programs for tiny models on the CPU. Most of each compile is
LLVM optimizing the generated code, which buys nothing at these sizes; level 0 without LLVM's
expensive passes compiles the same programs 40% faster (the tiny pretraining step: 13.7 s,
8.2 s at level 0; the small train step of tests/training 15.9 → 14.1 s CPU with the second
flag), with identical losses. XLA's elemental emitters instead of its (MLIR) fusion emitters
cut the compile by another 60% (the one-layer small step on 8 devices: 13.3 → 4.9 s CPU), again
with identical losses.
"""

FAST_COMPILE = ("--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true "
                "--xla_cpu_use_fusion_emitters=false")


def cpu_flags(devices: int) -> str:
    """``XLA_FLAGS`` for ``devices`` simulated CPU devices."""
    return f"--xla_force_host_platform_device_count={devices} {FAST_COMPILE}"
