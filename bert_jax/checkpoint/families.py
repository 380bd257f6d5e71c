"""Hugging Face RoBERTa, ALBERT, ELECTRA and DistilBERT checkpoints <-> bert-jax parameters.

Every family is BERT's post-LayerNorm encoder with small differences, which bert-jax keeps
as ``BertConfig`` fields:

- RoBERTa: positions start at ``pad_token_id + 1`` (``position_offset``), one token type,
  byte-level BPE vocabulary (``vocab.json`` + ``merges.txt``); the sequence classifier's
  ``classifier.dense`` / ``classifier.out_proj`` are BERT's pooler and classifier.
- ALBERT: factorized embeddings (``embedding_size``) and one shared layer (``share_layers``),
  sentence-order head in BERT's NSP place; SentencePiece vocabulary (``spiece.model``).
- ELECTRA: ``embeddings_project`` when ``embedding_size != hidden_size``, no pooler; the
  discriminator's replaced-token head (``rtd``) or the generator's MLM head; the sequence
  classifier's head as RoBERTa's, with gelu (``pooler_activation``).
- DistilBERT: no token types (``use_token_types=False``), no pooler, its own parameter names;
  the sequence classifier's ``pre_classifier`` is the pooler, with relu.

Import renames a family's state dict into BERT's names and hands it to
:func:`bert_jax.checkpoint.hf.params_from_hf_state`; export runs
:func:`bert_jax.checkpoint.hf.bert_named_state` and renames back. Each rename rule is a pair
of templates (``{i}`` a layer index, a trailing ``*`` the rest of the name), so the two
directions cannot disagree.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from bert_jax import fileio, storage
from bert_jax.checkpoint import hf
from bert_jax.config import BertConfig
from bert_jax.errors import BertJaxError

FAMILY_TYPES = ("roberta", "albert", "electra", "distilbert")
BPE_VOCAB_FILE = "vocab.json"
BPE_MERGES_FILE = "merges.txt"
SPIECE_FILE = "spiece.model"


@dataclasses.dataclass(frozen=True)
class Architecture:
    """An exportable class: whether it holds the pooler, the bert-jax heads it holds, and its
    head's own renames (tried before the family's in both directions)."""

    pooler: bool
    heads: tuple[str, ...] = ()
    rules: tuple[tuple[str, str], ...] = ()


@dataclasses.dataclass(frozen=True)
class Family:
    model_type: str
    prefix: str  # the encoder's name inside task classes ("roberta.")
    class_prefix: str  # the start of its class names ("Roberta")
    # (family template, BERT template) for the encoder and pretraining heads; the first
    # matching rule wins in either direction.
    rules: tuple[tuple[str, str], ...]
    # Exportable class -> what it holds; the first is the base model.
    architectures: dict[str, Architecture]

    @property
    def import_rules(self) -> tuple[tuple[str, str], ...]:
        """Import reads any class: every class's head renames (their family names differ),
        then the family's."""
        heads = dict.fromkeys(r for a in self.architectures.values() for r in a.rules)
        return (*heads, *self.rules)

    def export_rules(self, architecture: str) -> tuple[tuple[str, str], ...]:
        return (*self.architectures[architecture].rules, *self.rules)


def _layer_rules(family_layer: str, names: tuple[tuple[str, str], ...]):
    return tuple((f"{family_layer}.{a}.*", f"bert.encoder.layer.{{i}}.{b}.*") for a, b in names)


def _task_classes(name: str, sequence_rules=(), choice_rules=()) -> dict[str, Architecture]:
    """The four fine-tuned classes: the sequence and multiple-choice classifiers read the
    pooled first token (``sequence_rules`` / ``choice_rules`` name the family's pooling
    layer), the token classifier and ``qa_outputs`` a plain linear layer on every token."""
    return {f"{name}{hf.SEQUENCE_CLASS}": Architecture(True, ("classifier",), sequence_rules),
            f"{name}{hf.TOKEN_CLASS}": Architecture(False, ("classifier",)),
            f"{name}{hf.QA_CLASS}": Architecture(False, ("qa_outputs",)),
            f"{name}{hf.CHOICE_CLASS}": Architecture(True, ("classifier",), choice_rules)}


