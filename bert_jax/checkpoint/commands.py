"""``bert-jax convert`` (Hugging Face / Google TF -> bert-jax model directory) and
``bert-jax export`` (any bert-jax checkpoint -> Hugging Face directory)."""

from __future__ import annotations

import argparse
import json

from bert_jax import fileio, storage
from bert_jax.checkpoint import hf
from bert_jax.checkpoint.families import ARCHITECTURE_FAMILY
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
    elif fmt == "google":
        from bert_jax.checkpoint.google_tf import load_google_tf

        params, config, tokenizer, report = load_google_tf(source, scan_layers=scan_layers)
    else:
        raise BertJaxError(f"unknown source format {fmt!r} (expected hf, google or auto)")
    fileio.check_output_path(output, directory=True)
    _refuse_foreign_config(output, "bert-jax")
    extra = {"converted_from": {"format": fmt, "source": storage.abspath(source),
                                "architecture": report.architecture, "heads": report.heads,
                                "unused": report.unused}}
    save_model(output, params, config, tokenizer, extra=extra)
    return report


# What an export writes: an output directory holding anything else is refused, not replaced.
EXPORT_FILES = (hf.HF_CONFIG_FILE, hf.SAFETENSORS_FILE, "vocab.txt", "tokenizer_config.json",
                "vocab.json", "merges.txt", "spiece.model", "special_tokens_map.json",
                "tokenizer.json")


def export_checkpoint(checkpoint: str, output: str, architecture: str | None = None
                      ) -> hf.ConversionReport:
    """Exports any checkpoint fine-tuning accepts (bert-jax model dir, workdir, step dir, or a
    Hugging Face directory) to a Hugging Face directory with its tokenizer.

    The export is written under a staging name and swapped in complete: an earlier export
    in ``output`` stays whole until then."""
    from bert_jax.checkpoint.detect import load_checkpoint
    from bert_jax.checkpoint.families import export_hf_any

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
    params, config, tokenizer, _ = load_checkpoint(checkpoint)
    with fileio.replace_directory(output, marker=hf.HF_CONFIG_FILE) as staging:
        report = export_hf_any(params, config, staging, tokenizer, architecture=architecture)
    report.source = storage.abspath(checkpoint)
    report.output = storage.abspath(output)
    if not report.files:
        report.files = sorted(storage.listdir(output))
    return report


class convert:  # noqa: N801 (CLI command object)
    @staticmethod
    def add_arguments(p: argparse.ArgumentParser) -> None:
        p.add_argument("source", help="Hugging Face model directory, or Google checkpoint "
                                      "directory / prefix (DIR/bert_model.ckpt)")
        p.add_argument("--from", dest="source_format", choices=["hf", "google", "auto"],
                       default="auto", help="source format (default: detect from the files)")
        p.add_argument("--output", required=True, help="bert-jax model directory to write")
        p.add_argument("--scan-layers", action="store_true",
                       help="store the layers stacked for nn.scan (default: unrolled)")

    @staticmethod
    def run(args: argparse.Namespace) -> int:
        report = convert_checkpoint(args.source, args.output, args.source_format,
                                    args.scan_layers)
        print(report)
        print(f"wrote bert-jax model directory {storage.abspath(args.output)}")
        return 0


class export:  # noqa: N801 (CLI command object)
    @staticmethod
    def add_arguments(p: argparse.ArgumentParser) -> None:
        p.add_argument("checkpoint", help="bert-jax model directory, pretraining or "
                                          "fine-tuning workdir, step directory, or Hugging "
                                          "Face BERT directory")
        p.add_argument("--output", required=True,
                       help="directory to write: config.json, model.safetensors and the "
                            "tokenizer (AutoTokenizer loads it)")
        p.add_argument("--format", choices=["hf"], default="hf", help="output format")
        p.add_argument("--architecture", choices=sorted(ARCHITECTURE_FAMILY),
                       help="Hugging Face class to export as (default: from the heads present)")

    @staticmethod
    def run(args: argparse.Namespace) -> int:
        report = export_checkpoint(args.checkpoint, args.output, args.architecture)
        print(report)
        print(f"wrote Hugging Face directory {storage.abspath(args.output)}")
        return 0
