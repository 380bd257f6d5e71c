"""Checksum manifests for saved checkpoints, and the check that a restore can trust them.

A complete checkpoint directory (a training step ``checkpoints/<step>/`` or a model's
``params/``) carries ``sha256.json``: size and SHA-256 of every other file in it, written
last and atomically. :func:`verify` re-hashes the files and raises :class:`DamagedCheckpoint`
naming the first file that is missing, short or different. A directory without a manifest
(written before manifests existed, or killed between the save and its manifest) is
*unverified*: callers restore it and treat any failure as damage.
"""

from __future__ import annotations

import hashlib
import json
import os

from bert_jax.errors import BertJaxError
from bert_jax.fileio import atomic_write_json

MANIFEST = "sha256.json"
_CHUNK = 1 << 22


class DamagedCheckpoint(BertJaxError):
    """A checkpoint file is missing, truncated or altered since it was saved."""


def _files(directory: str) -> list[str]:
    out = []
    for root, dirs, files in os.walk(directory):
        dirs.sort()
        for name in sorted(files):
            rel = os.path.relpath(os.path.join(root, name), directory)
            if rel != MANIFEST:
                out.append(rel)
    return out


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def write_manifest(directory: str) -> str:
    """Hashes every file under ``directory`` into ``directory/sha256.json``."""
    entries = {}
    for rel in _files(directory):
        path = os.path.join(directory, rel)
        entries[rel] = {"size": os.path.getsize(path), "sha256": _sha256(path)}
    return atomic_write_json(os.path.join(directory, MANIFEST), {"files": entries})


def has_manifest(directory: str) -> bool:
    return os.path.isfile(os.path.join(directory, MANIFEST))


def verify(directory: str) -> bool:
    """True if the manifest matches, False if there is none; DamagedCheckpoint otherwise."""
    path = os.path.join(directory, MANIFEST)
    if not os.path.isfile(path):
        return False
    try:
        with open(path, encoding="utf-8") as f:
            entries = json.load(f)["files"]
        items = [(rel, int(e["size"]), str(e["sha256"])) for rel, e in entries.items()]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        raise DamagedCheckpoint(f"{path}: damaged checksum manifest") from None
    for rel, size, digest in items:
        file = os.path.join(directory, rel)
        if not os.path.isfile(file):
            raise DamagedCheckpoint(f"{file}: missing (listed in {MANIFEST})")
        actual = os.path.getsize(file)
        if actual != size:
            raise DamagedCheckpoint(f"{file}: {actual} bytes, {size} when saved (truncated or "
                                    "overwritten)")
        if _sha256(file) != digest:
            raise DamagedCheckpoint(f"{file}: contents differ from when saved (checksum "
                                    "mismatch)")
    return True


def describe_failure(directory: str, error: BaseException) -> str:
    """One line for a restore that raised: the damaged file where the error names one."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    if isinstance(error, BertJaxError):
        return text
    return f"{directory}: cannot be read ({type(error).__name__}: {text[:300]})"
