"""The span (SQuAD) head starts at transformers' scale.

The head barely moves during fine-tuning (Adam steps of about the learning rate against
weights of about ``initializer_range``), so its initial scale multiplies how fast the start and
end logits follow the encoder: a head drawn 0.88x as wide (Google's truncated normal) trains
measurably slower than transformers' from the same checkpoint.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.config import get_preset
from bert_jax.modeling.heads import BertForQuestionAnswering

HIDDEN = 256
SEEDS = range(8)  # 8 x 512 weights: the std is known to about 1%


def _tiny(initializer_range=0.02):
    return get_preset("tiny", vocab_size=16, hidden_size=HIDDEN, num_attention_heads=2,
                      intermediate_size=32, max_position_embeddings=16, num_hidden_layers=1,
                      vocab_pad_multiple=8, initializer_range=initializer_range)


def _bert_jax_head(config) -> np.ndarray:
    ids = jnp.zeros((1, 8), jnp.int32)
    init = jax.jit(lambda rng: nn.unbox(BertForQuestionAnswering(config).init(
        rng, ids, jnp.ones_like(ids), ids))["params"]["qa_outputs"]["kernel"])
    return np.concatenate([np.asarray(jax.device_get(init(jax.random.PRNGKey(s)))).ravel()
                           for s in SEEDS])


def test_span_head_std_is_transformers():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    hf_config = transformers.BertConfig(vocab_size=16, hidden_size=HIDDEN, num_hidden_layers=1,
                                        num_attention_heads=2, intermediate_size=32,
                                        max_position_embeddings=16, initializer_range=0.02)
    theirs = []
    for seed in SEEDS:
        torch.manual_seed(seed)
        model = transformers.BertForQuestionAnswering(hf_config)
        theirs.append(model.qa_outputs.weight.detach().numpy().ravel())
    theirs = np.concatenate(theirs)
    ours = _bert_jax_head(_tiny())
    assert ours.shape == theirs.shape
    # Google's truncated_normal(0.02) has std 0.0176: a ratio of 0.88, far outside 4%.
    assert np.std(ours) / np.std(theirs) == pytest.approx(1.0, abs=0.04)
    assert np.std(ours) == pytest.approx(0.02, rel=0.04)
    assert np.abs(ours).max() <= 2 * 0.02 / 0.8796 + 1e-6  # still truncated at 2 std


def test_span_head_follows_initializer_range():
    """``model.initializer_range`` (a run-time field) scales the head: 0.02 x 0.8796 gives
    back the earlier draws exactly (the same truncated-normal samples, scaled)."""
    wide = _bert_jax_head(_tiny(0.02))
    google = _bert_jax_head(_tiny(0.02 * 0.87962566103423978))
    np.testing.assert_allclose(google, wide * 0.87962566103423978, rtol=1e-5, atol=1e-8)
