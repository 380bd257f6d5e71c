"""Hugging Face BERT checkpoints <-> bert-jax parameters.

Import reads a directory with ``config.json`` and ``model.safetensors`` (or a sharded
``model.safetensors.index.json``, or ``pytorch_model.bin`` read with
``torch.load(weights_only=True)``, never a full unpickle) written by BertModel,
BertForPreTraining, BertForMaskedLM or a task-head class, with or without the ``bert.`` prefix.
Export writes ``config.json`` + ``model.safetensors`` (+ ``vocab.txt`` for WordPiece) that
``transformers`` loads with no missing or unexpected keys.

Layout differences handled here: torch ``Linear`` weights are ``[out, in]`` (bert-jax kernels
``[in, out]``); query/key/value fuse into one ``qkv`` kernel ``[hidden, 3, heads, head_dim]``;
the attention output kernel is ``[heads, head_dim, hidden]``; LayerNorm ``weight``/``bias``
(or the old ``gamma``/``beta``) become ``scale``/``bias``; vocabulary rows are padded with zeros
to ``config.padded_vocab_size``; the MLM decoder is tied to the word embeddings.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from bert_jax import fileio, storage
from bert_jax.config import BertConfig
from bert_jax.errors import BertJaxError

HF_CONFIG_FILE = "config.json"
SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
TORCH_FILE = "pytorch_model.bin"
TORCH_INDEX = "pytorch_model.bin.index.json"
VOCAB_FILE = "vocab.txt"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"

# Non-persistent buffers that older checkpoints carry; they are not parameters.
_BUFFER_SUFFIXES = ("embeddings.position_ids", "embeddings.token_type_ids")

# Which bert-jax parts each exportable Hugging Face class holds: (prefix, pooler, heads).
ARCHITECTURES: dict[str, tuple[str, bool, tuple[str, ...]]] = {
    "BertForPreTraining": ("bert.", True, ("mlm", "nsp")),
    "BertForMaskedLM": ("bert.", False, ("mlm",)),
    "BertModel": ("", True, ()),
    "BertForSequenceClassification": ("bert.", True, ("classifier",)),
    "BertForMultipleChoice": ("bert.", True, ("classifier",)),
    "BertForTokenClassification": ("bert.", False, ("classifier",)),
    "BertForQuestionAnswering": ("bert.", False, ("qa_outputs",)),
}


@dataclasses.dataclass
class ConversionReport:
    """What a conversion used, skipped on purpose, and left over (nothing is lost silently)."""

    source: str
    architecture: str = ""
    heads: list[str] = dataclasses.field(default_factory=list)
    unused: list[str] = dataclasses.field(default_factory=list)  # source tensors not used
    ignored: list[str] = dataclasses.field(default_factory=list)  # buffers, optimizer slots
    notes: list[str] = dataclasses.field(default_factory=list)
    unused_label: str = "UNUSED: source tensors not converted"
    output: str = ""  # the directory written (export)
    files: list[str] = dataclasses.field(default_factory=list)  # the files written (export)

    def check_tokenizer(self, tokenizer, config: BertConfig) -> None:
        """Notes a missing tokenizer or one whose size differs from the model's vocabulary."""
        if tokenizer is None:
            self.notes.append(f"no {VOCAB_FILE}: the checkpoint has no tokenizer")
        elif tokenizer.vocab_size != config.vocab_size:
            self.notes.append(f"{VOCAB_FILE} has {tokenizer.vocab_size} tokens but the model "
                              f"has vocab_size={config.vocab_size}")

    def lines(self) -> list[str]:
        out = [f"source: {self.source}"]
        if self.output:
            out.append(f"output: {self.output}" + (f" ({', '.join(self.files)})"
                                                    if self.files else ""))
        if self.architecture:
            out.append(f"architecture: {self.architecture}")
        out.append(f"heads: {', '.join(self.heads) if self.heads else '(encoder only)'}")
        if self.ignored:
            out.append(f"ignored ({len(self.ignored)} non-parameter tensors): "
                       + _summarize(self.ignored))
        if self.unused:
            out.append(f"{self.unused_label} ({len(self.unused)}):")
            out += [f"  {name}" for name in self.unused]
        out += [f"note: {n}" for n in self.notes]
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())


def _summarize(names: list[str]) -> str:
    """Counts by last name component: 'adam_m x44, adam_v x44, global_step x1'."""
    counts = collections.Counter(re.split(r"[./]", name)[-1] for name in names)
    return ", ".join(f"{kind} x{n}" for kind, n in sorted(counts.items()))