_MLM = "cls.predictions"
# RoBERTa's and ELECTRA's sequence-classification head (dense + activation on the first token,
# then out_proj) is BERT's pooler + classifier; their token and QA heads are plain linear
# layers (``classifier`` / ``qa_outputs``). RobertaForMultipleChoice keeps RoBERTa's pooler;
# ElectraForMultipleChoice pools with ``sequence_summary.summary`` (+ gelu). DistilBERT's
# ``pre_classifier`` (+ relu) is the pooler of its sequence and multiple-choice classifiers.
_CLASSIFICATION_HEAD = (("classifier.dense.*", "bert.pooler.dense.*"),
                        ("classifier.out_proj.*", "classifier.*"))
_PRE_CLASSIFIER = (("pre_classifier.*", "bert.pooler.dense.*"),)
# The activation after each family's pooler / classification-head dense layer.
POOLER_ACTIVATIONS = {"bert": "tanh", "roberta": "tanh", "albert": "tanh", "electra": "gelu",
                      "distilbert": "relu"}

FAMILIES: dict[str, Family] = {
    "roberta": Family("roberta", "roberta.", "Roberta", (
        ("roberta.*", "bert.*"),
        ("lm_head.dense.*", f"{_MLM}.transform.dense.*"),
        ("lm_head.layer_norm.*", f"{_MLM}.transform.LayerNorm.*"),
        ("lm_head.bias", f"{_MLM}.bias"),
        ("lm_head.decoder.*", f"{_MLM}.decoder.*"),
    ), {"RobertaModel": Architecture(True),
        "RobertaForMaskedLM": Architecture(False, ("mlm",)),
        **_task_classes("Roberta", _CLASSIFICATION_HEAD)}),
    "albert": Family("albert", "albert.", "Albert", (
        ("albert.encoder.embedding_hidden_mapping_in.*", "bert.embeddings.embedding_projection.*"),
        ("albert.embeddings.*", "bert.embeddings.*"),
        *_layer_rules("albert.encoder.albert_layer_groups.0.albert_layers.{i}", (
            ("attention.query", "attention.self.query"),
            ("attention.key", "attention.self.key"),
            ("attention.value", "attention.self.value"),
            ("attention.dense", "attention.output.dense"),
            ("attention.LayerNorm", "attention.output.LayerNorm"),
            ("ffn", "intermediate.dense"), ("ffn_output", "output.dense"),
            ("full_layer_layer_norm", "output.LayerNorm"))),
        ("albert.pooler.*", "bert.pooler.dense.*"),
        ("predictions.dense.*", f"{_MLM}.transform.dense.*"),
        ("predictions.LayerNorm.*", f"{_MLM}.transform.LayerNorm.*"),
        ("predictions.bias", f"{_MLM}.bias"),
        ("predictions.decoder.*", f"{_MLM}.decoder.*"),
        ("sop_classifier.classifier.*", "cls.seq_relationship.*"),
    ), {"AlbertModel": Architecture(True),
        "AlbertForPreTraining": Architecture(True, ("mlm", "nsp")),
        "AlbertForMaskedLM": Architecture(False, ("mlm",)),
        **_task_classes("Albert")}),
    "electra": Family("electra", "electra.", "Electra", (
        ("electra.embeddings_project.*", "bert.embeddings.embedding_projection.*"),
        ("electra.*", "bert.*"),
        ("generator_predictions.dense.*", f"{_MLM}.transform.dense.*"),
        ("generator_predictions.LayerNorm.*", f"{_MLM}.transform.LayerNorm.*"),
        ("generator_lm_head.bias", f"{_MLM}.bias"),
        ("generator_lm_head.weight", f"{_MLM}.decoder.weight"),
        ("discriminator_predictions.dense_prediction.*", "rtd.prediction.*"),
        ("discriminator_predictions.dense.*", "rtd.dense.*"),
    ), {"ElectraModel": Architecture(False),
        "ElectraForPreTraining": Architecture(False, ("rtd",)),
        "ElectraForMaskedLM": Architecture(False, ("mlm",)),
        **_task_classes("Electra", _CLASSIFICATION_HEAD,
                        (("sequence_summary.summary.*", "bert.pooler.dense.*"),))}),
    "distilbert": Family("distilbert", "distilbert.", "DistilBert", (
        ("distilbert.embeddings.*", "bert.embeddings.*"),
        *_layer_rules("distilbert.transformer.layer.{i}", (
            ("attention.q_lin", "attention.self.query"),
            ("attention.k_lin", "attention.self.key"),
            ("attention.v_lin", "attention.self.value"),
            ("attention.out_lin", "attention.output.dense"),
            ("sa_layer_norm", "attention.output.LayerNorm"),
            ("ffn.lin1", "intermediate.dense"), ("ffn.lin2", "output.dense"),
            ("output_layer_norm", "output.LayerNorm"))),
        ("vocab_transform.*", f"{_MLM}.transform.dense.*"),
        ("vocab_layer_norm.*", f"{_MLM}.transform.LayerNorm.*"),
        ("vocab_projector.bias", f"{_MLM}.bias"),
        ("vocab_projector.weight", f"{_MLM}.decoder.weight"),
    ), {"DistilBertModel": Architecture(False),
        "DistilBertForMaskedLM": Architecture(False, ("mlm",)),
        **_task_classes("DistilBert", _PRE_CLASSIFIER, _PRE_CLASSIFIER)}),
}
CLASS_PREFIXES = {"bert": "Bert", **{f.model_type: f.class_prefix for f in FAMILIES.values()}}
# Every exportable class of every family (BERT's included) -> its model_type.
ARCHITECTURE_FAMILY = {**{a: "bert" for a in hf.ARCHITECTURES},
                       **{a: f.model_type for f in FAMILIES.values() for a in f.architectures}}


