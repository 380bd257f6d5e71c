"""Fine-tuned models of every family export as the family's own task class.

For BERT, RoBERTa, ALBERT, ELECTRA and DistilBERT and each of sequence classification, token
classification, question answering and multiple choice: a small random transformers model
of that class converts into bert-jax, and bert-jax's export of it loads through the Auto class
as the same class with every weight in place, the task's label names in config.json, and
logits within 1e-5 of bert-jax's. `transformers.pipeline` loads an export with its tokenizer
for each of the three pipeline tasks, and `bert-jax export` of a fine-tuning workdir picks the
class from the task it was fine-tuned on."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from hf_helpers import randomize
from test_families import COMMON, _batch, _hf_model

from bert_jax import modeling
from bert_jax.checkpoint import families, hf, store
from bert_jax.cli import main
from bert_jax.errors import BertJaxError
from bert_jax.modeling.params import flatten_params
from bert_jax.tokenization.wordpiece import WordPieceTokenizer

TOL = 1e-5
FAMILY_NAMES = ("bert", "roberta", "albert", "electra", "distilbert")
KINDS = {  # task kind -> (class suffix, transformers Auto class)
    "classification": ("ForSequenceClassification", "AutoModelForSequenceClassification"),
    "token_classification": ("ForTokenClassification", "AutoModelForTokenClassification"),
    "span": ("ForQuestionAnswering", "AutoModelForQuestionAnswering"),
    "multiple_choice": ("ForMultipleChoice", "AutoModelForMultipleChoice"),
}
LABELS = ("negative", "neutral", "positive")


def _source_model(family: str, cls_name: str, **overrides):
    if family == "bert":
        config = transformers.BertConfig(**{**COMMON, "max_position_embeddings": 20,
                                            **overrides})
        return randomize(getattr(transformers, cls_name)(config))
    return _hf_model(family, cls_name, **overrides)


def _bert_jax_logits(kind: str, config, params, ids, mask, segments):
    """bert-jax's task model on the batch: [batch, seq, labels] / [batch, labels] logits, or
    [batch, seq, 2] (start, end) for question answering."""
    model = {"classification": lambda: modeling.BertForSequenceClassification(config, 3),
             "token_classification": lambda: modeling.BertForTokenClassification(config, 3),
             "span": lambda: modeling.BertForQuestionAnswering(config),
             "multiple_choice": lambda: modeling.BertForMultipleChoice(config)}[kind]()
    out = jax.jit(model.apply)({"params": params}, jnp.asarray(ids), jnp.asarray(mask),
                               jnp.asarray(segments))
    if kind == "span":
        return np.stack([out["start_logits"], out["end_logits"]], -1)
    return np.asarray(out["logits"])


def _hf_logits(kind: str, family: str, model, ids, mask, segments):
    kwargs = dict(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask))
    if family != "distilbert":
        kwargs["token_type_ids"] = torch.tensor(segments)
    with torch.no_grad():
        out = model.eval()(**kwargs)
    if kind == "span":
        return np.stack([out.start_logits.numpy(), out.end_logits.numpy()], -1)
    return out.logits.numpy()


def _assert_close(ours, theirs, kind, mask):
    assert ours.shape == theirs.shape
    diff = np.abs(ours.astype(np.float64) - theirs)
    if kind in ("token_classification", "span"):  # padded positions are not predictions
        diff = np.where(mask.astype(bool)[..., None], diff, 0.0)
    assert diff.max() <= TOL, diff.max()


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_task_class_exports_with_bert_jax_logits(family, kind, tmp_path):
    suffix, auto = KINDS[kind]
    cls_name = families.CLASS_PREFIXES[family] + suffix
    labelled = kind in ("classification", "token_classification")
    source = _source_model(family, cls_name, **({"num_labels": 3} if labelled else {}))
    source.save_pretrained(tmp_path / "src")
    params, config, _, report = families.load_hf_any(tmp_path / "src")
    assert report.unused == [], report.unused

    ids, mask, segments = _batch(config)
    if kind == "multiple_choice":  # [batch, choices, seq]
        ids, mask, segments = (x.reshape(2, 2, -1) for x in (ids, mask, segments))
    ours = _bert_jax_logits(kind, config, params, ids, mask, segments)
    _assert_close(ours, _hf_logits(kind, family, source, ids, mask, segments), kind, mask)

    # The heads alone name the class, except multiple choice (a one-output pooled classifier
    # is also a regression): that needs the task kind.
    detected = families.detect_family_architecture(params, families.export_family(config))
    assert detected == (families.CLASS_PREFIXES[family] + "ForSequenceClassification"
                        if kind == "multiple_choice" else cls_name)
    report = families.export_hf_any(params, config, str(tmp_path / "out"), kind=kind,
                                    labels=LABELS if labelled else ())
    assert report.architecture == cls_name and report.unused == []

    back, info = getattr(transformers, auto).from_pretrained(
        tmp_path / "out", output_loading_info=True, attn_implementation="eager")
    assert type(back).__name__ == cls_name
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert not info["mismatched_keys"], info
    if labelled:
        assert back.config.id2label == dict(enumerate(LABELS))
        assert back.config.label2id == {name: i for i, name in enumerate(LABELS)}
    _assert_close(ours, _hf_logits(kind, family, back, ids, mask, segments), kind, mask)

    # ... and the export imports back into the same parameters.
    params2, config2, _, report2 = families.load_hf_any(tmp_path / "out")
    assert config2 == config and report2.unused == []
    flat, flat2 = flatten_params(params), flatten_params(params2)
    assert sorted(flat) == sorted(flat2)
    for key in flat:
        np.testing.assert_array_equal(flat[key], flat2[key], err_msg=key)


def test_roberta_token_classifier_is_not_renamed_as_the_sequence_head(tmp_path):
    """RobertaForTokenClassification's classifier is a plain linear layer (no out_proj), and
    RobertaForSequenceClassification's head takes the pooler's place as classifier.dense."""
    source = _source_model("roberta", "RobertaForTokenClassification", num_labels=3)
    source.save_pretrained(tmp_path / "src")
    params, config, _, _ = families.load_hf_any(tmp_path / "src")
    state, _ = families.params_to_family_state(params, config, "roberta",
                                               "RobertaForTokenClassification")
    assert {"classifier.weight", "classifier.bias"} <= set(state)
    assert not any(k.startswith("classifier.out_proj") for k in state)
    params["bert"]["pooler"] = {"kernel": np.eye(32, dtype=np.float32),
                                "bias": np.zeros(32, np.float32)}
    state, _ = families.params_to_family_state(params, config, "roberta",
                                               "RobertaForSequenceClassification")
    assert {"classifier.dense.weight", "classifier.out_proj.weight"} <= set(state)
    assert not any(k.startswith("roberta.pooler") for k in state)


@pytest.fixture(scope="module")
def tiny_classifier_params():
    """A converted DistilBertForSequenceClassification (pooler + 3-label classifier)."""
    return _converted("distilbert", "DistilBertForSequenceClassification", num_labels=3)


def _converted(family, cls_name, **overrides):
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        _source_model(family, cls_name, **overrides).save_pretrained(tmp)
        params, config, _, _ = families.load_hf_any(tmp)
    return params, config


def test_class_that_does_not_fit_the_head_is_one_error(tiny_classifier_params, tmp_path):
    params, config = tiny_classifier_params
    out = str(tmp_path / "out")
    cases = [  # (architecture, kind, error)
        ("DistilBertForTokenClassification", None, "reads the pooled first token"),
        ("DistilBertForMultipleChoice", None, "one output; this classifier has 3"),
        ("DistilBertForQuestionAnswering", None, r"needs the \['qa_outputs'\] head"),
        ("DistilBertForMultipleChoice", "classification",
         "its head is for a classification task; choose DistilBertForSequenceClassification"),
    ]
    for architecture, kind, error in cases:
        with pytest.raises(BertJaxError, match=error):
            families.export_hf_any(params, config, out, architecture=architecture, kind=kind)
    with pytest.raises(BertJaxError, match="the task has 2 labels"):
        families.export_hf_any(params, config, out, labels=("a", "b"))
    tagger = {"bert": {k: v for k, v in params["bert"].items() if k != "pooler"},
              "classifier": params["classifier"]}
    with pytest.raises(BertJaxError, match="has no pooler: its classifier reads every token"):
        families.export_hf_any(tagger, config, out,
                               architecture="DistilBertForSequenceClassification")
    with pytest.raises(BertJaxError, match="pooler applies relu; this model's pooler applies "
                       "tanh"):
        families.export_hf_any(params, config.replace(pooler_activation="tanh"), out)
    featured = {**params, "feature_mix": {"weights": np.zeros(3, np.float32)}}
    with pytest.raises(BertJaxError, match="combined hidden states"):
        families.export_hf_any(featured, config, out)
    assert not (tmp_path / "out" / "config.json").exists()


# ---- pipelines ----------------------------------------------------------------------------------
def _wordpiece(tmp_path, config) -> WordPieceTokenizer:
    from tests.finetuning import helpers as H

    vocab = H.VOCAB + [f"tok{i}" for i in range(config.vocab_size - len(H.VOCAB))]
    return WordPieceTokenizer(vocab)


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_text_classification_pipeline_roberta(tmp_path):
    """A RoBERTa sequence classifier with its byte-level BPE tokenizer: the pipeline names
    bert-jax's top label with bert-jax's probability."""
    from bert_jax.tokenization.bpe import train_bpe
    from tests.finetuning import helpers as H

    texts, _ = H.sentences(60, 3)
    (tmp_path / "corpus.txt").write_text("\n".join(texts) + "\n")
    tokenizer, _ = train_bpe([str(tmp_path / "corpus.txt")], vocab_size=300, min_frequency=1)
    params, config = _converted("roberta", "RobertaForSequenceClassification", num_labels=3,
                                vocab_size=tokenizer.vocab_size, max_position_embeddings=40)
    families.export_hf_any(params, config, str(tmp_path / "out"), tokenizer,
                           kind="classification", labels=LABELS)
    pipe = transformers.pipeline("text-classification", model=str(tmp_path / "out"),
                                 device="cpu")
    text = "the old man likes a red car ."
    enc = tokenizer.encode(text)
    ids = np.array([enc.input_ids])
    logits = _bert_jax_logits("classification", config, params, ids, np.ones_like(ids),
                              np.zeros_like(ids))[0]
    probs = _softmax(logits.astype(np.float64))
    (result,) = pipe(text)
    assert result["label"] == LABELS[int(np.argmax(probs))]
    assert result["score"] == pytest.approx(probs.max(), abs=1e-5)


def test_token_classification_pipeline_distilbert(tmp_path):
    """A DistilBERT tagger with its WordPiece vocabulary: the pipeline tags every token with
    bert-jax's label and probability."""
    tags = ("B-X", "I-X", "Y")
    params, config = _converted("distilbert", "DistilBertForTokenClassification",
                                num_labels=3, vocab_size=60)
    tokenizer = _wordpiece(tmp_path, config)
    families.export_hf_any(params, config, str(tmp_path / "out"), tokenizer,
                           kind="token_classification", labels=tags)
    text = "john walks in paris and mary sees a big tree"
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
    assert hf_tok(text)["input_ids"] == tokenizer.encode(text).input_ids
    assert "token_type_ids" not in hf_tok(text)  # DistilBERT takes none
    pipe = transformers.pipeline("token-classification", model=str(tmp_path / "out"),
                                 device="cpu", ignore_labels=[])
    ids = np.array([tokenizer.encode(text).input_ids])
    probs = _softmax(_bert_jax_logits("token_classification", config, params, ids,
                                      np.ones_like(ids), np.zeros_like(ids))[0]
                     .astype(np.float64))
    results = pipe(text)
    assert [r["index"] for r in results] == list(range(1, ids.shape[1] - 1))
    for r in results:
        assert r["entity"] == tags[int(np.argmax(probs[r["index"]]))]
        assert r["score"] == pytest.approx(probs[r["index"]].max(), abs=1e-5)


