"""Which files of a corpus directory are text to train on.

Directories are walked recursively in sorted order; hidden entries are skipped, and so are
the files that describe a corpus rather than belong to it (README, LICENSE, MANIFEST, ...):
they are counted and named so the caller can report them. A file given by name is always
used, whatever it is called.
"""

from __future__ import annotations

import dataclasses

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
    files, skipped = [], []
    for path in paths:
        if storage.isfile(path):
            files.append(path)
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
    return CorpusFiles(files, skipped)
