"""The prepared data of ``python -m bench variants``: made on a machine with tensorflow, read on
one without.

``python -m bench variants --prepare-only DIR`` materializes, for every (data kind, masking)
pair the variants train on, the pipeline's first N batches (``bert-jax materialize-batches``:
every batch masked afresh, as a live run masks it); :func:`pack` and :func:`write_archive` put
them with the tokenizer and the GLUE files into ``DIR/variants_prep.tar.xz`` beside
``DIR/prepared.json``. :func:`unpack` rebuilds the materialized batch folders
(``data.source=materialized``) with numpy alone.

The archive stores only what cannot be derived. Maskings of one data kind read the same
examples in the same order (the shuffle does not depend on the masking), so the unmasked ids,
input mask, segments and labels are stored once per kind; each masking adds its positions,
weights and what the masked input holds at those positions ([MASK], a random id or the
original). ``masked_lm_ids`` (the originals at the positions) and the masked ``input_ids``
are rebuilt from these; packing checks that the rebuilt batches equal the pipeline's.

  variants_prep.tar.xz
    tokenizer/                        the SentencePiece tokenizer the data was made with
    glue/<TASK>/train.tsv             the files the fine-tuning reads
    kinds/<kind>/KEY.npy              input_ids (unmasked), input_mask, segment_ids,
                                      next_sentence_labels: [N, B, ...]
    batches/<kind>_<masking>/         masked_lm_positions, masked_lm_weights, masked_inputs
                                      ([N, B, P]) and the batches' manifest.json
"""

from __future__ import annotations

import json
import os
import shutil
import tarfile
import time

import numpy as np

ARCHIVE = "variants_prep.tar.xz"
PREPARED_JSON = "prepared.json"
SHARED_KEYS = ("input_mask", "segment_ids", "next_sentence_labels")
MASK_KEYS = ("masked_lm_positions", "masked_lm_weights")


def combo_name(kind: str, masking: str) -> str:
    return f"{kind}_{masking}"


def unmasked_ids(batches: dict[str, np.ndarray]) -> np.ndarray:
    """The input ids before masking: the originals written back at the predicted positions."""
    ids = batches["input_ids"].astype(np.int64)
    positions = batches["masked_lm_positions"].astype(np.int64)
    values = np.where(batches["masked_lm_weights"] > 0, batches["masked_lm_ids"],
                      np.take_along_axis(ids, positions, axis=-1))
    np.put_along_axis(ids, positions, values, axis=-1)
    return ids


def rebuild(ids: np.ndarray, masks: dict[str, np.ndarray], dtypes: dict[str, str]
            ) -> dict[str, np.ndarray]:
    """A masking's ``input_ids`` and ``masked_lm_ids`` from the unmasked ``ids`` and its
    positions, weights and masked inputs."""
    positions = masks["masked_lm_positions"].astype(np.int64)
    masked = ids.astype(np.int64)
    np.put_along_axis(masked, positions, masks["masked_inputs"].astype(np.int64), axis=-1)
    labels = np.where(masks["masked_lm_weights"] > 0,
                      np.take_along_axis(ids.astype(np.int64), positions, axis=-1), 0)
    return {"input_ids": masked.astype(dtypes["input_ids"]),
            "masked_lm_ids": labels.astype(dtypes["masked_lm_ids"])}


def _load(directory: str) -> dict[str, np.ndarray]:
    with open(os.path.join(directory, "manifest.json"), encoding="utf-8") as f:
        keys = json.load(f)["keys"]
    return {k: np.load(os.path.join(directory, f"{k}.npy")) for k in keys}


def _storage_dtypes(directory: str) -> dict[str, str]:
    with open(os.path.join(directory, "manifest.json"), encoding="utf-8") as f:
        keys = json.load(f)["keys"]
    return {k: spec.get("storage_dtype", spec["dtype"]) for k, spec in keys.items()}