# ---- Hugging Face state dict -> bert-jax params -----------------------------------------------
class _StateReader:
    """Hands out source tensors by name, checking shapes and remembering what was used."""

    def __init__(self, state: Mapping[str, Any], source: str, names: Mapping[str, str] | None,
                 dtype: str):
        self.state = state
        self.source = source
        self.names = names or {}
        self.dtype = dtype
        self.used: set[str] = set()

    def name(self, key: str) -> str:
        return self.names.get(key, key)

    def has(self, key: str) -> bool:
        return key in self.state

    def take(self, key: str, shape: tuple[int, ...], target: str) -> np.ndarray:
        if key not in self.state:
            raise BertJaxError(f"{self.source}: weight {self.name(key)!r} not found (needed for "
                               f"bert-jax parameter {target}, shape {shape})")
        value = np.asarray(self.state[key])
        if value.shape != tuple(shape):
            raise BertJaxError(f"{self.source}: {self.name(key)} has shape {value.shape} but "
                               f"bert-jax parameter {target} needs {tuple(shape)} (check "
                               "config.json against the weights)")
        self.used.add(key)
        return value.astype(self.dtype)

    def linear(self, key: str, n_in: int, n_out: int, target: str) -> dict[str, np.ndarray]:
        """torch Linear ``key.weight`` [out, in] / ``key.bias`` -> kernel [in, out] / bias."""
        return {"kernel": self.take(f"{key}.weight", (n_out, n_in), f"{target}/kernel").T,
                "bias": self.take(f"{key}.bias", (n_out,), f"{target}/bias")}

    def norm(self, key: str, width: int, target: str) -> dict[str, np.ndarray]:
        return {"scale": self.take(f"{key}.weight", (width,), f"{target}/scale"),
                "bias": self.take(f"{key}.bias", (width,), f"{target}/bias")}


def _pad_rows(table: np.ndarray, rows: int) -> np.ndarray:
    """Zero rows appended up to the padded vocabulary size (never predicted: masked logits)."""
    pad = [(0, rows - table.shape[0])] + [(0, 0)] * (table.ndim - 1)
    return np.pad(table, pad)


def _normalize_key(key: str) -> str:
    """Old checkpoints name LayerNorm parameters gamma/beta."""
    if key.endswith("LayerNorm.gamma"):
        return key[: -len("gamma")] + "weight"
    if key.endswith("LayerNorm.beta"):
        return key[: -len("beta")] + "bias"
    return key


def _layer_params(r: _StateReader, key: str, cfg: BertConfig, target: str) -> dict[str, Any]:
    h, n, d, i = cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim, cfg.intermediate_size
    q, k, v = (r.linear(f"{key}.attention.self.{name}", h, h, f"{target}/attention/qkv")
               for name in ("query", "key", "value"))
    out = r.linear(f"{key}.attention.output.dense", h, h, f"{target}/attention/out")
    return {
        "attention": {
            # [hidden, 3, heads, head_dim] and [3, heads, head_dim]
            "qkv": {"kernel": np.stack([p["kernel"].reshape(h, n, d) for p in (q, k, v)], 1),
                    "bias": np.stack([p["bias"].reshape(n, d) for p in (q, k, v)])},
            # [heads, head_dim, hidden]
            "out": {"kernel": out["kernel"].reshape(n, d, h), "bias": out["bias"]},
        },
        "attention_norm": r.norm(f"{key}.attention.output.LayerNorm", h,
                                 f"{target}/attention_norm"),
        "mlp_in": r.linear(f"{key}.intermediate.dense", h, i, f"{target}/mlp_in"),
        "mlp_out": r.linear(f"{key}.output.dense", i, h, f"{target}/mlp_out"),
        "output_norm": r.norm(f"{key}.output.LayerNorm", h, f"{target}/output_norm"),
    }


def _encoder_params(r: _StateReader, p: str, cfg: BertConfig) -> dict[str, Any]:
    e, h, v = cfg.embedding_dim, cfg.hidden_size, cfg.vocab_size
    emb = "bert/embeddings"
    embeddings = {
        "word_embeddings": {"embedding": _pad_rows(
            r.take(f"{p}embeddings.word_embeddings.weight", (v, e),
                   f"{emb}/word_embeddings/embedding"), cfg.padded_vocab_size)},
        "position_embeddings": {"embedding": r.take(
            f"{p}embeddings.position_embeddings.weight", (cfg.max_position_embeddings, e),
            f"{emb}/position_embeddings/embedding")},
        "LayerNorm": r.norm(f"{p}embeddings.LayerNorm", e, f"{emb}/LayerNorm"),
    }
    if cfg.use_token_types:
        embeddings["token_type_embeddings"] = {"embedding": r.take(
            f"{p}embeddings.token_type_embeddings.weight", (cfg.type_vocab_size, e),
            f"{emb}/token_type_embeddings/embedding")}
    if e != h:  # factorized embeddings (ALBERT, ELECTRA): projection to hidden_size
        embeddings["embedding_projection"] = r.linear(
            f"{p}embeddings.embedding_projection", e, h, f"{emb}/embedding_projection")
    if cfg.share_layers:  # one layer applied at every depth (ALBERT)
        encoder = {"layer": _layer_params(r, f"{p}encoder.layer.0", cfg, "bert/encoder/layer")}
    else:
        encoder = {f"layer_{i}": _layer_params(r, f"{p}encoder.layer.{i}", cfg,
                                               f"bert/encoder/layer_{i}")
                   for i in range(cfg.num_hidden_layers)}
    bert = {"embeddings": embeddings, "encoder": encoder}
    if r.has(f"{p}pooler.dense.weight"):
        bert["pooler"] = r.linear(f"{p}pooler.dense", h, h, "bert/pooler")
    return bert