def _template_regex(template: str) -> re.Pattern:
    body = re.escape(template.removesuffix("*")).replace(r"\{i\}", r"(?P<i>\d+)")
    return re.compile(body + ("(?P<rest>.*)" if template.endswith("*") else ""))


def _fill(template: str, match: re.Match) -> str:
    out = template.removesuffix("*")
    if "{i}" in out:
        out = out.replace("{i}", match.group("i"))
    return out + (match.group("rest") if template.endswith("*") else "")


def rename(keys, rules, to_bert: bool) -> dict[str, str]:
    """key -> renamed key for every key (unmatched keys keep their name)."""
    compiled = [(_template_regex(a if to_bert else b), b if to_bert else a) for a, b in rules]
    out = {}
    for key in keys:
        for pattern, target in compiled:
            m = pattern.fullmatch(key)
            if m:
                out[key] = _fill(target, m)
                break
        else:
            out[key] = key
    return out


# ---- config.json ------------------------------------------------------------------------------
_BERT_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
              "intermediate_size", "hidden_act", "hidden_dropout_prob",
              "attention_probs_dropout_prob", "max_position_embeddings", "type_vocab_size",
              "initializer_range", "layer_norm_eps", "pad_token_id")
# DistilBERT's names for BERT's keys.
_DISTILBERT_KEYS = {"dim": "hidden_size", "n_layers": "num_hidden_layers",
                    "n_heads": "num_attention_heads", "hidden_dim": "intermediate_size",
                    "activation": "hidden_act", "dropout": "hidden_dropout_prob",
                    "attention_dropout": "attention_probs_dropout_prob",
                    "vocab_size": "vocab_size", "max_position_embeddings":
                    "max_position_embeddings", "initializer_range": "initializer_range",
                    "pad_token_id": "pad_token_id"}