def test_question_answering_pipeline_electra(tmp_path):
    """An ELECTRA QA model: transformers' tokenizer encodes the question/context pair as
    bert-jax does, the reloaded model gives bert-jax's start/end logits, and the pipeline
    answers with a span of the context (where this transformers has the question-answering
    pipeline: version 5 removed it)."""
    params, config = _converted("electra", "ElectraForQuestionAnswering", vocab_size=60,
                                max_position_embeddings=40)
    tokenizer = _wordpiece(tmp_path, config)
    families.export_hf_any(params, config, str(tmp_path / "out"), tokenizer, kind="span")
    question, context = "who walks in the park ?", "john walks in the park and mary sits ."
    enc = tokenizer.encode(question, context)
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
    hf_enc = hf_tok(question, context)
    assert hf_enc["input_ids"] == enc.input_ids
    assert hf_enc["token_type_ids"] == enc.segment_ids
    ids, segments = np.array([enc.input_ids]), np.array([enc.segment_ids])
    ours = _bert_jax_logits("span", config, params, ids, np.ones_like(ids), segments)
    back = transformers.AutoModelForQuestionAnswering.from_pretrained(
        tmp_path / "out", attn_implementation="eager")
    _assert_close(ours, _hf_logits("span", "electra", back, ids, np.ones_like(ids), segments),
                  "span", np.ones_like(ids))
    from transformers.pipelines import SUPPORTED_TASKS

    if "question-answering" not in SUPPORTED_TASKS:
        return
    pipe = transformers.pipeline("question-answering", model=str(tmp_path / "out"),
                                 device="cpu")
    answer = pipe(question=question, context=context)
    assert answer["answer"] and answer["answer"] in context
    assert context[answer["start"]:answer["end"]] == answer["answer"]
    assert 0.0 < answer["score"] <= 1.0