def _mlm_params(r: _StateReader, cfg: BertConfig, word_table: np.ndarray) -> dict[str, Any]:
    e, h, v = cfg.embedding_dim, cfg.hidden_size, cfg.vocab_size
    bias_key = "cls.predictions.bias"
    if not r.has(bias_key):
        bias_key = "cls.predictions.decoder.bias"
    mlm = {
        "transform": r.linear("cls.predictions.transform.dense", h, e, "mlm/transform"),
        "transform_norm": r.norm("cls.predictions.transform.LayerNorm", e, "mlm/transform_norm"),
        "bias": _pad_rows(r.take(bias_key, (v,), "mlm/bias"), cfg.padded_vocab_size),
    }
    # Older checkpoints also store the (tied) decoder; it must equal the word embeddings.
    for key, tied in (("cls.predictions.decoder.weight", word_table[:v]),
                      ("cls.predictions.decoder.bias", mlm["bias"][:v])):
        if r.has(key) and key not in r.used:
            value = r.take(key, tied.shape, "mlm (tied decoder)")
            if not np.array_equal(value, tied):
                raise BertJaxError(f"{r.source}: {r.name(key)} differs from the weights it is "
                                   "tied to in BERT; an untied MLM decoder is not supported")
    return mlm


def _classifier_params(r: _StateReader, key: str, cfg: BertConfig, target: str
                       ) -> dict[str, Any]:
    shape = np.shape(r.state[f"{key}.weight"])
    labels = shape[0] if len(shape) == 2 else -1
    return r.linear(key, cfg.hidden_size, labels, target)


def params_from_hf_state(state: Mapping[str, Any], config: BertConfig, source: str = "checkpoint",
                         names: Mapping[str, str] | None = None
                         ) -> tuple[dict[str, Any], ConversionReport]:
    """A Hugging Face BERT state dict (numpy arrays) -> bert-jax params (unrolled layout).

    ``names`` maps state keys to the names to show in messages (the original TF names when
    the state comes from a Google checkpoint). Heads present in the state (MLM, NSP,
    classifier, QA) are converted; every other tensor is reported as unused.
    """
    state = {_normalize_key(k): v for k, v in state.items()}
    if names and any(_normalize_key(k) != k for k in names):
        names = {_normalize_key(k): v for k, v in names.items()}
    r = _StateReader(state, source, names, config.param_dtype)
    prefix = "bert." if any(k.startswith("bert.") for k in state) else ""
    params: dict[str, Any] = {"bert": _encoder_params(r, prefix, config)}
    heads = []
    if any(k.startswith("cls.predictions.") for k in state):
        word_table = params["bert"]["embeddings"]["word_embeddings"]["embedding"]
        params["mlm"] = _mlm_params(r, config, word_table)
        heads.append("mlm")
    if r.has("cls.seq_relationship.weight"):
        nsp = r.linear("cls.seq_relationship", config.hidden_size, 2, "nsp/dense")
        params["nsp"] = {"dense": nsp}
        heads.append("nsp")
    if r.has("classifier.weight"):
        params["classifier"] = _classifier_params(r, "classifier", config, "classifier")
        heads.append(f"classifier ({params['classifier']['bias'].shape[0]} labels)")
    if r.has("qa_outputs.weight"):
        params["qa_outputs"] = r.linear("qa_outputs", config.hidden_size, 2, "qa_outputs")
        heads.append("qa_outputs")
    ignored = sorted(r.name(k) for k in state if k.endswith(_BUFFER_SUFFIXES))
    unused = sorted(r.name(k) for k in state
                    if k not in r.used and not k.endswith(_BUFFER_SUFFIXES))
    report = ConversionReport(source=source, heads=heads, unused=unused, ignored=ignored)
    if "pooler" not in params["bert"]:
        report.notes.append("no pooler weights (the pooler is initialised fresh where needed)")
    from bert_jax.modeling.params import to_layout  # jax: only when converting

    return to_layout(params, config), report


