"""How a pipeline masks each batch, as a run names it: ``data.masking`` and its rates.

One object carries them by name from a run config (or ``bert-jax materialize-batches``)
through the pipelines to :class:`~bert_jax.data.masking.MaskingConfig`, whose defaults they
are."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from bert_jax.data.masking import MaskingConfig, mode_flags

_DEFAULTS = {field.name: field.default for field in dataclasses.fields(MaskingConfig)
             if field.default is not dataclasses.MISSING}


@dataclasses.dataclass(frozen=True)
class MaskSettings:
    """``masking``: one of ``masking.MASKING_MODES`` (``data.masking``); None: the older
    ``whole_word`` / ``span_masking`` switches choose. ``mask_rate``: the share of tokens
    masked (``data.masked_lm_prob``); of those, ``mask_token_fraction`` shown as [MASK] and
    ``random_token_fraction`` replaced at random. ``span_p`` / ``max_span``: span lengths
    (SpanBERT); ``basic_fraction``: sequences masked token by token (knowledge)."""

    masking: str | None = None
    whole_word: bool = _DEFAULTS["whole_word"]
    span_masking: bool = _DEFAULTS["span_masking"]
    mask_rate: float = _DEFAULTS["mask_rate"]
    mask_token_fraction: float = _DEFAULTS["mask_token_fraction"]
    random_token_fraction: float = _DEFAULTS["random_token_fraction"]
    span_p: float = _DEFAULTS["span_p"]
    max_span: int = _DEFAULTS["max_span"]
    basic_fraction: float = _DEFAULTS["basic_fraction"]

    @property
    def needs_words(self) -> bool:
        """Whether masking needs the tokenizer's word starts (every mode but token)."""
        return self.whole_word or self.masking not in (None, "token")

    def masking_config(self, *, vocab_size: int, special_ids: Sequence[int], mask_id: int,
                       max_predictions: int, word_start_mask: np.ndarray | None = None
                       ) -> MaskingConfig:
        """The MaskingConfig of these settings for one vocabulary."""
        flags = mode_flags(self.masking) if self.masking is not None else {
            "whole_word": self.whole_word, "span_masking": self.span_masking}
        return MaskingConfig(vocab_size=vocab_size,
                             special_ids=tuple(int(i) for i in special_ids), mask_id=mask_id,
                             max_predictions=max_predictions, mask_rate=self.mask_rate,
                             word_start_mask=word_start_mask, span_p=self.span_p,
                             max_span=self.max_span, basic_fraction=self.basic_fraction,
                             mask_token_fraction=self.mask_token_fraction,
                             random_token_fraction=self.random_token_fraction, **flags)