# ---- the CLI: workdirs and converted checkpoints ------------------------------------------------
def _workdir(path, params, config, tokenizer, task: str, **run_overrides):
    """A fine-tuning workdir as `bert-jax finetune` leaves it (config.json's task and run
    config, params, tokenizer)."""
    from bert_jax.finetuning.config import base_config

    run = base_config()
    run.task = task
    for key, value in run_overrides.items():
        setattr(run, key, value)
    store.save_model(str(path), params, config, tokenizer,
                     extra={"task": task, "num_labels": 3, "finetune": run.to_dict()})
    return str(path)


def test_cli_export_of_workdirs_picks_the_task_class(tiny_classifier_params, tmp_path, capsys):
    """An MNLI workdir exports as the family's sequence classifier with MNLI's labels; a SWAG
    workdir (a one-output pooled classifier, like a regression) as its multiple-choice class;
    a class of another task, or a feature-based head, is one clear error."""
    from bert_jax.tasks.registry import get_task

    params, config = tiny_classifier_params
    tokenizer = _wordpiece(tmp_path, config)
    mnli = _workdir(tmp_path / "mnli", params, config, tokenizer, "mnli")
    assert main(["export", mnli, "--output", str(tmp_path / "out")]) == 0
    assert "architecture: DistilBertForSequenceClassification" in capsys.readouterr().out
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["architectures"] == ["DistilBertForSequenceClassification"]
    labels = get_task("mnli").labels
    assert written["id2label"] == {str(i): name for i, name in enumerate(labels)}
    assert written["problem_type"] == "single_label_classification"
    assert (tmp_path / "out" / "vocab.txt").exists()

    assert main(["export", mnli, "--output", str(tmp_path / "bad"),
                 "--architecture", "DistilBertForTokenClassification"]) == 2
    err = capsys.readouterr().err
    assert "its head is for a classification task" in err
    assert "DistilBertForSequenceClassification" in err and "Traceback" not in err

    choice = {"bert": params["bert"],
              "classifier": {"kernel": params["classifier"]["kernel"][:, :1],
                             "bias": params["classifier"]["bias"][:1]}}
    swag = _workdir(tmp_path / "swag", choice, config, tokenizer, "swag")
    assert main(["export", swag, "--output", str(tmp_path / "swag_hf")]) == 0
    back, info = transformers.AutoModelForMultipleChoice.from_pretrained(
        tmp_path / "swag_hf", output_loading_info=True)
    assert type(back).__name__ == "DistilBertForMultipleChoice"
    assert not info["missing_keys"] and not info["unexpected_keys"]

    mixed = _workdir(tmp_path / "mix", params, config, tokenizer, "mnli",
                     feature_layers="second_to_last")
    capsys.readouterr()
    assert main(["export", mixed, "--output", str(tmp_path / "mix_hf")]) == 2
    assert "feature_layers='second_to_last'" in capsys.readouterr().err
    assert not (tmp_path / "mix_hf").exists()