# ---- reading a Hugging Face directory ---------------------------------------------------------
def _read_json(path: str) -> dict[str, Any]:
    from bert_jax.textio import read_text

    try:
        data = json.loads(read_text(path))
    except json.JSONDecodeError as e:
        raise BertJaxError(f"{path}: not valid JSON (line {e.lineno}: {e.msg})") from None
    if not isinstance(data, dict):
        raise BertJaxError(f"{path}: expected a JSON object")
    return data


def _load_safetensors(path: str) -> dict[str, np.ndarray]:
    try:
        return _read_safetensors(path)
    except BertJaxError:
        raise
    except Exception as e:  # SafetensorError: truncated header or data, not safetensors
        detail = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise BertJaxError(f"{path}: not a readable safetensors file ({detail[:200]}); it is "
                           "damaged or truncated") from None


def _read_safetensors(path: str) -> dict[str, np.ndarray]:
    from safetensors import safe_open

    out, half = {}, []
    with safe_open(path, framework="numpy") as f:
        for key in f.keys():
            try:
                out[key] = f.get_tensor(key)
            except TypeError:  # bfloat16: numpy has no such dtype
                half.append(key)
    if half:  # the flax backend reads bfloat16 (as ml_dtypes arrays); keep them on the host
        import jax

        with jax.default_device(jax.devices("cpu")[0]), safe_open(path, framework="flax") as f:
            out.update({key: np.asarray(f.get_tensor(key)) for key in half})
    return out


def _load_torch(path: str) -> dict[str, np.ndarray]:
    try:
        import torch
    except ImportError:
        raise BertJaxError(f"{path}: reading pytorch_model.bin needs PyTorch (pip install torch), "
                           "or convert the checkpoint to model.safetensors") from None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # weights_only refuses arbitrary pickled objects
        raise BertJaxError(f"{path}: cannot be read safely with torch.load(weights_only=True): "
                           f"{e}") from None
    if not isinstance(state, Mapping):
        raise BertJaxError(f"{path}: expected a state dict, got {type(state).__name__}")
    return {k: v.detach().float().numpy() if v.dtype == torch.bfloat16 else v.detach().numpy()
            for k, v in state.items() if isinstance(v, torch.Tensor)}


def read_hf_weights(directory: str) -> tuple[dict[str, np.ndarray], str]:
    """All tensors of a Hugging Face model directory (single file or sharded). Returns
    (state, weights file or index read)."""
    for index_name, loader in ((SAFETENSORS_INDEX, _load_safetensors),
                               (TORCH_INDEX, _load_torch)):
        index_path = storage.join(directory, index_name)
        if storage.exists(index_path):
            shards = sorted(set(_read_json(index_path).get("weight_map", {}).values()))
            if not shards:
                raise BertJaxError(f"{index_path}: no weight_map entries")
            state = {}
            for shard in shards:
                shard_path = storage.join(directory, shard)
                if not storage.exists(shard_path):
                    raise BertJaxError(f"{index_path}: shard {shard} not found")
                state.update(loader(shard_path))
            return state, index_path
    for name, loader in ((SAFETENSORS_FILE, _load_safetensors), (TORCH_FILE, _load_torch)):
        path = storage.join(directory, name)
        if storage.exists(path):
            return loader(path), path
    raise BertJaxError(f"{directory}: no weights found (expected {SAFETENSORS_FILE}, "
                       f"{SAFETENSORS_INDEX} or {TORCH_FILE})")


def read_hf_config(directory: str, **overrides: Any) -> tuple[BertConfig, dict[str, Any]]:
    """config.json of a Hugging Face BERT directory -> (BertConfig, raw dict)."""
    path = storage.join(directory, HF_CONFIG_FILE)
    if not storage.exists(path):
        raise BertJaxError(f"{directory}: {HF_CONFIG_FILE} not found (not a Hugging Face model "
                           "directory)")
    raw = _read_json(path)
    if raw.get("format") == "bert_jax":
        raise BertJaxError(f"{path}: this is already a bert-jax checkpoint")
    if "model_type" in raw and raw["model_type"] != "bert":
        raise BertJaxError(f"{path}: model_type {raw['model_type']!r} is not supported "
                           "(expected 'bert')")
    return BertConfig.from_external_dict(raw, source=path, **overrides), raw


