"""Experiment configs: overrides are typed and checked; every variant builds."""

import jax
import pytest

from bert_jax import parallel
from bert_jax.errors import BertJaxError
from bert_jax.modeling.heads import BertForPreTraining
from bert_jax.training import config as config_lib
from bert_jax.training.config import load_config
from bert_jax.training.setup import build_training

from .helpers import EXPERIMENT, small_config

VARIANTS = ["tiny", "bert_base_phase1", "bert_base_phase2", "bert_large_phase1",
            "bert_large_phase2", "lamb_large_batch", "lamb_large_batch_phase2",
            "roberta_style", "albert_base"]


def test_overrides_are_typed():
    c = small_config("--config.optimizer.learning_rate=3e-4", "--config.microbatches", "2",
                     "--config.model.scan_layers=true", "--config.profile_steps=(3, 5)")
    assert c.optimizer.learning_rate == 3e-4 and c.microbatches == 2
    assert c.model.scan_layers is True and tuple(c.profile_steps) == (3, 5)
    assert config_lib.model_config(c).hidden_size == 32


def test_unknown_key_names_closest():
    with pytest.raises(BertJaxError, match=r"optimizer.learning_rat.*did you mean "
                                           r"--config.optimizer.learning_rate"):
        small_config("--config.optimizer.learning_rat=1e-3")


@pytest.mark.parametrize("override, message", [
    ("--config.num_train_steps=ten", "expected an integer"),
    ("--config.model.scan_layers=maybe", "expected true or false"),
    ("--config.optimizer=3", "is a section"),
])
def test_bad_values_fail_clearly(override, message):
    with pytest.raises(BertJaxError, match=message):
        small_config(override)


def test_duplicate_override_rejected():
    with pytest.raises(BertJaxError, match="given twice"):
        small_config("--config.seed=1", "--config.seed=2")


def test_unknown_file_and_variant():
    with pytest.raises(BertJaxError, match="not found"):
        load_config("experiments/nope.py:tiny")
    with pytest.raises(BertJaxError, match="unknown variant 'bert_huge'.*bert_base_phase1"):
        load_config(f"{EXPERIMENT}:bert_huge")


def test_config_is_locked():
    c = small_config()
    with pytest.raises(AttributeError):
        c.new_field = 1


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_variant_builds(variant):
    c = load_config(f"{EXPERIMENT}:{variant}")
    model_cfg = config_lib.model_config(c)
    model = BertForPreTraining(model_cfg, pair_head=config_lib.pair_head(c))
    seq, preds = c.data.max_seq_length, c.data.max_predictions_per_seq
    assert seq <= model_cfg.max_position_embeddings
    assert c.global_batch_size % c.microbatches == 0
    ids = jax.ShapeDtypeStruct((1, seq), "int32")
    pos = jax.ShapeDtypeStruct((1, preds), "int32")
    shapes = jax.eval_shape(lambda i, p: model.init(jax.random.PRNGKey(0), i, i, i, p), ids, pos)
    count = sum(x.size for x in jax.tree.leaves(shapes["params"]))
    expected = {"tiny": (3e6, 6e6), "bert_base": (105e6, 115e6), "bert_large": (330e6, 345e6),
                "lamb": (330e6, 345e6), "roberta": (105e6, 115e6), "albert": (10e6, 14e6)}
    low, high = next(v for k, v in expected.items() if variant.startswith(k))
    assert low < count < high, count
    assert ("nsp" in shapes["params"]) == (c.objective != "mlm")
    # The full train state (params + optimizer) gets shardings on an 8-way FSDP mesh.
    mesh = parallel.create_mesh({"data": 1, "fsdp": -1, "tensor": 1})
    training = build_training(c, model_cfg, mesh)
    table = training.abstract_state.params["bert"]["embeddings"]["word_embeddings"]["embedding"]
    assert table.sharding.spec == jax.sharding.PartitionSpec("tensor", "fsdp")
    mu = training.abstract_state.opt_state[1].mu  # (clip, adam, decay, lr)
    assert mu["bert"]["embeddings"]["word_embeddings"]["embedding"].sharding == table.sharding
