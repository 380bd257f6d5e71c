"""Entity-level precision/recall/F1 with the semantics of the CoNLL shared-task ``conlleval``.

Chunk boundaries follow conlleval.pl's ``startOfChunk``/``endOfChunk``: they work for IOB1 and
IOB2 (and IOE) alike; an ``I-X`` after ``O`` or after another type starts a chunk; a type change
ends one. A chunk is correct when gold and prediction have it with the same type, start and end.
Scores are percentages, as conlleval prints them.
"""

from __future__ import annotations

from collections.abc import Sequence


def _split(tag: str) -> tuple[str, str]:
    """'B-PER' -> ('B', 'PER'); 'O' -> ('O', '') (conlleval's /^([^-]*)-(.*)$/)."""
    prefix, dash, kind = tag.partition("-")
    return (prefix, kind) if dash else (tag, "")


def _end_of_chunk(prev_tag, tag, prev_type, type_) -> bool:
    end = (prev_tag, tag) in {("B", "B"), ("B", "O"), ("I", "B"), ("I", "O"), ("E", "E"),
                              ("E", "I"), ("E", "O")}
    if prev_tag not in ("O", ".") and prev_type != type_:
        end = True
    return end or prev_tag in ("[", "]")


def _start_of_chunk(prev_tag, tag, prev_type, type_) -> bool:
    start = (prev_tag, tag) in {("B", "B"), ("I", "B"), ("O", "B"), ("O", "I"), ("E", "E"),
                                ("E", "I"), ("O", "E")}
    if tag not in ("O", ".") and prev_type != type_:
        start = True
    return start or tag in ("[", "]")


def get_chunks(tags: Sequence[str]) -> list[tuple[str, int, int]]:
    """One sentence's tags -> chunks (type, first, last) with conlleval boundaries."""
    chunks = []
    prev_tag, prev_type = "O", ""
    start = None
    for i, tag in enumerate([*tags, "O"]):  # a sentence boundary closes the last chunk
        t, kind = _split(tag)
        if start is not None and _end_of_chunk(prev_tag, t, prev_type, kind):
            chunks.append((prev_type, start, i - 1))
            start = None
        if _start_of_chunk(prev_tag, t, prev_type, kind):
            start = i
        prev_tag, prev_type = t, kind
    return chunks


def _prf(correct: int, guessed: int, gold: int) -> dict[str, float]:
    p = 100.0 * correct / guessed if guessed else 0.0
    r = 100.0 * correct / gold if gold else 0.0
    f = 2 * p * r / (p + r) if p + r else 0.0
    return {"precision": p, "recall": r, "f1": f}


def conlleval(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> dict[str, float]:
    """Sentences of gold and predicted tags -> overall and per-type scores, token accuracy.

    Keys: precision, recall, f1, accuracy, and <TYPE>_precision / _recall / _f1 per type.
    """
    if len(gold) != len(pred):
        raise ValueError(f"{len(gold)} gold sentences, {len(pred)} predicted")
    totals = {"correct": 0, "gold": 0, "guessed": 0}
    per_type: dict[str, dict[str, int]] = {}
    tokens = correct_tags = 0
    for g, p in zip(gold, pred, strict=True):
        if len(g) != len(p):
            raise ValueError(f"sentence of {len(g)} gold tags, {len(p)} predicted")
        g_chunks, p_chunks = set(get_chunks(g)), set(get_chunks(p))
        for name, chunks in (("gold", g_chunks), ("guessed", p_chunks),
                             ("correct", g_chunks & p_chunks)):
            totals[name] += len(chunks)
            for kind, _, _ in chunks:
                per_type.setdefault(kind, {"correct": 0, "gold": 0, "guessed": 0})[name] += 1
        tokens += len(g)
        correct_tags += sum(a == b for a, b in zip(g, p, strict=True))
    out = _prf(totals["correct"], totals["guessed"], totals["gold"])
    out["accuracy"] = 100.0 * correct_tags / tokens if tokens else 0.0
    for kind in sorted(per_type):
        c = per_type[kind]
        for key, value in _prf(c["correct"], c["guessed"], c["gold"]).items():
            out[f"{kind}_{key}"] = value
    return out
