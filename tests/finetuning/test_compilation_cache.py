"""The persistent compilation cache: its folder from $BERT_JAX_CACHE, and the off switch."""

from __future__ import annotations

import jax

from bert_jax import compilation_cache


def test_enable_sets_folder_and_switch_turns_it_off(tmp_path, monkeypatch):
    before = (jax.config.jax_compilation_cache_dir,
              jax.config.jax_persistent_cache_min_compile_time_secs)
    monkeypatch.setenv(compilation_cache.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv(compilation_cache.SWITCH_ENV, "0")
    assert compilation_cache.enable() is None
    assert jax.config.jax_compilation_cache_dir == before[0]
    monkeypatch.setenv(compilation_cache.SWITCH_ENV, "1")
    try:
        folder = compilation_cache.enable()
        assert folder == str(tmp_path / "cache" / "xla")
        assert (tmp_path / "cache" / "xla").is_dir()
        assert jax.config.jax_compilation_cache_dir == folder
        assert jax.config.jax_persistent_cache_min_compile_time_secs == 0.1
    finally:  # nothing compiled meanwhile: the rest of the test run keeps no cache
        jax.config.update("jax_compilation_cache_dir", before[0])
        jax.config.update("jax_persistent_cache_min_compile_time_secs", before[1])


def test_default_root(monkeypatch):
    monkeypatch.delenv(compilation_cache.CACHE_ENV, raising=False)
    monkeypatch.setenv("HOME", "/home/someone")
    assert compilation_cache.xla_cache_dir() == "/home/someone/.cache/bert_jax/xla"
