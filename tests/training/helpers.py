"""Small pretraining configs shared by the training tests (tiny widths, short sequences)."""

import os

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.modeling.params import unbox
from bert_jax.training.config import load_config

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXPERIMENT = os.path.join(REPO, "experiments", "pretrain.py")

# A model small enough to compile and step in well under a second on simulated CPUs, still
# divisible by 8 (FSDP) and with 4 heads (tensor parallel 2).
SMALL = [
    "--config.model.hidden_size=32", "--config.model.num_attention_heads=4",
    "--config.model.intermediate_size=64", "--config.model.num_hidden_layers=2",
    "--config.model.vocab_size=200", "--config.model.max_position_embeddings=32",
    "--config.data.max_seq_length=32", "--config.data.max_predictions_per_seq=5",
    "--config.global_batch_size=16", "--config.progress_bar=false",
    "--config.data.source=synthetic",
]


def small_config(*overrides: str):
    """SMALL with ``overrides`` (an override of a SMALL key replaces it)."""
    return load_config(f"{EXPERIMENT}:tiny", [*without_keys(SMALL, overrides), *overrides])


def without_keys(base, overrides) -> list[str]:
    """The ``--config.key=value`` entries of ``base`` whose key ``overrides`` does not set."""
    keys = {o.split("=", 1)[0] for o in overrides}
    return [b for b in base if b.split("=", 1)[0] not in keys]


def random_variables(model, *args, std: float = 0.1):
    """Every variable collection of ``model`` for inputs ``args`` without compiling its init
    (a compiled Flax init costs a compile of its own): parameters drawn in numpy (normal with
    ``std``, LayerNorm scales near 1, float32), the leaves of every other collection 1 (the
    FP8 scales' initial value)."""
    shapes = unbox(jax.eval_shape(model.init, jax.random.PRNGKey(0), *args))
    rng = np.random.default_rng(1)

    def fill(path, x):
        name = jax.tree_util.keystr(path)
        if not name.startswith("['params']"):
            return jnp.ones(x.shape, x.dtype)
        base = 1.0 if name.endswith("['scale']") else 0.0
        return jnp.asarray(base + rng.normal(0, std, x.shape), jnp.float32)

    return jax.tree_util.tree_map_with_path(fill, shapes)


def random_params(model, *args):
    """Random float32 parameters of ``model`` for inputs ``args`` (:func:`random_variables`)."""
    return random_variables(model, *args)["params"]
