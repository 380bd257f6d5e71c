"""JAX's persistent compilation cache and bert-jax's cache folder.

Compiled XLA programs are written to disk and reused by later runs of the same program on the
same backend, so a second ``bert-jax finetune`` with the same model and shapes skips
compilation. JAX keys each entry by the program, the compile options, the backend, the device
kind and the jax/jaxlib versions, so one folder is safe across versions and devices.

Folders: ``$BERT_JAX_CACHE`` (default ``~/.cache/bert_jax``) holds ``xla/`` (compiled programs)
and ``converted/`` (checkpoints converted from other formats, ``checkpoint/convert_cache.py``).
``BERT_JAX_COMPILATION_CACHE=0`` turns the compilation cache off, as does the fine-tuning
config field ``compilation_cache=False``.
"""

from __future__ import annotations

import os

import jax

CACHE_ENV = "BERT_JAX_CACHE"
SWITCH_ENV = "BERT_JAX_COMPILATION_CACHE"
_OFF = ("0", "false", "no", "off")


def cache_root() -> str:
    """``$BERT_JAX_CACHE``, else ``~/.cache/bert_jax``."""
    return os.path.expanduser(os.environ.get(CACHE_ENV) or os.path.join("~", ".cache",
                                                                        "bert_jax"))


def xla_cache_dir() -> str:
    return os.path.join(cache_root(), "xla")


def enabled_by_env() -> bool:
    return os.environ.get(SWITCH_ENV, "1").strip().lower() not in _OFF


def enable(directory: str | None = None) -> str | None:
    """Turns the persistent compilation cache on (unless ``BERT_JAX_COMPILATION_CACHE=0``);
    returns its folder, or None when off. Call before the first compilation: jax reads the
    folder when it first compiles. Programs that took at least 0.1 s to compile are kept."""
    if not enabled_by_env():
        return None
    directory = directory or xla_cache_dir()
    try:
        os.makedirs(directory, exist_ok=True)  # local: this machine's cache
    except OSError:
        return None  # an unwritable home folder must not stop a run
    jax.config.update("jax_compilation_cache_dir", directory)
    for option, value in (("jax_persistent_cache_min_compile_time_secs", 0.1),
                          ("jax_persistent_cache_min_entry_size_bytes", 0)):
        try:
            jax.config.update(option, value)
        except AttributeError:  # an option this jax version does not have
            pass
    return directory