def test_task_and_labels_of_workdir_configs():
    """What export reads from a workdir's config.json: the task's kind and label names (a
    custom task's from its run config), or the converted source's class and labels."""
    from bert_jax.finetuning.config import base_config
    from bert_jax.finetuning.export import checkpoint_task

    def extra(task, **run_overrides):
        run = base_config()
        run.task = task
        for key, value in run_overrides.items():
            setattr(run, key, value)
        return {"task": task, "finetune": run.to_dict()}

    assert checkpoint_task(extra("stsb"), "w") == ("regression", ())
    assert checkpoint_task(extra("squad_v1"), "w") == ("span", ())
    assert checkpoint_task(extra("conll2003"), "w")[0] == "token_classification"
    assert checkpoint_task(extra("custom_classification", labels='["spam", "ham"]',
                                 text_column="text"), "w") == (
        "classification", ("spam", "ham"))
    converted = {"converted_from": {"architecture": "AlbertForSequenceClassification",
                                    "labels": ["x", "y"], "problem_type": "regression"}}
    assert checkpoint_task(converted, "w") == ("regression", ("x", "y"))
    assert checkpoint_task({"converted_from": {"architecture": "BertForPreTraining"}},
                           "w") == (None, ())
    with pytest.raises(BertJaxError, match="feature_head='bilstm'"):
        checkpoint_task(extra("conll2003", feature_head="bilstm"), "w")


