"""ELECTRA's pretraining loss and gradients against transformers' ElectraForMaskedLM (the
generator) + ElectraForPreTraining (the discriminator) with the same weights, the same masked
batch and the same generator samples (float32, CPU, no dropout)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.checkpoint import families
from bert_jax.modeling import family
from bert_jax.modeling.params import flatten_params
from bert_jax.training import objectives
from bert_jax.training.inputs import SyntheticBatches

from .helpers import random_params
from .test_family_objectives import CFG

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

RTD_WEIGHT = 50.0


def _hf(params, config, cls_name, tmp_path):
    out = tmp_path / cls_name
    report = families.export_hf_any(params, config, str(out))
    assert report.architecture == cls_name
    model = getattr(transformers, cls_name).from_pretrained(out, attn_implementation="eager")
    return model.eval()


def test_electra_loss_and_gradients_match_transformers(tmp_path):
    cfg = CFG.replace(model_type="electra")
    gen_cfg = family.generator_config(cfg, 0.5)
    model = family.ElectraForPreTraining(cfg, gen_cfg)
    batch = {k: jnp.asarray(v) for k, v in next(SyntheticBatches(4, 32, 5, 200, seed=3)).items()}
    args = (batch["input_ids"], batch["input_mask"], batch["segment_ids"],
            batch["masked_lm_positions"], batch["masked_lm_ids"], batch["masked_lm_weights"])
    params = family.untie_generator_embeddings(
        random_params(model, *args, jax.random.PRNGKey(0)))
    rng = jax.random.PRNGKey(7)
    sums_fn = objectives.electra_sums(model, RTD_WEIGHT)

    def loss(p):
        sums = sums_fn(p, batch, rng, True)
        return (sums["mlm_loss_sum"] / sums["mlm_weight"]
                + sums["rtd_weighted_sum"] / sums["token_count"])

    ours, grads = jax.value_and_grad(loss)(params)
    # The generator's samples of this step (the same key split as electra_sums).
    tied = family.tie_generator_embeddings(params)
    out = model.apply({"params": tied}, *args, jax.random.split(rng)[1], deterministic=True)
    corrupted = np.asarray(out["corrupted_ids"])
    assert np.asarray(out["rtd_labels"]).any()  # some samples differ from the originals

    gen = _hf({"bert": tied["generator"], "mlm": params["generator_mlm"]}, gen_cfg,
              "ElectraForMaskedLM", tmp_path)
    disc = _hf({"bert": params["bert"], "rtd": {"dense": params["rtd_dense"],
                                                "prediction": params["rtd_output"]}},
               cfg, "ElectraForPreTraining", tmp_path)
    ids, mask, segments = (torch.tensor(np.asarray(batch[k]), dtype=torch.long)
                           for k in ("input_ids", "input_mask", "segment_ids"))
    positions = torch.tensor(np.asarray(batch["masked_lm_positions"]), dtype=torch.long)
    weights = torch.tensor(np.asarray(batch["masked_lm_weights"]), dtype=torch.float32)
    labels = torch.tensor(np.asarray(batch["masked_lm_ids"]), dtype=torch.long)
    logits = gen(input_ids=ids, attention_mask=mask, token_type_ids=segments).logits
    logits = torch.gather(logits, 1, positions[..., None].expand(-1, -1, logits.shape[-1]))
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), labels, reduction="none")
    mlm = (nll * weights).sum() / weights.sum()
    rtd_logits = disc(input_ids=torch.tensor(corrupted, dtype=torch.long), attention_mask=mask,
                      token_type_ids=segments).logits
    replaced = torch.tensor(np.asarray(out["rtd_labels"]), dtype=torch.float32)
    bce = torch.nn.functional.binary_cross_entropy_with_logits(rtd_logits, replaced,
                                                               reduction="none")
    real = mask.float()
    theirs = mlm + RTD_WEIGHT * (bce * real).sum() / real.sum()
    theirs.backward()
    np.testing.assert_allclose(float(ours), theirs.item(), rtol=1e-5)

    # The shared token embeddings get both models' gradients; the discriminator's layers only
    # the RTD term's, the generator's only its MLM loss'.
    shared = (gen.electra.embeddings.word_embeddings.weight.grad
              + disc.electra.embeddings.word_embeddings.weight.grad).numpy()
    flat = {k: np.asarray(v) for k, v in flatten_params(grads).items()}
    ours_shared = flat[next(k for k in flat if k.startswith("bert/")
                            and "word_embeddings" in k)][:shared.shape[0]]
    np.testing.assert_allclose(ours_shared, shared, rtol=1e-4, atol=1e-6)
    mlp_disc = disc.electra.encoder.layer[0].intermediate.dense.weight.grad.numpy().T
    mlp_ours = [v for k, v in flat.items() if k.startswith("bert/")
                and v.shape == mlp_disc.shape]  # [hidden, intermediate]: the MLP's input
    assert len(mlp_ours) == 1
    np.testing.assert_allclose(mlp_ours[0], mlp_disc, rtol=1e-4, atol=1e-6)
