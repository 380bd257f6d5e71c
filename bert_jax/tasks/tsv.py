"""Reading GLUE-style TSV files exactly as distributed.

GLUE files are read with no quoting at all (``csv.QUOTE_NONE``): RTE, QNLI, MNLI and others contain
stray double quotes that a quoting reader would treat as field delimiters, silently merging rows.
Splitting each ``\\n``-terminated line on tabs is that behaviour, and keeps line numbers exact for
error messages. A UTF-8 byte-order mark (MRPC) is dropped.
"""

from __future__ import annotations

from collections.abc import Iterator

from bert_jax.errors import BertJaxError
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


def read_tsv_header(path: str, empty: str = "empty file"
                    ) -> tuple[list[str], Iterator[tuple[int, list[str]]]]:
    """(the fields of line 1, the lines after it as :func:`read_tsv_lines` yields them); a file
    without lines is a BertJaxError ``<path>: <empty>``."""
    lines = read_tsv_lines(path)
    first = next(lines, None)
    if first is None:
        raise BertJaxError(f"{path}: {empty}")
    return first[1], lines


def column_count_problem(header: list[str], fields: list[str]) -> str | None:
    """What is wrong with a row whose fields do not match the header's columns, or None."""
    if len(fields) == len(header):
        return None
    return (f"expected {len(header)} tab-separated columns as in the header, found "
            f"{len(fields)}")
