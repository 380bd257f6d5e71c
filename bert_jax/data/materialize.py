"""Pre-materialized pretraining batches: the pipeline's output saved as plain ``.npy`` files.

``bert-jax materialize-batches`` runs the tf.data pipeline (one host, the global batch size)
for N steps and writes one memory-mappable ``KEY.npy`` per batch key, stacked ``[N, B, ...]``,
plus ``manifest.json``. :class:`MaterializedBatches` reads them back with numpy alone (machines
without tensorflow train from these); each host takes its contiguous slice of every global
batch. The masking is the pipeline's, so a materialized run sees the same batches as a live one.
Packed data (``create-pretraining-data --pack``) adds the pipeline's packed keys
(``example_ids``, ``position_ids``, ``cls_positions``, ``next_sentence_weights``, and
``next_sentence_labels`` per example slot); the manifest then says ``"packed": true`` and
``max_examples_per_row``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from bert_jax import fileio, storage
from bert_jax.data.mask_settings import MaskSettings
from bert_jax.data.masking import MASKING_MODES
from bert_jax.errors import BertJaxError

MANIFEST_JSON = "manifest.json"
# The dtypes every reader yields (what the pipeline emits).
_KEYS_AND_DTYPES = (("input_ids", "int32"), ("input_mask", "int32"), ("segment_ids", "int32"),
                    ("masked_lm_positions", "int32"), ("masked_lm_ids", "int32"),
                    ("masked_lm_weights", "float32"), ("next_sentence_labels", "int32"))
_PACKED_KEYS_AND_DTYPES = (("example_ids", "int32"), ("position_ids", "int32"),
                           ("cls_positions", "int32"), ("next_sentence_weights", "float32"))


def storage_dtypes(vocab_size: int, seq_len: int, examples_per_row: int = 0) -> dict[str, str]:
    """The smallest exact on-disk dtype of each key (ids fit uint16 for vocabularies up to
    65,536; masks, segments, weights and labels are 0/1; positions and example slots are
    below ``seq_len``). About 4x smaller than int32, which matters when batches travel to an
    accelerator machine."""
    ids = "uint16" if vocab_size <= 2 ** 16 else "int32"
    pos = "uint8" if seq_len <= 2 ** 8 else "uint16"
    dtypes = {"input_ids": ids, "input_mask": "uint8", "segment_ids": "uint8",
              "masked_lm_positions": pos, "masked_lm_ids": ids, "masked_lm_weights": "uint8",
              "next_sentence_labels": "uint8"}
    if examples_per_row:
        dtypes.update({"example_ids": "uint8" if examples_per_row < 2 ** 8 else "uint16",
                       "position_ids": pos, "cls_positions": pos,
                       "next_sentence_weights": "uint8"})
    return dtypes


def materialize_batches(data_dir: str, output_dir: str, *, steps: int, batch_size: int,
                        max_predictions: int, seed: int = 0, whole_word: bool = False,
                        span_masking: bool = False, seq_len: int | None = None,
                        tokenizer=None, shuffle_buffer: int = 10_000, split: str = "train",
                        pairing: str | None = None, short_seq_prob: float = 0.1,
                        masking: str | None = None, mask_rate: float = MaskSettings.mask_rate,
                        span_p: float = MaskSettings.span_p,
                        max_span: int = MaskSettings.max_span,
                        basic_fraction: float = MaskSettings.basic_fraction,
                        mask_token_fraction: float = MaskSettings.mask_token_fraction,
                        random_token_fraction: float = MaskSettings.random_token_fraction,
                        progress: bool = True) -> dict[str, Any]:
    """Runs the pipeline for ``steps`` global batches of ``split`` (train, or eval: the
    held-out shards) and writes them; returns the manifest. Document shards are paired with
    ``pairing`` (nsp, sop, full_sentences, doc_sentences) at ``seq_len``, as in training.

    ``masking`` is a training run's ``data.masking`` (token, whole_word, span, knowledge; with
    ``mask_rate``, ``span_p``, ``max_span`` and ``basic_fraction`` as ``data.masked_lm_prob``,
    ``data.span_p``, ``data.max_span`` and ``data.basic_masking_fraction``; the masked tokens
    shown as [MASK] / replaced at random in the shares ``mask_token_fraction`` /
    ``random_token_fraction``, ``data.mask_token_fraction`` / ``data.random_token_fraction``,
    whatever the masking): the batches are
    masked exactly as that run's pipeline masks them. Unset, ``whole_word`` / ``span_masking``
    select the masking flags directly (the pipeline's older switches)."""
    if storage.is_remote(output_dir):  # memory maps need a local file: stage, then publish
        args = {k: v for k, v in locals().items() if k not in ("data_dir", "output_dir")}
        with fileio.replace_directory(output_dir, marker=MANIFEST_JSON) as staging:
            return materialize_batches(data_dir, staging, **args)
    from tqdm import tqdm

    from bert_jax.data.metadata import load_metadata
    from bert_jax.data.pipeline import PretrainingIterator

    if steps < 1 or batch_size < 1:
        raise BertJaxError(f"--steps {steps} and --batch-size {batch_size} must be >= 1")
    meta = load_metadata(data_dir)
    if masking is not None:
        if masking not in MASKING_MODES:
            raise BertJaxError(f"--masking {masking!r}: expected one of {MASKING_MODES}")
        if whole_word or span_masking:
            raise BertJaxError("--masking replaces --whole-word and --span-masking; give one")
    if (whole_word or masking not in (None, "token")) and tokenizer is None:
        raise BertJaxError(f"--masking {masking or 'whole_word'} needs --tokenizer (its "
                           "word-start table)")
    if meta.format == "documents" and not seq_len:
        raise BertJaxError(f"{data_dir}: document shards need --seq-len")
    options = {"masking": masking, "span_p": span_p, "max_span": max_span,
               "basic_fraction": basic_fraction} if masking is not None else {
        "whole_word": whole_word, "span_masking": span_masking}
    mask = MaskSettings(mask_rate=mask_rate, mask_token_fraction=mask_token_fraction,
                        random_token_fraction=random_token_fraction, **options)
    iterator = PretrainingIterator.from_data_dir(
        data_dir, per_host_batch_size=batch_size, max_predictions_per_seq=max_predictions,
        seq_len=seq_len, tokenizer=tokenizer, seed=seed, mask=mask,
        shuffle_buffer=shuffle_buffer, split=split, pairing=pairing,
        short_seq_prob=short_seq_prob)
    seq = seq_len or meta.max_seq_length
    storage.makedirs(output_dir)
    first = next(iterator)
    # Packed rows (the pipeline's PACKED_BATCH_KEYS) carry their example slots along.
    k = first["cls_positions"].shape[1] if "cls_positions" in first else 0
    keys = dict(_KEYS_AND_DTYPES + (_PACKED_KEYS_AND_DTYPES if k else ()))
    shapes = {key: first[key].shape[1:] for key in keys}
    on_disk = storage_dtypes(meta.vocab_size, seq, k)
    arrays = {key: np.lib.format.open_memmap(storage.join(output_dir, f"{key}.npy.tmp"),
                                             mode="w+", dtype=on_disk[key],
                                             shape=(steps, batch_size, *shapes[key]))
              for key in keys}
    for step in tqdm(range(steps), desc="materialize-batches", disable=not progress):
        batch = first if step == 0 else next(iterator)
        for key, array in arrays.items():
            value = batch[key]
            if not np.array_equal(value.astype(array.dtype), value):
                raise BertJaxError(f"{key}: values do not fit the storage dtype {array.dtype}")
            array[step] = value
    for array in arrays.values():
        array.flush()
    arrays.clear()  # close the memory maps before renaming
    for key in keys:
        os.replace(os.path.join(output_dir, f"{key}.npy.tmp"),  # local: staging
                   os.path.join(output_dir, f"{key}.npy"))
    manifest = {
        "steps": steps, "batch_size": batch_size, "seq_len": seq,
        "max_predictions": max_predictions, "seed": seed, "whole_word": whole_word,
        "span_masking": span_masking, "masking": masking, "mask_rate": mask_rate,
        "mask_token_fraction": mask_token_fraction,
        "random_token_fraction": random_token_fraction,
        **({"span_p": span_p, "max_span": max_span} if masking == "span" else {}),
        **({"basic_fraction": basic_fraction} if masking == "knowledge" else {}),
        "shuffle_buffer": shuffle_buffer, "split": split, "mode": meta.mode,
        "pairing": pairing or ("nsp" if meta.format == "documents" else "static"),
        "short_seq_prob": short_seq_prob,
        "data_dir": storage.abspath(data_dir),
        "tokenizer": meta.raw["tokenizer"],
        "packed": bool(k),
        **({"max_examples_per_row": k} if k else {}),
        "keys": {key: {"dtype": dtype, "storage_dtype": on_disk[key],
                       "shape": [steps, batch_size, *shapes[key]]}
                 for key, dtype in keys.items()},
        "next_state": iterator.state(),
    }
    fileio.atomic_write_json(storage.join(output_dir, MANIFEST_JSON), manifest, sort_keys=False)
    return manifest


def load_manifest(directory: str) -> dict[str, Any]:
    """``directory``'s manifest.json; a missing or unreadable one is an error naming it."""
    path = storage.join(directory, MANIFEST_JSON)
    if not storage.exists(path):
        raise BertJaxError(f"{path}: not found (run `bert-jax materialize-batches` first)")
    try:
        return json.loads(storage.read_text(path))
    except (OSError, ValueError) as e:
        raise BertJaxError(f"{path}: not a readable manifest ({e})") from None


def examples_per_row(manifest: dict[str, Any]) -> int:
    """Example slots per row of materialized packed batches (the width of their
    ``cls_positions``), 0 for unpacked ones."""
    spec = manifest.get("keys", {}).get("cls_positions")
    return int(spec["shape"][-1]) if spec else 0


class MaterializedBatches(Iterator[dict[str, np.ndarray]]):
    """Reads materialized batches (numpy only); host ``process_index`` gets rows
    ``[i*B/n, (i+1)*B/n)`` of every global batch. ``repeat=True`` cycles back to step 0 (the
    same masks again) instead of stopping after the last step."""

    def __init__(self, directory: str, start_step: int = 0, process_index: int = 0,
                 process_count: int = 1, repeat: bool = False):
        path = storage.join(directory, MANIFEST_JSON)
        self.manifest = load_manifest(directory)
        global_batch = self.manifest["batch_size"]
        if not 0 <= process_index < process_count or global_batch % process_count:
            raise BertJaxError(f"{path}: batch_size {global_batch} cannot be split over "
                               f"process {process_index} of {process_count}")
        self.steps = int(self.manifest["steps"])
        if not 0 <= start_step <= self.steps and not repeat:
            raise BertJaxError(f"{path}: start_step {start_step} outside [0, {self.steps}]")
        self._arrays, self._dtypes = {}, {}
        for key, spec in self.manifest["keys"].items():
            array = np.load(storage.join(storage.localize(directory), f"{key}.npy"),
                            mmap_mode="r")
            stored = spec.get("storage_dtype", spec["dtype"])
            if list(array.shape) != spec["shape"] or str(array.dtype) != stored:
                raise BertJaxError(f"{directory}/{key}.npy: shape {array.shape} {array.dtype}, "
                                   f"manifest says {spec['shape']} {stored}")
            self._arrays[key] = array
            self._dtypes[key] = np.dtype(spec["dtype"])
        per_host = global_batch // process_count
        self._rows = slice(process_index * per_host, (process_index + 1) * per_host)
        self.step = start_step
        self.repeat = repeat
        self.process_index, self.process_count = process_index, process_count

    def state(self) -> dict[str, Any]:
        return {"step": self.step, "process_index": self.process_index,
                "process_count": self.process_count}

    def __len__(self) -> int:
        return self.steps

    def __next__(self) -> dict[str, np.ndarray]:
        if self.step >= self.steps and not self.repeat:
            raise StopIteration
        index = self.step % self.steps
        batch = {k: np.asarray(a[index, self._rows], dtype=self._dtypes[k])
                 for k, a in self._arrays.items()}
        self.step += 1
        return batch
