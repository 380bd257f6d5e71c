"""A fine-tuning run's starting model: the checkpoint's encoder (bert-jax or Hugging Face,
``bert_jax.checkpoint.detect``) or a random one, its config with the run's runtime fields, the
tokenizer checked against the checkpoint's vocabulary, and the encoder merged into freshly
initialised task-head parameters."""

from __future__ import annotations

from typing import Any

from bert_jax.checkpoint.detect import load_checkpoint
from bert_jax.config import RUNTIME_FIELDS, BertConfig
from bert_jax.errors import BertJaxError
from bert_jax.finetuning.trainer import HEAD_NAMES
from bert_jax.modeling.params import flatten_params, merge_pretrained, to_layout
from bert_jax.runs import config as config_lib
from bert_jax.tasks.base import Task


def model_config_for_checkpoint(config, ckpt: BertConfig, source: str) -> BertConfig:
    """The checkpoint's config with the run's runtime fields (dropout, dtype, ...); any other
    model field set in the run must equal the checkpoint's."""
    fields = config_lib.model_fields(config.model)
    kernels = fields.pop("kernels", {})
    for key, value in fields.items():
        if key not in RUNTIME_FIELDS and value != getattr(ckpt, key):
            raise BertJaxError(f"--config.model.{key}={value!r} does not match the checkpoint "
                               f"{source}, which has {key}={getattr(ckpt, key)!r} (the "
                               "encoder's shape comes from the checkpoint; unset the field)")
    return ckpt.replace(**{k: v for k, v in fields.items() if k in RUNTIME_FIELDS}
                        ).with_kernels(**kernels)


def check_tokenizer(tokenizer, ckpt_tokenizer, model_cfg: BertConfig, source: str,
                    tokenizer_source: str) -> list[str]:
    """Vocabulary of the task tokenizer vs the checkpoint: an error when ids would fall
    outside the embedding table or name other tokens; notes otherwise."""
    n, m = tokenizer.vocab_size, model_cfg.vocab_size
    if n > m:
        raise BertJaxError(f"vocabulary mismatch: the tokenizer {tokenizer_source} has {n} "
                           f"tokens but the checkpoint {source} has vocab_size={m}; ids >= {m} "
                           "have no embedding. Use the checkpoint's own tokenizer (leave "
                           "--config.tokenizer unset) or a checkpoint trained with this one")
    notes = []
    if ckpt_tokenizer is not None and ckpt_tokenizer is not tokenizer:
        common = min(n, ckpt_tokenizer.vocab_size)
        differ = [i for i in range(common)
                  if tokenizer.id_to_token(i) != ckpt_tokenizer.id_to_token(i)]
        if differ:
            i = differ[0]
            raise BertJaxError(
                f"vocabulary mismatch: {len(differ)} of {common} token ids name different "
                f"tokens in the tokenizer {tokenizer_source} and in the checkpoint {source} "
                f"(id {i}: {tokenizer.id_to_token(i)!r} vs {ckpt_tokenizer.id_to_token(i)!r})")
    if n < m:
        notes.append(f"tokenizer has {n} tokens, the checkpoint's embedding {m} rows: "
                     f"rows {n}..{m - 1} are never used")
    return notes


def reinitialized_paths(pretrained_encoder: dict, prefixes: str) -> tuple[str, ...]:
    """The checkpoint's encoder tensors named by ``prefixes`` (``--config.reinitialize``:
    comma-separated parameter path prefixes such as ``bert/pooler``, matched at ``/``
    boundaries); a prefix that names none is an error listing the encoder's top-level
    modules."""
    paths = flatten_params({"bert": pretrained_encoder})
    chosen = []
    for prefix in filter(None, (p.strip().strip("/") for p in prefixes.split(","))):
        match = [p for p in paths if p == prefix or p.startswith(prefix + "/")]
        if not match:
            tops = sorted({"/".join(p.split("/")[:2]) for p in paths})
            raise BertJaxError(f"--config.reinitialize: {prefix!r} names no encoder tensor of "
                               f"the checkpoint (its modules: {', '.join(tops)})")
        chosen += match
    return tuple(sorted(set(chosen)))


def merge_encoder(fresh: dict, pretrained: dict, model_cfg: BertConfig, reinitialize: str = ""
                  ) -> tuple[dict, list[str]]:
    """Pretrained ``bert`` subtree into fresh task params, except the tensors ``reinitialize``
    names (:func:`reinitialized_paths`), which keep their fresh initialisation; (params,
    report lines)."""
    if "bert" not in pretrained:
        raise BertJaxError(f"checkpoint has no encoder ('bert' subtree); top-level keys: "
                           f"{sorted(pretrained)}")
    pretrained = to_layout(pretrained, model_cfg)
    skip = reinitialized_paths(pretrained["bert"], reinitialize)
    params, unused = merge_pretrained(fresh, {"bert": pretrained["bert"]}, dont_load=skip)
    unused = [p for p in unused if p not in skip]
    unused += sorted(p for p in flatten_params(pretrained) if not p.startswith("bert/"))
    loaded = set(flatten_params({"bert": pretrained["bert"]})) - set(unused) - set(skip)
    fresh_paths = sorted(set(flatten_params(fresh)) - loaded)
    heads = sorted({p.split("/")[0] for p in fresh_paths if p.split("/")[0] in HEAD_NAMES})
    lines = [f"restored {len(loaded)} encoder tensors; head {', '.join(heads)} freshly "
             "initialised"]
    encoder_fresh = [p for p in fresh_paths if p.startswith("bert/") and p not in skip]
    if encoder_fresh:
        lines.append(f"encoder tensors not in the checkpoint (freshly initialised, "
                     f"{len(encoder_fresh)}): {', '.join(encoder_fresh)}")
    if skip:
        lines.append(f"re-initialised instead of restored ({len(skip)}): {', '.join(skip)}")
    if unused:
        lines.append(f"checkpoint tensors not used ({len(unused)}): {', '.join(unused)}")
    return params, lines


def initial_model(task: Task, config) -> tuple[BertConfig, Any, Any, list[str]]:
    """(model config, tokenizer, host params or None for random init, report lines)."""
    del task  # the head comes from the task when the Finetuner initialises it
    from bert_jax.tokenization import load_tokenizer

    tokenizer = load_tokenizer(config.tokenizer) if config.tokenizer else None
    if not config.init_checkpoint:
        if tokenizer is None:
            raise BertJaxError("random initialisation (init_checkpoint='') needs "
                               "--config.tokenizer=DIR (a vocabulary to embed)")
        model_cfg = config_lib.model_config(config, vocab_size=tokenizer.vocab_size)
        if tokenizer.vocab_size > model_cfg.vocab_size:
            raise BertJaxError(f"tokenizer has {tokenizer.vocab_size} tokens but "
                               f"model.vocab_size={model_cfg.vocab_size}")
        return model_cfg, tokenizer, None, [
            f"random initialisation: preset {config.model.preset}, seed {config.seed}"]
    source = config.init_checkpoint
    pretrained, ckpt_cfg, ckpt_tokenizer, lines = load_checkpoint(source)
    model_cfg = model_config_for_checkpoint(config, ckpt_cfg, source)
    if tokenizer is None:
        if ckpt_tokenizer is None:
            raise BertJaxError(f"{source}: checkpoint has no tokenizer; pass "
                               "--config.tokenizer=DIR (the vocabulary it was trained with)")
        tokenizer = ckpt_tokenizer
    lines += check_tokenizer(tokenizer, ckpt_tokenizer, model_cfg, source,
                             config.tokenizer or f"of {source}")
    return model_cfg, tokenizer, pretrained, lines
