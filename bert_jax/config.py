"""Model configuration: a validated, frozen dataclass with presets (pure data, no jax).

Reads and writes Hugging Face ``config.json`` and Google's ``bert_config.json``.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from bert_jax import storage
from bert_jax.errors import BertJaxError

ATTENTION_IMPLS = ("xla", "cudnn", "splash", "auto")
# Attention while attention dropout is active (training): fused kernels above have no dropout.
DROPOUT_ATTENTION_IMPLS = ("explicit", "flash", "flash_tpu", "auto")
# Hidden-state dropout masks: hash (counter hash, recomputed in the backward pass) | prng
# (Flax nn.Dropout, threefry Bernoulli mask); bert_jax/kernels/dropout.py.
HIDDEN_DROPOUT_IMPLS = ("hash", "prng")
# The counter hash behind hash dropout masks, hidden and (flash kernel) attention: rowcol (a
# code per row and per column, one finalizer round per element) | flat (two rounds of the
# flat element index); bert_jax/kernels/dropout.py.
DROPOUT_HASHES = ("rowcol", "flat")
# The query/key/value projection: one matmul into [.., 3, heads, head_dim] then slices
# (fused), one matmul per slice of the same kernel (split), or (packed) one matmul whose
# output the flash kernel reads in place and whose gradient it writes packed (training with
# attention dropout on the flash kernel; elsewhere as split). Parameters are the same.
QKV_PROJECTIONS = ("split", "fused", "packed")
# LayerNorm: two_stage (custom backward with two-stage column sums for the scale/bias
# gradients; bert_jax/modeling/ops.py), Flax's nn.LayerNorm (autodiff backward), or fused:
# each layer's bias + hidden dropout + residual add + LayerNorm as one Pallas kernel per
# direction (bert_jax/kernels/fused_norm.py; GPU; needs hash dropout with the rowcol hash);
# auto: fused on GPU where it applies, else two_stage.
LAYER_NORM_IMPLS = ("two_stage", "flax", "fused", "auto")
# The residual stream (LayerNorm outputs and the sums into them): the compute dtype, or float32
# while matmuls still run in the compute dtype (what torch autocast does).
RESIDUAL_DTYPES = ("compute", "float32")
REMAT_POLICIES = ("none", "full", "dots", "dots_no_batch", "offload_dots")
# A Pallas kernel in place of XLA's fusions: auto (on GPUs where it applies: the axis it reads
# whole not split over a mesh) | off (XLA's fusions) | force (wherever it applies, any backend:
# Pallas interpret mode off GPUs, for tests).
KERNEL_CHOICES = ("auto", "off", "force")
# The family a checkpoint came from (its Hugging Face ``model_type``): decides the parameter
# names on export; the math differences are the fields position_offset / use_token_types.
MODEL_TYPES = ("bert", "roberta", "albert", "electra", "distilbert")
DTYPES = ("float32", "bfloat16", "float16")
ACTIVATIONS = ("gelu", "gelu_new", "gelu_approx", "relu", "tanh")
# BertConfig fields restricted to a set of values (checked in __post_init__).
CHOICE_FIELDS = {
    "hidden_act": ACTIVATIONS, "pooler_activation": ACTIVATIONS, "dtype": DTYPES,
    "param_dtype": DTYPES, "residual_dtype": RESIDUAL_DTYPES, "remat_policy": REMAT_POLICIES,
    "model_type": MODEL_TYPES,
}
# KernelOptions fields restricted to a set of values.
KERNEL_CHOICE_FIELDS = {
    "attention_impl": ATTENTION_IMPLS, "dropout_attention_impl": DROPOUT_ATTENTION_IMPLS,
    "hidden_dropout_impl": HIDDEN_DROPOUT_IMPLS, "dropout_hash": DROPOUT_HASHES,
    "qkv_projection": QKV_PROJECTIONS, "layer_norm_impl": LAYER_NORM_IMPLS,
    "fused_gelu": KERNEL_CHOICES, "fused_mlm_loss": KERNEL_CHOICES,
}
KERNEL_BOOL_FIELDS = ("split_norm_grads", "direct_weight_grads", "flash_bias_grads",
                      "fp8_gelu_quantize", "fp8_gelu_transpose", "fp8_cast_kernel")
# Kernel tile overrides: field -> (the type of each entry: int (positive) or bool, what they are).
BLOCK_FIELDS = {"norm_blocks": ((int, int, bool), "(block_rows, num_warps, recompute)"),
                "gelu_blocks": ((int, int, int), "(block_rows, block_cols, num_warps)")}
SUM_BLOCK_FIELDS = ("norm_sum_blocks", "gelu_sum_blocks")


def _bad(owner: str):
    """``bad(key, msg)``: raises the BertJaxError of an invalid ``owner.key``."""
    def bad(key, msg):
        raise BertJaxError(f"invalid {owner}.{key}: {msg}")
    return bad


@dataclasses.dataclass(frozen=True)
class KernelOptions:
    """How the encoder computes, not what: attention backends, dropout masks, the Pallas
    kernels and their tiles (``bert_jax/kernels/``). Every choice gives the same parameters;
    the values agree up to float32 summation order (dropout masks: the same distribution).
    ``BertConfig.kernels``; in experiment configs ``model.kernels.<field>``."""

    attention_impl: str = "auto"  # xla | cudnn | splash | auto (cudnn on GPU, else xla)
    # With attention dropout active: explicit einsum | flash (Pallas kernel with in-kernel
    # dropout, bert_jax/kernels/flash.py) | flash_tpu (its TPU counterpart, the same masks,
    # bert_jax/kernels/flash_tpu.py) | auto (flash on GPU, flash_tpu on TPU where shapes allow).
    dropout_attention_impl: str = "auto"
    hidden_dropout_impl: str = "hash"  # hash | prng (see HIDDEN_DROPOUT_IMPLS)
    dropout_hash: str = "rowcol"  # rowcol | flat (see DROPOUT_HASHES)
    qkv_projection: str = "packed"  # packed | split | fused (see QKV_PROJECTIONS)
    layer_norm_impl: str = "auto"  # auto | two_stage | flax | fused (see LAYER_NORM_IMPLS)
    # Kernel choices (KERNEL_CHOICES): the erf GELU after the MLP's first projection as the
    # bias + GELU kernel pair (bert_jax/kernels/fused_gelu.py; the intermediate axis unsplit),
    # and the MLM loss as the fused decoder + softmax cross-entropy (bert_jax/kernels/
    # fused_xent.py; the vocabulary axis unsplit).
    fused_gelu: str = "auto"
    fused_mlm_loss: str = "auto"
    # Gradient paths (same values either way, up to float32 summation order): the fused
    # LayerNorm's backward kernel adds the gradients of its output's two consumers as it reads
    # them (False: XLA sums them first, one more pass over [tokens, hidden] per sublayer);
    # projection weight gradients as one dot_general in the kernel's own layout (False: JAX's
    # transpose rule, [out, in] then a transpose); the flash kernel's backward sums the
    # query/key/value bias gradients as it writes dQ, dK, dV (False: XLA's column sums).
    split_norm_grads: bool = True
    direct_weight_grads: bool = True
    flash_bias_grads: bool = True
    # Kernel tiles for every shape, in place of the per-shape defaults (None): the fused
    # LayerNorm's (block_rows, num_warps, recompute) and row blocks per backward program
    # (fused_norm.blocks_for), the bias + GELU kernels' (block_rows, block_cols, num_warps)
    # and row blocks per backward program (fused_gelu.blocks_for).
    norm_blocks: tuple | None = None
    norm_sum_blocks: int | None = None
    gelu_blocks: tuple | None = None
    gelu_sum_blocks: int | None = None
    # Under ``BertConfig.fp8`` with the fused GELU kernels: the GELU kernels write the MLP's
    # activation, and its gradient, directly in float8 (``modeling/fp8.py: fp8_gelu_mlp``)
    # instead of XLA quantizing their bf16 outputs in separate passes.
    fp8_gelu_quantize: bool = True
    # With ``fp8_gelu_quantize``: the GELU kernels also write those float8 tensors transposed,
    # [intermediate, tokens], the layout of the MLP's weight-gradient GEMMs (FP8 GEMMs take
    # operands only with the contracted axis innermost), instead of XLA transposing them.
    fp8_gelu_transpose: bool = True
    # Under ``fp8`` with the fused LayerNorm kernels: every FP8 matmul's input and output
    # gradient are quantized by one Pallas kernel (``kernels/fp8_cast.py``) that also writes
    # the transposed copy the weight gradient takes and the maximum, instead of XLA's
    # separate cast, maximum and transpose.
    fp8_cast_kernel: bool = True

    def __post_init__(self):
        bad = _bad("BertConfig.kernels")
        # JSON stores tuples as lists: back to tuples (the options stay hashable).
        for key in BLOCK_FIELDS:
            if isinstance(getattr(self, key), list):
                object.__setattr__(self, key, tuple(getattr(self, key)))
        for key, choices in KERNEL_CHOICE_FIELDS.items():
            if getattr(self, key) not in choices:
                bad(key, f"{getattr(self, key)!r} is not one of {choices}")
        for key in KERNEL_BOOL_FIELDS:
            if not isinstance(getattr(self, key), bool):
                bad(key, f"expected true or false, got {getattr(self, key)!r}")
        for key, (types, entries) in BLOCK_FIELDS.items():
            value = getattr(self, key)
            if value is not None and (
                    not isinstance(value, tuple) or len(value) != len(types)
                    or not all(_entry_ok(v, t) for v, t in zip(value, types, strict=False))):
                bad(key, f"expected None or {len(types)} values {entries} (positive integers"
                    f"{', recompute true or false' if bool in types else ''}), got {value!r}")
        for key in SUM_BLOCK_FIELDS:
            value = getattr(self, key)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                      or value <= 0):
                bad(key, f"expected None or a positive integer, got {value!r}")
        if self.layer_norm_impl == "fused" and (self.hidden_dropout_impl != "hash"
                                                or self.dropout_hash != "rowcol"):
            bad("layer_norm_impl", "'fused' draws its dropout mask from the rowcol hash: it "
                "needs hidden_dropout_impl='hash' and dropout_hash='rowcol' (got "
                f"{self.hidden_dropout_impl!r}, {self.dropout_hash!r})")

    def replace(self, **changes: Any) -> KernelOptions:
        unknown = sorted(set(changes) - set(KERNEL_FIELDS))
        if unknown:
            raise BertJaxError(f"unknown BertConfig.kernels field(s) {unknown}; valid: "
                               f"{sorted(KERNEL_FIELDS)}")
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> KernelOptions:
        unknown = sorted(set(data) - set(KERNEL_FIELDS))
        if unknown:
            raise BertJaxError(f"{source}: unknown BertConfig.kernels key(s) {unknown}")
        return cls(**data)


KERNEL_FIELDS = tuple(f.name for f in dataclasses.fields(KernelOptions))


def moved_field_message(name: str, prefix: str = "") -> str | None:
    """Where a field that left BertConfig for :class:`KernelOptions` lives now (``prefix``:
    how the caller names the model, e.g. ``--config.model.``), or None for other names."""
    if name not in KERNEL_FIELDS:
        return None
    return (f"{prefix}{name} moved to {prefix}kernels.{name} (the kernel options are one "
            "sub-config, BertConfig.kernels)")


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """Architecture and numerics of a BERT (or ALBERT-style) encoder.

    Architecture fields use Hugging Face / Google names so configs round-trip. Runtime fields
    (dtypes, scan, remat, FP8, and the kernel options in ``kernels``) do not change the
    parameters.
    """

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    # ALBERT: factorized embeddings (None = hidden_size) and one layer shared by all depths.
    embedding_size: int | None = None
    share_layers: bool = False
    # Model family (see MODEL_TYPES); RoBERTa's positions start at pad_token_id + 1
    # (position_offset); DistilBERT has no token-type table (use_token_types=False).
    model_type: str = "bert"
    position_offset: int = 0
    use_token_types: bool = True
    # The pooler (dense on the first token, then this; the sequence classifier's input):
    # BERT / RoBERTa / ALBERT tanh, ELECTRA's classification head gelu, DistilBERT's relu.
    pooler_activation: str = "tanh"
    # Efficiency (no effect on the parameter values).
    vocab_pad_multiple: int = 128
    dtype: str = "float32"  # compute dtype
    param_dtype: str = "float32"
    residual_dtype: str = "compute"  # compute | float32 (see RESIDUAL_DTYPES)
    scan_layers: bool = False
    remat_policy: str = "none"
    # The encoder layers' matmuls (query/key/value, attention output, MLP in and out) in FP8
    # with delayed per-tensor scaling over the maxima of the last ``fp8_amax_history`` steps
    # (bert_jax/modeling/fp8.py): e4m3 forward, e5m2 gradients; for Hopper GPUs. The
    # pretraining step keeps the scales; elsewhere the matmuls run in ``dtype``.
    fp8: bool = False
    fp8_amax_history: int = 1024
    # Attention backends, dropout masks, Pallas kernels and their tiles (no effect on the
    # parameters): see KernelOptions.
    kernels: KernelOptions = dataclasses.field(default_factory=KernelOptions)

    def __post_init__(self):
        bad = _bad("BertConfig")
        if isinstance(self.kernels, dict):  # from JSON, or a caller's dict of options
            object.__setattr__(self, "kernels", KernelOptions.from_dict(self.kernels))
        if not isinstance(self.kernels, KernelOptions):
            bad("kernels", f"expected KernelOptions or a dict, got {self.kernels!r}")

        for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                    "intermediate_size", "max_position_embeddings", "type_vocab_size",
                    "vocab_pad_multiple"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                bad(key, f"expected a positive integer, got {value!r}")
        if self.hidden_size % self.num_attention_heads:
            bad("hidden_size", f"{self.hidden_size} is not divisible by num_attention_heads="
                f"{self.num_attention_heads}")
        if self.embedding_size is not None and (
                not isinstance(self.embedding_size, int) or self.embedding_size <= 0):
            bad("embedding_size", f"expected a positive integer or None, got "
                f"{self.embedding_size!r}")
        for key in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            if not 0.0 <= getattr(self, key) < 1.0:
                bad(key, f"expected a probability in [0, 1), got {getattr(self, key)!r}")
        for key, choices in CHOICE_FIELDS.items():
            if getattr(self, key) not in choices:
                bad(key, f"{getattr(self, key)!r} is not one of {choices}")
        if not isinstance(self.fp8, bool):
            bad("fp8", f"expected true or false, got {self.fp8!r}")
        if (not isinstance(self.fp8_amax_history, int) or isinstance(self.fp8_amax_history, bool)
                or self.fp8_amax_history <= 0):
            bad("fp8_amax_history", f"expected a positive integer, got "
                f"{self.fp8_amax_history!r}")
        if self.fp8 and self.share_layers:
            bad("fp8", "FP8 scaling keeps one state per layer; shared layers (share_layers) "
                "have one layer used many times")
        if not isinstance(self.position_offset, int) or not (
                0 <= self.position_offset < self.max_position_embeddings):
            bad("position_offset", f"expected an integer in [0, max_position_embeddings="
                f"{self.max_position_embeddings}), got {self.position_offset!r}")
        if not 0 <= self.pad_token_id < self.vocab_size:
            bad("pad_token_id", f"{self.pad_token_id} is outside the vocabulary "
                f"[0, {self.vocab_size})")

    # ---- derived sizes -------------------------------------------------------------------
    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def embedding_dim(self) -> int:
        """Width of the embedding tables (ALBERT factorizes it below hidden_size)."""
        return self.embedding_size or self.hidden_size

    @property
    def max_sequence_length(self) -> int:
        """Longest input the position table serves (RoBERTa keeps its first rows unused)."""
        return self.max_position_embeddings - self.position_offset

    @property
    def padded_vocab_size(self) -> int:
        """Vocabulary rows in the embedding/decoder, padded to a multiple for fast matmuls."""
        m = self.vocab_pad_multiple
        return (self.vocab_size + m - 1) // m * m

    def replace(self, **changes: Any) -> BertConfig:
        _refuse_moved_fields(changes)
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise BertJaxError(f"unknown BertConfig field(s) {unknown}; valid: "
                               f"{sorted(f.name for f in dataclasses.fields(self))}")
        return dataclasses.replace(self, **changes)

    def with_xla_kernels(self, only_auto: bool = False) -> BertConfig:
        """This model with its kernel choices on XLA's own ops (no Pallas kernel, no cuDNN
        attention); ``only_auto``: only the choices left to ``auto``. The parameters and
        their initial values are the same. Such programs trace, lower, compile and load
        faster: what a short run or one that only initialises parameters needs
        (``model.init`` traces a forward pass that the program then drops)."""
        xla = {"attention_impl": "xla", "dropout_attention_impl": "explicit",
               "layer_norm_impl": "two_stage", "fused_gelu": "off", "fused_mlm_loss": "off"}
        return self.with_kernels(**{k: v for k, v in xla.items()
                                    if not only_auto or getattr(self.kernels, k) == "auto"})

    def with_kernels(self, **changes: Any) -> BertConfig:
        """This model with some :class:`KernelOptions` fields changed."""
        return dataclasses.replace(self, kernels=self.kernels.replace(**changes))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> BertConfig:
        """From :meth:`to_dict`'s form; configs saved before the kernel options became one
        sub-config (their fields at the top level) load too."""
        data = with_kernel_options_nested(data)
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise BertJaxError(f"{source}: unknown BertConfig key(s) {unknown}")
        return cls(**data)

    # ---- Hugging Face / Google formats ---------------------------------------------------
    def to_hf_dict(self) -> dict[str, Any]:
        """A ``config.json`` for transformers' BertModel / BertForPreTraining."""
        if self.share_layers or self.embedding_size not in (None, self.hidden_size):
            raise BertJaxError("ALBERT-style configs (share_layers / embedding_size) have no "
                               "Hugging Face BERT equivalent")
        out = {k: getattr(self, k) for k in _ARCH_KEYS}
        out.update(model_type="bert", architectures=["BertForPreTraining"],
                   position_embedding_type="absolute")
        return out

    def to_google_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in _ARCH_KEYS if k not in ("layer_norm_eps",
                                                                      "pad_token_id")}

    @classmethod
    def from_external_dict(cls, data: dict[str, Any], source: str, **overrides: Any
                           ) -> BertConfig:
        """Builds a config from an HF ``config.json`` or Google ``bert_config.json`` dict."""
        model_type = data.get("model_type", "bert")
        if model_type not in ("bert", "albert"):
            raise BertJaxError(f"{source}: model_type {model_type!r} is not a BERT model")
        pet = data.get("position_embedding_type", "absolute")
        if pet != "absolute":
            raise BertJaxError(f"{source}: position_embedding_type={pet!r} is not supported "
                               "(only absolute positions)")
        missing = [k for k in ("vocab_size", "hidden_size", "num_hidden_layers",
                               "num_attention_heads", "intermediate_size") if k not in data]
        if missing:
            raise BertJaxError(f"{source}: missing required key(s) {missing}")
        kwargs = {k: data[k] for k in _ARCH_KEYS if k in data and data[k] is not None}
        if model_type == "albert":
            kwargs["embedding_size"] = data.get("embedding_size")
            kwargs["share_layers"] = True
        elif data.get("embedding_size") not in (None, data["hidden_size"]):
            kwargs["embedding_size"] = data["embedding_size"]
        kwargs.update(overrides)
        return cls(**kwargs)

    @classmethod
    def from_json_file(cls, path: str | os.PathLike, **overrides: Any) -> BertConfig:
        """Reads a bert-jax, Hugging Face or Google config JSON file."""
        path = os.fspath(path)
        if not storage.exists(path):
            raise BertJaxError(f"{path}: config file not found")
        try:
            data = json.loads(storage.read_text(path))
        except json.JSONDecodeError as e:
            raise BertJaxError(f"{path}: not valid JSON (line {e.lineno}: {e.msg})") from None
        _refuse_moved_fields(overrides)
        if data.get("format") == "bert_jax":
            data = dict(data["config"])
            data.update(overrides)
            return cls.from_dict(data, source=path)
        return cls.from_external_dict(data, source=path, **overrides)

    def save_json(self, path: str | os.PathLike, flavor: str = "bert_jax") -> None:
        """Writes ``flavor`` = bert_jax (all fields), hf (config.json) or google."""
        if flavor == "bert_jax":
            data = {"format": "bert_jax", "config": self.to_dict()}
        elif flavor == "hf":
            data = self.to_hf_dict()
        elif flavor == "google":
            data = self.to_google_dict()
        else:
            raise ValueError(f"unknown config flavor {flavor!r}")
        from bert_jax import fileio

        fileio.atomic_write_json(os.fspath(path), data)


