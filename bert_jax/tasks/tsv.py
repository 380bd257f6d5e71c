"""Reading GLUE-style TSV files exactly as distributed.

GLUE files are read with no quoting at all (``csv.QUOTE_NONE``): RTE, QNLI, MNLI and others contain
stray double quotes that a quoting reader would treat as field delimiters, silently merging rows.
Splitting each ``\\n``-terminated line on tabs is that behaviour, and keeps line numbers exact for
error messages. A UTF-8 byte-order mark (MRPC) is dropped.
"""

from __future__ import annotations

from collections.abc import Iterator

from bert_jax.textio import read_text


def read_tsv_lines(path: str) -> Iterator[tuple[int, list[str]]]:
    """Yields (1-based line number, tab-separated fields) for each non-final line of ``path``."""
    text = read_text(path)
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    for number, line in enumerate(lines, start=1):
        if line.endswith("\r"):
            line = line[:-1]
        yield number, line.split("\t")
