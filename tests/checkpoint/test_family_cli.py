"""Every family end to end through the CLI: tiny random RoBERTa, ALBERT, ELECTRA and
DistilBERT masked-LM models saved by transformers with their tokenizers (byte-level BPE,
SentencePiece with ALBERT's normalisation, WordPiece), `bert-jax convert`, then `fill-mask`
and `embed` against transformers, `finetune` / `evaluate` / `predict` on a toy SST-2 with
`export` of the fine-tuned classifier (the family's sequence-classification class, bert-jax's
logits), and `export` back to transformers."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from hf_helpers import randomize

from bert_jax.checkpoint import store
from bert_jax.cli import main
from tests.finetuning import helpers as H

# One xdist worker runs the file: the module fixture converts the four families once.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("family_cli")]

FAMILIES = ("roberta", "albert", "electra", "distilbert")
SIZE = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=48,
            attn_implementation="eager")
FAST = ["--config.max_seq_length=24", "--config.log_every=0", "--config.eval_batch_size=16",
        "--config.global_batch_size=16", "--config.epochs=1"]


@dataclasses.dataclass
class Converted:
    hf_dir: Path
    ckpt: Path
    model: torch.nn.Module  # the transformers masked-LM model
    tokenizer: object  # its transformers tokenizer

    @property
    def mask(self) -> str:
        return self.tokenizer.mask_token

    def encoder(self):
        return getattr(self.model, self.model.base_model_prefix)


def _corpus(root: Path) -> Path:
    texts, _ = H.sentences(200, 7)
    path = root / "corpus.txt"
    path.write_text("\n".join(texts) + "\n", encoding="utf-8")
    return path


def _roberta(root: Path, hf_dir: Path):
    from bert_jax.checkpoint.families import _write_bpe_tokenizer
    from bert_jax.config import BertConfig
    from bert_jax.tokenization.bpe import train_bpe

    tok, _ = train_bpe([str(_corpus(root))], vocab_size=300, min_frequency=1)
    config = transformers.RobertaConfig(vocab_size=tok.vocab_size, max_position_embeddings=34,
                                        type_vocab_size=1, pad_token_id=1, **SIZE)
    model = randomize(transformers.RobertaForMaskedLM(config))
    model.save_pretrained(hf_dir)
    _write_bpe_tokenizer(tok, str(hf_dir), BertConfig(vocab_size=tok.vocab_size))
    return model, transformers.AutoTokenizer.from_pretrained(hf_dir)


def _albert(root: Path, hf_dir: Path):
    import sentencepiece as spm

    spm.SentencePieceTrainer.train(
        input=str(_corpus(root)), model_prefix=str(root / "spiece"), vocab_size=44,
        pad_id=0, pad_piece="<pad>", unk_id=1, unk_piece="<unk>", bos_id=-1, eos_id=-1,
        user_defined_symbols=["[CLS]", "[SEP]", "[MASK]"], minloglevel=2)
    config = transformers.AlbertConfig(vocab_size=44, embedding_size=16,
                                       max_position_embeddings=32, **SIZE)
    model = randomize(transformers.AlbertForMaskedLM(config))
    model.save_pretrained(hf_dir)
    (hf_dir / "spiece.model").write_bytes((root / "spiece.model").read_bytes())
    (hf_dir / "tokenizer_config.json").write_text('{"tokenizer_class": "AlbertTokenizer"}')
    return model, transformers.AlbertTokenizer.from_pretrained(hf_dir)


def _electra(root: Path, hf_dir: Path):
    config = transformers.ElectraConfig(vocab_size=len(H.VOCAB), embedding_size=24,
                                        max_position_embeddings=32, **SIZE)
    model = randomize(transformers.ElectraForMaskedLM(config))
    model.save_pretrained(hf_dir)
    H.write_vocab(str(hf_dir))
    return model, transformers.BertTokenizer(str(hf_dir / "vocab.txt"))


def _distilbert(root: Path, hf_dir: Path):
    config = transformers.DistilBertConfig(vocab_size=len(H.VOCAB), dim=32, n_layers=1,
                                           n_heads=4, hidden_dim=48, max_position_embeddings=32,
                                           attn_implementation="eager")
    model = randomize(transformers.DistilBertForMaskedLM(config))
    model.save_pretrained(hf_dir)
    H.write_vocab(str(hf_dir))
    return model, transformers.BertTokenizer(str(hf_dir / "vocab.txt"))


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> dict[str, Converted]:
    """Each family's transformers directory and its `bert-jax convert` output."""
    out = {}
    for family in FAMILIES:
        root = tmp_path_factory.mktemp(family)
        model, tokenizer = globals()[f"_{family}"](root, root / "hf")
        assert main(["convert", str(root / "hf"), "--output", str(root / "ckpt")]) == 0
        out[family] = Converted(root / "hf", root / "ckpt", model.eval(), tokenizer)
    return out