def test_convert_then_export_keeps_class_and_labels(tmp_path):
    """`bert-jax convert` of a multiple-choice model and of a labelled tagger: `export` gives
    back the same classes with the same label names; so does `export` of the source
    directory itself."""
    choice = _source_model("electra", "ElectraForMultipleChoice")
    choice.save_pretrained(tmp_path / "mc")
    tagger = _source_model("roberta", "RobertaForTokenClassification", num_labels=3,
                           id2label=dict(enumerate(("O", "B-PER", "I-PER"))),
                           label2id={"O": 0, "B-PER": 1, "I-PER": 2})
    tagger.save_pretrained(tmp_path / "ner")
    for name, auto in (("mc", "AutoModelForMultipleChoice"),
                       ("ner", "AutoModelForTokenClassification")):
        assert main(["convert", str(tmp_path / name), "--output", str(tmp_path / f"{name}_bj")
                     ]) == 0
        assert main(["export", str(tmp_path / f"{name}_bj"), "--output",
                     str(tmp_path / f"{name}_hf")]) == 0
        back = getattr(transformers, auto).from_pretrained(tmp_path / f"{name}_hf")
        source = choice if name == "mc" else tagger
        assert type(back).__name__ == type(source).__name__
        assert back.config.id2label == source.config.id2label
        assert hf.task_class_suffix(type(back).__name__) is not None
    # A Hugging Face directory exports directly, keeping its class too.
    assert main(["export", str(tmp_path / "mc"), "--output", str(tmp_path / "mc_again")]) == 0
    written = json.loads((tmp_path / "mc_again" / "config.json").read_text())
    assert written["architectures"] == ["ElectraForMultipleChoice"]
