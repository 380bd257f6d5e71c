"""The wheel ships the experiment configs: installed (not editable) and run from an empty
folder, ``--config experiments/pretrain.py:tiny`` and ``--config pretrain:tiny`` both work."""

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.slow

RUN = """
import sys
import bert_jax
assert bert_jax.__file__.startswith(sys.argv[1]), bert_jax.__file__
from bert_jax.cli import main
sys.exit(main(sys.argv[2:]))
"""


def test_installed_wheel_finds_the_shipped_configs(tmp_path):
    dist, site, empty = tmp_path / "dist", tmp_path / "site", tmp_path / "empty"
    empty.mkdir()
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(dist), REPO], check=True, capture_output=True, timeout=600)
    wheel = next(dist.glob("bert_jax-*.whl"))
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target",
                    str(site), str(wheel)], check=True, capture_output=True, timeout=600)
    assert (site / "bert_jax" / "experiments" / "pretrain.py").is_file()
    env = dict(os.environ, PYTHONPATH=str(site))
    small = ["--config.data.source=synthetic", "--config.num_train_steps=1",
             "--config.optimizer.warmup_steps=0",
             "--config.model.hidden_size=32", "--config.model.num_attention_heads=4",
             "--config.model.intermediate_size=64", "--config.model.num_hidden_layers=1",
             "--config.progress_bar=false"]
    for n, spec in enumerate(("experiments/pretrain.py:tiny", "pretrain:tiny")):
        done = subprocess.run([sys.executable, "-c", RUN, str(site), "pretrain", "--config",
                               spec, "--workdir", f"run{n}", *small], cwd=empty, env=env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout + done.stderr
        assert (empty / f"run{n}" / "config.json").is_file()
    missing = subprocess.run([sys.executable, "-c", RUN, str(site), "pretrain", "--config",
                              "nosuch:tiny", "--workdir", "x"], cwd=empty, env=env,
                             capture_output=True, text=True, timeout=600)
    assert missing.returncode == 2 and "shipped names" in missing.stderr
