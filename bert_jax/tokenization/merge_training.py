"""Vocabulary learning by pair merges, shared by the byte-level BPE trainer (``bpe.py``) and
the WordPiece trainer (``wordpiece_trainer.py``).

Words are counted once over the corpus (in worker processes: the pre-tokenizer is the slow
part), then the most frequent adjacent symbol pair is merged into a new symbol, again and
again, until the vocabulary is full or no pair occurs ``min_frequency`` times. Pair counts are
updated only around the merged positions of the words a merge touches (a word may stay
listed under a pair it lost; merging it then finds nothing), and the next pair comes from a
heap with stale entries skipped: one merge costs the words it changes, not the corpus.
Ties go to the lexicographically smallest pair, which makes training deterministic.
"""

from __future__ import annotations

import collections
import heapq
import multiprocessing
from collections.abc import Callable, Iterable, Iterator

from bert_jax.tokenization.sentencepiece import CorpusReport, iter_lines, list_text_files

_CHUNK_LINES = 4096
_worker_split: Callable[[str], Iterable[str]] | None = None


def _init_worker(split: Callable[[str], Iterable[str]]) -> None:
    global _worker_split
    _worker_split = split


def _count_chunk(lines: list[str]) -> collections.Counter:
    counts: collections.Counter = collections.Counter()
    for line in lines:
        counts.update(_worker_split(line))
    return counts


def _chunks(lines: Iterator[str], size: int) -> Iterator[list[str]]:
    chunk = []
    for line in lines:
        chunk.append(line)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def count_words(inputs: list[str], split: Callable[[str], Iterable[str]],
                num_workers: int = 1, max_line_bytes: int = 1 << 20
                ) -> tuple[collections.Counter, CorpusReport]:
    """Word counts of the text files/directories ``inputs`` with ``split`` (line -> words;
    a picklable module-level callable) run in ``num_workers`` processes."""
    report = CorpusReport()
    files = list_text_files(inputs, report)
    lines = iter_lines(files, report, max_line_bytes)
    counts: collections.Counter = collections.Counter()
    if num_workers <= 1:
        for line in lines:
            counts.update(split(line))
        return counts, report
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
    with ctx.Pool(num_workers, initializer=_init_worker, initargs=(split,)) as pool:
        for part in pool.imap_unordered(_count_chunk, _chunks(lines, _CHUNK_LINES)):
            counts.update(part)
    return counts, report


def learn_merges(words: dict[tuple[str, ...], int], max_merges: int,
                 join: Callable[[str, str], str], min_frequency: int = 2
                 ) -> list[tuple[str, str, str]]:
    """Greedy pair merges over ``words`` (symbol tuples -> counts): up to ``max_merges``
    (left, right, merged) triples in the order learned; ``join`` builds the merged symbol."""
    names: list[str] = []
    index: dict[str, int] = {}

    def symbol(s: str) -> int:
        if s not in index:
            index[s] = len(names)
            names.append(s)
        return index[s]

    seqs = [[symbol(s) for s in w] for w in words]
    freqs = list(words.values())
    pair_counts: collections.Counter = collections.Counter()
    where: dict[tuple[int, int], set[int]] = collections.defaultdict(set)
    for w, (seq, f) in enumerate(zip(seqs, freqs, strict=True)):
        for pair in zip(seq, seq[1:], strict=False):
            pair_counts[pair] += f
            where[pair].add(w)
    heap = [(-c, names[a], names[b], a, b) for (a, b), c in pair_counts.items()]
    heapq.heapify(heap)
    merges: list[tuple[str, str, str]] = []
    while heap and len(merges) < max_merges:
        neg, _, _, a, b = heapq.heappop(heap)
        if pair_counts.get((a, b), 0) != -neg:
            continue  # stale entry: the count changed since it was pushed
        if -neg < min_frequency:
            break
        merged = join(names[a], names[b])
        new = symbol(merged)
        merges.append((names[a], names[b], merged))
        changed: set[tuple[int, int]] = set()
        for w in where[(a, b)]:
            seq, f = seqs[w], freqs[w]
            out, i, n = [], 0, len(seq)
            while i < n:
                if i + 1 < n and seq[i] == a and seq[i + 1] == b:
                    # Neighbours pair with the new symbol instead of a / b. The left one is
                    # already rewritten, so runs (a b a b) come out right.
                    if out:
                        left = out[-1]
                        pair_counts[(left, a)] -= f
                        pair_counts[(left, new)] += f
                        changed.update(((left, a), (left, new)))
                        where[(left, new)].add(w)
                    if i + 2 < n:
                        right = seq[i + 2]
                        pair_counts[(b, right)] -= f
                        pair_counts[(new, right)] += f
                        changed.update(((b, right), (new, right)))
                        where[(new, right)].add(w)
                    out.append(new)
                    i += 2
                else:
                    out.append(seq[i])
                    i += 1
            seqs[w] = out
        pair_counts.pop((a, b), None)
        where.pop((a, b), None)
        changed.discard((a, b))
        for pair in changed:
            count = pair_counts.get(pair, 0)
            if count > 0:
                heapq.heappush(heap, (-count, names[pair[0]], names[pair[1]], *pair))
            else:
                pair_counts.pop(pair, None)
    return merges
