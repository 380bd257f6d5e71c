"""Helpers for checkpoint tests: randomly initialised transformers BERT models (every weight,
LayerNorm and bias random so that a misplaced or transposed tensor shows), and right-padded
batches with both token types."""

from __future__ import annotations

import numpy as np

# Small configs that differ in depth, width, heads, FFN size and activation; vocab sizes are
# not multiples of 128 so vocabulary padding is exercised.
HF_CONFIGS = {
    "2L-32H-4A": dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=37, max_position_embeddings=40),
    "3L-48H-3A": dict(vocab_size=211, hidden_size=48, num_hidden_layers=3,
                      num_attention_heads=3, intermediate_size=64, max_position_embeddings=24,
                      type_vocab_size=3),
    "1L-64H-8A-gelu_new": dict(vocab_size=130, hidden_size=64, num_hidden_layers=1,
                               num_attention_heads=8, intermediate_size=96, hidden_act="gelu_new",
                               max_position_embeddings=16, layer_norm_eps=1e-6),
}
WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "a", "cat", "dog", "sat", "on",
         "mat", "##s", "run", "##ning", ".", ",", "!"]


def hf_config(name: str, **overrides):
    import transformers

    return transformers.BertConfig(**{**HF_CONFIGS[name], **overrides},
                                   attn_implementation="eager")


def randomize(model, seed: int = 0):
    """Every parameter random (LayerNorm scales around 1), so nothing is zero or one."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen) * 0.1
            p.copy_(1.0 + noise if "LayerNorm.weight" in name else noise * 2)
    return model.eval()


def make_hf_model(cls_name: str, config_name: str, seed: int = 0, **overrides):
    import transformers

    cls = getattr(transformers, cls_name)
    return randomize(cls(hf_config(config_name, **overrides)), seed)


def make_batch(vocab_size: int, batch: int = 4, seq_len: int = 12, seed: int = 0,
               type_vocab_size: int = 2):
    """Right-padded ids/mask/segments: varied lengths, a second segment in most rows."""
    rng = np.random.default_rng(seed)
    lengths = np.array([seq_len, 7, 3, seq_len - 2, 5, 9][:batch])
    positions = np.arange(seq_len)[None, :]
    mask = (positions < lengths[:, None]).astype(np.int64)
    ids = rng.integers(5, vocab_size, (batch, seq_len)) * mask
    ids[:, 0] = 2
    second = np.maximum(lengths // 2, 1)[:, None]
    segments = np.where(positions >= second, min(1, type_vocab_size - 1), 0) * mask
    return ids, mask, segments


def write_vocab(directory, words=WORDS, size: int | None = None) -> list[str]:
    tokens = list(words) + [f"tok{i}" for i in range(max(0, (size or 0) - len(words)))]
    with open(f"{directory}/vocab.txt", "w", encoding="utf-8") as f:
        f.writelines(t + "\n" for t in tokens)
    return tokens
