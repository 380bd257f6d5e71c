"""Fixtures shared by the whole test run: one tiny checkpoint and the task folders, written
once."""

import pytest

from tests.finetuning import helpers as H


@pytest.fixture(scope="session")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("finetune")
    return {
        "root": root,
        # One layer: the fine-tuning tests check heads, tasks and the loop, alike for any
        # depth (a layer less halves each compile of the encoder).
        "ckpt": H.write_checkpoint(str(root / "ckpt"), num_hidden_layers=1),
        "vocab_dir": str(root / "ckpt_vocab"),
        "sst2": H.write_sst2(str(root / "SST-2"), n_train=400, n_dev=80, n_test=20),
        "stsb": H.write_stsb(str(root / "STS-B")),
        "conll": H.write_conll(str(root / "conll")),
        "squad": H.write_squad(str(root / "squad")),
        "swag": H.write_swag(str(root / "swag")),
    }
