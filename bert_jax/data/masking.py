"""Dynamic masked-LM masking in TF ops, vectorised over a batch, with stateless randomness.

A batch is masked as a whole: the tokens that may be masked (not special, not padding) are
grouped into *units* (single tokens; whole words with ``whole_word``; with ``span_masking``,
runs of units whose lengths follow a geometric distribution clipped at ``max_span``, as in
SpanBERT). Units are visited in a random order and each is taken when it fits in what is left
of ``round(n * mask_rate)`` tokens (at least 1, at most ``max_predictions``) and skipped
otherwise, as Google's loop does, so whole words and spans are never cut and the budget is
filled up to the last unit that fits. Each chosen token becomes [MASK] with probability
``mask_token_fraction`` (BERT's 0.8), a random non-special token with ``random_token_fraction``
(0.1), and stays unchanged otherwise (0.1); with ``per_unit_actions``
(span and knowledge masking) the draw is made once per unit, so a whole span is masked,
replaced or kept together (SpanBERT, Joshi et al. 2020, section 3.1).

Packed rows (``bert_jax/data/packing.py``) pass ``example_ids``: a unit never continues from
one example into the next, so every word and span lies inside one example.

``knowledge`` (ERNIE, Sun et al. 2019): units are the phrases and entities annotated when the
data was created (``unit_ids``: int32 [B, S], 0 outside any unit, equal ids mark one unit) and
whole words elsewhere; a fraction ``basic_fraction`` of the sequences uses basic (single
token) masking instead, ERNIE's basic-level masking. In packed rows (``example_ids`` given)
that choice is made per example, and a row's unit ids are distinct across its examples.

The modes users select (``MASKING_MODES``) map onto these flags with :func:`mode_flags`.

All randomness comes from ``seed`` (a [2] int64 tensor), so the same seed gives the same masks.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from bert_jax.errors import BertJaxError

_SEED_MIX = 1_000_003


def mix_seed(*values: int) -> int:
    """One 62-bit seed from several integers (the run's seed and a stream index): the tf.data
    stages (file order, shuffle, masking) each draw from their own mix of the run's seed."""
    out = 0
    for v in values:
        out = (out * _SEED_MIX + int(v)) % (1 << 62)
    return out


MASKING_MODES = ("token", "whole_word", "span", "knowledge")


def mode_flags(mode: str) -> dict[str, bool]:
    """``data.masking`` -> MaskingConfig flags. Spans are measured in whole words (SpanBERT
    samples span lengths in words and masks complete words)."""
    if mode not in MASKING_MODES:
        raise BertJaxError(f"data.masking={mode!r}: expected one of {MASKING_MODES}")
    return {"whole_word": mode != "token", "span_masking": mode == "span",
            "knowledge": mode == "knowledge", "per_unit_actions": mode in ("span", "knowledge")}


@dataclasses.dataclass(frozen=True)
class MaskingConfig:
    vocab_size: int
    special_ids: tuple[int, ...]  # never masked, never used as random replacements
    mask_id: int
    max_predictions: int
    mask_rate: float = 0.15
    whole_word: bool = False
    span_masking: bool = False
    span_p: float = 0.2  # geometric span-length parameter (mean 1/p before clipping)
    max_span: int = 10
    word_start_mask: np.ndarray | None = None  # bool[vocab_size], for whole_word
    knowledge: bool = False  # units from the examples' unit_ids (phrases and entities)
    basic_fraction: float = 0.0  # knowledge: share of sequences masked token by token
    per_unit_actions: bool = False  # one 80/10/10 draw per unit instead of per token
    mask_token_fraction: float = 0.8  # chosen tokens shown as [MASK]
    random_token_fraction: float = 0.1  # chosen tokens replaced by a random token

    def validate(self) -> None:
        if not 0.0 < self.mask_rate < 1.0:
            raise BertJaxError(f"mask_rate {self.mask_rate}: must be in (0, 1)")
        if self.max_predictions < 1:
            raise BertJaxError(f"max_predictions_per_seq {self.max_predictions}: must be >= 1")
        if self.whole_word:
            if self.word_start_mask is None:
                raise BertJaxError("whole_word masking needs the tokenizer's word_start_mask")
            if len(self.word_start_mask) != self.vocab_size:
                raise BertJaxError(f"word_start_mask has {len(self.word_start_mask)} entries, "
                                   f"vocab_size is {self.vocab_size}")
        if self.span_masking and not (0.0 < self.span_p <= 1.0 and self.max_span >= 1):
            raise BertJaxError(f"span masking needs 0 < span_p <= 1 and max_span >= 1, got "
                               f"{self.span_p}, {self.max_span}")
        for name in ("mask_token_fraction", "random_token_fraction"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise BertJaxError(f"{name} {getattr(self, name)}: must be in [0, 1]")
        if self.mask_token_fraction + self.random_token_fraction > 1.0:
            raise BertJaxError(f"mask_token_fraction {self.mask_token_fraction} + "
                               f"random_token_fraction {self.random_token_fraction}: must be "
                               "at most 1 (the rest stay unchanged)")
        if not 0.0 <= self.basic_fraction <= 1.0:
            raise BertJaxError(f"basic_fraction {self.basic_fraction}: must be in [0, 1]")
        bad = [i for i in (*self.special_ids, self.mask_id) if not 0 <= i < self.vocab_size]
        if bad:
            raise BertJaxError(f"special ids {bad} outside vocab_size {self.vocab_size}")


def _shift_right(x, fill):
    """x[:, t-1] at position t, ``fill`` at t=0."""
    import tensorflow as tf

    return tf.concat([tf.fill([tf.shape(x)[0], 1], fill), x[:, :-1]], axis=1)


def _unit_starts(input_ids, candidate, config: MaskingConfig, tables, seed, unit_ids=None,
                 example_ids=None):
    """bool[B, S]: True where a maskable unit (token, word, span or knowledge unit) begins.
    ``example_ids`` (packed rows, 0 at padding): an example's first token starts a unit, and
    knowledge masking draws the basic-level choice per example rather than per row."""
    import tensorflow as tf

    prev_candidate = _shift_right(candidate, False)
    if example_ids is not None:  # packed rows: an example's first token starts afresh
        prev_candidate &= example_ids == _shift_right(example_ids, -1)
    starts = candidate
    if config.whole_word:
        word_start = tf.gather(tables["word_start"], input_ids)
        starts = candidate & (word_start | ~prev_candidate)
    if config.knowledge:
        # A phrase/entity is one unit; outside them the whole-word starts stand.
        prev_unit = _shift_right(unit_ids, -1)
        in_unit = unit_ids > 0
        starts = candidate & (~prev_candidate | (unit_ids != prev_unit)
                              | (~in_unit & starts))
        seeds = tf.random.experimental.stateless_split(seed, 2, alg="philox")
        if example_ids is None:
            basic = tf.random.stateless_uniform([tf.shape(input_ids)[0]], seeds[0],
                                                alg="philox")[:, None] < config.basic_fraction
        else:  # one draw per example slot of each row, slot 0 (padding) unused
            per_slot = tf.random.stateless_uniform(
                [tf.shape(input_ids)[0], tf.shape(input_ids)[1] + 1], seeds[0],
                alg="philox") < config.basic_fraction
            basic = tf.gather(per_slot, example_ids, batch_dims=1)  # [B, S]
        return tf.where(basic, candidate, starts)
    if not config.span_masking:
        return starts
    # A span boundary at each unit with probability p gives geometric span lengths; a boundary
    # is forced after max_span units, which clips the distribution at max_span.
    coin = tf.random.stateless_uniform(tf.shape(input_ids), seed, alg="philox")
    boundary = starts & (~prev_candidate | (coin < config.span_p))
    unit_index = tf.cumsum(tf.cast(starts, tf.int32), axis=1)  # [B, S]
    seq_len = tf.shape(input_ids)[1]
    positions = tf.range(seq_len)[None, :]
    # The position of the latest boundary at or before each token.
    order = tf.argsort(tf.where(boundary, positions, positions + seq_len), axis=1, stable=True)
    nth = tf.maximum(tf.cumsum(tf.cast(boundary, tf.int32), axis=1) - 1, 0)
    last_boundary = tf.gather(order, nth, batch_dims=1)
    since = unit_index - tf.gather(unit_index, last_boundary, batch_dims=1)
    forced = starts & (since > 0) & (since % config.max_span == 0)
    return boundary | forced


def _take_fitting(lengths, budget):
    """bool[B, U]: which units, visited in order, are taken: a unit is taken when it fits in
    what the units taken before it left of ``budget`` [B], and skipped otherwise (Google's
    loop). Stopping at the first misfit instead leaves spans of up to ten words far short of
    the budget: 57% of it at seq 128 with 20 predictions."""
    import tensorflow as tf

    def visit(total, length):  # total, length: [B]
        return tf.where(total + length <= budget, total + length, total)

    by_unit = tf.transpose(lengths)  # [U, B]
    totals = tf.scan(visit, by_unit, initializer=tf.zeros_like(budget))  # after each unit
    before = tf.concat([tf.zeros_like(totals[:1]), totals[:-1]], axis=0)
    return tf.transpose(totals > before)  # units of no tokens are never taken


def mask_batch(input_ids, seed, config: MaskingConfig, tables, unit_ids=None,
               example_ids=None):
    """Masks int32[B, S] ids. Returns (masked_ids, positions, ids, weights); see module doc.

    ``tables`` comes from :func:`make_tables` (built once, outside the per-batch function);
    ``unit_ids`` int32[B, S] is required with ``knowledge``; ``example_ids`` int32[B, S]
    marks the examples of packed rows: every unit stays inside one example (knowledge:
    basic-level masking per example).
    """
    import tensorflow as tf

    seeds = tf.random.experimental.stateless_split(seed, 4, alg="philox")  # [4, 2]
    batch = tf.shape(input_ids)[0]
    seq_len = int(input_ids.shape[1])  # static: the pipeline pads to a fixed length
    k = min(config.max_predictions, seq_len)
    candidate = ~tf.gather(tables["special"], input_ids)  # [B, S]
    num_candidates = tf.reduce_sum(tf.cast(candidate, tf.int32), axis=1)  # [B]
    budget = tf.cast(tf.round(tf.cast(num_candidates, tf.float32) * config.mask_rate), tf.int32)
    budget = tf.minimum(tf.clip_by_value(budget, 1, config.max_predictions), num_candidates)

    if config.knowledge and unit_ids is None:
        raise BertJaxError("knowledge masking needs the examples' unit_ids (create the data "
                           "with `bert-jax create-pretraining-data --knowledge-units`)")
    action = tf.random.stateless_uniform(tf.shape(input_ids), seeds[2], alg="philox")
    if config.whole_word or config.span_masking or config.knowledge:
        starts = _unit_starts(input_ids, candidate, config, tables, seeds[0], unit_ids,
                              example_ids)
        # Units numbered 0.. per row; non-candidates go to a dummy unit ``seq_len``.
        unit = tf.where(candidate, tf.cumsum(tf.cast(starts, tf.int32), axis=1) - 1, seq_len)
        slots = seq_len + 1
        flat = unit + tf.range(batch)[:, None] * slots
        unit_len = tf.reshape(tf.math.unsorted_segment_sum(
            tf.cast(candidate, tf.int32), flat, batch * slots), [batch, slots])  # [B, S+1]
        score = tf.random.stateless_uniform([batch, slots], seeds[1], alg="philox")
        score = tf.where(unit_len > 0, score, 2.0)
        order = tf.argsort(score, axis=1)
        take_sorted = _take_fitting(tf.gather(unit_len, order, batch_dims=1), budget)
        rows = tf.broadcast_to(tf.range(batch)[:, None], tf.shape(order))
        take_unit = tf.scatter_nd(tf.stack([rows, order], axis=-1), take_sorted,
                                  tf.shape(order))  # undo the sort
        selected = tf.gather(take_unit, unit, batch_dims=1) & candidate
        if config.per_unit_actions:
            unit_action = tf.random.stateless_uniform([batch, slots], seeds[2], alg="philox")
            action = tf.gather(unit_action, unit, batch_dims=1)  # one draw per unit
    else:
        # Single tokens: the ``budget`` candidates with the smallest random scores.
        score = tf.random.stateless_uniform(tf.shape(input_ids), seeds[1], alg="philox")
        score = tf.where(candidate, score, 2.0)
        _, lowest = tf.math.top_k(-score, k=k)  # [B, k]
        chosen = tf.range(k)[None, :] < budget[:, None]
        flat = tf.boolean_mask(lowest + tf.range(batch)[:, None] * seq_len, chosen)
        selected = tf.reshape(tf.scatter_nd(flat[:, None], tf.ones_like(flat, tf.bool),
                                            [batch * seq_len]), [batch, seq_len])

    # Masked positions in increasing order, padded with position 0 / weight 0.
    positions = tf.range(seq_len)[None, :]
    key = tf.where(selected, seq_len - positions, 0)
    values, lm_positions = tf.math.top_k(key, k=k)  # [B, k]
    valid = values > 0
    lm_positions = tf.where(valid, lm_positions, 0)
    lm_ids = tf.where(valid, tf.gather(input_ids, lm_positions, batch_dims=1), 0)
    weights = tf.cast(valid, tf.float32)
    pad = config.max_predictions - k
    lm_positions = tf.pad(lm_positions, [[0, 0], [0, pad]])
    lm_ids = tf.pad(lm_ids, [[0, 0], [0, pad]])
    weights = tf.pad(weights, [[0, 0], [0, pad]])

    replacement_index = tf.random.stateless_uniform(
        tf.shape(input_ids), seeds[3], minval=0, maxval=tf.shape(tables["replacements"])[0],
        dtype=tf.int32, alg="philox")
    random_tokens = tf.gather(tables["replacements"], replacement_index)
    to_mask = config.mask_token_fraction
    to_random = to_mask + config.random_token_fraction
    masked = tf.where(selected & (action < to_mask), config.mask_id, input_ids)
    masked = tf.where(selected & (action >= to_mask) & (action < to_random), random_tokens,
                      masked)
    return masked, lm_positions, lm_ids, weights


def make_tables(config: MaskingConfig) -> dict:
    """Constant lookup tensors: special[vocab], replacements[n], word_start[vocab]."""
    import tensorflow as tf

    config.validate()
    special = np.zeros(config.vocab_size, bool)
    special[list(config.special_ids)] = True
    tables = {"special": tf.constant(special),
              "replacements": tf.constant(np.flatnonzero(~special).astype(np.int32))}
    if config.word_start_mask is not None:
        tables["word_start"] = tf.constant(np.asarray(config.word_start_mask, bool))
    return tables
