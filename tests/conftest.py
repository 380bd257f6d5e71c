"""Test-wide setup: 8 simulated CPU devices (set before jax is imported) and shared fixtures."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
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
