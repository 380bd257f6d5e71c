"""RoBERTa, ALBERT, ELECTRA and DistilBERT: Hugging Face checkpoints load into bert-jax with
transformers' logits (float32, CPU), export back with no missing or unexpected keys, and an
export -> import round trip gives the parameters back exactly."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import linen as nn
from hf_helpers import randomize

from bert_jax import modeling
from bert_jax.checkpoint import families
from bert_jax.config import BertConfig
from bert_jax.errors import BertJaxError
from bert_jax.modeling.discriminator import BertForReplacedTokenDetection
from bert_jax.modeling.params import flatten_params

TOL = 1e-5
COMMON = dict(vocab_size=101, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
              intermediate_size=48, attn_implementation="eager")
HF_CONFIGS = {
    "roberta": lambda: transformers.RobertaConfig(
        **COMMON, max_position_embeddings=20, type_vocab_size=1, pad_token_id=1),
    "albert": lambda: transformers.AlbertConfig(
        **{**COMMON, "num_hidden_layers": 3}, embedding_size=16, max_position_embeddings=16,
        hidden_act="gelu_new"),
    "electra": lambda: transformers.ElectraConfig(
        **COMMON, embedding_size=24, max_position_embeddings=16),
    "distilbert": lambda: transformers.DistilBertConfig(
        vocab_size=101, dim=32, n_layers=2, n_heads=4, hidden_dim=48,
        max_position_embeddings=16, attn_implementation="eager"),
}
# HF class, the bert-jax model to run, (HF output, bert-jax output) pairs to compare.
CASES = [
    ("roberta", "RobertaForMaskedLM", "mlm", [("logits", "mlm_logits")]),
    ("roberta", "RobertaModel", "encoder", [("last_hidden_state", "sequence_output"),
                                            ("pooler_output", "pooled_output")]),
    ("albert", "AlbertForPreTraining", "pretraining", [("prediction_logits", "mlm_logits"),
                                                       ("sop_logits", "nsp_logits")]),
    ("albert", "AlbertModel", "encoder", [("pooler_output", "pooled_output")]),
    ("electra", "ElectraForPreTraining", "rtd", [("logits", "rtd_logits")]),
    ("electra", "ElectraForMaskedLM", "mlm", [("logits", "mlm_logits")]),
    ("electra", "ElectraModel", "encoder", [("last_hidden_state", "sequence_output")]),
    ("distilbert", "DistilBertForMaskedLM", "mlm", [("logits", "mlm_logits")]),
    ("distilbert", "DistilBertModel", "encoder", [("last_hidden_state", "sequence_output")]),
]


def _hf_model(family: str, cls_name: str, seed: int = 0, **config_overrides):
    config = HF_CONFIGS[family]()
    for key, value in config_overrides.items():
        setattr(config, key, value)
    model = getattr(transformers, cls_name)(config)
    randomize(model, seed)
    with torch.no_grad():  # LayerNorm scales near one, whatever the family calls them
        for name, p in model.named_parameters():
            if name.endswith(("norm.weight", "LayerNorm.weight")):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=torch.Generator()
                                                .manual_seed(len(name))))
    return model


def _batch(config: BertConfig, seed: int = 0):
    """Right-padded ids (pad id at padded positions), mask, two segments where there are."""
    rng = np.random.default_rng(seed)
    lengths = np.array([12, 7, 3, 10])
    pos = np.arange(12)[None]
    mask = (pos < lengths[:, None]).astype(np.int64)
    ids = np.where(mask == 1, rng.integers(5, config.vocab_size, (4, 12)), config.pad_token_id)
    segments = ((pos >= lengths[:, None] // 2) * mask) if config.type_vocab_size > 1 else 0 * mask
    return ids, mask, segments


def _ours(kind: str, config: BertConfig, params):
    if kind == "mlm":
        return modeling.BertForPreTraining(config, pair_head=False, add_pooler=False)
    if kind == "pretraining":
        return modeling.BertForPreTraining(config)
    if kind == "rtd":
        return BertForReplacedTokenDetection(config)
    return modeling.BertModel(config, add_pooler="pooler" in params["bert"])


def _run_ours(kind, config, params, ids, mask, segments):
    model = _ours(kind, config, params)
    tree = params["bert"] if kind == "encoder" else params
    shapes = jax.eval_shape(model.init, jax.random.key(0), jnp.asarray(ids))
    assert jax.tree.map(np.shape, nn.unbox(shapes)["params"]) == jax.tree.map(np.shape, tree)
    return model.apply({"params": tree}, jnp.asarray(ids), jnp.asarray(mask),
                       jnp.asarray(segments))


def _run_hf(model, family, ids, mask, segments):
    kwargs = dict(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask))
    if family != "distilbert":
        kwargs["token_type_ids"] = torch.tensor(segments)
    with torch.no_grad():
        return model(**kwargs)


def _compare(ours, ref, mask, vocab_size):
    ours, ref = np.asarray(ours, np.float64), ref.numpy().astype(np.float64)
    if ours.ndim == 3 and ours.shape[-1] > ref.shape[-1]:  # padded vocabulary
        assert ref.shape[-1] == vocab_size
        ours = ours[..., :vocab_size]
    assert ours.shape == ref.shape
    valid = mask.astype(bool) if ours.ndim >= 2 and ours.shape[:2] == mask.shape else True
    if ours.ndim == 3:
        valid = valid[..., None]
    diff = np.where(valid, np.abs(ours - ref), 0.0)
    assert diff.max() <= TOL, diff.max()


@pytest.mark.parametrize(("family", "cls_name", "kind", "outputs"), CASES,
                         ids=[c[1] for c in CASES])
def test_import_parity_and_round_trip(family, cls_name, kind, outputs, tmp_path):
    hf_model = _hf_model(family, cls_name)
    hf_model.save_pretrained(tmp_path / "hf")
    params, config, _, report = families.load_hf_any(tmp_path / "hf")
    assert config.model_type == family and report.unused == []
    ids, mask, segments = _batch(config)
    if family == "roberta":
        assert config.position_offset == 2 and config.type_vocab_size == 1
    if family == "distilbert":
        assert not config.use_token_types
        assert "token_type_embeddings" not in params["bert"]["embeddings"]
    ours = _run_ours(kind, config, params, ids, mask, segments)
    ref = _run_hf(hf_model, family, ids, mask, segments)
    for hf_out, our_out in outputs:
        _compare(ours[our_out], getattr(ref, hf_out), mask, config.vocab_size)

    # Export: transformers loads it with every weight in place and gives the same outputs.
    report = families.export_hf_any(params, config, str(tmp_path / "out"))
    assert report.architecture == cls_name and report.unused == []
    back, info = getattr(transformers, cls_name).from_pretrained(
        tmp_path / "out", output_loading_info=True, attn_implementation="eager")
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    # The weights come back bit for bit...
    original, loaded = hf_model.state_dict(), back.state_dict()
    assert sorted(original) == sorted(loaded)
    for name in original:
        assert torch.equal(original[name], loaded[name]), name
    # ... so the outputs are the same computation; torch's CPU kernels may split a float32
    # sum differently from one call to the next (thread count under load): a few ulps.
    again = _run_hf(back.eval(), family, ids, mask, segments)
    for hf_out, _ in outputs:
        np.testing.assert_allclose(getattr(again, hf_out).numpy(),
                                   getattr(ref, hf_out).numpy(), rtol=1e-5, atol=1e-6)
    # ... and bert-jax reads its own export back exactly.
    params2, config2, _, _ = families.load_hf_any(tmp_path / "out")
    assert config2 == config
    flat, flat2 = flatten_params(params), flatten_params(params2)
    assert sorted(flat) == sorted(flat2)
    for key in flat:
        np.testing.assert_array_equal(flat[key], flat2[key], err_msg=key)


def test_albert_preset_exports_as_albert(tmp_path):
    """ALBERT models built here (model_type bert, shared layers) export as AlbertForPreTraining."""
    config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=48, embedding_size=16,
                        share_layers=True, max_position_embeddings=16)
    model = modeling.BertForPreTraining(config)
    shapes = nn.unbox(jax.eval_shape(model.init, jax.random.key(1), jnp.ones((2, 8), jnp.int32)))
    rng = np.random.default_rng(1)
    params = jax.tree.map(lambda s: rng.normal(0, 0.2, s.shape).astype(np.float32),
                          shapes["params"])
    report = families.export_hf_any(params, config, str(tmp_path / "out"))
    assert report.architecture == "AlbertForPreTraining"
    hf_model, info = transformers.AlbertForPreTraining.from_pretrained(
        tmp_path / "out", output_loading_info=True, attn_implementation="eager")
    assert not info["missing_keys"] and not info["unexpected_keys"]
    ids = np.random.default_rng(0).integers(5, 64, (2, 8))
    out = jax.jit(model.apply)({"params": params}, jnp.asarray(ids))
    with torch.no_grad():
        ref = hf_model.eval()(input_ids=torch.tensor(ids))
    _compare(out["mlm_logits"], ref.prediction_logits, np.ones((2, 8)), 64)
    _compare(out["nsp_logits"], ref.sop_logits, np.ones((2, 8)), 64)


def test_wrong_architecture_for_family_is_one_error(tmp_path):
    hf_model = _hf_model("distilbert", "DistilBertModel")
    hf_model.save_pretrained(tmp_path / "hf")
    params, config, _, _ = families.load_hf_any(tmp_path / "hf")
    with pytest.raises(BertJaxError, match="does not fit this distilbert model"):
        families.export_hf_any(params, config, str(tmp_path / "out"),
                               architecture="BertForMaskedLM")
    with pytest.raises(BertJaxError, match="needs the \\['mlm'\\] head"):
        families.export_hf_any(params, config, str(tmp_path / "out"),
                               architecture="DistilBertForMaskedLM")


def test_albert_layer_groups_are_refused(tmp_path):
    config = transformers.AlbertConfig(**COMMON, embedding_size=16, num_hidden_groups=2)
    transformers.AlbertModel(config).save_pretrained(tmp_path / "hf")
    with pytest.raises(BertJaxError, match="num_hidden_groups=2 is not supported"):
        families.load_hf_any(tmp_path / "hf")


def test_albert_sentencepiece_tokenizer_travels(tmp_path):
    """ALBERT's spiece.model layout (<pad> <unk> [CLS] [SEP] [MASK]) converts with the model and
    is exported back as spiece.model."""
    import sentencepiece as spm

    text = tmp_path / "text.txt"
    text.write_text("\n".join(f"the {w} sat on the mat number {i}" for i, w in
                              enumerate(["cat", "dog", "bird", "fish"] * 20)) + "\n")
    spm.SentencePieceTrainer.train(
        input=str(text), model_prefix=str(tmp_path / "spiece"), vocab_size=36,
        pad_id=0, pad_piece="<pad>", unk_id=1, unk_piece="<unk>", bos_id=-1, eos_id=-1,
        user_defined_symbols=["[CLS]", "[SEP]", "[MASK]"], minloglevel=2)
    model = _hf_model("albert", "AlbertForMaskedLM")
    model.config.vocab_size = 101
    model.save_pretrained(tmp_path / "hf")
    (tmp_path / "hf" / "spiece.model").write_bytes((tmp_path / "spiece.model").read_bytes())
    params, config, tokenizer, report = families.load_hf_any(tmp_path / "hf")
    assert tokenizer.kind == "sentencepiece"
    assert (tokenizer.pad_id, tokenizer.unk_id, tokenizer.cls_id, tokenizer.sep_id,
            tokenizer.mask_id) == (0, 1, 2, 3, 4)
    assert any("36 tokens" in n for n in report.notes)  # vocab sizes differ: reported
    families.export_hf_any(params, config, str(tmp_path / "out"), tokenizer)
    assert (tmp_path / "out" / "spiece.model").read_bytes() == (
        tmp_path / "spiece.model").read_bytes()
    assert not (tmp_path / "out" / "tokenizer.json").exists()