# Fields that change how the model computes but not its parameters' shapes or meaning: a run
# may set them differently from the checkpoint it starts from.
RUNTIME_FIELDS = ("hidden_dropout_prob", "attention_probs_dropout_prob", "initializer_range",
                  "dtype", "param_dtype", "residual_dtype", "scan_layers", "remat_policy",
                  "fp8", "fp8_amax_history", "kernels")


def _refuse_moved_fields(changes: dict[str, Any]) -> None:
    for key in changes:
        message = moved_field_message(key, "BertConfig.")
        if message:
            raise BertJaxError(f"{message}: use .with_kernels({key}=...)")


def with_kernel_options_nested(data: dict[str, Any]) -> dict[str, Any]:
    """A saved config's dict with the kernel options of the earlier flat layout (fields such
    as ``layer_norm_impl`` at the top level) moved under ``kernels``; other dicts unchanged."""
    flat = {k: v for k, v in data.items() if k in KERNEL_FIELDS}
    if not flat:
        return data
    nested = {k: v for k, v in data.items() if k not in KERNEL_FIELDS}
    nested["kernels"] = {**flat, **dict(data.get("kernels") or {})}
    return nested


def _entry_ok(value: Any, kind: type) -> bool:
    if kind is bool:
        return isinstance(value, bool)
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


