"""A data directory written whole or not at all.

``create-pretraining-data`` writes into a staging directory; :func:`staged_data_directory`
records each shard's size in ``metadata.json`` (so a later truncation is caught when the
data is loaded) and swaps the staging directory in for the output directory only when the
run completed. The output directory must be new or hold only earlier pretraining data: a
directory with other files (a corpus, a checkpoint) is refused rather than replaced.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator

from bert_jax import fileio, storage
from bert_jax.data.metadata import METADATA_JSON, write_metadata
from bert_jax.errors import BertJaxError

_DATA_SUFFIXES = (".tfrecord", ".tfrecord.gz", METADATA_JSON)


def _check_replaceable(output_dir: str) -> None:
    fileio.check_output_path(output_dir, directory=True)
    if not storage.isdir(output_dir):
        return
    others = sorted(name for name in storage.listdir(output_dir)
                    if not name.startswith(".") and not name.endswith(_DATA_SUFFIXES))
    if others:
        raise BertJaxError(f"--output-dir {output_dir}: holds files that are not pretraining "
                           f"data ({', '.join(others[:3])}{' ...' if len(others) > 3 else ''}); "
                           "choose an empty or new directory")


def _record_sizes(directory: str) -> None:
    path = storage.join(directory, METADATA_JSON)
    metadata = json.loads(storage.read_text(path))
    for split in metadata.get("splits", {}).values():
        for shard in split.get("shards", []):
            shard["bytes"] = storage.getsize(storage.join(directory, shard["file"]))
    write_metadata(directory, metadata)


@contextlib.contextmanager
def staged_data_directory(output_dir: str) -> Iterator[str]:
    """``with staged_data_directory(out) as staging:`` write shards + metadata.json into
    ``staging``; on success they replace ``out`` at once, on failure ``out`` is untouched."""
    output_dir = storage.abspath(output_dir)
    _check_replaceable(output_dir)
    with fileio.replace_directory(output_dir, marker=METADATA_JSON) as staging:
        yield staging
        if storage.exists(storage.join(staging, METADATA_JSON)):
            _record_sizes(staging)
