"""Raw-text reading for pretraining: finding files, decoding, and splitting into documents.

Two layouts are understood:

* ``lines`` (BERT's format): one sentence per line, a blank line between documents.
* ``paragraphs``: ordinary prose (hard-wrapped or one paragraph per line); the wrapped lines of
  a paragraph are joined and split into sentences with a regular-expression splitter, and two
  or more blank lines in a row (chapter or article breaks) separate documents.

``auto`` decides per file from its first lines. Nothing is dropped silently: undecodable bytes
are replaced (and counted), and the caller counts documents it cannot use.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys

from bert_jax import storage
from bert_jax.corpus import list_corpus_files, select_text_files
from bert_jax.errors import BertJaxError

INPUT_FORMATS = ("auto", "lines", "paragraphs")

# A sentence ends at . ! ? (optionally followed by closing quotes/brackets) before whitespace and
# an upper-case letter, digit or opening quote, unless the word before is a known abbreviation.
_ABBREVIATIONS = (
    "mr", "mrs", "ms", "dr", "prof", "st", "sr", "jr", "vs", "etc", "e.g", "i.e", "no", "fig",
    "gen", "col", "capt", "lt", "sgt", "rev", "hon", "inc", "ltd", "co", "corp", "mt", "jan",
    "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec", "u.s", "u.k",
)
_BOUNDARY = re.compile(r"""([.!?]+["'”’)\]]*)\s+(?=["'“‘(\[]?[A-Z0-9])""")
_LAST_WORD = re.compile(r"(\S+)$")


@dataclasses.dataclass
class TextFile:
    """One decoded input file."""

    path: str
    text: str
    bytes: int
    replaced_chars: int  # U+FFFD inserted for undecodable bytes


def list_input_files(inputs: list[str]) -> list[str]:
    """Expands files and directories to a sorted list (recursively; hidden and
    README/LICENSE-like files in directories skipped, and the latter reported on stderr)."""
    return list_text_input_files(inputs)[0]


def list_text_input_files(inputs: list[str]) -> tuple[list[str], int]:
    """(``list_input_files``, the number of files found in directories that are not UTF-8
    text and were skipped, each named on stderr; see ``bert_jax.corpus``)."""
    corpus = list_corpus_files(inputs)
    if corpus.skipped:
        print(corpus.skipped_note(), file=sys.stderr)
    files, not_text = select_text_files(corpus)
    return sorted(dict.fromkeys(storage.abspath(f) if storage.is_remote(f) else
                                os.path.normpath(f) for f in files)), len(not_text)


def read_text_file(path: str) -> TextFile:
    """Reads a file as UTF-8, replacing undecodable bytes with U+FFFD and counting them."""
    raw = storage.read_bytes(path)
    text = raw.decode("utf-8", errors="replace")
    # Only count replacements that decoding introduced, not U+FFFD already in the file.
    replaced = text.count("\ufffd") - raw.count("\ufffd".encode())
    if text.startswith("\ufeff"):
        text = text[1:]
    return TextFile(path, text, len(raw), replaced)


def split_sentences(paragraph: str) -> list[str]:
    """Splits prose into sentences at terminal punctuation, keeping abbreviations intact."""
    paragraph = " ".join(paragraph.split())
    sentences: list[str] = []
    start = 0
    for m in _BOUNDARY.finditer(paragraph):
        head = paragraph[start:m.start(1)]
        last = _LAST_WORD.search(head)
        word = last.group(1).lower().lstrip("\"'([“‘") if last else ""
        if m.group(1) == "." and (word in _ABBREVIATIONS or len(word) == 1 and word.isalpha()):
            continue
        sentences.append(paragraph[start:m.end(1)])
        start = m.end()
    tail = paragraph[start:].strip()
    if tail:
        sentences.append(tail)
    return sentences


def detect_format(text: str, sample_lines: int = 2000) -> str:
    """Guesses ``lines`` or ``paragraphs`` from the first non-blank lines of a file.

    Prose shows itself either by lines holding several sentences (one paragraph per line) or by
    hard wrapping (lines that end mid-sentence and continue on the next line).
    """
    lines = text.splitlines()[: sample_lines * 2]
    nonblank = [i for i, line in enumerate(lines) if line.strip()][:sample_lines]
    if not nonblank:
        return "lines"
    multi = sum(len(split_sentences(lines[i])) > 1 for i in nonblank)
    wrapped = sum(
        1 for i in nonblank
        if i + 1 < len(lines) and lines[i + 1].strip()
        and not re.search(r"""[.!?:;"'”’)\]]\s*$""", lines[i]))
    if multi > 0.2 * len(nonblank) or wrapped > 0.3 * len(nonblank):
        return "paragraphs"
    return "lines"


def split_documents(text: str, input_format: str) -> list[list[str]]:
    """Text -> documents, each a list of sentence strings.

    ``lines``: each non-blank line is a sentence, a blank line ends the document.
    ``paragraphs``: a blank line ends a paragraph (its lines are joined and split into
    sentences); two or more consecutive blank lines (chapter or article breaks) end the
    document, and a file without them is one document.
    """
    if input_format not in ("lines", "paragraphs"):
        raise BertJaxError(f"input format {input_format!r}: expected 'lines' or 'paragraphs'")
    documents: list[list[str]] = [[]]
    block: list[str] = []
    blank_run = 0
    for line in text.splitlines():
        line = line.strip()
        if not line:
            blank_run += 1
            if input_format == "lines":
                documents.append([])
            elif block:
                documents[-1].extend(split_sentences(" ".join(block)))
                block = []
            continue
        if input_format == "lines":
            documents[-1].append(line)
        else:
            if blank_run >= 2 and documents[-1]:
                documents.append([])
            block.append(line)
        blank_run = 0
    if block:
        documents[-1].extend(split_sentences(" ".join(block)))
    return [d for d in documents if d]
