"""Checksum manifests for saved checkpoints, and the check that a restore can trust them.

A complete checkpoint directory (a training step ``checkpoints/<step>/`` or a model's
``params/``) carries ``sha256.json``: size and SHA-256 of every other file in it, written
last and atomically. :func:`verify` re-hashes the files and raises :class:`DamagedCheckpoint`
naming the first file that is missing, short or different. A directory without a manifest
(written before manifests existed, or killed between the save and its manifest) is
*unverified*: callers restore it and treat any failure as damage.
"""

from __future__ import annotations

import json

from bert_jax import storage
from bert_jax.errors import BertJaxError
from bert_jax.fileio import atomic_write_json

MANIFEST = "sha256.json"


class DamagedCheckpoint(BertJaxError):
    """A checkpoint file is missing, truncated or altered since it was saved."""


def _entries(directory: str) -> dict[str, dict]:
    """What the manifest records of each file: size and SHA-256 on local disk; in a bucket
    size and the server's CRC32C (objects are immutable and checksummed by the server, so a
    listing proves them without downloading the checkpoint again)."""
    files = storage.files_with_info(directory)
    files.pop(MANIFEST, None)
    if storage.is_remote(directory):
        return files
    return {rel: {"size": info["size"], "sha256": storage.sha256(storage.join(directory, rel))}
            for rel, info in files.items()}


def write_manifest(directory: str) -> str:
    """Records every file under ``directory`` in ``directory/sha256.json``."""
    return atomic_write_json(storage.join(directory, MANIFEST), {"files": _entries(directory)})


def has_manifest(directory: str) -> bool:
    return storage.isfile(storage.join(directory, MANIFEST))


def verify(directory: str) -> bool:
    """True if the manifest matches, False if there is none; DamagedCheckpoint otherwise."""
    path = storage.join(directory, MANIFEST)
    if not storage.isfile(path):
        return False
    try:
        entries = json.loads(storage.read_text(path))["files"]
        items = [(rel, int(e["size"]), e.get("sha256"), e.get("crc32c"))
                 for rel, e in entries.items()]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        raise DamagedCheckpoint(f"{path}: damaged checksum manifest") from None
    found = storage.files_with_info(directory)
    for rel, size, digest, crc in items:
        file = storage.join(directory, rel)
        if rel not in found:
            raise DamagedCheckpoint(f"{file}: missing (listed in {MANIFEST})")
        actual = found[rel]["size"]
        if actual != size:
            raise DamagedCheckpoint(f"{file}: {actual} bytes, {size} when saved (truncated or "
                                    "overwritten)")
        if (crc is not None and found[rel].get("crc32c") != crc) or (
                digest is not None and storage.sha256(file) != digest):
            raise DamagedCheckpoint(f"{file}: contents differ from when saved (checksum "
                                    "mismatch)")
    return True


def describe_failure(directory: str, error: BaseException) -> str:
    """One line for a restore that raised: the damaged file where the error names one."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    if isinstance(error, BertJaxError):
        return text
    return f"{directory}: cannot be read ({type(error).__name__}: {text[:300]})"