def config_from_hf(raw: Mapping[str, Any], source: str, **overrides: Any) -> BertConfig:
    """A family's ``config.json`` dict -> BertConfig (model_type and its fields set)."""
    model_type = raw.get("model_type")
    if model_type not in FAMILIES:
        raise BertJaxError(f"{source}: model_type {model_type!r} is not one of "
                           f"{('bert', *FAMILY_TYPES)}")
    if model_type == "distilbert":
        # sinusoidal_pos_embds: the sinusoids are stored as the table, read like learned ones
        data = {ours: raw[theirs] for theirs, ours in _DISTILBERT_KEYS.items() if theirs in raw}
        data.update(layer_norm_eps=1e-12, use_token_types=False)
    else:
        pet = raw.get("position_embedding_type", "absolute")
        if pet != "absolute":
            raise BertJaxError(f"{source}: position_embedding_type={pet!r} is not supported "
                               "(only absolute positions)")
        data = {k: raw[k] for k in _BERT_KEYS if raw.get(k) is not None}
        if raw.get("embedding_size") not in (None, raw.get("hidden_size")):
            data["embedding_size"] = raw["embedding_size"]
    if model_type == "albert":
        for key in ("num_hidden_groups", "inner_group_num"):
            if raw.get(key, 1) != 1:
                raise BertJaxError(f"{source}: {key}={raw[key]} is not supported (bert-jax "
                                   "shares one layer: num_hidden_groups = inner_group_num = 1)")
        data["share_layers"] = True
    if model_type == "roberta":
        data["position_offset"] = data.get("pad_token_id", 1) + 1
    data["pooler_activation"] = POOLER_ACTIVATIONS[model_type]
    missing = [k for k in ("vocab_size", "hidden_size", "num_hidden_layers",
                           "num_attention_heads", "intermediate_size") if k not in data]
    if missing:
        raise BertJaxError(f"{source}: missing required key(s) {missing}")
    return BertConfig(model_type=model_type, **{**data, **overrides})


def export_family(config: BertConfig) -> str:
    """The Hugging Face family a bert-jax config exports as (ALBERT for shared layers)."""
    if config.model_type != "bert":
        return config.model_type
    if config.share_layers:
        return "albert"
    if config.embedding_dim != config.hidden_size:
        raise BertJaxError("factorized embeddings without shared layers have no Hugging Face "
                           "BERT class; set model_type='electra' (ElectraModel) to export them")
    return "bert"


