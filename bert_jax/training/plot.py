"""``bert-jax plot-metrics WORKDIR``: a run's curves (``WORKDIR/metrics.jsonl``) as one PNG.

Two panels over steps: the masked-LM loss and the masked-LM accuracy, training (logged
means) and held-out (each evaluation), with optional horizontal reference lines such as a
unigram baseline. Needs matplotlib (the ``monitor`` and ``demo`` extras install it).
"""

from __future__ import annotations

import json

from bert_jax import fileio, storage
from bert_jax.errors import BertJaxError

PLOT_FILE = "curves.png"


def _series(records: list[dict], split: str, key: str) -> tuple[list[int], list[float]]:
    rows = {}
    for r in records:  # a resumed run logs a step again: the last record wins
        if r.get("split") == split and key in r:
            rows[r["step"]] = r[key]
    steps = sorted(rows)
    return steps, [rows[s] for s in steps]


def read_records(workdir: str) -> list[dict]:
    path = storage.join(workdir, "metrics.jsonl")
    if not storage.exists(path):
        raise BertJaxError(f"{path}: not found (is {workdir} a pretraining workdir?)")
    records = []
    if True:
        for number, line in enumerate(storage.read_text(path).splitlines(), 1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except ValueError:
                raise BertJaxError(f"{path}:{number}: not a JSON object") from None
    if not records:
        raise BertJaxError(f"{path}: no metrics logged yet")
    return records


def plot_metrics(workdir: str, output: str | None = None, *,
                 baselines: dict[str, float] | None = None) -> str:
    """Writes the PNG (default ``WORKDIR/curves.png``) and returns its path. ``baselines``:
    ``{"mlm_loss": x, "mlm_accuracy": y}`` reference lines (e.g. the unigram baseline)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise BertJaxError("plot-metrics needs matplotlib: pip install 'bert-jax[monitor]' "
                           "(or pip install matplotlib)") from None
    records = read_records(workdir)
    output = output or storage.join(workdir, PLOT_FILE)
    baselines = baselines or {}
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), dpi=100)
    for ax, key, title in ((axes[0], "mlm_loss", "masked-LM loss"),
                           (axes[1], "mlm_accuracy", "masked-LM accuracy")):
        for split, style in (("train", "-"), ("eval", "o-")):
            steps, values = _series(records, split, key)
            if steps:
                ax.plot(steps, values, style, label="held-out" if split == "eval" else split)
        if key in baselines:
            ax.axhline(baselines[key], color="gray", linestyle="--", label="unigram baseline")
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(storage.basename(storage.abspath(workdir)))
    fig.tight_layout()
    fileio.atomic_write(output, lambda f: fig.savefig(f, format="png"))
    plt.close(fig)
    return output