def read_hf_tokenizer(directory: str):
    """WordPiece tokenizer from vocab.txt (+ tokenizer_config.json casing), or None."""
    from bert_jax.tokenization.wordpiece import WordPieceTokenizer

    vocab = storage.join(directory, VOCAB_FILE)
    if not storage.exists(vocab):
        return None
    options = {}
    tok_config = storage.join(directory, TOKENIZER_CONFIG_FILE)
    if storage.exists(tok_config):
        raw = _read_json(tok_config)
        for key in ("do_lower_case", "strip_accents", "tokenize_chinese_chars"):
            if raw.get(key) is not None:
                options[key] = raw[key]
    return WordPieceTokenizer.from_vocab_file(vocab, **options)


def load_hf(directory: str, **config_overrides: Any):
    """Loads a Hugging Face BERT directory.

    Returns ``(params, config, tokenizer-or-None, report)``; params are numpy arrays in the
    layout ``config`` builds (``scan_layers=True`` in the overrides stacks the layers).
    """
    directory = os.fspath(directory)
    if not storage.isdir(directory):
        raise BertJaxError(f"{directory}: not a directory")
    directory = storage.localize(directory)  # safetensors and torch open files by name
    config, raw = read_hf_config(directory, **config_overrides)
    state, weights_path = read_hf_weights(directory)
    params, report = params_from_hf_state(state, config, source=weights_path)
    report.architecture = ",".join(raw.get("architectures") or [])
    tokenizer = read_hf_tokenizer(directory)
    report.check_tokenizer(tokenizer, config)
    return params, config, tokenizer, report


# ---- bert-jax params -> Hugging Face ------------------------------------------------------------
def _linear_out(p: Mapping[str, Any], key: str, state: dict[str, np.ndarray]) -> None:
    state[f"{key}.weight"] = np.asarray(p["kernel"]).T
    state[f"{key}.bias"] = np.asarray(p["bias"])


def _norm_out(p: Mapping[str, Any], key: str, state: dict[str, np.ndarray]) -> None:
    state[f"{key}.weight"] = np.asarray(p["scale"])
    state[f"{key}.bias"] = np.asarray(p["bias"])


def detect_architecture(params: Mapping[str, Any]) -> str:
    """The Hugging Face class whose weights ``params`` fills best."""
    if "mlm" in params:
        return "BertForPreTraining" if "nsp" in params else "BertForMaskedLM"
    if "qa_outputs" in params:
        return "BertForQuestionAnswering"
    if "classifier" in params:
        has_pooler = "pooler" in params["bert"]
        return "BertForSequenceClassification" if has_pooler else "BertForTokenClassification"
    return "BertModel"


def params_to_hf_state(params: Mapping[str, Any], config: BertConfig, architecture: str
                       ) -> tuple[dict[str, np.ndarray], list[str]]:
    """bert-jax params (any layer layout) -> (HF state dict, param paths not exported)."""
    if architecture not in ARCHITECTURES:
        raise BertJaxError(f"unknown Hugging Face architecture {architecture!r}; choose one of "
                           f"{sorted(ARCHITECTURES)}")
    if (config.share_layers or config.embedding_dim != config.hidden_size
            or config.position_offset or not config.use_token_types):
        raise BertJaxError("ALBERT-style (shared layers / factorized embeddings), RoBERTa "
                           "(position offset) or DistilBERT (no token types) parameters have "
                           "no Hugging Face BERT class; `bert-jax export` writes them as "
                           "their own family (bert_jax.checkpoint.families)")
    return bert_named_state(params, config, architecture, *ARCHITECTURES[architecture])


