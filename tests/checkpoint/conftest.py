"""Fixtures for checkpoint tests (helpers live in hf_helpers.py)."""

from __future__ import annotations

import pytest
from hf_helpers import HF_CONFIGS, make_hf_model, write_vocab


@pytest.fixture
def hf_pretraining_dir(tmp_path):
    """A saved BertForPreTraining (config 2L-32H-4A) with a WordPiece vocab.txt."""
    model = make_hf_model("BertForPreTraining", "2L-32H-4A")
    directory = tmp_path / "hf"
    model.save_pretrained(directory)
    write_vocab(directory, size=HF_CONFIGS["2L-32H-4A"]["vocab_size"])
    return directory, model