def config_to_hf(config: BertConfig, family: str, architecture: str,
                 task_fields: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """BertConfig -> the family's ``config.json`` dict (``task_fields``: a classifier's
    labels, :func:`bert_jax.checkpoint.hf.task_config_fields`)."""
    if family == "bert":
        return hf.hf_config_dict(config, architecture, task_fields)
    fields = {k: getattr(config, k) for k in _BERT_KEYS}
    if family == "distilbert":
        if config.layer_norm_eps != 1e-12:
            raise BertJaxError(f"DistilBERT's LayerNorm epsilon is fixed at 1e-12; this model "
                               f"has layer_norm_eps={config.layer_norm_eps}")
        out = {theirs: fields[ours] for theirs, ours in _DISTILBERT_KEYS.items()}
        out.update(sinusoidal_pos_embds=False, qa_dropout=0.1, seq_classif_dropout=0.2)
    else:
        out = dict(fields)
        out["position_embedding_type"] = "absolute"
        if family in ("albert", "electra"):
            out["embedding_size"] = config.embedding_dim
        if family == "albert":
            out.update(num_hidden_groups=1, inner_group_num=1, classifier_dropout_prob=0.1)
        if family == "electra":  # ElectraForMultipleChoice's pooling: gelu(dense(first))
            out.update(summary_type="first", summary_use_proj=True, summary_activation="gelu",
                       summary_last_dropout=0.1)
        if family == "roberta":
            if config.position_offset != config.pad_token_id + 1:
                raise BertJaxError(f"RoBERTa positions start at pad_token_id + 1 = "
                                   f"{config.pad_token_id + 1}, but this model has "
                                   f"position_offset={config.position_offset}")
    if family != "roberta" and config.position_offset:
        raise BertJaxError(f"{family} has no position offset (position_offset="
                           f"{config.position_offset})")
    if family != "distilbert" and not config.use_token_types:
        raise BertJaxError(f"{family} has a token-type table; this model has none")
    if family != "albert" and config.share_layers:
        raise BertJaxError(f"{family} does not share layers (share_layers=True is ALBERT)")
    out.update(model_type=family, architectures=[architecture], tie_word_embeddings=True,
               **(task_fields or {}))
    return out


# ---- import ------------------------------------------------------------------------------------
class _FamilyNames(dict):
    """BERT name -> the family's name, for messages: the source's own name where it has the
    tensor, else the name it would have (a missing weight is named as the family spells it)."""

    def __init__(self, family: Family, known: dict[str, str]):
        super().__init__(known)
        self.family = family

    def get(self, key, default=None):
        if key in self:
            return self[key]
        return rename([key], self.family.rules, to_bert=False)[key]


def params_from_family_state(state: Mapping[str, Any], config: BertConfig,
                             source: str = "checkpoint"
                             ) -> tuple[dict[str, Any], hf.ConversionReport]:
    """A family's state dict -> bert-jax params and the conversion report (original names)."""
    family = FAMILIES[config.model_type]
    if not any(k.startswith(family.prefix) for k in state):  # the base model class
        state = {family.prefix + k: v for k, v in state.items()}
    names = rename(state, family.import_rules, to_bert=True)
    bert_state = {names[k]: np.asarray(v) for k, v in state.items()}
    original = _FamilyNames(family, {new: old for old, new in names.items()})
    rtd = {k: bert_state.pop(k) for k in list(bert_state) if k.startswith("rtd.")}
    if config.model_type == "electra" and f"{_MLM}.transform.dense.weight" in bert_state \
            and config.hidden_act != "gelu":
        raise BertJaxError(f"{source}: ELECTRA's generator head uses gelu but the encoder's "
                           f"hidden_act is {config.hidden_act!r}; bert-jax's MLM head uses "
                           "the encoder's activation")
    params, report = hf.params_from_hf_state(bert_state, config, source, names=original)
    if rtd:
        r = hf._StateReader(rtd, source, original, config.param_dtype)
        h = config.hidden_size
        params["rtd"] = {"dense": r.linear("rtd.dense", h, h, "rtd/dense"),
                         "prediction": r.linear("rtd.prediction", h, 1, "rtd/prediction")}
        report.heads.append("rtd")
        report.unused += sorted(original.get(k, k) for k in rtd if k not in r.used)
    if config.model_type == "albert" and "nsp" in params:
        report.heads[report.heads.index("nsp")] = "nsp (ALBERT sentence order)"
    report.notes = [n for n in report.notes if not n.startswith("no pooler")
                    or config.model_type in ("bert", "albert", "roberta")]
    return params, report


def read_family_tokenizer(directory: str, config: BertConfig):
    """The tokenizer a family's directory holds (None if none)."""
    vocab_json = storage.join(directory, BPE_VOCAB_FILE)
    merges = storage.join(directory, BPE_MERGES_FILE)
    if storage.exists(vocab_json) and storage.exists(merges):
        from bert_jax.tokenization.bpe import ByteLevelBPETokenizer

        return ByteLevelBPETokenizer.from_files(vocab_json, merges)
    spiece = storage.join(directory, SPIECE_FILE)
    if storage.exists(spiece):
        return _read_spiece_tokenizer(directory, spiece)
    return hf.read_hf_tokenizer(directory)


def _read_spiece_tokenizer(directory: str, spiece: str):
    """``spiece.model`` with AlbertTokenizer's normalisation: its defaults, or the
    ``do_lower_case`` / ``keep_accents`` / ``remove_space`` of ``tokenizer_config.json``."""
    from bert_jax.tokenization.sentencepiece import ALBERT_NORMALIZATION, SentencePieceTokenizer

    options = dict(ALBERT_NORMALIZATION)
    path = storage.join(directory, hf.TOKENIZER_CONFIG_FILE)
    if storage.exists(path):
        raw = hf._read_json(path)
        for key in ("do_lower_case", "keep_accents", "remove_space"):
            if raw.get(key) is not None:
                if not isinstance(raw[key], bool):
                    raise BertJaxError(f"{path}: {key} must be true or false, got {raw[key]!r}")
                options[key] = raw[key]
    return SentencePieceTokenizer(spiece, **options)


def load_hf_any(directory: str, **config_overrides: Any):
    """Loads a Hugging Face BERT, RoBERTa, ALBERT, ELECTRA or DistilBERT directory: the
    family comes from ``config.json``'s ``model_type``. Returns (params, config, tokenizer,
    report) as :func:`bert_jax.checkpoint.hf.load_hf`."""
    directory = os.fspath(directory)
    path = storage.join(directory, hf.HF_CONFIG_FILE)
    if not storage.isdir(directory):
        raise BertJaxError(f"{directory}: not a directory")
    if not storage.exists(path):
        raise BertJaxError(f"{directory}: {hf.HF_CONFIG_FILE} not found (not a Hugging Face "
                           "model directory)")
    raw = hf._read_json(path)
    directory = storage.localize(directory)  # safetensors and torch open files by name
    if raw.get("model_type", "bert") == "bert" or raw.get("format") == "bert_jax":
        return hf.load_hf(directory, **config_overrides)
    config = config_from_hf(raw, path, **config_overrides)
    state, weights_path = hf.read_hf_weights(directory)
    params, report = params_from_family_state(state, config, source=weights_path)
    report.architecture = ",".join(raw.get("architectures") or [])
    tokenizer = read_family_tokenizer(directory, config)
    if tokenizer is None:
        report.notes.append("no tokenizer files: the checkpoint has no tokenizer")
    elif tokenizer.vocab_size != config.vocab_size:
        report.notes.append(f"the tokenizer has {tokenizer.vocab_size} tokens but the model has "
                            f"vocab_size={config.vocab_size}")
    return params, config, tokenizer, report


# ---- export ------------------------------------------------------------------------------------
def detect_family_architecture(params: Mapping[str, Any], family: str,
                               kind: str | None = None) -> str:
    """The family's class whose weights ``params`` fills best: a fine-tuned checkpoint's task
    class (from the task ``kind`` where known, else from its head), else the pretraining
    class with the most of its heads."""
    suffix = hf.detect_task_class(params, kind)
    if suffix is not None:
        return CLASS_PREFIXES[family] + suffix
    if family == "bert":
        return hf.detect_architecture(params)
    choices = FAMILIES[family].architectures
    for arch, spec in sorted(choices.items(), key=lambda kv: -len(kv[1].heads)):
        if spec.heads and all(h in params for h in spec.heads):
            return arch
    return next(iter(choices))


def params_to_family_state(params: Mapping[str, Any], config: BertConfig, family: str,
                           architecture: str) -> tuple[dict[str, np.ndarray], list[str]]:
    """bert-jax params -> (the family's state dict for ``architecture``, params not exported)."""
    fam = FAMILIES[family]
    if architecture not in fam.architectures:
        raise BertJaxError(f"{architecture} is not a {family} class; choose one of "
                           f"{sorted(fam.architectures)}")
    spec = fam.architectures[architecture]
    bert_heads = tuple(h for h in spec.heads if h != "rtd")
    missing = [h for h in spec.heads if h not in params]
    if missing:
        raise BertJaxError(f"{architecture} needs the {missing} head(s), which this checkpoint "
                           f"does not have (it has {sorted(params)})")
    state, dropped = hf.bert_named_state(params, config, architecture, "bert.", spec.pooler,
                                         bert_heads, POOLER_ACTIVATIONS[family])
    if "rtd" in spec.heads:
        for name in ("dense", "prediction"):
            state[f"rtd.{name}.weight"] = np.asarray(params["rtd"][name]["kernel"]).T
            state[f"rtd.{name}.bias"] = np.asarray(params["rtd"][name]["bias"])
        dropped.remove("rtd")
    names = rename(state, fam.export_rules(architecture), to_bert=False)
    base = not spec.heads
    out = {}
    for key, value in state.items():
        name = names[key]
        if base:
            name = name.removeprefix(fam.prefix)
        out[name] = np.ascontiguousarray(value, dtype=np.float32)
    return out, dropped


def _write_bpe_tokenizer(tokenizer, directory: str, config: BertConfig) -> None:
    tokenizer.save_vocab_files(directory)
    tok_config = {"tokenizer_class": "RobertaTokenizer", "add_prefix_space": False,
                  "model_max_length": config.max_sequence_length, "errors": "replace",
                  **tokenizer.hf_special_tokens()}
    fileio.atomic_write_json(storage.join(directory, hf.TOKENIZER_CONFIG_FILE), tok_config,
                             sort_keys=False)


def export_hf_any(params: Mapping[str, Any], config: BertConfig, directory: str,
                  tokenizer=None, architecture: str | None = None, kind: str | None = None,
                  labels=()) -> hf.ConversionReport:
    """Writes a Hugging Face directory in the family the config belongs to (see
    :func:`export_family`): config.json, model.safetensors, and the tokenizer files.

    A fine-tuned checkpoint exports as the family's task class (``*ForSequenceClassification``,
    ``*ForTokenClassification``, ``*ForQuestionAnswering``, ``*ForMultipleChoice``): the one
    of the task ``kind`` where given, else the one its head fits; ``labels`` (the task's label
    names) become config.json's ``id2label`` / ``label2id``."""
    from safetensors.numpy import save

    family = export_family(config)
    if architecture is not None and ARCHITECTURE_FAMILY.get(architecture) != family:
        raise BertJaxError(f"--architecture {architecture} does not fit this {family} model; "
                           f"choose one of {sorted(_architectures(family))}")
    if family == "bert":
        return hf.export_hf(params, config, directory, tokenizer, architecture, kind=kind,
                            labels=labels)
    architecture = architecture or detect_family_architecture(params, family, kind)
    hf.check_task_head(params, architecture, kind)
    state, dropped = params_to_family_state(params, config, family, architecture)
    task_fields = hf.task_config_fields(params, architecture, kind, labels)
    storage.makedirs(directory)
    fileio.atomic_write(storage.join(directory, hf.SAFETENSORS_FILE),
                        save(state, metadata={"format": "pt"}))
    fileio.atomic_write_json(storage.join(directory, hf.HF_CONFIG_FILE),
                             config_to_hf(config, family, architecture, task_fields))
    report = hf.ConversionReport(source=directory, architecture=architecture,
                                 heads=list(FAMILIES[family].architectures[architecture].heads),
                                 unused=dropped,
                                 unused_label="NOT EXPORTED: parameters the class has no place for",
                                 files=[hf.SAFETENSORS_FILE, hf.HF_CONFIG_FILE])
    tokenizer_kind = getattr(tokenizer, "kind", None)
    if tokenizer is None:
        report.notes.append("no tokenizer in the checkpoint: no tokenizer files written")
    elif tokenizer_kind == "bpe":
        _write_bpe_tokenizer(tokenizer, directory, config)
        report.files += [BPE_VOCAB_FILE, BPE_MERGES_FILE, hf.TOKENIZER_CONFIG_FILE]
    elif tokenizer_kind == "sentencepiece":
        fileio.atomic_write(storage.join(directory, SPIECE_FILE),
                            storage.read_bytes(tokenizer.model_path))
        options = tokenizer.options()
        tok_config = {"tokenizer_class": "AlbertTokenizer" if family == "albert" else None,
                      "model_max_length": config.max_sequence_length,
                      "do_lower_case": options["do_lower_case"],
                      "keep_accents": options["keep_accents"],
                      "remove_space": options["remove_space"]}
        fileio.atomic_write_json(storage.join(directory, hf.TOKENIZER_CONFIG_FILE),
                                 {k: v for k, v in tok_config.items() if v is not None},
                                 sort_keys=False)
        report.files += [SPIECE_FILE, hf.TOKENIZER_CONFIG_FILE]
    else:
        written = hf._write_tokenizer(tokenizer, directory, config,
                                      f"{CLASS_PREFIXES[family]}Tokenizer")
        if not written:
            report.notes.append(f"tokenizer of kind {tokenizer_kind!r} not exported (Hugging "
                                "Face has no tokenizer class for it)")
        report.files += written
    return report


def _architectures(family: str) -> list[str]:
    return [a for a, f in ARCHITECTURE_FAMILY.items() if f == family]