def bert_named_state(params: Mapping[str, Any], config: BertConfig, architecture: str,
                     prefix: str, with_pooler: bool, heads: tuple[str, ...],
                     pooler_activation: str = "tanh"
                     ) -> tuple[dict[str, np.ndarray], list[str]]:
    """bert-jax params -> a state dict in BERT's names (the other families rename it);
    shared layers export as layer 0, factorized embeddings add
    ``embeddings.embedding_projection``. ``pooler_activation``: what the class applies after
    the pooler (or the head's dense layer that takes its place)."""
    missing = [h for h in heads if h not in params]
    if missing:
        raise BertJaxError(f"{architecture} needs the {missing} head(s), which this checkpoint "
                           f"does not have (it has {sorted(params)})")
    from bert_jax.modeling.params import to_layout  # jax: only when converting

    params = to_layout(dict(params), config.replace(scan_layers=False))
    bert, v = params["bert"], config.vocab_size
    n, d, h = config.num_attention_heads, config.head_dim, config.hidden_size
    state: dict[str, np.ndarray] = {}
    emb, p = bert["embeddings"], f"{prefix}embeddings"
    state[f"{p}.word_embeddings.weight"] = np.asarray(emb["word_embeddings"]["embedding"])[:v]
    for name in ("position_embeddings", "token_type_embeddings"):
        if name in emb:
            state[f"{p}.{name}.weight"] = np.asarray(emb[name]["embedding"])
    _norm_out(emb["LayerNorm"], f"{p}.LayerNorm", state)
    if "embedding_projection" in emb:
        _linear_out(emb["embedding_projection"], f"{p}.embedding_projection", state)
    layers = ([bert["encoder"]["layer"]] if config.share_layers else
              [bert["encoder"][f"layer_{i}"] for i in range(config.num_hidden_layers)])
    for i, layer in enumerate(layers):
        p = f"{prefix}encoder.layer.{i}"
        qkv = layer["attention"]["qkv"]
        kernel, bias = np.asarray(qkv["kernel"]), np.asarray(qkv["bias"])
        for j, name in enumerate(("query", "key", "value")):
            state[f"{p}.attention.self.{name}.weight"] = kernel[:, j].reshape(h, n * d).T
            state[f"{p}.attention.self.{name}.bias"] = bias[j].reshape(n * d)
        out = layer["attention"]["out"]
        state[f"{p}.attention.output.dense.weight"] = np.asarray(out["kernel"]).reshape(n * d, h).T
        state[f"{p}.attention.output.dense.bias"] = np.asarray(out["bias"])
        _norm_out(layer["attention_norm"], f"{p}.attention.output.LayerNorm", state)
        _linear_out(layer["mlp_in"], f"{p}.intermediate.dense", state)
        _linear_out(layer["mlp_out"], f"{p}.output.dense", state)
        _norm_out(layer["output_norm"], f"{p}.output.LayerNorm", state)
    dropped = []
    if "pooler" in bert:
        if with_pooler and config.pooler_activation != pooler_activation:
            raise BertJaxError(f"{architecture}'s pooler applies {pooler_activation}; this "
                               f"model's pooler applies {config.pooler_activation} "
                               "(pooler_activation)")
        if with_pooler:
            _linear_out(bert["pooler"], f"{prefix}pooler.dense", state)
        else:
            dropped.append("bert/pooler")
    if "mlm" in heads:
        mlm = params["mlm"]
        _linear_out(mlm["transform"], "cls.predictions.transform.dense", state)
        _norm_out(mlm["transform_norm"], "cls.predictions.transform.LayerNorm", state)
        state["cls.predictions.bias"] = np.asarray(mlm["bias"])[:v]
    if "nsp" in heads:
        _linear_out(params["nsp"]["dense"], "cls.seq_relationship", state)
    for head in ("classifier", "qa_outputs"):
        if head in heads:
            _linear_out(params[head], head, state)
    dropped += sorted(k for k in params if k != "bert" and k not in heads)
    state = {k: np.ascontiguousarray(a, dtype=np.float32) for k, a in state.items()}
    return state, dropped


def hf_config_dict(config: BertConfig, architecture: str,
                   task_fields: Mapping[str, Any] | None = None) -> dict[str, Any]:
    out = config.to_hf_dict()
    out.update(architectures=[architecture], tie_word_embeddings=True, **(task_fields or {}))
    return out


# ---- fine-tuned task heads ----------------------------------------------------------------------
SEQUENCE_CLASS, TOKEN_CLASS = "ForSequenceClassification", "ForTokenClassification"
QA_CLASS, CHOICE_CLASS = "ForQuestionAnswering", "ForMultipleChoice"
# A fine-tuning task's kind (bert_jax.tasks) -> the suffix of the class holding its head, the
# same in every family (BertForTokenClassification, RobertaForTokenClassification...).
TASK_CLASS_SUFFIX = {"classification": SEQUENCE_CLASS, "regression": SEQUENCE_CLASS,
                     "token_classification": TOKEN_CLASS, "span": QA_CLASS,
                     "multiple_choice": CHOICE_CLASS}
# Heads of the feature-based models (modeling/feature_heads.py): no Hugging Face class has them.
FEATURE_HEADS = ("feature_mix", "bilstm")


def task_class_suffix(architecture: str) -> str | None:
    """The task suffix of a class name (``ForTokenClassification``), None for other classes."""
    return next((s for s in (SEQUENCE_CLASS, TOKEN_CLASS, QA_CLASS, CHOICE_CLASS)
                 if architecture.endswith(s)), None)


def detect_task_class(params: Mapping[str, Any], kind: str | None = None) -> str | None:
    """The task suffix for a checkpoint with a task head: from the fine-tuning ``kind`` where
    known, else from the heads (``qa_outputs``; a classifier on the pooled first token, which
    needs a pooler, or on every token). None without a task head."""
    if kind is not None:
        if kind not in TASK_CLASS_SUFFIX:
            raise BertJaxError(f"a {kind!r} task has no Hugging Face class; exportable kinds: "
                               f"{', '.join(TASK_CLASS_SUFFIX)}")
        return TASK_CLASS_SUFFIX[kind]
    if "qa_outputs" in params:
        return QA_CLASS
    if "classifier" in params:
        return SEQUENCE_CLASS if "pooler" in params["bert"] else TOKEN_CLASS
    return None


