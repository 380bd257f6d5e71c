"""Phrase and entity annotations for ERNIE-style knowledge masking (Sun et al. 2019).

ERNIE masks phrases and named entities as whole units. The units are found when pretraining
data is created and stored with each example as ``unit_ids`` (int64 per token: 0 outside
any unit, 1, 2, ... numbering the units of the example); the tf.data pipeline then masks them
dynamically (``bert_jax.data.masking`` with ``knowledge``).

Where units come from:

* a lexicon file the user passes (``--knowledge-lexicon FILE``: one entity or phrase per line,
  ``#`` starts a comment), and
* a built-in fallback found in each work unit's raw text: runs of two or more capitalised
  words (entity candidates; ERNIE used a named-entity tagger) and word n-grams (n = 2..3)
  that occur at least ``min_count`` times and are not made of stop words only (phrase
  candidates; ERNIE used a chunker).

Every unit is tokenized once and matched on token ids, longest first, starting and ending on
word boundaries, so a unit never cuts a word.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Iterable, Sequence

import numpy as np

from bert_jax import storage
from bert_jax.errors import BertJaxError

_WORD = re.compile(r"[A-Za-z][A-Za-z'-]*")
_STOP_WORDS = frozenset(
    "a an the of to in on at by for with from and or but is are was were be been it its this "
    "that these those as not no so if then than he she they we you i his her their our your "
    "my me him them us had has have do did does will would can could shall should may might "
    "must there here which who whom what when where why how all any each some such into out "
    "up down over under again very just also only own same too".split())


def load_lexicon(path: str) -> list[str]:
    """Entities/phrases of a lexicon file, one per line (blank lines and ``#`` comments
    skipped); a line with fewer than one word is an error naming the line."""
    try:
        lines = storage.read_text(path).splitlines()
    except OSError as e:
        raise BertJaxError(f"--knowledge-lexicon {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise BertJaxError(f"--knowledge-lexicon {path}: not UTF-8 text") from None
    entries = []
    for number, line in enumerate(lines, 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        if not any(ch.isalnum() for ch in line):
            raise BertJaxError(f"{path}:{number}: {line!r} has no word")
        entries.append(line)
    if not entries:
        raise BertJaxError(f"--knowledge-lexicon {path}: no entries")
    return entries


def discover_units(sentences: Iterable[str], min_count: int = 3, max_n: int = 3,
                   max_phrases: int = 2000) -> list[str]:
    """The built-in fallback: capitalised multi-word spans and frequent word n-grams."""
    entities: set[str] = set()
    ngrams: collections.Counter = collections.Counter()
    for sentence in sentences:
        words = _WORD.findall(sentence)
        run: list[str] = []
        for i, word in enumerate(words + [""]):
            # The sentence's first word is capitalised anyway: it may end a run, not start one.
            if word[:1].isupper() and i > 0:
                run.append(word)
                continue
            if len(run) >= 2:
                entities.add(" ".join(run))
            run = []
        lower = [w.lower() for w in words]
        for n in range(2, max_n + 1):
            for i in range(len(lower) - n + 1):
                gram = lower[i:i + n]
                if all(w in _STOP_WORDS for w in gram) or gram[0] in _STOP_WORDS \
                        or gram[-1] in _STOP_WORDS:
                    continue
                ngrams[" ".join(gram)] += 1
    phrases = [g for g, c in ngrams.most_common(max_phrases) if c >= min_count]
    return sorted(entities) + phrases


class UnitMatcher:
    """Greedy longest-match of tokenized units over example token ids (a trie on ids)."""

    def __init__(self, unit_token_ids: Iterable[Sequence[int]], word_start: np.ndarray):
        self._word_start = np.asarray(word_start, bool)
        self._trie: dict = {}
        self.num_units = 0
        for ids in unit_token_ids:
            if len(ids) < 2 or not self._word_start[ids[0]]:
                continue  # a single token is already a basic unit; a unit starts a word
            node = self._trie
            for token in ids:
                node = node.setdefault(int(token), {})
            if "$" not in node:
                node["$"] = True
                self.num_units += 1

    def annotate(self, ids: Sequence[int]) -> list[int]:
        """unit_ids for one example: 0 outside units, 1, 2, ... for each matched unit."""
        unit_ids = [0] * len(ids)
        n, i, next_id = len(ids), 0, 1
        while i < n:
            end, node, j = -1, self._trie, i
            if self._word_start[ids[i]] if ids[i] < len(self._word_start) else False:
                while j < n and ids[j] in node:
                    node = node[ids[j]]
                    j += 1
                    at_boundary = j == n or ids[j] >= len(self._word_start) \
                        or self._word_start[ids[j]]
                    if "$" in node and at_boundary:
                        end = j
            if end > 0:
                unit_ids[i:end] = [next_id] * (end - i)
                next_id += 1
                i = end
            else:
                i += 1
        return unit_ids
