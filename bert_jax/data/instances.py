"""Pretraining examples from tokenized documents, made the way Google's BERT makes them.

``documents`` is a list of documents, each a list of sentences, each a list of token ids (no
special tokens). Three modes:

* ``nsp`` (BERT): a target length (``max_seq_length - 3``, or with ``short_seq_prob`` a random
  length in [2, max]); segment A is one or more sentences up to a random split of the current
  chunk; B is the true continuation 50% of the time (label 0), otherwise a random span from
  another document (label 1) and the unused sentences of the chunk go back into the stream; the
  longer segment is truncated from a random end. This mirrors ``create_instances_from_document``
  of google-research/bert line by line, including its use of Python's ``random.Random``.
* ``sop`` (ALBERT): B is always the true continuation; with probability 0.5 the segments are
  swapped (label 1). A chunk of one sentence is split inside the sentence at a random token so
  that both segments stay contiguous text (ALBERT falls back to a random next segment there,
  which would not be an order-prediction example).
* ``full_sentences`` (RoBERTa): contiguous sentences packed up to ``max_seq_length - 2`` tokens,
  crossing document boundaries with an extra [SEP] between documents; one segment, label 0.
"""

from __future__ import annotations

import collections
import random

MODES = ("nsp", "sop", "full_sentences")

# One example: (input_ids with [CLS]/[SEP], segment_ids, pair label).
Example = tuple[list[int], list[int], int]


def truncate_seq_pair(tokens_a: list[int], tokens_b: list[int], max_num_tokens: int,
                      rng: random.Random) -> None:
    """Truncates the longer list in place, one token at a time from a random end."""
    while len(tokens_a) + len(tokens_b) > max_num_tokens:
        trunc = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
        if rng.random() < 0.5:
            del trunc[0]
        else:
            trunc.pop()


def _pair(tokens_a: list[int], tokens_b: list[int], label: int, cls_id: int,
          sep_id: int) -> Example:
    ids = [cls_id, *tokens_a, sep_id, *tokens_b, sep_id]
    segs = [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1)
    return ids, segs, label


def pair_examples_from_document(documents: list[list[list[int]]], document_index: int,
                                max_seq_length: int, short_seq_prob: float, mode: str,
                                rng: random.Random, cls_id: int, sep_id: int,
                                stats: collections.Counter) -> list[Example]:
    """NSP or SOP examples from one document (see the module docstring)."""
    document = documents[document_index]
    max_num_tokens = max_seq_length - 3
    target_seq_length = max_num_tokens
    if rng.random() < short_seq_prob:
        target_seq_length = rng.randint(2, max_num_tokens)
    examples: list[Example] = []
    current_chunk: list[list[int]] = []
    current_length = 0
    i = 0
    while i < len(document):
        segment = document[i]
        current_chunk.append(segment)
        current_length += len(segment)
        if i == len(document) - 1 or current_length >= target_seq_length:
            a_end = 1
            if len(current_chunk) >= 2:
                a_end = rng.randint(1, len(current_chunk) - 1)
            tokens_a = [t for s in current_chunk[:a_end] for t in s]
            tokens_b: list[int] = []
            label = 0
            if mode == "nsp" and (len(current_chunk) == 1 or rng.random() < 0.5):
                label = 1
                target_b_length = target_seq_length - len(tokens_a)
                random_document_index = document_index
                for _ in range(10):
                    random_document_index = rng.randint(0, len(documents) - 1)
                    if random_document_index != document_index:
                        break
                if random_document_index == document_index:
                    stats["random_next_from_same_document"] += 1
                random_document = documents[random_document_index]
                random_start = rng.randint(0, len(random_document) - 1)
                for j in range(random_start, len(random_document)):
                    tokens_b.extend(random_document[j])
                    if len(tokens_b) >= target_b_length:
                        break
                i -= len(current_chunk) - a_end  # unused sentences go back into the stream
            elif len(current_chunk) == 1:  # SOP with one sentence: split inside it
                if len(tokens_a) < 2:  # a one-token tail sentence cannot form a pair
                    stats["sop_one_token_chunks_skipped"] += 1
                    current_chunk, current_length = [], 0
                    i += 1
                    continue
                split = rng.randint(1, len(tokens_a) - 1)
                tokens_a, tokens_b = tokens_a[:split], tokens_a[split:]
            else:
                tokens_b = [t for s in current_chunk[a_end:] for t in s]
            if mode == "sop" and rng.random() < 0.5:
                tokens_a, tokens_b, label = tokens_b, tokens_a, 1
            truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
            examples.append(_pair(tokens_a, tokens_b, label, cls_id, sep_id))
            current_chunk = []
            current_length = 0
        i += 1
    return examples


def full_sentence_examples(documents: list[list[list[int]]], max_seq_length: int,
                           cls_id: int, sep_id: int) -> list[Example]:
    """RoBERTa FULL-SENTENCES packing over ``documents`` in the given order."""
    max_num_tokens = max_seq_length - 2
    examples: list[Example] = []
    current: list[int] = []
    pending_sep = False

    def emit() -> None:
        ids = [cls_id, *current, sep_id]
        examples.append((ids, [0] * len(ids), 0))

    for document in documents:
        for sentence in document:
            # A sentence longer than a whole example is cut into example-sized pieces.
            for start in range(0, len(sentence), max_num_tokens):
                piece = sentence[start:start + max_num_tokens]
                extra = 1 if pending_sep and current else 0
                if current and len(current) + extra + len(piece) > max_num_tokens:
                    emit()
                    current = []
                    extra = 0
                if extra:
                    current.append(sep_id)
                pending_sep = False
                current.extend(piece)
        pending_sep = True
    if current:
        emit()
    return examples


def document_is_usable(document: list[list[int]], mode: str) -> bool:
    """Whether a tokenized document can give at least one example in ``mode``."""
    tokens = sum(len(s) for s in document)
    return tokens >= (2 if mode == "sop" else 1)


def create_examples(documents: list[list[list[int]]], mode: str, max_seq_length: int,
                    short_seq_prob: float, dupe_factor: int, rng: random.Random, cls_id: int,
                    sep_id: int, stats: collections.Counter) -> list[Example]:
    """All examples of a pool of usable documents: shuffle, ``dupe_factor`` passes, shuffle."""
    documents = list(documents)
    rng.shuffle(documents)
    examples: list[Example] = []
    for _ in range(dupe_factor):
        if mode == "full_sentences":
            order = list(range(len(documents)))
            rng.shuffle(order)
            examples.extend(full_sentence_examples([documents[k] for k in order],
                                                   max_seq_length, cls_id, sep_id))
        else:
            for index in range(len(documents)):
                examples.extend(pair_examples_from_document(
                    documents, index, max_seq_length, short_seq_prob, mode, rng, cls_id,
                    sep_id, stats))
    rng.shuffle(examples)
    return examples
