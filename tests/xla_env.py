"""XLA flags for every JAX process the tests run: this one and the CLI subprocesses they start.

The tests compile hundreds of programs for tiny models on the CPU. Most of each compile is
LLVM optimizing the generated code, which buys nothing at these sizes; level 0 compiles the
same programs about a third faster (identical losses on the tiny pretraining run).
"""

FAST_COMPILE = "--xla_backend_optimization_level=0"


def cpu_flags(devices: int) -> str:
    """``XLA_FLAGS`` for ``devices`` simulated CPU devices."""
    return f"--xla_force_host_platform_device_count={devices} {FAST_COMPILE}"