@pytest.fixture(scope="module")
def sst2(tmp_path_factory):
    return H.write_sst2(str(tmp_path_factory.mktemp("sst2") / "SST-2"), n_train=32, n_dev=16,
                        n_test=4)


def _hf_inputs(family: str, tokenizer, text: str):
    enc = tokenizer(text, return_tensors="pt")
    return {k: v for k, v in enc.items() if family != "distilbert" or k != "token_type_ids"}


@pytest.mark.parametrize("family", FAMILIES)
def test_fill_mask_matches_transformers(family, converted, capsys):
    c = converted[family]
    text = f"the Cat sits in the {c.mask} ."  # ALBERT lower-cases; the others see [UNK] / BPE
    capsys.readouterr()
    assert main(["fill-mask", str(c.ckpt), "--text", text, "--top-k", "3", "--json"]) == 0
    masks = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["masks"]
    enc = _hf_inputs(family, c.tokenizer, text)
    with torch.no_grad():
        logits = c.model(**enc).logits
    position = enc["input_ids"][0].tolist().index(c.tokenizer.mask_token_id)
    probs = torch.softmax(logits[0, position], -1).numpy()
    top = np.argsort(-probs)[:3]
    assert [m["id"] for m in masks[0]] == top.tolist()
    np.testing.assert_allclose([m["probability"] for m in masks[0]], probs[top], atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_embed_matches_transformers(family, converted, tmp_path):
    c = converted[family]
    text = "a Dog  runs in the park ."
    assert main(["embed", str(c.ckpt), "--text", text, "--output", str(tmp_path / "v.npy"),
                 "--pooling", "none"]) == 0
    vectors = np.load(tmp_path / "v.npy")
    with torch.no_grad():
        ref = c.encoder()(**_hf_inputs(family, c.tokenizer, text)).last_hidden_state[0]
    assert np.abs(vectors[0, ref.shape[0]:]).max(initial=0) == 0  # padding rows zeroed
    np.testing.assert_allclose(vectors[0, :ref.shape[0]], ref.numpy(), atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_finetune_evaluate_predict(family, converted, sst2, tmp_path, capsys):
    c = converted[family]
    workdir = str(tmp_path / "run")
    assert main(["finetune", "--config", "experiments/glue.py:sst2", "--workdir", workdir,
                 f"--config.init_checkpoint={c.ckpt}", f"--config.data_dir={sst2}",
                 *FAST]) == 0
    out = capsys.readouterr().out
    assert "head classifier freshly initialised" in out
    metrics = json.load(open(os.path.join(workdir, "metrics.json")))
    assert metrics["dev_examples"] == {"dev": 16}
    _, cfg, tok, _ = store.load_model(workdir)
    kind = {"roberta": "bpe", "albert": "sentencepiece"}.get(family, "wordpiece")
    assert (cfg.model_type, tok.kind) == (family, kind)
    if family == "albert":
        assert tok.do_lower_case and not tok.keep_accents  # AlbertTokenizer's normalisation
    assert main(["evaluate", "--workdir", workdir]) == 0
    assert json.loads(capsys.readouterr().out)["dev"]["accuracy"] == pytest.approx(
        metrics["best"]["value"])
    assert main(["predict", "--workdir", workdir, "--output", str(tmp_path / "pred")]) == 0
    rows = open(tmp_path / "pred" / "SST-2.tsv").read().splitlines()
    assert rows[0] == "index\tprediction" and len(rows) == 5
    assert {r.split("\t")[1] for r in rows[1:]} <= {"0", "1"}
    _check_classifier_export(family, workdir, tmp_path / "hf")


def _check_classifier_export(family: str, workdir: str, out: Path):
    """`export` of the SST-2 workdir: the family's sequence classifier with SST-2's labels,
    whose tokenizer and logits are bert-jax's."""
    import jax

    from bert_jax.checkpoint.families import CLASS_PREFIXES
    from bert_jax.modeling import BertForSequenceClassification
    from bert_jax.modeling.params import to_layout

    assert main(["export", workdir, "--output", str(out)]) == 0
    back = transformers.AutoModelForSequenceClassification.from_pretrained(
        out, attn_implementation="eager")
    assert type(back).__name__ == f"{CLASS_PREFIXES[family]}ForSequenceClassification"
    assert back.config.id2label == {0: "0", 1: "1"}
    params, cfg, tok, _ = store.load_model(workdir)
    text = "the old man sits in a big park ."
    enc = tok.encode(text)
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    hf_enc = hf_tok(text, return_tensors="pt")
    assert hf_enc["input_ids"][0].tolist() == enc.input_ids
    ids = np.array([enc.input_ids])
    ours = jax.jit(BertForSequenceClassification(cfg, 2).apply)(
        {"params": to_layout(params, cfg)}, ids, np.ones_like(ids),
        np.array([enc.segment_ids]))["logits"]
    with torch.no_grad():
        ref = back.eval()(**hf_enc).logits.numpy()
    np.testing.assert_allclose(np.asarray(ours), ref, atol=1e-5)


@pytest.mark.parametrize("family", ["roberta", "distilbert"])
def test_converted_encoder_restored_exactly_for_a_pair_task(family, converted):
    """The task model built from a converted checkpoint holds its encoder bit for bit (no
    token-type table for DistilBERT, a fresh pooler where the checkpoint has none), and pair
    inputs follow the family's layout."""
    import jax

    from bert_jax.finetuning.config import load_config
    from bert_jax.finetuning.model_init import initial_model, merge_encoder
    from bert_jax.finetuning.trainer import build_finetuner
    from bert_jax.modeling.params import flatten_params
    from bert_jax.tasks import get_task

    ckpt = str(converted[family].ckpt)
    c = load_config("experiments/glue.py:mrpc", [*FAST, f"--config.init_checkpoint={ckpt}"])
    task = get_task("mrpc")
    model_cfg, tokenizer, pretrained, _ = initial_model(task, c)
    finetuner = build_finetuner(task, c, model_cfg, None)
    fresh = jax.device_get(finetuner.init_params(jax.random.PRNGKey(0)))
    merged, _ = merge_encoder(fresh, pretrained, model_cfg)
    placed = flatten_params(jax.device_get(finetuner.place_params(merged)))
    expected = flatten_params(store.load_model(ckpt)[0])
    encoder = [p for p in expected if p.startswith("bert/")]
    assert encoder and all(np.array_equal(placed[p], expected[p]) for p in encoder)
    assert "bert/pooler/kernel" in placed and "bert/pooler/kernel" not in expected
    has_types = "bert/embeddings/token_type_embeddings/embedding" in placed
    assert has_types == (family == "roberta")
    enc = tokenizer.encode("the cat sits", "a dog runs")
    if family == "roberta":
        first_sep = enc.input_ids.index(tokenizer.sep_id)
        assert enc.input_ids[first_sep + 1] == tokenizer.sep_id and set(enc.segment_ids) == {0}
    else:
        assert enc.input_ids.count(tokenizer.sep_id) == 2 and set(enc.segment_ids) == {0, 1}


def test_convert_then_export_cli_round_trip(converted, tmp_path, capsys):
    """convert -> export --architecture: transformers loads model and tokenizer files back."""
    c = converted["roberta"]
    assert main(["export", str(c.ckpt), "--output", str(tmp_path / "hf"),
                 "--architecture", "RobertaModel"]) == 0
    assert "NOT EXPORTED" in capsys.readouterr().out  # the MLM head has no place in the class
    back = transformers.RobertaModel.from_pretrained(tmp_path / "hf", attn_implementation="eager")
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    text = "the cat <mask> on a mat\nend"
    assert tok(text)["input_ids"] == c.tokenizer(text)["input_ids"]
    enc = c.tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        np.testing.assert_array_equal(back.eval()(**enc).last_hidden_state.numpy(),
                                      c.encoder()(**enc).last_hidden_state.numpy())
    assert main(["export", str(c.ckpt), "--output", str(tmp_path / "bad"),
                 "--architecture", "BertModel"]) == 2
    assert "does not fit this roberta model" in capsys.readouterr().err


def test_albert_export_keeps_the_normalisation(converted, tmp_path):
    """A converted ALBERT exports its tokenizer with the same options: AlbertTokenizer loads
    it and encodes as the source directory's tokenizer does."""
    c = converted["albert"]
    assert main(["export", str(c.ckpt), "--output", str(tmp_path / "hf")]) == 0
    back = transformers.AlbertTokenizer.from_pretrained(tmp_path / "hf")
    text = "The CAT  sat on ``the'' Mät."
    assert back(text)["input_ids"] == c.tokenizer(text)["input_ids"]