def pack(stage: str, materialized: dict[str, str], kinds: dict[str, str]) -> None:
    """Writes ``stage``/kinds and ``stage``/batches from the materialized folders
    (combination -> folder; ``kinds``: combination -> data kind), checking that every
    combination's batches rebuild exactly from what is stored."""
    shared: dict[str, dict[str, np.ndarray]] = {}
    for combo, directory in sorted(materialized.items()):
        kind = kinds[combo]
        batches = _load(directory)
        ids = unmasked_ids(batches).astype(batches["input_ids"].dtype)
        mine = {"input_ids": ids, **{k: batches[k] for k in SHARED_KEYS}}
        if kind not in shared:
            shared[kind] = mine
            out = os.path.join(stage, "kinds", kind)
            os.makedirs(out, exist_ok=True)
            for key, value in mine.items():
                np.save(os.path.join(out, f"{key}.npy"), value)
        for key, value in mine.items():
            if not np.array_equal(value, shared[kind][key]):
                raise SystemExit(f"{directory}: {key} differs from the other maskings of the "
                                 f"{kind} data (the pipeline order must not depend on masking)")
        positions = batches["masked_lm_positions"].astype(np.int64)
        masks = {k: batches[k] for k in MASK_KEYS}
        masks["masked_inputs"] = np.take_along_axis(
            batches["input_ids"], positions, axis=-1).astype(batches["input_ids"].dtype)
        rebuilt = rebuild(shared[kind]["input_ids"], masks, _storage_dtypes(directory))
        for key, value in rebuilt.items():
            if not np.array_equal(value, batches[key]):
                raise SystemExit(f"{directory}: {key} does not rebuild from the stored masks")
        out = os.path.join(stage, "batches", combo)
        os.makedirs(out, exist_ok=True)
        for key, value in masks.items():
            np.save(os.path.join(out, f"{key}.npy"), value)
        shutil.copy(os.path.join(directory, "manifest.json"), out)


def write_archive(stage: str, folder: str, prepared: dict) -> dict:
    """``folder``/variants_prep.tar.xz of ``stage`` and ``folder``/prepared.json; returns
    prepared.json's contents (with the archive's size)."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, ARCHIVE)
    tmp = path + ".tmp"
    started = time.perf_counter()
    with tarfile.open(tmp, "w:xz", preset=9) as tar:
        for name in sorted(os.listdir(stage)):
            tar.add(os.path.join(stage, name), arcname=name)
    os.replace(tmp, path)
    raw = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(stage) for f in fs)
    prepared = {**prepared, "archive_bytes": os.path.getsize(path), "unpacked_bytes": raw,
                "pack_seconds": round(time.perf_counter() - started, 1)}
    with open(os.path.join(folder, PREPARED_JSON), "w", encoding="utf-8") as f:
        json.dump(prepared, f, indent=2)
    return prepared


def read_prepared(folder: str) -> dict:
    path = os.path.join(folder, PREPARED_JSON)
    if not os.path.exists(path) or not os.path.exists(os.path.join(folder, ARCHIVE)):
        raise SystemExit(f"--prepared {folder}: no {PREPARED_JSON} and {ARCHIVE} there (make "
                         "them with --prepare-only on a machine with tensorflow)")
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def unpack(folder: str, target: str) -> dict[str, str]:
    """Extracts the archive into ``target`` and rebuilds every combination's materialized
    batches; returns {"tokenizer": dir, "glue": dir, combination: batches dir}. Reuses a
    complete earlier unpacking of the same archive."""
    prepared = read_prepared(folder)
    done = os.path.join(target, "unpacked.json")
    paths = {"tokenizer": os.path.join(target, "tokenizer"),
             "glue": os.path.join(target, "glue"),
             **{c: os.path.join(target, "materialized", c) for c in prepared["combos"]}}
    if os.path.exists(done):
        with open(done, encoding="utf-8") as f:
            if json.load(f).get("archive_bytes") == prepared["archive_bytes"]:
                return paths
    shutil.rmtree(target, ignore_errors=True)
    os.makedirs(target)
    with tarfile.open(os.path.join(folder, ARCHIVE), "r:xz") as tar:
        tar.extractall(target, filter="data")
    for combo, spec in prepared["combos"].items():
        kind_dir = os.path.join(target, "kinds", spec["kind"])
        mask_dir = os.path.join(target, "batches", combo)
        ids = np.load(os.path.join(kind_dir, "input_ids.npy"))
        masks = {k: np.load(os.path.join(mask_dir, f"{k}.npy"))
                 for k in (*MASK_KEYS, "masked_inputs")}
        out = paths[combo]
        os.makedirs(out)
        for key, value in rebuild(ids, masks, _storage_dtypes(mask_dir)).items():
            np.save(os.path.join(out, f"{key}.npy"), value)
        for key in SHARED_KEYS:
            shutil.copy(os.path.join(kind_dir, f"{key}.npy"), out)
        for key in MASK_KEYS:
            np.save(os.path.join(out, f"{key}.npy"), masks[key])
        shutil.copy(os.path.join(mask_dir, "manifest.json"), out)
    with open(done, "w", encoding="utf-8") as f:
        json.dump({"archive_bytes": prepared["archive_bytes"]}, f)
    return paths
