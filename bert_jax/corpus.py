"""Which files of a corpus directory are text to train on.

Directories are walked recursively in sorted order; hidden entries are skipped, and so are
the files that describe a corpus rather than belong to it (README, LICENSE, MANIFEST, ...):
they are counted and named so the caller can report them. A file given by name is always
used, whatever it is called.

Every command that reads a corpus (``create-pretraining-data``, ``train-tokenizer``) takes only
UTF-8 text (:func:`select_text_files`): a file with a NUL byte (binary) or a byte sequence that
is not UTF-8 (another encoding) is not text. Given by name, it is an error naming the file and
the byte offset; found in a directory, it is skipped, named on one warning line and counted,
as long as such files are a minority of the files found; otherwise it is an error.
"""

from __future__ import annotations

import codecs
import dataclasses
import sys

from bert_jax import storage
from bert_jax.errors import BertJaxError

# Names (before the first dot, case-insensitive) of files that describe a corpus.
META_FILE_STEMS = frozenset({
    "readme", "license", "licence", "copying", "manifest", "notice", "changelog", "changes",
    "authors", "contributors", "contributing", "citation", "checksums", "md5sums", "sha256sums",
})


def is_meta_file(name: str) -> bool:
    """README.md, LICENSE, MANIFEST.in, COPYING.txt, ... (not readme_notes.txt)."""
    return name.split(".", 1)[0].lower() in META_FILE_STEMS


@dataclasses.dataclass
class CorpusFiles:
    files: list[str]
    skipped: list[str]  # README/LICENSE-like files found in directories
    given: frozenset[str] = frozenset()  # the files named directly (not found in a directory)

    def skipped_note(self) -> str:
        """'' or one line naming what was left out."""
        if not self.skipped:
            return ""
        names = ", ".join(sorted({storage.basename(p) for p in self.skipped}))
        return (f"skipped {len(self.skipped)} README/LICENSE-like file"
                f"{'s' if len(self.skipped) != 1 else ''} in the input directories ({names}); "
                "name a file explicitly to use it")


def list_corpus_files(paths: list[str]) -> CorpusFiles:
    """Files given directly plus the text files under given directories."""
    files, skipped, given = [], [], set()
    for path in paths:
        if storage.isfile(path):
            files.append(path)
            given.add(path)
        elif storage.isdir(path):
            for root, dirs, names in storage.walk(path):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                for name in sorted(names):
                    if name.startswith("."):
                        continue
                    (skipped if is_meta_file(name) else files).append(storage.join(root, name))
        else:
            raise BertJaxError(f"--input {path}: no such file or directory")
    if not files:
        raise BertJaxError(f"--input {' '.join(paths)}: no text files found"
                           + (f" ({len(skipped)} README/LICENSE-like skipped)" if skipped else ""))
    return CorpusFiles(files, skipped, frozenset(given))


def text_problem(path: str, block_size: int = 1 << 20) -> str | None:
    """None if ``path`` is UTF-8 text; otherwise why not, naming the byte offset (one
    streaming pass: a NUL byte means binary, an undecodable sequence another encoding)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset, lines = 0, 0
    with storage.open_read(path, block_size=block_size) as f:
        while True:
            block = f.read(block_size)
            final = not block
            nul = block.find(b"\0")
            if nul >= 0:
                return f"not utf-8 text (binary: NUL byte at offset {offset + nul})"
            pending = len(decoder.getstate()[0])
            try:
                decoder.decode(block, final=final)
            except UnicodeDecodeError as e:
                start = max(0, e.start - pending)
                line = lines + block.count(b"\n", 0, start) + 1
                return (f"not utf-8 text (byte offset {offset - pending + e.start}, line {line}: "
                        f"{e.reason})")
            if final:
                return None
            offset += len(block)
            lines += block.count(b"\n")


def select_text_files(corpus: CorpusFiles) -> tuple[list[str], list[str]]:
    """(the text files of ``corpus``, the files found in directories that are not text).

    A file given by name that is not text raises BertJaxError; each one found in a directory
    is named on a warning line and left out, unless they are not a minority of the files
    found (then BertJaxError: the input is probably not the corpus meant)."""
    text, not_text = [], []
    for path in corpus.files:
        problem = text_problem(path)
        if problem is None:
            text.append(path)
        elif path in corpus.given:
            raise BertJaxError(f"{path}: {problem}")
        else:
            not_text.append(path)
            print(f"warning: skipped {path}: {problem}", file=sys.stderr, flush=True)
    if not_text and len(not_text) * 2 >= len(corpus.files):
        raise BertJaxError(
            f"--input: {len(not_text)} of {len(corpus.files)} files found are not utf-8 text "
            f"(first: {not_text[0]}); convert them to UTF-8, or name the text files")
    return text, not_text
