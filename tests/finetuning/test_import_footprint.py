"""The fine-tuning command never imports TensorFlow (local files need none) or torch: checked
in a fresh interpreter after a whole ``bert-jax finetune`` run."""

from __future__ import annotations

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPT = """
import json, sys
from bert_jax.cli import main
rc = main(sys.argv[1:])
print(json.dumps({"rc": rc, "heavy": sorted(m for m in ("tensorflow", "torch")
                                            if m in sys.modules)}))
"""


def test_finetune_imports_no_tensorflow(data, tmp_path):
    env = {**os.environ, "PYTHONPATH": REPO, "BERT_JAX_COMPILATION_CACHE": "0"}
    args = ["finetune", "--config", "experiments/glue.py:sst2", "--workdir",
            str(tmp_path / "run"), f"--config.init_checkpoint={data['ckpt']}",
            f"--config.data_dir={data['sst2']}", "--config.max_seq_length=32",
            "--config.epochs=1", "--config.max_train_examples=64", "--config.log_every=0"]
    out = subprocess.run([sys.executable, "-c", SCRIPT, *args], cwd=REPO, env=env,
                         capture_output=True, text=True, check=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert result["rc"] == 0
    assert os.path.isfile(tmp_path / "run" / "metrics.json")
    assert result["heavy"] == []  # neither tensorflow nor torch was imported
