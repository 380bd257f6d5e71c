"""Looking inside a BERT checkpoint: attention-head statistics (``analyze-attention``), layer
probes (``probe``) and the feature-based CoNLL-2003 table (``feature_table``)."""
