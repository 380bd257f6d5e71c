"""Conversion (Hugging Face / Google TF -> bert-jax model directory) and export (any
bert-jax checkpoint -> Hugging Face directory), as ``bert-jax convert`` and ``bert-jax export``
run them."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from bert_jax import fileio, storage
from bert_jax.checkpoint import hf
from bert_jax.checkpoint.google_tf import GOOGLE_CONFIG_FILE
from bert_jax.errors import BertJaxError

HF_WEIGHT_FILES = (hf.SAFETENSORS_FILE, hf.SAFETENSORS_INDEX, hf.TORCH_FILE, hf.TORCH_INDEX)


def detect_format(path: str) -> str:
    """'hf' or 'google' from the files at ``path`` (a directory or a TF checkpoint prefix)."""
    if storage.isdir(path):
        if storage.exists(storage.join(path, hf.HF_CONFIG_FILE)) and any(
                storage.exists(storage.join(path, f)) for f in HF_WEIGHT_FILES):
            return "hf"
        if (storage.exists(storage.join(path, GOOGLE_CONFIG_FILE))
                or storage.glob(storage.join(path, "*.index"))):
            return "google"
        raise BertJaxError(f"{path}: neither a Hugging Face directory (config.json + "
                           f"{' / '.join(HF_WEIGHT_FILES)}) nor a Google TF checkpoint "
                           f"({GOOGLE_CONFIG_FILE} + *.ckpt.index)")
    if storage.exists(path + ".index"):
        return "google"
    raise BertJaxError(f"{path}: checkpoint not found")


def _refuse_foreign_config(output: str, what: str) -> None:
    """Never overwrite another format's config.json (e.g. converting into the source dir)."""
    path = storage.join(output, hf.HF_CONFIG_FILE)
    if not storage.exists(path):
        return
    try:
        is_bert_jax = json.loads(storage.read_text(path)).get("format") == "bert_jax"
    except (OSError, ValueError, AttributeError):
        is_bert_jax = False
    if is_bert_jax != (what == "bert-jax"):
        raise BertJaxError(f"{output}: already holds a different checkpoint ({path}); choose an "
                           "empty --output directory")


def convert_checkpoint(source: str, output: str, source_format: str = "auto",
                       scan_layers: bool = False) -> hf.ConversionReport:
    """Converts a Hugging Face or Google checkpoint into a bert-jax model directory."""
    from bert_jax.checkpoint.store import save_model

    fmt = detect_format(source) if source_format == "auto" else source_format
    if fmt == "hf":
        if not storage.isdir(source):
            raise BertJaxError(f"{source}: Hugging Face checkpoint directory not found")
        from bert_jax.checkpoint.families import load_hf_any

        params, config, tokenizer, report = load_hf_any(source, scan_layers=scan_layers)
        head_info = _hf_head_info(hf._read_json(storage.join(source, hf.HF_CONFIG_FILE)))
    elif fmt == "google":
        from bert_jax.checkpoint.google_tf import load_google_tf

        params, config, tokenizer, report = load_google_tf(source, scan_layers=scan_layers)
        head_info = {}
    else:
        raise BertJaxError(f"unknown source format {fmt!r} (expected hf, google or auto)")
    fileio.check_output_path(output, directory=True)
    _refuse_foreign_config(output, "bert-jax")
    extra = {"converted_from": {"format": fmt, "source": storage.abspath(source),
                                "architecture": report.architecture, "heads": report.heads,
                                "unused": report.unused, **head_info}}
    save_model(output, params, config, tokenizer, extra=extra)
    return report


def _hf_head_info(raw: dict[str, Any]) -> dict[str, Any]:
    """A Hugging Face classifier's label names and problem type (config.json's ``id2label``
    and ``problem_type``), kept with a converted checkpoint so that its export gives them back."""
    suffix = hf.task_class_suffix(",".join(raw.get("architectures") or []))
    out: dict[str, Any] = {}
    id2label = raw.get("id2label")
    if suffix in (hf.SEQUENCE_CLASS, hf.TOKEN_CLASS) and isinstance(id2label, dict):
        try:
            out["labels"] = [str(id2label[k]) for k in sorted(id2label, key=int)]
        except ValueError:  # keys that are not numbers: no usable label names
            pass
    if raw.get("problem_type"):
        out["problem_type"] = raw["problem_type"]
    return out