def check_task_head(params: Mapping[str, Any], architecture: str, kind: str | None = None
                    ) -> None:
    """One clear error when a task class does not fit the checkpoint's head: another task
    kind, a feature-based head, a pooled head without a pooler (or, where the task is not
    known, the reverse), or a multiple-choice classifier with more than one output."""
    suffix = task_class_suffix(architecture)
    if suffix is None:
        return
    name = architecture.removesuffix(suffix)
    features = [h for h in FEATURE_HEADS if h in params]
    if features:
        raise BertJaxError(f"this checkpoint's head reads combined hidden states ({features}: "
                           "feature_layers / feature_head), which no Hugging Face class has; "
                           "fine-tune with feature_layers=last and feature_head=linear to export")
    if kind is not None and TASK_CLASS_SUFFIX.get(kind) != suffix:
        fits = f"; choose {name}{TASK_CLASS_SUFFIX[kind]}" if kind in TASK_CLASS_SUFFIX else ""
        raise BertJaxError(f"{architecture} does not fit this checkpoint: its head is for a "
                           f"{kind} task{fits}")
    head = "qa_outputs" if suffix == QA_CLASS else "classifier"
    if head not in params:
        raise BertJaxError(f"{architecture} needs the [{head!r}] head, which this checkpoint "
                           f"does not have (it has {sorted(params)})")
    pooled = suffix in (SEQUENCE_CLASS, CHOICE_CLASS)
    if pooled and "pooler" not in params["bert"]:
        raise BertJaxError(f"{architecture} classifies the pooled first token, but this "
                           "checkpoint has no pooler: its classifier reads every token; choose "
                           f"{name}{TOKEN_CLASS}")
    if suffix == TOKEN_CLASS and kind is None and "pooler" in params["bert"]:
        raise BertJaxError(f"{architecture} classifies every token, but this checkpoint's "
                           "classifier reads the pooled first token (it has a pooler); choose "
                           f"{name}{SEQUENCE_CLASS} or {name}{CHOICE_CLASS}")
    width = np.shape(params[head]["bias"])[-1]
    if suffix == CHOICE_CLASS and width != 1:
        raise BertJaxError(f"{architecture} scores each choice with one output; this "
                           f"classifier has {width}: choose {name}{SEQUENCE_CLASS}")


def task_config_fields(params: Mapping[str, Any], architecture: str, kind: str | None = None,
                       labels=()) -> dict[str, Any]:
    """config.json's label fields of a classifier class: ``id2label`` / ``label2id`` from the
    task's ``labels`` (``LABEL_i`` where the checkpoint does not know them) and
    ``problem_type`` where the task kind is known. Empty for the other classes."""
    suffix = task_class_suffix(architecture)
    if suffix not in (SEQUENCE_CLASS, TOKEN_CLASS):
        return {}
    width = int(np.shape(params["classifier"]["bias"])[-1])
    labels = [str(label) for label in labels or ()]
    if labels and len(labels) != width:
        raise BertJaxError(f"the task has {len(labels)} labels {labels} but the classifier has "
                           f"{width} outputs")
    names = labels or [f"LABEL_{i}" for i in range(width)]
    out: dict[str, Any] = {"id2label": {str(i): n for i, n in enumerate(names)},
                           "label2id": {n: i for i, n in enumerate(names)}}
    if suffix == SEQUENCE_CLASS and kind in ("classification", "regression"):
        out["problem_type"] = ("regression" if kind == "regression"
                               else "single_label_classification")
    return out


SPM_FILE = "spiece.model"  # the name AlbertTokenizer / T5Tokenizer look for


