"""Flax BERT encoder and heads."""

from bert_jax.modeling.encoder import BertEmbeddings, BertEncoder, BertLayer, BertModel
from bert_jax.modeling.heads import (
    BertForMultipleChoice,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    MaskedLMHead,
    PairHead,
)

__all__ = [
    "BertEmbeddings", "BertEncoder", "BertLayer", "BertModel", "BertForPreTraining",
    "BertForSequenceClassification", "BertForTokenClassification", "BertForQuestionAnswering",
    "BertForMultipleChoice", "MaskedLMHead", "PairHead",
]
