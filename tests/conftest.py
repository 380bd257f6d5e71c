"""Test-wide setup: 8 simulated CPU devices (set before jax is imported) and shared fixtures."""

import atexit
import os
import shutil
import tempfile

from xla_env import cpu_flags

os.environ.setdefault("XLA_FLAGS", cpu_flags(8))
# libtpu (test extra) is only a compile target here: the CPU runs everything, and the TPU
# topology API works without taking libtpu's machine-wide lock (bert_jax/tpu/topologies.py).
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v4-8")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# CLI runs in tests keep no compiled programs in the user's cache folder.
os.environ.setdefault("BERT_JAX_COMPILATION_CACHE", "0")
# Instead the whole test run shares one fresh persistent XLA cache: many tests compile the same
# tiny programs (the same model, step and shapes, in-process or in the CLI subprocesses they
# start), and the second compile of a program is a read. The process that makes the folder
# (pytest, or its xdist controller; the workers and subprocesses inherit the variable) removes
# it at exit.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _xla_cache = tempfile.mkdtemp(prefix="bert-jax-tests-xla-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _xla_cache
    atexit.register(shutil.rmtree, _xla_cache, ignore_errors=True)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")

# Every test process runs XLA on the CPU: the malloc settings the CLI makes there
# (bert_jax/allocator.py) apply to the pytest processes too, set before jax starts threads.
from bert_jax import allocator  # noqa: E402

allocator.configure()


def pytest_collection_modifyitems(config, items):
    """Longest first: the TPU compile group, the multi-process tests and the tests marked slow
    start before the rest, so that with several xdist workers no long test starts last and
    runs alone while the other workers sit idle (the order within each rank is kept)."""

    def rank(item) -> int:
        if item.get_closest_marker("xdist_group"):
            return 0
        if item.get_closest_marker("multiprocess") or item.get_closest_marker("slow"):
            return 1
        return 2

    items.sort(key=rank)