def _kind_of_hf_class(architecture: str, problem_type: str | None) -> str | None:
    """The fine-tuning task kind a Hugging Face class serves (None where not a task class, or
    a sequence classifier whose problem type is not single-label or regression)."""
    suffix = hf.task_class_suffix(architecture)
    if suffix == hf.SEQUENCE_CLASS:
        return {"regression": "regression",
                "single_label_classification": "classification"}.get(problem_type or "")
    return {hf.TOKEN_CLASS: "token_classification", hf.QA_CLASS: "span",
            hf.CHOICE_CLASS: "multiple_choice"}.get(suffix)


def converted_task(extra: dict[str, Any], source: str
                   ) -> tuple[str | None, tuple[str, ...]]:
    """(task kind, label names) of a checkpoint converted from a Hugging Face task class,
    from its config.json's record of it; (None, ()) where it records none."""
    converted = extra.get("converted_from")
    if isinstance(converted, dict):
        kind = _kind_of_hf_class(converted.get("architecture") or "",
                                 converted.get("problem_type"))
        return kind, tuple(converted.get("labels") or ())
    return None, ()


# What an export writes: an output directory holding anything else is refused, not replaced.
EXPORT_FILES = (hf.HF_CONFIG_FILE, hf.SAFETENSORS_FILE, "vocab.txt", "tokenizer_config.json",
                "vocab.json", "merges.txt", "spiece.model", "special_tokens_map.json",
                "tokenizer.json")


def export_checkpoint(checkpoint: str, output: str, architecture: str | None = None, *,
                      task_of: Callable[[dict[str, Any], str],
                                        tuple[str | None, tuple[str, ...]]] = converted_task
                      ) -> hf.ConversionReport:
    """Exports any checkpoint fine-tuning accepts (bert-jax model dir, workdir, step dir, or a
    Hugging Face directory) to a Hugging Face directory with its tokenizer.

    A fine-tuned checkpoint exports as its family's class for the task (sequence or token
    classification, question answering, multiple choice), with the task's label names in
    config.json: ``task_of(extra, checkpoint)`` reads them from its config.json
    (``bert_jax.finetuning.export.checkpoint_task`` knows fine-tuning workdirs; the default only
    converted checkpoints); ``architecture`` names another class.

    The export is written under a staging name and swapped in complete: an earlier export
    in ``output`` stays whole until then."""
    from bert_jax.checkpoint.detect import is_hf_directory
    from bert_jax.checkpoint.families import export_hf_any, load_hf_any
    from bert_jax.checkpoint.store import load_model

    if storage.abspath(checkpoint) == storage.abspath(output):
        raise BertJaxError(f"{output}: --output is the checkpoint itself; choose another "
                           "directory")
    fileio.check_output_path(output, directory=True)
    _refuse_foreign_config(output, "hf")
    if storage.isdir(output):
        others = sorted(set(storage.listdir(output)) - set(EXPORT_FILES))
        if others:
            raise BertJaxError(f"{output}: holds files an export does not write "
                               f"({', '.join(others[:3])}); choose a new or empty --output")
    if storage.isdir(checkpoint) and is_hf_directory(checkpoint):
        params, config, tokenizer, _ = load_hf_any(checkpoint)
        raw = hf._read_json(storage.join(checkpoint, hf.HF_CONFIG_FILE))
        info = _hf_head_info(raw)
        kind = _kind_of_hf_class(",".join(raw.get("architectures") or []),
                                 info.get("problem_type"))
        labels = tuple(info.get("labels") or ())
    else:
        params, config, tokenizer, extra = load_model(checkpoint)
        kind, labels = task_of(extra, checkpoint)
    with fileio.replace_directory(output, marker=hf.HF_CONFIG_FILE) as staging:
        report = export_hf_any(params, config, staging, tokenizer, architecture=architecture,
                               kind=kind, labels=labels)
    report.source = storage.abspath(checkpoint)
    report.output = storage.abspath(output)
    if not report.files:
        report.files = sorted(storage.listdir(output))
    return report
