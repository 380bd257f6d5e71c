"""What the analysis commands share: loading any checkpoint as an encoder, reading texts from
a text or TSV file, fixed-shape batches, and matplotlib (imported only when plotting)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from bert_jax import storage
from bert_jax.errors import BertJaxError


def load_encoder(path: str):
    """(encoder params ``{"bert": ...}`` in the config's layout, config, tokenizer) of a
    bert-jax model dir / workdir or a Hugging Face directory."""
    from bert_jax.checkpoint.detect import load_checkpoint
    from bert_jax.modeling.params import to_layout

    if not storage.exists(path):
        raise BertJaxError(f"{path}: no such checkpoint")
    params, config, tokenizer, _ = load_checkpoint(path)
    if tokenizer is None:
        raise BertJaxError(f"{path}: checkpoint has no tokenizer; the analysis needs the "
                           "tokenizer the model was trained with")
    if "bert" not in params:
        raise BertJaxError(f"{path}: checkpoint has no encoder ('bert' subtree)")
    return to_layout(params, config), config, tokenizer


def read_texts(path: str, text_column: str | None = None, pair_column: str | None = None,
               limit: int = 0) -> list[tuple[str, str | None]]:
    """(text, pair-or-None) per non-blank line of a text file, or per row of a TSV when
    ``text_column`` is given (a header name, or a 0-based index for headerless files)."""
    if not storage.isfile(path):
        raise BertJaxError(f"{path}: input file not found")
    out: list[tuple[str, str | None]] = []
    if text_column is None:
        out = [(line, None) for line in storage.read_text(path).splitlines() if line.strip()]
    else:
        from bert_jax.tasks.tsv import read_tsv_lines

        rows = read_tsv_lines(path)
        columns = [c for c in (text_column, pair_column) if c is not None]
        if all(c.isdigit() for c in columns):
            index = [int(c) for c in columns]
        else:
            first = next(rows, None)
            if first is None:
                raise BertJaxError(f"{path}: empty file")
            header = first[1]
            missing = [c for c in columns if c not in header]
            if missing:
                raise BertJaxError(f"{path}:1: no column {missing[0]!r}; the header has "
                                   f"{header}")
            index = [header.index(c) for c in columns]
        for number, fields in rows:
            if fields == [""]:
                continue
            if max(index) >= len(fields):
                raise BertJaxError(f"{path}:{number}: {len(fields)} columns, no column "
                                   f"{max(index)}")
            out.append((fields[index[0]], fields[index[1]] if len(index) > 1 else None))
    if limit:
        out = out[:limit]
    if not out:
        raise BertJaxError(f"{path}: no texts")
    return out


def padded_batches(rows: Sequence[Sequence[int]], batch_size: int, length: int, pad_id: int,
                   segments: Sequence[Sequence[int]] | None = None
                   ) -> Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray]]:
    """(start, ids, mask, segment ids) in one fixed shape [batch_size, length]; the last batch
    is filled with all-padding rows (mask 0)."""
    for start in range(0, len(rows), batch_size):
        ids = np.full((batch_size, length), pad_id, np.int32)
        mask = np.zeros((batch_size, length), np.int32)
        segs = np.zeros((batch_size, length), np.int32)
        for i, row in enumerate(rows[start:start + batch_size]):
            ids[i, :len(row)] = row
            mask[i, :len(row)] = 1
            if segments is not None:
                segs[i, :len(row)] = segments[start + i]
        yield start, ids, mask, segs


def bucket_length(longest: int, limit: int, multiple: int = 8) -> int:
    """The padded length: the longest row rounded up to ``multiple``, at most ``limit``."""
    return min(limit, -(-longest // multiple) * multiple)


def pyplot():
    """matplotlib.pyplot with a file-only backend, or a clear error when it is missing."""
    try:
        import matplotlib
    except ImportError:
        raise BertJaxError("plots need matplotlib: pip install 'bert-jax[analysis]' (or pip "
                           "install matplotlib)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def progress(iterable, total: int, desc: str):
    """A tqdm progress bar on stderr (plain iteration when tqdm is missing)."""
    try:
        from tqdm import tqdm
    except ImportError:
        return iterable
    return tqdm(iterable, total=total, desc=desc, unit="batch")