_ARCH_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
              "intermediate_size", "hidden_act", "hidden_dropout_prob",
              "attention_probs_dropout_prob", "max_position_embeddings", "type_vocab_size",
              "initializer_range", "layer_norm_eps", "pad_token_id")


def _preset(layers: int, hidden: int, heads: int, **kw: Any) -> BertConfig:
    return BertConfig(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                      intermediate_size=4 * hidden, **kw)


PRESETS: dict[str, BertConfig] = {
    "tiny": _preset(2, 128, 2),
    "mini": _preset(4, 256, 4),
    "small": _preset(4, 512, 8),
    "medium": _preset(8, 512, 8),
    "base": _preset(12, 768, 12),
    "large": _preset(24, 1024, 16),
    "albert_base": _preset(12, 768, 12, vocab_size=30000, embedding_size=128,
                           share_layers=True),
    "albert_large": _preset(24, 1024, 16, vocab_size=30000, embedding_size=128,
                            share_layers=True),
}


def get_preset(name: str, **overrides: Any) -> BertConfig:
    """A preset by name, optionally with field overrides."""
    if name not in PRESETS:
        raise BertJaxError(f"unknown model preset {name!r}; choose one of {sorted(PRESETS)}")
    return PRESETS[name].replace(**overrides) if overrides else PRESETS[name]
