"""SpanBERT's SBO, ELECTRA's RTD and DistilBERT's losses (bert_jax.modeling.family,
bert_jax.training.objectives, bert_jax.training.family)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.config import get_preset
from bert_jax.modeling import family
from bert_jax.modeling.params import flatten_params
from bert_jax.training import objectives
from bert_jax.training.family import every_other_layer
from bert_jax.training.inputs import SyntheticBatches

from .helpers import random_params

NO_DROPOUT = ("--config.model.hidden_dropout_prob=0.0",
              "--config.model.attention_probs_dropout_prob=0.0")
CFG = get_preset("tiny", vocab_size=200, hidden_size=32, num_attention_heads=4,
                 intermediate_size=64, num_hidden_layers=1, max_position_embeddings=32,
                 hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def test_span_boundaries_by_hand():
    # masked runs: 2-4 and 7; position 9 has weight 0 (padding) and is not masked
    positions = jnp.array([[2, 3, 4, 7, 9]])
    weights = jnp.array([[1.0, 1, 1, 1, 0]])
    left, right, offset = family.span_boundaries(positions, weights, 10)
    np.testing.assert_array_equal(left[0, :4], [1, 1, 1, 6])
    np.testing.assert_array_equal(right[0, :4], [5, 5, 5, 8])
    np.testing.assert_array_equal(offset[0, :4], [1, 2, 3, 1])


def test_sbo_shapes_and_gradient_flow():
    model = family.SpanBertForPreTraining(CFG, max_relative_position=8)
    batch = next(SyntheticBatches(4, 32, 5, 200, seed=1))
    batch = {k: jnp.asarray(v) for k, v in batch.items()}
    inputs = (batch["input_ids"], batch["input_mask"], batch["segment_ids"],
              batch["masked_lm_positions"], batch["masked_lm_weights"])
    params = random_params(model, *inputs)
    # Shapes only: abstract evaluation, nothing compiled.
    out = jax.eval_shape(model.apply, {"params": params}, *inputs)
    assert out["sbo_logits"].shape == (4, 5, CFG.padded_vocab_size)
    assert out["sbo_decoder"].hidden.shape == (4, 5, CFG.hidden_size)
    sums_fn = objectives.span_boundary_sums(model)

    def sbo_only(p):
        return sums_fn(p, batch, None, True)["sbo_loss_sum"]

    grads = flatten_params(jax.jit(jax.grad(sbo_only))(params))
    for name in ("sbo/layer_0/kernel", "sbo/layer_1/kernel", "sbo/bias",
                 "sbo/relative_position_embeddings/embedding",
                 "bert/embeddings/word_embeddings/embedding"):
        assert float(jnp.abs(grads[name]).sum()) > 0, name
    encoder = [g for k, g in grads.items() if k.startswith("bert/encoder/")]
    assert all(float(jnp.abs(g).sum()) > 0 for g in encoder)
    assert float(jnp.abs(grads["mlm/bias"]).sum()) == 0  # SBO alone never touches the MLM head


@functools.cache
def _electra():
    """(model, params, batch), made once for the file (the tests only read them)."""
    gen = family.generator_config(CFG, 0.5)
    assert gen.hidden_size == 64 and gen.embedding_size == CFG.embedding_dim
    model = family.ElectraForPreTraining(CFG, gen)
    batch = {k: jnp.asarray(v) for k, v in next(SyntheticBatches(4, 32, 5, 200, seed=2)).items()}
    params = random_params(model, batch["input_ids"], batch["input_mask"],
                            batch["segment_ids"], batch["masked_lm_positions"],
                            batch["masked_lm_ids"], batch["masked_lm_weights"],
                            jax.random.PRNGKey(0))
    params = family.untie_generator_embeddings(params)
    assert "word_embeddings" not in params["generator"]["embeddings"]
    return model, params, batch


def test_electra_rtd_labels_match_replacements():
    model, params, batch = _electra()
    out = jax.jit(model.apply)({"params": family.tie_generator_embeddings(params)},
                               batch["input_ids"], batch["input_mask"], batch["segment_ids"],
                               batch["masked_lm_positions"], batch["masked_lm_ids"],
                               batch["masked_lm_weights"], jax.random.PRNGKey(5))
    ids = np.asarray(batch["input_ids"])
    positions = np.asarray(batch["masked_lm_positions"])
    weights = np.asarray(batch["masked_lm_weights"])
    original = ids.copy()
    for r in range(len(ids)):
        k = int(weights[r].sum())
        original[r, positions[r, :k]] = np.asarray(batch["masked_lm_ids"])[r, :k]
    corrupted = np.asarray(out["corrupted_ids"])
    sampled = np.asarray(out["sampled_ids"])
    masked = np.zeros(ids.shape, bool)
    for r in range(len(ids)):
        k = int(weights[r].sum())
        masked[r, positions[r, :k]] = True
        np.testing.assert_array_equal(corrupted[r, positions[r, :k]], sampled[r, :k])
    np.testing.assert_array_equal(corrupted[~masked], original[~masked])  # only masked change
    np.testing.assert_array_equal(np.asarray(out["rtd_labels"]), corrupted != original)
    assert (corrupted != original).sum() > 0  # an untrained generator replaces most tokens


def test_electra_samples_carry_no_gradient():
    model, params, batch = _electra()
    sums_fn = objectives.electra_sums(model, rtd_weight=50.0)

    def rtd_and_mlm(p):
        sums = sums_fn(p, batch, jax.random.PRNGKey(3), True)
        return jnp.stack([sums["rtd_loss_sum"], sums["mlm_loss_sum"]])

    # Each loss's gradient (one row of the Jacobian), both from one compiled program.
    rows = jax.jit(jax.jacrev(rtd_and_mlm))(params)
    rtd = flatten_params(jax.tree.map(lambda g: g[0], rows))
    mlm = flatten_params(jax.tree.map(lambda g: g[1], rows))
    generator = [k for k in rtd if k.startswith(("generator/", "generator_mlm/"))]
    assert generator
    for name in generator:  # nothing reaches the generator through its samples
        assert float(jnp.abs(rtd[name]).sum()) == 0, name
    assert float(jnp.abs(mlm["generator/encoder/layer_0/attention/qkv/kernel"]).sum()) > 0
    # the shared embeddings get both losses' gradients; the discriminator only RTD's
    assert float(jnp.abs(mlm["bert/embeddings/word_embeddings/embedding"]).sum()) > 0
    assert float(jnp.abs(rtd["bert/embeddings/word_embeddings/embedding"]).sum()) > 0
    assert float(jnp.abs(mlm["bert/encoder/layer_0/attention/qkv/kernel"]).sum()) == 0


def test_kd_and_cosine_losses_by_hand():
    student = jnp.array([[1.0, 2.0, 0.0]])
    teacher = jnp.array([[0.0, 2.0, 2.0]])
    t = 2.0
    p = np.exp(np.array([0.0, 1.0, 1.0]))
    p /= p.sum()
    q = np.exp(np.array([0.5, 1.0, 0.0]))
    q /= q.sum()
    expected = float(np.sum(p * np.log(p / q)) * t * t)
    np.testing.assert_allclose(objectives.kd_loss(student, teacher, t), [expected], rtol=1e-6)
    np.testing.assert_allclose(objectives.kd_loss(teacher, teacher, t), [0.0], atol=1e-7)
    a = jnp.array([[3.0, 4.0], [1.0, 0.0]])
    b = jnp.array([[4.0, 3.0], [-2.0, 0.0]])
    np.testing.assert_allclose(objectives.cosine_loss(a, b), [1 - 24 / 25, 2.0], rtol=1e-6)
    loss, correct = objectives.rtd_loss(jnp.array([0.0, 2.0]), jnp.array([1, 0]))
    np.testing.assert_allclose(loss, [np.log(2), 2 + np.log1p(np.exp(-2))], rtol=1e-6)
    np.testing.assert_array_equal(correct, [0.0, 0.0])


def test_every_other_layer():
    teacher = {f"layer_{i}": {"w": np.full(2, i)} for i in range(6)}
    student = every_other_layer(teacher, 3)
    assert [int(student[f"layer_{i}"]["w"][0]) for i in range(3)] == [0, 2, 4]
    stacked = every_other_layer({"layers": {"w": np.arange(6)[:, None]}}, 3)
    np.testing.assert_array_equal(stacked["layers"]["w"][:, 0], [0, 2, 4])
