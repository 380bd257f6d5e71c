"""Benchmarks of bert-jax: one entry point, ``python -m bench <suite> [--out DIR] [options]``.

Suites are named by what they measure (see ``bench.__main__.SUITES`` and
docs/performance.md). Every suite appends JSON lines to ``DIR/<suite>.jsonl`` (default
``./bench_out``); ``python -m bench summary DIR`` turns them into the markdown tables of
docs/performance.md. Importing this package imports no framework.
"""