def _write_tokenizer(tokenizer, directory: str, config: BertConfig,
                     wordpiece_class: str = "BertTokenizer") -> list[str]:
    """The tokenizer in a form ``transformers.AutoTokenizer`` loads; returns the files written
    (none for a kind Hugging Face cannot load).

    WordPiece: vocab.txt + tokenizer_config.json (``wordpiece_class``: BertTokenizer, or the
    family's own, whose model inputs match the family's: DistilBertTokenizer gives no
    token_type_ids). SentencePiece: the model as
    spiece.model + tokenizer_config.json naming AlbertTokenizer (the SentencePiece tokenizer
    of a BERT-style model: [CLS] x [SEP] framing, [MASK]) with the tokenizer's own
    lower-casing and accent options, so it encodes text exactly as bert-jax does."""
    specials = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]",
                "cls_token": "[CLS]", "mask_token": "[MASK]"}
    kind = getattr(tokenizer, "kind", None)
    if kind == "wordpiece":
        fileio.atomic_write(storage.join(directory, VOCAB_FILE), "".join(
            tokenizer.id_to_token(i) + "\n" for i in range(tokenizer.vocab_size)))
        options = tokenizer.options()
        tok_config = {
            "tokenizer_class": wordpiece_class, "do_lower_case": options["do_lower_case"],
            "strip_accents": options["strip_accents"],
            "tokenize_chinese_chars": options["tokenize_chinese_chars"], **specials}
        written = [VOCAB_FILE]
    elif kind == "sentencepiece":
        fileio.atomic_write(storage.join(directory, SPM_FILE),
                            storage.read_bytes(tokenizer.model_path))
        options = tokenizer.options()
        tok_config = {"tokenizer_class": "AlbertTokenizer",
                      "do_lower_case": options["do_lower_case"],
                      "keep_accents": options["keep_accents"], "remove_space": True,
                      "bos_token": "[CLS]",
                      "eos_token": "[SEP]", **specials}
        written = [SPM_FILE]
    else:
        return []
    tok_config["model_max_length"] = config.max_position_embeddings
    fileio.atomic_write_json(storage.join(directory, TOKENIZER_CONFIG_FILE), tok_config,
                             sort_keys=False)
    return [*written, TOKENIZER_CONFIG_FILE]



def export_hf(params: Mapping[str, Any], config: BertConfig, directory: str, tokenizer=None,
              architecture: str | None = None, source: str = "", kind: str | None = None,
              labels=()) -> ConversionReport:
    """Writes a Hugging Face directory: config.json, model.safetensors (decoder tied, as
    transformers saves it) and the tokenizer in a form ``AutoTokenizer`` loads (WordPiece:
    vocab.txt; SentencePiece: spiece.model; each with tokenizer_config.json). Files are
    written with the mode the umask gives (0644 typically).

    ``architecture`` defaults to the class the params fill: the fine-tuning task's class where
    ``kind`` (the task kind) is given, else from the heads (BertForPreTraining when they have
    the MLM and NSP heads). ``labels``: the task's label names for config.json's
    ``id2label``. The report names the checkpoint read (``source``) and the directory and
    files written, and lists params not exported.
    """
    from safetensors.numpy import save

    chosen = architecture is not None
    if architecture is None:
        suffix = detect_task_class(params, kind)
        architecture = f"Bert{suffix}" if suffix else detect_architecture(params)
    check_task_head(params, architecture, kind)
    state, dropped = params_to_hf_state(params, config, architecture)
    notes = []
    pooler = [name for name in dropped if name.split("/")[:2] == ["bert", "pooler"]]
    if architecture == "BertForMaskedLM" and "nsp" not in params and pooler and not chosen:
        # A masked-LM-only run (make demo's) has a pooler its objective never trained.
        dropped = [name for name in dropped if name not in pooler]
        notes.append("BertForMaskedLM, because the checkpoint has a masked-LM head and no "
                     "next-sentence head (a masked-LM-only run such as make demo's; a run "
                     "with NSP exports BertForPreTraining). BertForMaskedLM has no pooler, "
                     "and this run's pooler was never trained (the masked-LM loss does not "
                     "reach it), so it is left out. Load it with AutoModelForMaskedLM; "
                     "BertForPreTraining would initialise a pooler and a next-sentence head "
                     "at random")
    task_fields = task_config_fields(params, architecture, kind, labels)
    storage.makedirs(directory)
    fileio.atomic_write(storage.join(directory, SAFETENSORS_FILE),
                        save(state, metadata={"format": "pt"}))
    fileio.atomic_write_json(storage.join(directory, HF_CONFIG_FILE),
                             hf_config_dict(config, architecture, task_fields))
    report = ConversionReport(source=source, architecture=architecture,
                              heads=list(ARCHITECTURES[architecture][2]), unused=dropped,
                              unused_label="NOT EXPORTED: parameters the class has no place for",
                              output=directory, files=[SAFETENSORS_FILE, HF_CONFIG_FILE],
                              notes=notes)
    if tokenizer is None:
        report.notes.append("no tokenizer in the checkpoint: none written (AutoTokenizer "
                            "will not load this directory)")
    else:
        written = _write_tokenizer(tokenizer, directory, config)
        if not written:
            report.notes.append(f"tokenizer of kind {getattr(tokenizer, 'kind', '?')!r} not "
                                "exported (Hugging Face has no tokenizer class for it)")
        report.files += written
    return report
